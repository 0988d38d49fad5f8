// GGUF v2/v3 parser. The header is read through a buffered cursor in growing chunks (4 KiB up to
// 1 MiB), never the whole file; every count and length is checked against the caps and against the
// bytes left in the file before anything is allocated for it, so a hostile file fails fast.
#include "lib/util/hash_containers.h"
#include "lib/format/gguf.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <type_traits>

#include "lib/quant/codec.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the GGUF reader assumes a little-endian host");

namespace strata::format {
namespace {

constexpr uint32_t kGgufMagic = 0x46554747;  // "GGUF" read as a little-endian uint32
constexpr uint64_t kDefaultAlignment = 32;
constexpr char kAlignmentKey[] = "general.alignment";

// Smallest encodings, used to bound counts by the bytes left before reserving anything:
// a kv pair is a key length (8), a non-empty key (>= 1), a value type (4) and a value (>= 1);
// a tensor entry is a name length (8), a non-empty name (>= 1), n_dims (4), one dim (8), a type
// (4) and an offset (8).
constexpr uint64_t kMinKvBytes = 8 + 1 + 4 + 1;
constexpr uint64_t kMinTensorBytes = 8 + 1 + 4 + 8 + 4 + 8;

// Reads the header front to back. The buffer starts small so a tiny header costs one 4 KiB read,
// and doubles on every refill so a large vocabulary array costs few syscalls.
class Cursor {
 public:
  explicit Cursor(const Source &src) : src_(src), size_(src.size()) {}

  uint64_t pos() const { return pos_; }
  uint64_t left() const { return size_ - pos_; }

  absl::Status Read(void *dst, uint64_t n) {
    if (n > left()) {
      return Errorf(MOE_ERR_FORMAT_TRUNCATED,
                    "needs %u bytes at offset %u but the file ends at %u", n, pos_, size_);
    }
    auto *out = static_cast<uint8_t *>(dst);
    while (n > 0) {
      if (pos_ >= buf_start_ && pos_ < buf_start_ + buf_.size()) {
        uint64_t at = pos_ - buf_start_;
        uint64_t take = std::min<uint64_t>(n, buf_.size() - at);
        std::memcpy(out, buf_.data() + at, static_cast<size_t>(take));
        out += take;
        pos_ += take;
        n -= take;
        continue;
      }
      if (n >= chunk_) {
        // Large reads (long strings, big arrays) go straight to the destination.
        STRATA_RETURN_IF_ERROR(src_.ReadAt(pos_, out, n));
        pos_ += n;
        return absl::OkStatus();
      }
      uint64_t fill = std::min<uint64_t>(chunk_, left());
      buf_.resize(static_cast<size_t>(fill));
      buf_start_ = pos_;
      STRATA_RETURN_IF_ERROR(src_.ReadAt(pos_, buf_.data(), fill));
      chunk_ = std::min<uint64_t>(chunk_ * 2, kMaxChunk);
    }
    return absl::OkStatus();
  }

  template <typename T>
  absl::Status ReadScalar(T *v) {
    static_assert(std::is_trivially_copyable_v<T>);
    return Read(v, sizeof(T));
  }

  // A GGUF string: uint64 length, then that many bytes (no terminator).
  absl::Status ReadString(std::string *s, uint64_t max_bytes, moe_status too_long_code) {
    uint64_t at = pos_;
    uint64_t len = 0;
    STRATA_RETURN_IF_ERROR(ReadScalar(&len));
    if (len > max_bytes) {
      return Errorf(too_long_code, "string length %u at offset %u is over the limit of %u bytes",
                    len, at, max_bytes);
    }
    if (len > left()) {
      return Errorf(MOE_ERR_FORMAT_TRUNCATED,
                    "string length %u at offset %u runs past the end of the file (%u bytes left)",
                    len, at, left());
    }
    s->resize(static_cast<size_t>(len));
    return Read(s->data(), len);
  }

