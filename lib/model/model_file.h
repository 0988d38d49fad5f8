// A model file opened for reading, whatever its container: one GGUF file, or a Hugging Face
// checkpoint directory (config.json + safetensors shards). Both are reduced to one list of tensor
// references with GGUF's dimension order (ne[0] contiguous). Opening validates the containers;
// tensor data is not read here.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "lib/util/hash_containers.h"
#include "lib/format/file.h"
#include "lib/format/gguf.h"
#include "nlohmann/json.hpp"

namespace strata::model {

struct TensorRef {
  std::string name;
  uint32_t type = 0;     // ggml type id
  int n_dims = 0;
  int64_t ne[4] = {1, 1, 1, 1};
  int file_index = 0;    // index into ModelFile::files
  uint64_t offset = 0;   // absolute offset in that file
  uint64_t nbytes = 0;
};

class ModelFile {
 public:
  enum class Kind { kGguf, kHfCheckpoint };

  // Opens `path`: a directory with config.json is a checkpoint, anything else is read as GGUF.
  static absl::StatusOr<std::unique_ptr<ModelFile>> Open(const std::string &path);

  Kind kind() const { return kind_; }
  const std::string &path() const { return path_; }
  const std::vector<TensorRef> &tensors() const { return tensors_; }
  const TensorRef *Find(const std::string &name) const;
  const format::File &file(int i) const { return *files_[i]; }
  int n_files() const { return static_cast<int>(files_.size()); }
  uint64_t total_file_bytes() const;
  // The GGUF metadata (kind() == kGguf) or the checkpoint's config.json (kHfCheckpoint).
  const format::GgufFile &gguf() const { return gguf_; }
  const nlohmann::json &config() const { return config_; }

 private:
  Kind kind_ = Kind::kGguf;
  std::string path_;
  std::vector<std::unique_ptr<format::File>> files_;
  std::vector<TensorRef> tensors_;
  HashMap<std::string, size_t> index_;
  format::GgufFile gguf_;
  nlohmann::json config_;
};

}  // namespace strata::model
