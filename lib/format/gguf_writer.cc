// GGUF writer: header + metadata + tensor infos, then tensor data appended in order through one
// buffered descriptor on a temporary file that only Finish() renames into place.
#include "lib/format/gguf_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "lib/format/file.h"
#include "lib/quant/codec.h"

namespace strata::format {
namespace {

constexpr char kAlignmentKey[] = "general.alignment";
constexpr uint32_t kVersion = 3;
constexpr size_t kBufferBytes = 4u << 20;

uint64_t AlignUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

bool IsPowerOfTwo(uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

uint64_t ScalarBytes(GgufType t) {
  switch (t) {
    case GgufType::kUint8: case GgufType::kInt8: case GgufType::kBool: return 1;
    case GgufType::kUint16: case GgufType::kInt16: return 2;
    case GgufType::kUint32: case GgufType::kInt32: case GgufType::kFloat32: return 4;
    case GgufType::kUint64: case GgufType::kInt64: case GgufType::kFloat64: return 8;
    default: return 0;
  }
}

// Serialises values into a byte string (little-endian, as every GGUF reader expects on x86/ARM).
class Encoder {
 public:
  template <typename T>
  void Put(T v) {
    const size_t at = out_.size();
    out_.resize(at + sizeof v);
    std::memcpy(&out_[at], &v, sizeof v);
  }
  void PutString(const std::string &s) {
    Put<uint64_t>(s.size());
    out_.append(s);
  }
  // One scalar of type t from the value's integer (i or u, by signedness) or float field.
  void PutScalar(GgufType t, int64_t i, uint64_t u, double f) {
    switch (t) {
      case GgufType::kUint8: Put<uint8_t>(static_cast<uint8_t>(u)); break;
      case GgufType::kInt8: Put<int8_t>(static_cast<int8_t>(i)); break;
      case GgufType::kUint16: Put<uint16_t>(static_cast<uint16_t>(u)); break;
      case GgufType::kInt16: Put<int16_t>(static_cast<int16_t>(i)); break;
      case GgufType::kUint32: Put<uint32_t>(static_cast<uint32_t>(u)); break;
      case GgufType::kInt32: Put<int32_t>(static_cast<int32_t>(i)); break;
      case GgufType::kUint64: Put<uint64_t>(u); break;
      case GgufType::kInt64: Put<int64_t>(i); break;
      case GgufType::kFloat32: Put<float>(static_cast<float>(f)); break;
      case GgufType::kFloat64: Put<double>(f); break;
      case GgufType::kBool: Put<uint8_t>(u ? 1 : 0); break;
      default: break;
    }
  }
  absl::Status PutValue(const std::string &key, const GgufValue &v) {
    Put<uint32_t>(static_cast<uint32_t>(v.type));
    if (v.type == GgufType::kString) {
      PutString(v.s);
      return absl::OkStatus();
    }
    if (v.type != GgufType::kArray) {
      if (ScalarBytes(v.type) == 0) return Errorf(MOE_ERR_INVALID_ARGUMENT, "key '%s' has no valid type", key);
      PutScalar(v.type, v.i, v.u, v.f);
      return absl::OkStatus();
    }
    Put<uint32_t>(static_cast<uint32_t>(v.elem_type));
    if (v.elem_type == GgufType::kString) {
      Put<uint64_t>(v.arr_str.size());
      for (const auto &s : v.arr_str) PutString(s);
    } else if (ScalarBytes(v.elem_type) != 0 && v.arr_raw.size() == v.arr_len * ScalarBytes(v.elem_type)) {
      // Numbers are held as the file stores them.
      Put<uint64_t>(v.arr_len);
      out_.append(reinterpret_cast<const char *>(v.arr_raw.data()), v.arr_raw.size());
    } else if (ScalarBytes(v.elem_type) != 0) {
      return Errorf(MOE_ERR_INVALID_ARGUMENT, "key '%s' holds %u bytes for %u %u-byte elements", key,
                    v.arr_raw.size(), v.arr_len, ScalarBytes(v.elem_type));
    } else {
      return Errorf(MOE_ERR_INVALID_ARGUMENT, "key '%s' is an array of an invalid element type", key);
    }
    return absl::OkStatus();
  }
  std::string &bytes() { return out_; }

 private:
  std::string out_;
};

}  // namespace

GgufValue GgufString(std::string s) {
  GgufValue v;
  v.type = GgufType::kString;
  v.s = std::move(s);
  return v;
}
GgufValue GgufUint32(uint32_t x) {
  GgufValue v;
  v.type = GgufType::kUint32;
  v.u = x;
  return v;
}
GgufValue GgufUint64(uint64_t x) {
  GgufValue v;
  v.type = GgufType::kUint64;
  v.u = x;
  return v;
}
GgufValue GgufInt32(int32_t x) {
  GgufValue v;
  v.type = GgufType::kInt32;
  v.i = x;
  return v;
}
GgufValue GgufFloat32(float x) {
  GgufValue v;
  v.type = GgufType::kFloat32;
  v.f = x;
  return v;
}
GgufValue GgufBool(bool x) {
  GgufValue v;
  v.type = GgufType::kBool;
  v.u = x ? 1 : 0;
  return v;
}
GgufValue GgufStringArray(std::vector<std::string> x) {
  GgufValue v;
  v.type = GgufType::kArray;
  v.elem_type = GgufType::kString;
  v.arr_len = x.size();
  v.arr_str = std::move(x);
  return v;
}
namespace {
// A numeric array of `n` elements of type `elem`, each written by `put` into an encoder.
template <typename Put>
GgufValue NumberArray(GgufType elem, size_t n, Put put) {
  Encoder e;
  for (size_t k = 0; k < n; ++k) put(e, k);
  GgufValue v;
  v.type = GgufType::kArray;
  v.elem_type = elem;
  v.arr_len = n;
  v.arr_raw.assign(e.bytes().begin(), e.bytes().end());
  return v;
}
}  // namespace

GgufValue GgufIntArray(GgufType elem, const std::vector<int64_t> &x) {
  return NumberArray(elem, x.size(), [&](Encoder &e, size_t k) {
    e.PutScalar(elem, x[k], static_cast<uint64_t>(x[k]), 0);
  });
}
GgufValue GgufFloatArray(GgufType elem, const std::vector<double> &x) {
  return NumberArray(elem, x.size(), [&](Encoder &e, size_t k) { e.PutScalar(elem, 0, 0, x[k]); });
}

GgufWriter::GgufWriter(std::string path, uint32_t alignment)
    : path_(std::move(path)), alignment_(alignment) {
  temp_path_ = absl::StrCat(path_, ".tmp.", getpid());
}

GgufWriter::~GgufWriter() {
  if (!finished_) Abort();
}

void GgufWriter::SetValue(const std::string &key, GgufValue value) {
  if (key == kAlignmentKey) return;  // owned by the writer
  for (auto &kv : kv_) {
    if (kv.first == key) {
      kv.second = std::move(value);
      return;
    }
  }
  kv_.emplace_back(key, std::move(value));
}

void GgufWriter::RemoveValue(const std::string &key) {
  for (auto it = kv_.begin(); it != kv_.end(); ++it) {
    if (it->first == key) {
      kv_.erase(it);
      return;
    }
  }
}

bool GgufWriter::HasValue(const std::string &key) const {
  for (const auto &kv : kv_) {
    if (kv.first == key) return true;
  }
  return false;
}

absl::StatusOr<size_t> GgufWriter::AddTensor(const std::string &name, uint32_t type, int n_dims,
                                             const int64_t ne[4], uint64_t file_alignment) {
  if (begun_) return Errorf(MOE_ERR_STATE, "tensor '%s' added after the header was written", name);
  if (name.empty()) return Errorf(MOE_ERR_INVALID_ARGUMENT, "empty tensor name");
  for (const auto &t : tensors_) {
    if (t.name == name) return Errorf(MOE_ERR_INVALID_ARGUMENT, "duplicate tensor name '%s'", name);
  }
  if (n_dims < 1 || n_dims > 4) {
    return Errorf(MOE_ERR_INVALID_ARGUMENT, "tensor '%s': n_dims %d is not in 1..4", name, n_dims);
  }
  if (file_alignment % alignment_ != 0) {
    return Errorf(MOE_ERR_INVALID_ARGUMENT, "tensor '%s': alignment %u is not a multiple of %u", name,
                  file_alignment, alignment_);
  }
  GgufTensorLayout t;
  t.name = name;
  t.type = type;
  t.n_dims = n_dims;
  t.file_alignment = file_alignment;
  uint64_t rows = 1;
  for (int d = 0; d < n_dims; ++d) {
    if (ne[d] < 1) return Errorf(MOE_ERR_INVALID_ARGUMENT, "tensor '%s': dim %d is %d", name, d, ne[d]);
    t.ne[d] = ne[d];
    if (d > 0 && __builtin_mul_overflow(rows, static_cast<uint64_t>(ne[d]), &rows)) {
      return Errorf(MOE_ERR_INVALID_ARGUMENT, "tensor '%s': size overflows", name);
    }
  }
  auto row_bytes = quant::RowBytes(type, ne[0]);
  if (!row_bytes.ok()) {
    return Errorf(MOE_ERR_INVALID_ARGUMENT, "tensor '%s': %s", name, row_bytes.status().message());
  }
  if (__builtin_mul_overflow(*row_bytes, rows, &t.nbytes)) {
    return Errorf(MOE_ERR_INVALID_ARGUMENT, "tensor '%s': size overflows", name);
  }
  tensors_.push_back(std::move(t));
  return tensors_.size() - 1;
}

absl::Status GgufWriter::Fail(const std::string &what, int err) {
  failed_ = true;
  Abort();
  return Errorf(MOE_ERR_IO_WRITE, "cannot write '%s': %s: %s", path_, what, std::strerror(err));
}

absl::Status GgufWriter::Fail(const absl::Status &st) {
  failed_ = true;
  Abort();
  return Errorf(MOE_ERR_IO_WRITE, "cannot write '%s': %s", path_, st.message());
}

absl::Status GgufWriter::Begin() {
  if (begun_) return Errorf(MOE_ERR_STATE, "'%s': header already written", path_);
  if (!IsPowerOfTwo(alignment_)) {
    return Errorf(MOE_ERR_INVALID_ARGUMENT, "alignment %u is not a power of two", alignment_);
  }
  Encoder enc;
  enc.bytes().append("GGUF", 4);
  enc.Put<uint32_t>(kVersion);
  enc.Put<uint64_t>(tensors_.size());
  enc.Put<uint64_t>(kv_.size() + 1);
  enc.PutString(kAlignmentKey);
  STRATA_RETURN_IF_ERROR(enc.PutValue(kAlignmentKey, GgufUint32(alignment_)));
  for (const auto &[key, value] : kv_) {
    if (key.empty()) return Errorf(MOE_ERR_INVALID_ARGUMENT, "empty metadata key");
    enc.PutString(key);
    STRATA_RETURN_IF_ERROR(enc.PutValue(key, value));
  }
  // The infos' size does not depend on the offsets' values, so lay out after measuring.
  uint64_t infos = 0;
  for (const auto &t : tensors_) infos += 8 + t.name.size() + 4 + 8 * t.n_dims + 4 + 8;
  data_offset_ = AlignUp(enc.bytes().size() + infos, alignment_);
  uint64_t at = data_offset_;
  tensor_bytes_total_ = 0;
  for (auto &t : tensors_) {
    at = AlignUp(at, alignment_);
    if (t.file_alignment > 0) at = AlignUp(at, t.file_alignment);
    t.offset = at;
    at += t.nbytes;
    tensor_bytes_total_ += t.nbytes;
  }
  file_size_ = AlignUp(at, alignment_);
  for (const auto &t : tensors_) {
    enc.PutString(t.name);
    enc.Put<uint32_t>(static_cast<uint32_t>(t.n_dims));
    for (int d = 0; d < t.n_dims; ++d) enc.Put<uint64_t>(static_cast<uint64_t>(t.ne[d]));
    enc.Put<uint32_t>(t.type);
    enc.Put<uint64_t>(t.offset - data_offset_);
  }

  OpenOptions o;
  o.flags = O_WRONLY | O_CREAT | O_TRUNC;
  o.mode = 0644;
  absl::StatusOr<UniqueFd> fd = OpenRegularFile(temp_path_, o);  // never blocks on a FIFO there
  if (!fd.ok()) {
    failed_ = true;
    Abort();
    return Errorf(MOE_ERR_IO_WRITE, "cannot write '%s': %s", path_, fd.status().message());
  }
  fd_ = fd->Release();
  begun_ = true;
  buffer_.reserve(kBufferBytes);
  STRATA_RETURN_IF_ERROR(Append(enc.bytes().data(), enc.bytes().size()));
  current_ = 0;
  current_done_ = 0;
  if (!tensors_.empty()) STRATA_RETURN_IF_ERROR(Pad(tensors_[0].offset));
  else STRATA_RETURN_IF_ERROR(Pad(data_offset_));
  return absl::OkStatus();
}

absl::Status GgufWriter::Flush() {
  if (absl::Status st = WriteAll(fd_, buffer_.data(), buffer_.size(), temp_path_); !st.ok()) return Fail(st);
  buffer_.clear();
  return absl::OkStatus();
}

absl::Status GgufWriter::Append(const void *data, uint64_t n) {
  const uint8_t *p = static_cast<const uint8_t *>(data);
  while (n > 0) {
    const uint64_t room = kBufferBytes - buffer_.size();
    const uint64_t k = std::min(room, n);
    buffer_.insert(buffer_.end(), p, p + k);
    p += k;
    n -= k;
    written_ += k;
    if (buffer_.size() == kBufferBytes) STRATA_RETURN_IF_ERROR(Flush());
  }
  return absl::OkStatus();
}

absl::Status GgufWriter::Pad(uint64_t to) {
  static const uint8_t kZeros[4096] = {};
  while (written_ < to) {
    STRATA_RETURN_IF_ERROR(Append(kZeros, std::min<uint64_t>(sizeof kZeros, to - written_)));
  }
  return absl::OkStatus();
}

absl::Status GgufWriter::Write(const void *data, uint64_t n) {
  if (!begun_ || failed_ || finished_) {
    return Errorf(MOE_ERR_STATE, "'%s': tensor data written outside Begin()..Finish()", path_);
  }
  const uint8_t *p = static_cast<const uint8_t *>(data);
  while (n > 0) {
    if (current_ >= tensors_.size()) {
      return Errorf(MOE_ERR_INVALID_ARGUMENT, "'%s': %u bytes of tensor data beyond the last tensor", path_, n);
    }
    const GgufTensorLayout &t = tensors_[current_];
    const uint64_t k = std::min(n, t.nbytes - current_done_);
    STRATA_RETURN_IF_ERROR(Append(p, k));
    p += k;
    n -= k;
    current_done_ += k;
    if (current_done_ == t.nbytes) {
      ++current_;
      current_done_ = 0;
      STRATA_RETURN_IF_ERROR(Pad(current_ < tensors_.size() ? tensors_[current_].offset : file_size_));
    }
  }
  return absl::OkStatus();
}

absl::Status GgufWriter::SkipRemainingData() {
  if (!begun_ || failed_ || finished_) return Errorf(MOE_ERR_STATE, "'%s': nothing to skip", path_);
  STRATA_RETURN_IF_ERROR(Flush());
  if (::ftruncate(fd_, static_cast<off_t>(file_size_)) != 0) return Fail("extending", errno);
  if (::lseek(fd_, static_cast<off_t>(file_size_), SEEK_SET) < 0) return Fail("seeking", errno);
  written_ = file_size_;
  current_ = tensors_.size();
  current_done_ = 0;
  return absl::OkStatus();
}

absl::Status GgufWriter::Finish() {
  if (!begun_ || failed_ || finished_) return Errorf(MOE_ERR_STATE, "'%s': nothing to finish", path_);
  if (current_ < tensors_.size()) {
    return Errorf(MOE_ERR_STATE, "'%s': tensor '%s' has %u of its %u bytes", path_, tensors_[current_].name,
                  current_done_, tensors_[current_].nbytes);
  }
  STRATA_RETURN_IF_ERROR(Pad(file_size_));
  STRATA_RETURN_IF_ERROR(Flush());
  if (absl::Status st = SyncFile(fd_, temp_path_); !st.ok()) return Fail(st);
  if (::close(fd_) != 0) {
    fd_ = -1;
    return Fail("closing", errno);
  }
  fd_ = -1;
  if (::rename(temp_path_.c_str(), path_.c_str()) != 0) return Fail("renaming " + temp_path_, errno);
  finished_ = true;
  // Make the rename durable; a directory that cannot be opened or synced loses nothing written.
  std::string dir = path_.substr(0, path_.find_last_of('/') == std::string::npos ? 0 : path_.find_last_of('/'));
  if (path_.find('/') == std::string::npos) dir = ".";
  if (dir.empty()) dir = "/";
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
  return absl::OkStatus();
}

void GgufWriter::Abort() {
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
  if (begun_ && !finished_) ::unlink(temp_path_.c_str());
  buffer_.clear();
}

}  // namespace strata::format