 private:
  static constexpr uint64_t kMaxChunk = 1u << 20;
  const Source &src_;
  uint64_t size_;
  uint64_t pos_ = 0;
  std::vector<uint8_t> buf_;
  uint64_t buf_start_ = 0;
  uint64_t chunk_ = 4096;
};

bool IsKnownValueType(uint32_t t) { return t <= static_cast<uint32_t>(GgufType::kFloat64); }

const char *ValueTypeName(GgufType t) {
  switch (t) {
    case GgufType::kUint8: return "uint8";
    case GgufType::kInt8: return "int8";
    case GgufType::kUint16: return "uint16";
    case GgufType::kInt16: return "int16";
    case GgufType::kUint32: return "uint32";
    case GgufType::kInt32: return "int32";
    case GgufType::kFloat32: return "float32";
    case GgufType::kBool: return "bool";
    case GgufType::kString: return "string";
    case GgufType::kArray: return "array";
    case GgufType::kUint64: return "uint64";
    case GgufType::kInt64: return "int64";
    case GgufType::kFloat64: return "float64";
  }
  return "?";
}

// Encoded size of one scalar; strings report their minimum (the length field).
uint64_t ScalarBytes(GgufType t) {
  switch (t) {
    case GgufType::kUint8: case GgufType::kInt8: case GgufType::kBool: return 1;
    case GgufType::kUint16: case GgufType::kInt16: return 2;
    case GgufType::kUint32: case GgufType::kInt32: case GgufType::kFloat32: return 4;
    case GgufType::kUint64: case GgufType::kInt64: case GgufType::kFloat64: return 8;
    case GgufType::kString: return 8;
    case GgufType::kArray: return 4 + 8;
  }
  return 1;
}

bool IsSignedInt(GgufType t) {
  return t == GgufType::kInt8 || t == GgufType::kInt16 || t == GgufType::kInt32 ||
         t == GgufType::kInt64;
}
bool IsUnsignedInt(GgufType t) {
  return t == GgufType::kUint8 || t == GgufType::kUint16 || t == GgufType::kUint32 ||
         t == GgufType::kUint64;
}
bool IsFloat(GgufType t) { return t == GgufType::kFloat32 || t == GgufType::kFloat64; }

// Decodes one little-endian scalar of type `t` from `p` into the value's i/u/f fields.
absl::Status DecodeScalar(GgufType t, const uint8_t *p, int64_t *i, uint64_t *u, double *f) {
  switch (t) {
    case GgufType::kUint8: *u = p[0]; break;
    case GgufType::kInt8: *i = static_cast<int8_t>(p[0]); break;
    case GgufType::kUint16: { uint16_t v; std::memcpy(&v, p, 2); *u = v; break; }
    case GgufType::kInt16: { int16_t v; std::memcpy(&v, p, 2); *i = v; break; }
    case GgufType::kUint32: { uint32_t v; std::memcpy(&v, p, 4); *u = v; break; }
    case GgufType::kInt32: { int32_t v; std::memcpy(&v, p, 4); *i = v; break; }
    case GgufType::kUint64: { uint64_t v; std::memcpy(&v, p, 8); *u = v; break; }
    case GgufType::kInt64: { int64_t v; std::memcpy(&v, p, 8); *i = v; break; }
    case GgufType::kFloat32: { float v; std::memcpy(&v, p, 4); *f = v; break; }
    case GgufType::kFloat64: { double v; std::memcpy(&v, p, 8); *f = v; break; }
    case GgufType::kBool:
      // Writers emit 0 or 1; anything else is a corrupt byte, not a truth value.
      if (p[0] > 1) return Errorf(MOE_ERR_FORMAT_METADATA, "bool value %u is neither 0 nor 1", p[0]);
      *u = p[0];
      break;
    default:
      return Errorf(MOE_ERR_FORMAT_METADATA, "value type %s is not a scalar", ValueTypeName(t));
  }
  return absl::OkStatus();
}

absl::Status ReadArray(Cursor &cur, GgufValue *v, const GgufLimits &limits) {
  uint32_t elem = 0;
  STRATA_RETURN_IF_ERROR(cur.ReadScalar(&elem));
  if (!IsKnownValueType(elem)) {
    return Errorf(MOE_ERR_FORMAT_METADATA, "array of unknown value type %u", elem);
  }
  GgufType et = static_cast<GgufType>(elem);
  if (et == GgufType::kArray) {
    return Errorf(MOE_ERR_FORMAT_METADATA, "nested array (array of arrays) is not allowed");
  }
  uint64_t n = 0;
  uint64_t at = cur.pos();
  STRATA_RETURN_IF_ERROR(cur.ReadScalar(&n));
  if (n > limits.max_array_len) {
    return Errorf(MOE_ERR_FORMAT_METADATA, "array length %u at offset %u is over the limit of %u",
                  n, at, limits.max_array_len);
  }
  // n <= max_array_len (< 2^32 in any sane limits) and ScalarBytes <= 12, but check anyway: the
  // limits are caller-supplied.
  uint64_t need = 0;
  if (__builtin_mul_overflow(n, ScalarBytes(et), &need) || need > cur.left()) {
    return Errorf(MOE_ERR_FORMAT_TRUNCATED,
                  "array of %u %s values at offset %u needs at least %u bytes, only %u left", n,
                  ValueTypeName(et), at, n * ScalarBytes(et), cur.left());
  }
  v->elem_type = et;
  v->arr_len = n;
  if (et == GgufType::kString) {
    v->arr_str.reserve(static_cast<size_t>(n));
    for (uint64_t k = 0; k < n; ++k) {
      std::string s;
      absl::Status st = cur.ReadString(&s, limits.max_string_bytes, MOE_ERR_FORMAT_METADATA);
      if (!st.ok()) return Annotate(st, absl::StrCat("array element ", k));
      v->arr_str.push_back(std::move(s));
    }
    return absl::OkStatus();
  }
  // Numbers stay at their own width: one read straight into the value, then only bools need a
  // look (a byte other than 0 or 1 is corrupt, as for a scalar).
  v->arr_raw.resize(static_cast<size_t>(need));
  STRATA_RETURN_IF_ERROR(cur.Read(v->arr_raw.data(), need));
  if (et == GgufType::kBool) {
    for (uint64_t k = 0; k < n; ++k) {
      if (v->arr_raw[k] > 1) {
        return Errorf(MOE_ERR_FORMAT_METADATA, "array element %u: bool value %u is neither 0 nor 1", k,
                      v->arr_raw[k]);
      }
    }
  }
  return absl::OkStatus();
}

absl::Status ReadValue(Cursor &cur, GgufType t, GgufValue *v, const GgufLimits &limits) {
  v->type = t;
  if (t == GgufType::kString) {
    return cur.ReadString(&v->s, limits.max_string_bytes, MOE_ERR_FORMAT_METADATA);
  }
  if (t == GgufType::kArray) return ReadArray(cur, v, limits);
  uint8_t raw[8];
  STRATA_RETURN_IF_ERROR(cur.Read(raw, ScalarBytes(t)));
  return DecodeScalar(t, raw, &v->i, &v->u, &v->f);
}

// Names of ids GGUF once assigned and later removed, so the message says what the file is.
const char *RemovedTypeName(uint32_t id) {
  switch (id) {
    case 4: return "Q4_2";
    case 5: return "Q4_3";
    case 31: return "Q4_0_4_4";
    case 32: return "Q4_0_4_8";
    case 33: return "Q4_0_8_8";
    case 36: return "IQ4_NL_4_4";
    case 37: return "IQ4_NL_4_8";
    case 38: return "IQ4_NL_8_8";
  }
  return nullptr;
}

absl::Status ReadTensorInfo(Cursor &cur, uint64_t alignment, GgufTensorInfo *t,
                            const GgufLimits &limits) {
  absl::Status st = cur.ReadString(&t->name, limits.max_string_bytes, MOE_ERR_FORMAT_TENSOR);
  if (!st.ok()) return Annotate(st, "tensor name");
  if (t->name.empty()) return Errorf(MOE_ERR_FORMAT_TENSOR, "empty tensor name");
  auto fail = [&](moe_status code, const std::string &what) {
    return MakeError(code, absl::StrCat("tensor '", t->name, "': ", what));
  };
  auto read = [&](auto *v) {
    absl::Status rs = cur.ReadScalar(v);
    return rs.ok() ? rs : Annotate(rs, absl::StrCat("tensor '", t->name, "'"));
  };
  uint32_t n_dims = 0;
  STRATA_RETURN_IF_ERROR(read(&n_dims));
  if (n_dims < 1 || n_dims > 4) {
    return fail(MOE_ERR_FORMAT_TENSOR, absl::StrCat("n_dims ", n_dims, " is not in 1..4"));
  }
  t->n_dims = static_cast<int>(n_dims);
  for (uint32_t d = 0; d < n_dims; ++d) {
    uint64_t ne = 0;
    STRATA_RETURN_IF_ERROR(read(&ne));
    if (ne == 0 || ne > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return fail(MOE_ERR_FORMAT_TENSOR, absl::StrCat("dim ", d, " is ", ne, ", not in 1..2^63-1"));
    }
    t->ne[d] = static_cast<int64_t>(ne);
  }
  int64_t elems = 1;
  for (int d = 0; d < 4; ++d) {
    if (__builtin_mul_overflow(elems, t->ne[d], &elems)) {
      return fail(MOE_ERR_FORMAT_TENSOR,
                  absl::StrCat("element count of shape [", t->ne[0], ", ", t->ne[1], ", ", t->ne[2],
                               ", ", t->ne[3], "] overflows 64 bits"));
    }
  }
  STRATA_RETURN_IF_ERROR(read(&t->type));
  std::optional<quant::BlockGeometry> geo = quant::GeometryOf(t->type);
  if (!geo) {
    if (const char *removed = RemovedTypeName(t->type)) {
      return fail(MOE_ERR_FORMAT_TENSOR, absl::StrCat("type id ", t->type, " (", removed,
                                                      ") was removed from GGUF"));
    }
    return fail(MOE_ERR_FORMAT_TENSOR, absl::StrCat("unknown type id ", t->type));
  }
  if (geo->block_elems <= 0 || geo->block_bytes <= 0 || t->ne[0] % geo->block_elems != 0) {
    return fail(MOE_ERR_FORMAT_TENSOR,
                absl::StrCat("row length ne[0] = ", t->ne[0], " is not divisible by the block size ",
                             geo->block_elems, " of type ", std::string(quant::TypeName(t->type))));
  }
  uint64_t row = 0;
  uint64_t bytes = 0;
  bool over = __builtin_mul_overflow(static_cast<uint64_t>(t->ne[0] / geo->block_elems),
                                     static_cast<uint64_t>(geo->block_bytes), &row);
  t->nb[0] = static_cast<uint64_t>(geo->block_bytes);
  t->nb[1] = row;
  over = over || __builtin_mul_overflow(t->nb[1], static_cast<uint64_t>(t->ne[1]), &t->nb[2]);
  over = over || __builtin_mul_overflow(t->nb[2], static_cast<uint64_t>(t->ne[2]), &t->nb[3]);
  over = over || __builtin_mul_overflow(t->nb[3], static_cast<uint64_t>(t->ne[3]), &bytes);
  if (over) {
    return fail(MOE_ERR_FORMAT_TENSOR, "byte size overflows 64 bits");
  }
  t->nbytes = bytes;
  uint64_t rel = 0;
  STRATA_RETURN_IF_ERROR(read(&rel));
  if (rel % alignment != 0) {
    return fail(MOE_ERR_FORMAT_TENSOR, absl::StrCat("offset ", rel, " is not a multiple of the alignment ",
                                                    alignment));
  }
  uint64_t rel_end = 0;
  if (__builtin_add_overflow(rel, bytes, &rel_end)) {
    return fail(MOE_ERR_FORMAT_TENSOR,
                absl::StrCat("offset ", rel, " + size ", bytes, " overflows 64 bits"));
  }
  t->offset = rel;  // made absolute once the data section's start is known
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<GgufFile> ParseGguf(const Source &src, const GgufLimits &limits) {
  auto named = [&](const absl::Status &st) { return Annotate(st, src.name()); };
  Cursor cur(src);
  GgufFile out;
  out.file_size = src.size();

  uint32_t magic = 0;
  if (src.size() < 4) {
    return named(Errorf(MOE_ERR_FORMAT_TRUNCATED, "file is %u bytes, too short for the GGUF magic",
                        src.size()));
  }
  STRATA_RETURN_IF_ERROR(named(cur.ReadScalar(&magic)));
  if (magic != kGgufMagic) {
    return named(Errorf(MOE_ERR_FORMAT_HEADER, "bad magic 0x%08x, not a GGUF file (want \"GGUF\")",
                        magic));
  }
  absl::Status st = cur.ReadScalar(&out.version);
  if (!st.ok()) return named(Annotate(st, "GGUF version"));
  if (out.version == 1) {
    return named(Errorf(MOE_ERR_FORMAT_HEADER,
                        "GGUF version 1 is not supported (32-bit counts); convert to version 3"));
  }
  if (out.version != 2 && out.version != 3) {
    return named(Errorf(MOE_ERR_FORMAT_HEADER, "unsupported GGUF version %u (want 2 or 3)",
                        out.version));
  }
  uint64_t n_tensors = 0, n_kv = 0;
  st = cur.ReadScalar(&n_tensors);
  if (!st.ok()) return named(Annotate(st, "tensor count"));
  st = cur.ReadScalar(&n_kv);
  if (!st.ok()) return named(Annotate(st, "key/value count"));
  if (n_tensors > limits.max_tensors) {
    return named(Errorf(MOE_ERR_FORMAT_TENSOR, "tensor count %u is over the limit of %u",
                        n_tensors, limits.max_tensors));
  }
  if (n_kv > limits.max_kv) {
    return named(Errorf(MOE_ERR_FORMAT_METADATA, "key/value count %u is over the limit of %u", n_kv,
                        limits.max_kv));
  }
  // The caps are caller-supplied, so the products are overflow-checked too.
  uint64_t kv_bytes = 0, tensor_bytes = 0, min_bytes = 0;
  if (__builtin_mul_overflow(n_kv, kMinKvBytes, &kv_bytes) ||
      __builtin_mul_overflow(n_tensors, kMinTensorBytes, &tensor_bytes) ||
      __builtin_add_overflow(kv_bytes, tensor_bytes, &min_bytes) || min_bytes > cur.left()) {
    return named(Errorf(MOE_ERR_FORMAT_TRUNCATED,
                        "%u key/value pairs and %u tensor entries need at least %u bytes, but only "
                        "%u are left",
                        n_kv, n_tensors, n_kv * kMinKvBytes + n_tensors * kMinTensorBytes,
                        cur.left()));
  }

  out.kv.reserve(static_cast<size_t>(n_kv));
  out.kv_index.reserve(static_cast<size_t>(n_kv));
  for (uint64_t k = 0; k < n_kv; ++k) {
    std::string key;
    st = cur.ReadString(&key, limits.max_string_bytes, MOE_ERR_FORMAT_METADATA);
    if (!st.ok()) return named(Annotate(st, absl::StrCat("key of key/value pair ", k)));
    if (key.empty()) {
      return named(Errorf(MOE_ERR_FORMAT_METADATA, "key/value pair %u has an empty key", k));
    }
    if (out.kv_index.count(key) != 0) {
      return named(Errorf(MOE_ERR_FORMAT_METADATA, "duplicate key '%s'", key));
    }
    uint32_t type = 0;
    st = cur.ReadScalar(&type);
    if (!st.ok()) return named(Annotate(st, absl::StrCat("type of key '", key, "'")));
    if (!IsKnownValueType(type)) {
      return named(Errorf(MOE_ERR_FORMAT_METADATA, "key '%s' has unknown value type %u", key, type));
    }
    GgufValue v;
    st = ReadValue(cur, static_cast<GgufType>(type), &v, limits);
    if (!st.ok()) return named(Annotate(st, absl::StrCat("key '", key, "'")));
    out.kv_index.emplace(key, out.kv.size());
    out.kv.emplace_back(std::move(key), std::move(v));
  }

  if (const GgufValue *a = out.Find(kAlignmentKey)) {
    if (a->type != GgufType::kUint32) {
      return named(Errorf(MOE_ERR_FORMAT_METADATA, "key '%s' is of type %s, must be uint32",
                          kAlignmentKey, ValueTypeName(a->type)));
    }
    if (a->u == 0 || (a->u & (a->u - 1)) != 0) {
      return named(Errorf(MOE_ERR_FORMAT_METADATA, "key '%s' is %u, not a nonzero power of two",
                          kAlignmentKey, a->u));
    }
    out.alignment = a->u;
  } else {
    out.alignment = kDefaultAlignment;
  }

  out.tensors.reserve(static_cast<size_t>(n_tensors));
  out.tensor_index.reserve(static_cast<size_t>(n_tensors));
  for (uint64_t k = 0; k < n_tensors; ++k) {
    GgufTensorInfo t;
    st = ReadTensorInfo(cur, out.alignment, &t, limits);
    if (!st.ok()) return named(Annotate(st, absl::StrCat("tensor entry ", k)));
    if (out.tensor_index.count(t.name) != 0) {
      return named(Errorf(MOE_ERR_FORMAT_TENSOR, "duplicate tensor name '%s'", t.name));
    }
    out.tensor_index.emplace(t.name, out.tensors.size());
    out.tensors.push_back(std::move(t));
  }

  // The data section starts at the end of the header rounded up to the alignment (a power of two
  // at most 2^31, and pos <= file size, so this cannot wrap).
  const uint64_t header_end = cur.pos();
  out.data_offset = (header_end + out.alignment - 1) & ~(out.alignment - 1);

  std::vector<size_t> by_offset(out.tensors.size());
  for (size_t k = 0; k < out.tensors.size(); ++k) {
    GgufTensorInfo &t = out.tensors[k];
    uint64_t abs = 0, end = 0;
    if (__builtin_add_overflow(out.data_offset, t.offset, &abs) ||
        __builtin_add_overflow(abs, t.nbytes, &end)) {
      return named(Errorf(MOE_ERR_FORMAT_TENSOR,
                          "tensor '%s': data offset %u + offset %u + size %u overflows 64 bits",
                          t.name, out.data_offset, t.offset, t.nbytes));
    }
    if (end > out.file_size) {
      return named(Errorf(MOE_ERR_FORMAT_TRUNCATED,
                          "tensor '%s' spans bytes [%u, %u) but the file has only %u bytes", t.name,
                          abs, end, out.file_size));
    }
    t.offset = abs;
    by_offset[k] = k;
  }
  std::sort(by_offset.begin(), by_offset.end(), [&](size_t a, size_t b) {
    return out.tensors[a].offset < out.tensors[b].offset;
  });
  for (size_t k = 1; k < by_offset.size(); ++k) {
    const GgufTensorInfo &prev = out.tensors[by_offset[k - 1]];
    const GgufTensorInfo &cur_t = out.tensors[by_offset[k]];
    if (prev.offset + prev.nbytes > cur_t.offset) {
      return named(Errorf(MOE_ERR_FORMAT_TENSOR,
                          "tensors '%s' [%u, %u) and '%s' [%u, %u) overlap", prev.name, prev.offset,
                          prev.offset + prev.nbytes, cur_t.name, cur_t.offset,
                          cur_t.offset + cur_t.nbytes));
    }
  }
  return out;
}

uint64_t GgufElemBytes(GgufType t) {
  return t == GgufType::kString || t == GgufType::kArray ? 0 : ScalarBytes(t);
}

bool GgufValue::IsIntArray() const {
  return type == GgufType::kArray && (IsSignedInt(elem_type) || IsUnsignedInt(elem_type) ||
                                      elem_type == GgufType::kBool) &&
         arr_raw.size() == arr_len * GgufElemBytes(elem_type);
}

bool GgufValue::IsFloatArray() const {
  return type == GgufType::kArray && IsFloat(elem_type) && arr_raw.size() == arr_len * GgufElemBytes(elem_type);
}

int64_t GgufValue::IntAt(uint64_t k) const {
  int64_t i = 0;
  uint64_t u = 0;
  double f = 0;
  (void)DecodeScalar(elem_type, arr_raw.data() + k * GgufElemBytes(elem_type), &i, &u, &f);
  return IsSignedInt(elem_type) ? i : static_cast<int64_t>(u);
}

double GgufValue::FloatAt(uint64_t k) const {
  int64_t i = 0;
  uint64_t u = 0;
  double f = 0;
  (void)DecodeScalar(elem_type, arr_raw.data() + k * GgufElemBytes(elem_type), &i, &u, &f);
  return IsFloat(elem_type) ? f : IsSignedInt(elem_type) ? static_cast<double>(i) : static_cast<double>(u);
}

std::vector<int64_t> GgufValue::Ints() const {
  std::vector<int64_t> out;
  if (!IsIntArray()) return out;
  out.reserve(static_cast<size_t>(arr_len));
  for (uint64_t k = 0; k < arr_len; ++k) out.push_back(IntAt(k));
  return out;
}

std::vector<double> GgufValue::Floats() const {
  std::vector<double> out;
  if (!IsIntArray() && !IsFloatArray()) return out;
  out.reserve(static_cast<size_t>(arr_len));
  for (uint64_t k = 0; k < arr_len; ++k) out.push_back(FloatAt(k));
  return out;
}

const GgufValue *GgufFile::Find(const std::string &key) const {
  auto it = kv_index.find(key);
  return it == kv_index.end() ? nullptr : &kv[it->second].second;
}

const GgufTensorInfo *GgufFile::FindTensor(const std::string &name) const {
  auto it = tensor_index.find(name);
  return it == tensor_index.end() ? nullptr : &tensors[it->second];
}

namespace {
absl::Status Missing(const std::string &key) {
  return Errorf(MOE_ERR_FORMAT_HPARAMS, "key '%s' is missing", key);
}
absl::Status WrongType(const std::string &key, GgufType have, const char *want) {
  return Errorf(MOE_ERR_FORMAT_HPARAMS, "key '%s' is of type %s, not %s", key,
                ValueTypeName(have), want);
}
}  // namespace

absl::StatusOr<uint64_t> GgufFile::GetUint(const std::string &key) const {
  const GgufValue *v = Find(key);
  if (!v) return Missing(key);
  if (IsUnsignedInt(v->type)) return v->u;
  if (IsSignedInt(v->type)) {
    if (v->i < 0) {
      return Errorf(MOE_ERR_FORMAT_HPARAMS, "key '%s' is %d, must not be negative", key, v->i);
    }
    return static_cast<uint64_t>(v->i);
  }
  return WrongType(key, v->type, "an integer");
}

absl::StatusOr<double> GgufFile::GetFloat(const std::string &key) const {
  const GgufValue *v = Find(key);
  if (!v) return Missing(key);
  if (IsFloat(v->type)) return v->f;
  if (IsUnsignedInt(v->type)) return static_cast<double>(v->u);
  if (IsSignedInt(v->type)) return static_cast<double>(v->i);
  return WrongType(key, v->type, "a number");
}

absl::StatusOr<std::string> GgufFile::GetString(const std::string &key) const {
  const GgufValue *v = Find(key);
  if (!v) return Missing(key);
  if (v->type != GgufType::kString) return WrongType(key, v->type, "a string");
  return v->s;
}

absl::StatusOr<bool> GgufFile::GetBool(const std::string &key) const {
  const GgufValue *v = Find(key);
  if (!v) return Missing(key);
  if (v->type != GgufType::kBool) return WrongType(key, v->type, "a bool");
  return v->u != 0;
}

}  // namespace strata::format
