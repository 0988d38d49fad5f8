// Test helpers for the format parsers: a temporary directory removed on scope exit, a little-endian
// byte builder, and a GGUF writer whose every field can be overridden so malformed files are built
// from a valid one by changing one thing.
#pragma once

#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace strata::format::testing {

class TempDir {
 public:
  TempDir() {
    const char *base = getenv("TMPDIR");
    std::string tmpl = std::string(base && *base ? base : "/tmp") + "/strata_fmt_XXXXXX";
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    if (mkdtemp(buf.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = buf.data();
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir &) = delete;
  TempDir &operator=(const TempDir &) = delete;
  const std::string &path() const { return path_; }
  std::string File(const std::string &name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

inline void WriteFile(const std::string &path, const std::string &bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!f) throw std::runtime_error("cannot write " + path);
}

// Appends little-endian scalars and GGUF strings.
struct Bytes {
  std::string b;
  Bytes &U8(uint8_t v) { b.push_back(static_cast<char>(v)); return *this; }
  Bytes &U16(uint16_t v) { return Raw(&v, 2); }
  Bytes &U32(uint32_t v) { return Raw(&v, 4); }
  Bytes &U64(uint64_t v) { return Raw(&v, 8); }
  Bytes &I32(int32_t v) { return Raw(&v, 4); }
  Bytes &I64(int64_t v) { return Raw(&v, 8); }
  Bytes &F32(float v) { return Raw(&v, 4); }
  Bytes &F64(double v) { return Raw(&v, 8); }
  Bytes &Str(const std::string &s) { U64(s.size()); b += s; return *this; }
  Bytes &Raw(const void *p, size_t n) { b.append(static_cast<const char *>(p), n); return *this; }
  Bytes &Raw(const std::string &s) { b += s; return *this; }
};

// GGUF value type ids (as in the file).
enum : uint32_t {
  kU8 = 0, kI8 = 1, kU16 = 2, kI16 = 3, kU32 = 4, kI32 = 5, kF32v = 6, kBool = 7, kStr = 8,
  kArr = 9, kU64 = 10, kI64 = 11, kF64v = 12,
};
// ggml tensor type ids used by the tests.
enum : uint32_t { kTF32 = 0, kTF16 = 1, kTQ8_0 = 8, kTQ4_K = 12 };

inline uint64_t TensorBytes(uint32_t type, const std::vector<uint64_t> &dims) {
  uint64_t be = 1, bb = 4;
  if (type == kTF16) bb = 2;
  if (type == kTQ8_0) { be = 32; bb = 34; }
  if (type == kTQ4_K) { be = 256; bb = 144; }
  uint64_t n = dims.empty() ? 0 : dims[0] / be * bb;
  for (size_t i = 1; i < dims.size(); ++i) n *= dims[i];
  return n;
}

class GgufWriter {
 public:
  struct Tensor {
    std::string name;
    std::vector<uint64_t> dims;
    uint32_t type = kTF32;
    std::optional<uint64_t> offset;  // relative to the data section; default: packed, aligned
    std::optional<uint32_t> n_dims;  // override of dims.size()
  };

  std::string magic = "GGUF";
  uint32_t version = 3;
  std::optional<uint64_t> n_kv, n_tensors;  // overrides of the real counts
  uint64_t alignment = 32;                  // for packing (does not write general.alignment)
  std::optional<uint64_t> data_bytes;       // override of the data section size
  std::vector<Tensor> tensors;

  // Key/value pairs are kept encoded, so a test can append any bytes as a value.
  GgufWriter &KvRaw(const std::string &key, uint32_t type, const std::string &value_bytes) {
    kvs_.push_back(Bytes().Str(key).U32(type).Raw(value_bytes).b);
    return *this;
  }
  GgufWriter &KvU32(const std::string &k, uint32_t v) { return KvRaw(k, kU32, Bytes().U32(v).b); }
  GgufWriter &KvU64(const std::string &k, uint64_t v) { return KvRaw(k, kU64, Bytes().U64(v).b); }
  GgufWriter &KvI32(const std::string &k, int32_t v) { return KvRaw(k, kI32, Bytes().I32(v).b); }
  GgufWriter &KvF32(const std::string &k, float v) { return KvRaw(k, kF32v, Bytes().F32(v).b); }
  GgufWriter &KvBool(const std::string &k, bool v) { return KvRaw(k, kBool, Bytes().U8(v).b); }
  GgufWriter &KvStr(const std::string &k, const std::string &v) {
    return KvRaw(k, kStr, Bytes().Str(v).b);
  }
  GgufWriter &KvStrArr(const std::string &k, const std::vector<std::string> &v) {
    Bytes b;
    b.U32(kStr).U64(v.size());
    for (const auto &s : v) b.Str(s);
    return KvRaw(k, kArr, b.b);
  }
  GgufWriter &KvI32Arr(const std::string &k, const std::vector<int32_t> &v) {
    Bytes b;
    b.U32(kI32).U64(v.size());
    for (int32_t x : v) b.I32(x);
    return KvRaw(k, kArr, b.b);
  }
  GgufWriter &KvF32Arr(const std::string &k, const std::vector<float> &v) {
    Bytes b;
    b.U32(kF32v).U64(v.size());
    for (float x : v) b.F32(x);
    return KvRaw(k, kArr, b.b);
  }
  GgufWriter &AddTensor(const std::string &name, std::vector<uint64_t> dims, uint32_t type,
                        std::optional<uint64_t> offset = std::nullopt) {
    tensors.push_back(Tensor{name, std::move(dims), type, offset, std::nullopt});
    return *this;
  }

  // Offsets the writer assigns (relative to the data section), valid after Build().
  std::vector<uint64_t> offsets;
  uint64_t header_bytes = 0;  // size of header + kv + tensor table, before padding

  std::string Build() {
    Bytes h;
    h.Raw(magic.data(), 4).U32(version);
    h.U64(n_tensors.value_or(tensors.size())).U64(n_kv.value_or(kvs_.size()));
    for (const auto &kv : kvs_) h.Raw(kv);
    offsets.clear();
    uint64_t next = 0;
    for (const Tensor &t : tensors) {
      uint64_t off = t.offset.value_or(next);
      offsets.push_back(off);
      uint64_t nb = TensorBytes(t.type, t.dims);
      next = std::max(next, (off + nb + alignment - 1) / alignment * alignment);
      h.Str(t.name).U32(t.n_dims.value_or(static_cast<uint32_t>(t.dims.size())));
      for (uint64_t d : t.dims) h.U64(d);
      h.U32(t.type).U64(off);
    }
    header_bytes = h.b.size();
    uint64_t data_start = (h.b.size() + alignment - 1) / alignment * alignment;
    h.b.resize(data_start, '\0');
    uint64_t data = data_bytes.value_or(next);
    // A recognisable pattern so tests can check they read the right bytes.
    for (uint64_t i = 0; i < data; ++i) h.b.push_back(static_cast<char>(i * 7 + 1));
    return h.b;
  }

 private:
  std::vector<std::string> kvs_;
};

}  // namespace strata::format::testing

namespace strata::format::testing {

// A safetensors file from a header text and a data section of `data_bytes` patterned bytes.
inline std::string SafetensorsBytes(const std::string &header, uint64_t data_bytes) {
  Bytes b;
  b.U64(header.size()).Raw(header);
  for (uint64_t i = 0; i < data_bytes; ++i) b.U8(static_cast<uint8_t>(i * 13 + 5));
  return b.b;
}

struct StTensor {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  uint64_t begin, end;
};

// A header with the given entries (in the given order) and an optional __metadata__ object.
inline std::string SafetensorsHeader(const std::vector<StTensor> &tensors,
                                     const std::string &metadata = "") {
  std::string h = "{";
  if (!metadata.empty()) h += "\"__metadata__\":" + metadata;
  for (const StTensor &t : tensors) {
    if (h.size() > 1) h += ",";
    h += "\"" + t.name + "\":{\"dtype\":\"" + t.dtype + "\",\"shape\":[";
    for (size_t i = 0; i < t.shape.size(); ++i) h += (i ? "," : "") + std::to_string(t.shape[i]);
    h += "],\"data_offsets\":[" + std::to_string(t.begin) + "," + std::to_string(t.end) + "]}";
  }
  return h + "}";
}

// A valid file of the given tensors, packed in order: begin/end are computed from dtype sizes.
inline std::string PackedSafetensors(std::vector<StTensor> tensors) {
  uint64_t at = 0;
  for (StTensor &t : tensors) {
    uint64_t size = t.dtype == "F64" || t.dtype == "I64" ? 8
                    : t.dtype == "F32" || t.dtype == "I32" ? 4
                    : t.dtype == "F16" || t.dtype == "BF16" || t.dtype == "I16" ? 2 : 1;
    for (int64_t d : t.shape) size *= static_cast<uint64_t>(d);
    t.begin = at;
    t.end = at + size;
    at = t.end;
  }
  return SafetensorsBytes(SafetensorsHeader(tensors), at);
}

}  // namespace strata::format::testing
