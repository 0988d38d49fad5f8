// ModelFile: GGUF and HF checkpoints reduced to tensor references in GGUF dimension order.
#include "lib/model/model_file.h"

#include <algorithm>

#include "lib/format/safetensors.h"

namespace strata::model {

absl::StatusOr<std::unique_ptr<ModelFile>> ModelFile::Open(const std::string &path) {
  auto mf = std::unique_ptr<ModelFile>(new ModelFile());
  mf->path_ = path;
  if (format::IsHfCheckpointDir(path)) {
    mf->kind_ = Kind::kHfCheckpoint;
    STRATA_ASSIGN_OR_RETURN(format::HfCheckpoint ck, format::OpenHfCheckpoint(path));
    mf->config_ = std::move(ck.config);
    mf->files_ = std::move(ck.files);
    mf->tensors_.reserve(ck.tensors.size());
    for (const auto &t : ck.tensors) {
      TensorRef r;
      r.name = t.name;
      r.type = t.type;
      if (t.shape.size() > 4) {
        return Errorf(MOE_ERR_FORMAT_TENSOR, "tensor '%s' has %d dimensions (at most 4 supported)",
                      t.name, static_cast<int>(t.shape.size()));
      }
      r.n_dims = static_cast<int>(t.shape.size());
      // safetensors shapes are outermost-first; GGUF's ne[0] is the innermost.
      for (int d = 0; d < r.n_dims; ++d) r.ne[d] = t.shape[r.n_dims - 1 - d];
      r.file_index = t.file_index;
      r.offset = t.offset;
      r.nbytes = t.nbytes;
      mf->tensors_.push_back(std::move(r));
    }
  } else {
    STRATA_ASSIGN_OR_RETURN(auto file, format::File::Open(path));
    STRATA_ASSIGN_OR_RETURN(mf->gguf_, format::ParseGguf(*file));
    mf->files_.push_back(std::move(file));
    mf->kind_ = Kind::kGguf;
    for (const auto &t : mf->gguf_.tensors) {
      TensorRef r;
      r.name = t.name;
      r.type = t.type;
      r.n_dims = t.n_dims;
      std::copy(t.ne, t.ne + 4, r.ne);
      r.file_index = 0;
      r.offset = t.offset;
      r.nbytes = t.nbytes;
      mf->tensors_.push_back(std::move(r));
    }
  }
  for (size_t i = 0; i < mf->tensors_.size(); ++i) mf->index_.emplace(mf->tensors_[i].name, i);
  return mf;
}

const TensorRef *ModelFile::Find(const std::string &name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

uint64_t ModelFile::total_file_bytes() const {
  uint64_t s = 0;
  for (const auto &f : files_) s += f->size();
  return s;
}

}  // namespace strata::model
