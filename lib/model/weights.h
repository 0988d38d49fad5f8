// Weight binding: maps a model file's tensors (GGUF or HF names) onto one architecture-neutral
// layout, checking every shape against the hyper-parameters and every type against the codec
// registry before any data is read. Routed experts are views (file extent + codec) so the store can
// place them in any tier; loading fills `data` pointers.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "lib/model/hparams.h"
#include "lib/model/model_file.h"
#include "lib/quant/codec.h"

namespace strata::model {

// A 2-D weight matrix of `rows` rows of `cols` elements (cols contiguous), one codec.
struct Matrix {
  std::string name;            // tensor name, with "[expert e]" for expert views
  const TensorRef *tensor = nullptr;
  const quant::Codec *codec = nullptr;
  int64_t cols = 0;
  int64_t rows = 0;
  uint64_t row_bytes = 0;
  uint64_t sub_offset = 0;     // byte offset of this view inside its tensor
  const uint8_t *data = nullptr;  // resident bytes, set by WeightStore::Load

  uint64_t nbytes() const { return row_bytes * static_cast<uint64_t>(rows); }
  uint64_t file_offset() const { return tensor->offset + sub_offset; }
  const uint8_t *row(int64_t r) const { return data + static_cast<uint64_t>(r) * row_bytes; }
};

// A 1-D parameter (norm weight), converted to float at load.
struct Vec {
  std::string name;
  const TensorRef *tensor = nullptr;
  const quant::Codec *codec = nullptr;
  int64_t n = 0;
  std::vector<float> values;
};

struct ExpertWeights {
  Matrix gate;  // (n_ff, n_embd)
  Matrix up;    // (n_ff, n_embd)
  Matrix down;  // (n_embd, n_ff)
  uint64_t nbytes() const { return gate.nbytes() + up.nbytes() + down.nbytes(); }
};

struct LayerWeights {
  Vec attn_norm;                        // (n_embd)
  Matrix wq, wk, wv, wo;                // (q_dim, n_embd) (kv_dim, n_embd) x2 (n_embd, q_dim)
  Vec q_norm, k_norm;                   // (head_dim), Qwen3 only
  Vec ffn_norm;                         // (n_embd)
  Matrix router;                        // (n_expert, n_embd)
  std::vector<ExpertWeights> experts;   // n_expert routed experts
};

struct ModelWeights {
  Matrix tok_embd;     // (n_vocab, n_embd)
  Vec output_norm;     // (n_embd)
  Matrix output;       // (n_vocab, n_embd); the embedding when tied
  std::vector<LayerWeights> layers;
};

// Binds and validates. MOE_ERR_FORMAT_TENSOR for a missing tensor, MOE_ERR_FORMAT_HPARAMS for a
// shape that disagrees with the hyper-parameters, MOE_ERR_UNSUPPORTED_TYPE for a codec Strata lacks;
// each message names the tensor.
absl::StatusOr<ModelWeights> BindWeights(const ModelFile &mf, const HParams &hp);

// Bytes of weights that are not routed experts (what always stays resident).
uint64_t NonRoutedBytes(const ModelWeights &w);
uint64_t RoutedExpertBytes(const ModelWeights &w);

// Owns the resident bytes of the weights. Load reads every bound tensor once through the file layer
// (into one 64-byte aligned arena) and points the views at it.
class WeightStore {
 public:
  WeightStore() = default;
  ~WeightStore();
  WeightStore(const WeightStore &) = delete;
  WeightStore &operator=(const WeightStore &) = delete;

  // With routed_experts false, the routed experts stay in the file (their views keep data ==
  // nullptr) for the expert cache to stream.
  absl::Status Load(const ModelFile &mf, ModelWeights &w, bool routed_experts = true);
  uint64_t resident_bytes() const { return size_; }

 private:
  uint8_t *arena_ = nullptr;
  uint64_t size_ = 0;
};

}  // namespace strata::model
