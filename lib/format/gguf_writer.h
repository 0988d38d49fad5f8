// GGUF v3 writer that streams: metadata and tensor infos are laid out first, then tensor data is
// appended tensor by tensor (in the order added, in any chunk sizes), so no whole-model buffer exists.
// The file is written as `PATH.tmp.<pid>`, fsynced and renamed over PATH only by Finish(); any failure
// or a writer destroyed before Finish() removes the temporary file, so PATH is never half-written.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "lib/format/gguf.h"
#include "lib/util/status.h"

namespace strata::format {

// Builders for metadata values (scalars and arrays of scalars or strings).
GgufValue GgufString(std::string s);
GgufValue GgufUint32(uint32_t v);
GgufValue GgufUint64(uint64_t v);
GgufValue GgufInt32(int32_t v);
GgufValue GgufFloat32(float v);
GgufValue GgufBool(bool v);
GgufValue GgufStringArray(std::vector<std::string> v);
// Integer array of element type `elem` (any integer type or bool; values are cast to it).
GgufValue GgufIntArray(GgufType elem, const std::vector<int64_t> &v);
// Float array of element type `elem` (float32 or float64).
GgufValue GgufFloatArray(GgufType elem, const std::vector<double> &v);

struct GgufTensorLayout {
  std::string name;
  uint32_t type = 0;              // ggml type id
  int n_dims = 0;
  int64_t ne[4] = {1, 1, 1, 1};
  uint64_t nbytes = 0;
  uint64_t file_alignment = 0;    // 0, or a multiple of the file alignment the absolute offset must meet
  uint64_t offset = 0;            // absolute offset in the file, known after Begin()
};

class GgufWriter {
 public:
  // `path` is the final file name; `alignment` (a power of two) is written as general.alignment.
  explicit GgufWriter(std::string path, uint32_t alignment = 32);
  ~GgufWriter();
  GgufWriter(const GgufWriter &) = delete;
  GgufWriter &operator=(const GgufWriter &) = delete;

  // Metadata, written in the order first set; setting a key again replaces its value in place.
  // general.alignment is owned by the writer (set from the constructor) and cannot be set here.
  void SetValue(const std::string &key, GgufValue value);
  void RemoveValue(const std::string &key);
  bool HasValue(const std::string &key) const;

  // Declares the next tensor; data goes into the file in the order tensors are added. With
  // file_alignment > 0 the tensor's absolute file offset is a multiple of it (and of the file
  // alignment). MOE_ERR_INVALID_ARGUMENT for a bad shape, duplicate name, a row that is not whole
  // blocks, or a file_alignment that is not a multiple of the file alignment; returns its index.
  absl::StatusOr<size_t> AddTensor(const std::string &name, uint32_t type, int n_dims, const int64_t ne[4],
                                   uint64_t file_alignment = 0);

  // Lays out the tensors, creates the temporary file and writes the header, metadata and tensor
  // infos. After it, tensors() holds the final absolute offsets.
  absl::Status Begin();
  // Appends `n` bytes of tensor data: the bytes fill the tensors in order (padding between them is
  // written by the writer). MOE_ERR_INVALID_ARGUMENT if more bytes come than the tensors hold.
  absl::Status Write(const void *data, uint64_t n);
  // Leaves the data of every tensor not yet written as a hole: the file gets its full size without
  // the bytes being written (a sparse file whose tensors read as zeros). For tests and plans that
  // need a real-size header, not real data.
  absl::Status SkipRemainingData();
  // Checks every tensor was filled, flushes, fsyncs, renames over the final path and fsyncs the
  // directory. Errors are MOE_ERR_IO_WRITE naming the file; the temporary file is then removed.
  absl::Status Finish();
  // Drops the temporary file (also done by the destructor when Finish() did not succeed).
  void Abort();

  const std::vector<GgufTensorLayout> &tensors() const { return tensors_; }
  const std::string &path() const { return path_; }
  const std::string &temp_path() const { return temp_path_; }
  uint64_t data_offset() const { return data_offset_; }
  uint64_t file_size() const { return file_size_; }
  // Index of the tensor being filled (tensors().size() when all are complete).
  size_t current_tensor() const { return current_; }
  uint64_t tensor_bytes_total() const { return tensor_bytes_total_; }

 private:
  absl::Status Fail(const std::string &what, int err);
  absl::Status Fail(const absl::Status &st);
  absl::Status Append(const void *data, uint64_t n);   // buffered
  absl::Status Pad(uint64_t to);                       // zero bytes up to absolute offset `to`
  absl::Status Flush();

  std::string path_, temp_path_;
  uint32_t alignment_;
  std::vector<std::pair<std::string, GgufValue>> kv_;
  std::vector<GgufTensorLayout> tensors_;
  int fd_ = -1;
  bool begun_ = false, failed_ = false, finished_ = false;
  std::vector<uint8_t> buffer_;
  uint64_t written_ = 0;         // bytes handed to the file so far (incl. buffered)
  uint64_t data_offset_ = 0, file_size_ = 0, tensor_bytes_total_ = 0;
  size_t current_ = 0;           // tensor being filled
  uint64_t current_done_ = 0;    // bytes of it written
};

}  // namespace strata::format
