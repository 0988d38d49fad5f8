// Hyper-parameters of a supported MoE architecture, read from GGUF metadata or an HF config.json
// (both spellings in use: rope_theta / rope_parameters, num_experts / num_local_experts), with
// ranges checked so later loops and allocations can trust them.
#pragma once

#include <cstdint>
#include <string>

#include "lib/model/model_file.h"
#include "lib/util/status.h"

namespace strata::model {

enum class Arch { kQwen3Moe, kMixtral };

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

  int q_dim() const { return n_head * head_dim; }
  int kv_dim() const { return n_head_kv * head_dim; }
};

// Reads and range-checks the hyper-parameters. MOE_ERR_UNSUPPORTED_ARCH for an architecture Strata
// does not run; MOE_ERR_FORMAT_HPARAMS (naming the key) for a missing or out-of-range value.
absl::StatusOr<HParams> ReadHParams(const ModelFile &mf);

std::string_view ArchName(Arch a);

}  // namespace strata::model
