// Weight binding: maps a model file's tensors (GGUF or HF names) onto one architecture-neutral
// layout, checking every shape against the hyper-parameters and every type against the codec
// registry before any data is read. Routed experts are views (file extent + codec) so the store can
// place them in any tier; loading fills `data` pointers.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
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
  uint64_t sub_offset = 0;     // byte offset inside its tensor (a row of a 2-D bias tensor)
  std::vector<float> values;
  uint64_t bytes = 0;          // encoded bytes of this view
  uint64_t nbytes() const { return tensor == nullptr ? 0 : bytes; }
};

// A SwiGLU FFN: a routed expert, a shared expert or a dense MLP. The biases (gpt-oss experts) are
// optional: a Vec without a tensor is absent. A bias slice of a 2-D (n_expert, n) tensor is a
// Vec whose values the store fills at load.
struct ExpertWeights {
  Matrix gate;  // (n_ff, n_embd)
  Matrix up;    // (n_ff, n_embd)
  Matrix down;  // (n_embd, n_ff)
  Vec gate_bias, up_bias;  // (n_ff), optional
  Vec down_bias;           // (n_embd), optional
  // gpt-oss's clamped SwiGLU: (clamp(up, ±limit) + 1) * g * sigmoid(1.702 g), g = min(gate, limit);
  // 0 = plain SwiGLU silu(gate) * up.
  float swiglu_limit = 0.f;
  // HF gpt-oss layout: `gate` is the input-major (n_embd, 2 * n_ff) block of interleaved gate/up
  // columns (gate_bias the interleaved 2 * n_ff bias), `up` is empty, `down` is (n_ff, n_embd).
  bool input_major = false;
  bool present() const { return gate.tensor != nullptr; }
  uint64_t nbytes() const {
    uint64_t b = gate.nbytes() + up.nbytes() + down.nbytes();
    for (const Vec *v : {&gate_bias, &up_bias, &down_bias}) b += v->tensor ? v->nbytes() : 0;
    return b;
  }
};

struct LayerWeights {
  Vec attn_norm;                        // (n_embd)
  Matrix wq, wk, wv, wo;                // (q_dim, n_embd) (kv_dim, n_embd) x2 (n_embd, q_dim)
  Vec bq, bk, bv, bo;                   // optional biases of wq, wk, wv, wo
  Vec q_norm, k_norm;                   // (head_dim) Qwen3; (q_dim) / (kv_dim) OLMoE
  Vec sinks;                            // (n_head) attention sinks, gpt-oss
  // Multi-head latent attention (DeepSeek). wq is the single q projection when q_lora_rank is 0.
  Matrix wq_a;                          // (q_lora_rank, n_embd)
  Vec q_a_norm;                         // (q_lora_rank)
  Matrix wq_b;                          // (n_head * head_dim, q_lora_rank)
  Matrix wkv_a;                         // (kv_lora_rank + qk_rope_dim, n_embd)
  Vec kv_a_norm;                        // (kv_lora_rank)
  // Latent up-projections, either fused (HF kv_b_proj, GGUF attn_kv_b: per head qk_nope_dim key
  // rows then v_head_dim value rows) or split (GGUF attn_k_b, transposed, and attn_v_b).
  Matrix wkv_b;                         // (n_head * (qk_nope_dim + v_head_dim), kv_lora_rank)
  Matrix wk_b;                          // (n_head * kv_lora_rank, qk_nope_dim)
  Matrix wv_b;                          // (n_head * v_head_dim, kv_lora_rank)
  Vec ffn_norm;                         // (n_embd)
  Matrix router;                        // (n_expert, n_embd); absent on a dense layer
  Vec router_bias;                      // (n_expert) gpt-oss
  Vec expert_select_bias;               // (n_expert) DeepSeek-V3 e_score_correction_bias
  std::vector<ExpertWeights> experts;   // n_expert routed experts (none on a dense layer)
  ExpertWeights dense;                  // the dense MLP of a dense layer (resident)
  ExpertWeights shared;                 // shared expert(s), resident; absent when the family has none
  Matrix shared_gate;                   // (1, n_embd) Qwen2-MoE shared-expert gate
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

// How WeightStore::Load reads.
struct LoadOptions {
  int n_threads = 0;  // readers at once; 0 = one per core, at most kMaxLoadThreads
  int numa_node = -1; // the readers' memory node (the arena's pages are first touched there); -1 = any
  uint64_t piece_bytes = uint64_t{64} << 20;  // the most one read takes (tests make it small)
  // Called on the loading thread with the bytes read so far and the total: at most every
  // kLoadProgressSeconds while reading, and once with done == total when every byte is in.
  std::function<void(uint64_t done, uint64_t total)> progress;
  // Asked once with done == 0 before the first read, then after each progress call: false stops
  // the load (the readers finish the piece they hold) and Load fails with MOE_ERR_CANCELLED.
  std::function<bool(uint64_t done, uint64_t total)> keep_going;
  // The arena in transparent huge pages (AllocateLarge); unset = the STRATA_HUGEPAGES tunable.
  std::optional<bool> huge_pages;
};
inline constexpr int kMaxLoadThreads = 8;
inline constexpr double kLoadProgressSeconds = 0.1;

// Owns the resident bytes of the weights. Load reads every bound tensor once through the file layer
// (into one page-aligned arena, in huge pages where the host has them) and points the views at it.
// The tensors are read in pieces (64 MiB by default) by several threads at once: one thread's reads
// of a file in the page cache are bound by the copy out of the kernel's pages.
class WeightStore {
 public:
  WeightStore() = default;
  ~WeightStore();
  WeightStore(const WeightStore &) = delete;
  WeightStore &operator=(const WeightStore &) = delete;

  // With routed_experts false, the routed experts stay in the file (their views keep data ==
  // nullptr) for the expert cache to stream. A read that fails fails the load, naming its tensor
  // (the first tensor in file order among those that failed).
  absl::Status Load(const ModelFile &mf, ModelWeights &w, bool routed_experts = true, const LoadOptions &lo = {});
  uint64_t resident_bytes() const { return size_; }
  // The host arena every resident view points into (a device backend copies it whole).
  const uint8_t *arena() const { return arena_; }

 private:
  uint8_t *arena_ = nullptr;
  uint64_t size_ = 0;
};

}  // namespace strata::model
