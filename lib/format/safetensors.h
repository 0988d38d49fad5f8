// safetensors reader and Hugging Face checkpoint directories (config.json + *.safetensors, sharded
// with model.safetensors.index.json). Validates before trusting: header length against the file and
// a size cap, JSON well-formed with unique names, known dtypes, shapes of non-negative dims without
// overflow, offsets [begin, end) inside the data section, contiguous and non-overlapping, and
// dtype size x element count == end - begin.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "lib/util/hash_containers.h"
#include "lib/format/file.h"
#include "lib/util/status.h"
#include "nlohmann/json.hpp"

namespace strata::format {

struct SafetensorsTensor {
  std::string name;
  std::string dtype;            // "F32", "F16", "BF16", "I64", ...
  uint32_t type = 0;            // ggml type id for F32/F16/BF16/F64/I8..I64; kUnsupportedDtype else
  std::vector<int64_t> shape;   // row-major, outermost first (PyTorch order)
  uint64_t offset = 0;          // absolute offset in its file
  uint64_t nbytes = 0;
  int file_index = 0;           // which shard (HfCheckpoint::files)
};
inline constexpr uint32_t kUnsupportedDtype = 0xffffffffu;

struct SafetensorsLimits {
  uint64_t max_header_bytes = 100u << 20;  // 100 MiB, as the format's own reference caps it
};

// Parses one .safetensors file. Errors: MOE_ERR_FORMAT_HEADER (header length), _TRUNCATED,
// _METADATA (JSON malformed, duplicate names), _TENSOR (dtype, shape, offsets), or IO.
absl::StatusOr<std::vector<SafetensorsTensor>> ParseSafetensors(const Source &src,
                                                                const SafetensorsLimits &limits = {});

struct HfCheckpoint {
  std::string dir;
  nlohmann::json config;                      // config.json
  std::vector<std::unique_ptr<File>> files;   // the shards
  std::vector<SafetensorsTensor> tensors;     // all tensors of all shards
  HashMap<std::string, size_t> index;  // name -> tensors[i]

  const SafetensorsTensor *Find(const std::string &name) const;
};

// Opens a checkpoint directory: config.json (MOE_ERR_FORMAT_CONFIG if missing keys aside, malformed),
// then either model.safetensors.index.json (every shard it names must exist; every tensor must be
// in the shard the index says; no tensor twice) or all *.safetensors files of the directory.
absl::StatusOr<HfCheckpoint> OpenHfCheckpoint(const std::string &dir);

// True when `path` looks like a checkpoint directory (a directory holding config.json).
bool IsHfCheckpointDir(const std::string &path);

}  // namespace strata::format
