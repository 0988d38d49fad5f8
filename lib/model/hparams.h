// Hyper-parameters of a supported MoE architecture, read from GGUF metadata or an HF config.json
// (both spellings in use: rope_theta / rope_parameters, num_experts / num_local_experts), with
// ranges checked so later loops and allocations can trust them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "lib/model/model_file.h"
#include "lib/util/status.h"

namespace strata::model {

enum class Arch { kQwen3Moe, kMixtral, kOlmoe, kQwen2Moe, kGptOss, kDeepseek2 };

// How router logits become expert weights. kSoftmax: softmax over all experts, top-k, optional
// renormalisation. kSoftmaxSelected: top-k of the logits, softmax over those k (gpt-oss).
// kSigmoid: sigmoid scores; the selection (not the weights) adds a per-expert bias and may be
// limited to the best groups (DeepSeek-V3).
enum class Gating { kSoftmax, kSoftmaxSelected, kSigmoid };

// How RoPE pairs the dimensions of a head: kNormal rotates (x[2i], x[2i+1]) (GGUF llama, whose Q/K
// rows the converter permuted); kNeox rotates (x[i], x[i + d/2]) (HF checkpoints, GGUF qwen3moe).
enum class RopeStyle { kNormal, kNeox };

struct HParams {
  Arch arch = Arch::kQwen3Moe;
  std::string arch_name;   // "qwen3moe", "mixtral"
  int n_layer = 0;
  int n_embd = 0;
  int n_head = 0;
  int n_head_kv = 0;
  int head_dim = 0;
  int n_vocab = 0;
  int n_expert = 0;
  int n_expert_used = 0;
  int n_ff_expert = 0;
  int n_ctx_train = 0;
  int sliding_window = 0;   // 0 = full attention
  float rope_theta = 10000.f;
  float rms_eps = 1e-6f;
  bool norm_topk_prob = true;
  bool qk_norm = false;
  bool tied_embeddings = false;
  RopeStyle rope_style = RopeStyle::kNeox;

  // --- family features (all off for qwen3moe / mixtral) ---
  bool qk_norm_full = false;     // OLMoE: q_norm over q_dim, k_norm over kv_dim (not per head)
  bool attn_bias = false;        // q/k/v projection biases
  bool attn_out_bias = false;    // output projection bias
  bool attn_sinks = false;       // one learned sink logit per head (gpt-oss)
  std::vector<int> layer_window; // per-layer sliding window (0 = full); empty: sliding_window for all
  int n_ff_dense = 0;            // width of the dense MLP layers
  std::vector<uint8_t> dense_layer;  // per layer: 1 = dense MLP instead of routed experts
  int n_ff_shared = 0;           // total width of the always-resident shared expert(s); 0 = none
  bool shared_expert_gate = false;   // Qwen2-MoE: sigmoid(gate · x) scales the shared expert
  Gating gating = Gating::kSoftmax;
  float routed_scale = 1.f;      // routed_scaling_factor applied to the routed weights
  int n_group = 1, topk_group = 1;   // group-limited selection (DeepSeek)
  bool expert_select_bias = false;   // DeepSeek-V3 e_score_correction_bias (selection only)
  bool expert_bias = false;      // router and expert biases (gpt-oss)
  float swiglu_limit = 0.f;      // gpt-oss clamped SwiGLU (alpha 1.702); 0 = plain SwiGLU
  // YaRN RoPE (yarn_factor > 1): frequencies blended between interpolation and extrapolation;
  // cos/sin scaled by yarn_attn_factor; attention scores scaled by attn_scale when nonzero.
  bool yarn = false;
  float yarn_factor = 1.f, yarn_attn_factor = 1.f, yarn_beta_fast = 32.f, yarn_beta_slow = 1.f;
  int yarn_orig_ctx = 0;
  bool yarn_truncate = true;
  float attn_scale = 0.f;        // 0 = 1/sqrt(key head dimension)
  // Multi-head latent attention (DeepSeek-V2/V3). The cache holds kv_lora_rank + qk_rope_dim
  // floats per token and layer. head_dim is the query/key head width qk_nope_dim + qk_rope_dim;
  // q_lora_rank 0 = one q projection (V2-Lite). RoPE rotates only the last qk_rope_dim of a head.
  bool mla = false;
  int q_lora_rank = 0, kv_lora_rank = 0, qk_nope_dim = 0, qk_rope_dim = 0, v_head_dim = 0;
  int n_shared_experts = 0;      // DeepSeek n_shared_experts (n_ff_shared = this * n_ff_expert)
  float lora_norm_eps = 1e-6f;   // epsilon of q_a / kv_a norms (transformers: fixed 1e-6; GGUF: rms_eps)

  int q_dim() const { return n_head * head_dim; }
  int rope_dim() const { return mla ? qk_rope_dim : head_dim; }
  int kv_dim() const { return n_head_kv * head_dim; }
  bool is_dense(int l) const { return !dense_layer.empty() && dense_layer[l] != 0; }
  int window(int l) const { return layer_window.empty() ? sliding_window : layer_window[l]; }
};

// Reads and range-checks the hyper-parameters. MOE_ERR_UNSUPPORTED_ARCH for an architecture Strata
// does not run; MOE_ERR_FORMAT_HPARAMS (naming the key) for a missing or out-of-range value.
absl::StatusOr<HParams> ReadHParams(const ModelFile &mf);

// The hyper-parameters an HF config.json declares, range-checked as ReadHParams does, but without
// the checks against the checkpoint's tensors (the config alone, as the fuzz target drives it).
absl::StatusOr<HParams> HParamsFromConfig(const nlohmann::json &config);

std::string_view ArchName(Arch a);

}  // namespace strata::model
