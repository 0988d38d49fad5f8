// GGUF v2/v3 reader. Parses the header, the key/value metadata and the tensor table, validating
// everything before trusting it: counts and string/array lengths against the bytes left, key and
// tensor-name uniqueness, 1..4 dims each > 0, element and byte counts without overflow, known tensor
// types, rows divisible by the block size, power-of-two alignment, each tensor's extent inside the
// file and inside the data section, no overlapping tensors. Nothing is allocated beyond what the
// file's size can justify. Tensor data is not read.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "lib/util/hash_containers.h"
#include "lib/format/file.h"
#include "lib/util/status.h"

namespace strata::format {

enum class GgufType : uint32_t {
  kUint8 = 0, kInt8 = 1, kUint16 = 2, kInt16 = 3, kUint32 = 4, kInt32 = 5, kFloat32 = 6,
  kBool = 7, kString = 8, kArray = 9, kUint64 = 10, kInt64 = 11, kFloat64 = 12,
};

struct GgufValue {
  GgufType type = GgufType::kUint8;
  GgufType elem_type = GgufType::kUint8;  // for arrays
  // Scalars: integers in i (signed types) or u (unsigned, bool), floats in f, strings in s.
  int64_t i = 0;
  uint64_t u = 0;
  double f = 0;
  std::string s;
  // Arrays: strings in arr_str; numbers (integers, bools, floats) in arr_raw at their own width,
  // little-endian as in the file (arr_len * GgufElemBytes(elem_type) bytes), so a uint8 array
  // takes one byte per element. Read numbers through IsIntArray/IsFloatArray and IntAt/FloatAt.
  std::vector<uint8_t> arr_raw;
  std::vector<std::string> arr_str;
  uint64_t arr_len = 0;

  // An array of integers or bools / of float32 or float64 (arr_raw holds arr_len elements).
  bool IsIntArray() const;
  bool IsFloatArray() const;
  // Element k (< arr_len) of a numeric array: IntAt of an integer or bool array (a uint64 above
  // INT64_MAX wraps), FloatAt of any numeric array (exact for integers below 2^53).
  int64_t IntAt(uint64_t k) const;
  double FloatAt(uint64_t k) const;
  // All elements, widened: Ints of an integer or bool array, Floats of any numeric array; empty
  // for other values.
  std::vector<int64_t> Ints() const;
  std::vector<double> Floats() const;
};

// Bytes one element of a numeric type takes in a file and in GgufValue::arr_raw; 0 for strings
// and arrays.
uint64_t GgufElemBytes(GgufType t);

struct GgufTensorInfo {
  std::string name;
  uint32_t type = 0;        // ggml type id (see quant::TypeId)
  int n_dims = 0;
  int64_t ne[4] = {1, 1, 1, 1};  // ne[0] is the contiguous (row) dimension
  uint64_t nb[4] = {0, 0, 0, 0};  // byte strides: nb[1] = row bytes, nb[2] = nb[1]*ne[1], ...
  uint64_t offset = 0;      // absolute offset in the file
  uint64_t nbytes = 0;
};

struct GgufFile {
  uint32_t version = 0;
  uint64_t alignment = 32;
  uint64_t data_offset = 0;  // absolute offset of the tensor data section
  uint64_t file_size = 0;
  std::vector<std::pair<std::string, GgufValue>> kv;  // in file order
  std::vector<GgufTensorInfo> tensors;                // in file order
  HashMap<std::string, size_t> kv_index;
  HashMap<std::string, size_t> tensor_index;

  const GgufValue *Find(const std::string &key) const;
  const GgufTensorInfo *FindTensor(const std::string &name) const;
  // Typed getters: MOE_ERR_FORMAT_HPARAMS when missing or of a non-convertible type. Integer
  // getters accept any integer type whose value fits; GetF32 accepts float and integer types.
  absl::StatusOr<uint64_t> GetUint(const std::string &key) const;
  absl::StatusOr<double> GetFloat(const std::string &key) const;
  absl::StatusOr<std::string> GetString(const std::string &key) const;
  absl::StatusOr<bool> GetBool(const std::string &key) const;
};

// Limits a GGUF file must respect (caps on what a hostile file can make us allocate).
struct GgufLimits {
  uint64_t max_string_bytes = 1u << 24;     // one string
  uint64_t max_array_len = 1u << 26;        // one array
  uint64_t max_tensors = 1u << 20;
  uint64_t max_kv = 1u << 20;
};

// Parses and validates the GGUF file behind `src`. Errors are MOE_ERR_FORMAT_* (subcodes:
// _HEADER bad magic/version, _TRUNCATED data ends early, _METADATA bad key/value, _TENSOR bad tensor
// entry) or MOE_ERR_UNSUPPORTED_TYPE for tensor types Strata does not know, each with a message
// naming the key or tensor and the offending value; or MOE_ERR_IO_READ from the source.
absl::StatusOr<GgufFile> ParseGguf(const Source &src, const GgufLimits &limits = {});

}  // namespace strata::format
