// Hyper-parameters from GGUF metadata (llama.cpp's keys) and from HF config.json.
#include "lib/util/str_format.h"
#include "lib/model/hparams.h"

#include <algorithm>
#include <cmath>
#include <string_view>

#include "lib/util/safe_text.h"

#include "lib/format/json.h"

namespace strata::model {
namespace {

// Limits on the hyper-parameters. Every integer is capped so that each size derived from them
// (a row, a matrix, a layer's experts, a session's KV) is computed in 64 bits far from overflow and
// later 32-bit loops can trust it; real models sit well inside each cap (DeepSeek-V3: 61 layers,
// width 7168, 256 experts; Qwen3-235B: 94 layers, 128 experts; vocabularies up to ~256k). Floats
// must be finite and inside ranges that no released model comes near, so an absurd value is
// refused instead of turning every logit into NaN.
constexpr int64_t kMaxLayers = 1024;
constexpr int64_t kMaxEmbd = 1 << 16;
constexpr int64_t kMaxHeads = 1024;
constexpr int64_t kMaxHeadDim = 1024;
constexpr int64_t kMaxVocab = 1 << 22;
constexpr int64_t kMaxExperts = 4096;
constexpr int64_t kMaxFf = 1 << 18;             // one expert's, the dense MLP's, the shared experts' width
constexpr int64_t kMaxCtx = 1 << 24;            // context lengths and sliding windows
constexpr int64_t kMaxRoutedParams = int64_t{1} << 44;  // layers x experts x 3 x n_ff x n_embd
constexpr double kMaxRopeTheta = 1e12;
constexpr double kMaxEps = 1e-2;                // norm epsilons: (0, kMaxEps]
constexpr double kMaxYarnFactor = 1024;         // context extension factor: [1, kMaxYarnFactor]
constexpr double kMaxYarnBeta = 1e4;            // beta_fast / beta_slow: (0, kMaxYarnBeta]
constexpr double kMaxYarnAttnFactor = 16;       // cos/sin (attention) factor: (0, kMaxYarnAttnFactor]
constexpr double kMaxMscale = 100;              // YaRN mscale, mscale_all_dim, 10 x log multiplier: [0, kMaxMscale]
constexpr double kMaxRoutedScale = 1000;        // routed_scaling_factor: (0, kMaxRoutedScale]
constexpr double kMaxSwigluLimit = 1e4;         // gpt-oss clamp: [0, kMaxSwigluLimit]

absl::Status CheckRange(std::string_view key, int64_t v, int64_t lo, int64_t hi) {
  if (v < lo || v > hi) {
    return Errorf(MOE_ERR_FORMAT_HPARAMS, "hyper-parameter '%s' = %d is outside [%d, %d]", key, v, lo, hi);
  }
  return absl::OkStatus();
}

// A float hyper-parameter: finite and in [lo, hi] ((lo, hi] when lo_open).
absl::Status CheckFloat(std::string_view key, double v, double lo, double hi, bool lo_open = false) {
  if (!std::isfinite(v) || v < lo || (lo_open && v == lo) || v > hi) {
    return Errorf(MOE_ERR_FORMAT_HPARAMS, "hyper-parameter '%s' = %g is not a finite number in %s%g, %g]", key, v,
                  lo_open ? "(" : "[", lo, hi);
  }
  return absl::OkStatus();
}

// A product of non-negative sizes in 64 bits, saturated at INT32_MAX for an int field (the
// validator then refuses it by its cap).
int SizeProduct(int64_t a, int64_t b) {
  if (a <= 0 || b <= 0) return 0;
  return a > INT32_MAX / b ? INT32_MAX : static_cast<int>(a * b);
}

// The one validator of a read HParams, whatever its source: every integer in range, every float
// finite and in range, the sizes derived from them checked in 64 bits. Messages name the key as
// the source spells it (GGUF "<arch>.<key>" suffix or config.json key) and the value.
absl::Status ValidateFamily(const HParams &hp, bool gguf);

absl::Status Validate(const HParams &hp, bool gguf) {
  STRATA_RETURN_IF_ERROR(ValidateFamily(hp, gguf));
  auto K = [gguf](const char *g, const char *h) { return std::string_view(gguf ? g : h); };
  STRATA_RETURN_IF_ERROR(CheckRange(K("block_count", "num_hidden_layers"), hp.n_layer, 1, kMaxLayers));
  STRATA_RETURN_IF_ERROR(CheckRange(K("embedding_length", "hidden_size"), hp.n_embd, 1, kMaxEmbd));
  STRATA_RETURN_IF_ERROR(CheckRange(K("attention.head_count", "num_attention_heads"), hp.n_head, 1, kMaxHeads));
  STRATA_RETURN_IF_ERROR(
      CheckRange(K("attention.head_count_kv", "num_key_value_heads"), hp.n_head_kv, 1, hp.n_head));
  if (hp.n_head % hp.n_head_kv != 0) {
    return Errorf(MOE_ERR_FORMAT_HPARAMS, "head_count %d is not a multiple of head_count_kv %d",
                  hp.n_head, hp.n_head_kv);
  }
  STRATA_RETURN_IF_ERROR(CheckRange(K("attention.key_length", "head_dim"), hp.head_dim, 2, kMaxHeadDim));
  if (hp.head_dim % 2 != 0) {
    return Errorf(MOE_ERR_FORMAT_HPARAMS, "head dimension %d is odd; RoPE needs pairs", hp.head_dim);
  }
  STRATA_RETURN_IF_ERROR(CheckRange("vocab_size", hp.n_vocab, 1, kMaxVocab));
  STRATA_RETURN_IF_ERROR(CheckRange(K("expert_count", "num_experts"), hp.n_expert, 1, kMaxExperts));
  STRATA_RETURN_IF_ERROR(CheckRange(K("expert_used_count", "num_experts_per_tok"), hp.n_expert_used, 1, hp.n_expert));
  STRATA_RETURN_IF_ERROR(
      CheckRange(K("expert_feed_forward_length", "moe_intermediate_size"), hp.n_ff_expert, 1, kMaxFf));
  STRATA_RETURN_IF_ERROR(
      CheckRange(K("context_length", "max_position_embeddings"), hp.n_ctx_train, 1, kMaxCtx));
  STRATA_RETURN_IF_ERROR(CheckRange(K("attention.sliding_window", "sliding_window"), hp.sliding_window, 0, kMaxCtx));
  for (int w : hp.layer_window) {
    STRATA_RETURN_IF_ERROR(CheckRange(K("attention.sliding_window", "sliding_window"), w, 0, kMaxCtx));
  }
  STRATA_RETURN_IF_ERROR(CheckRange(K("feed_forward_length", "intermediate_size"), hp.n_ff_dense,
                                    hp.dense_layer.empty() ? 0 : 1, kMaxFf));
  STRATA_RETURN_IF_ERROR(CheckRange(K("expert_shared_count", "n_shared_experts"), hp.n_shared_experts, 0, kMaxExperts));
  STRATA_RETURN_IF_ERROR(CheckRange(K("expert_shared_feed_forward_length", "shared_expert_intermediate_size"),
                                    hp.n_ff_shared, 0, kMaxFf));
  if (hp.n_shared_experts > 0 && int64_t{hp.n_shared_experts} * hp.n_ff_expert != hp.n_ff_shared) {
    return Errorf(MOE_ERR_FORMAT_HPARAMS, "%d shared experts of width %d make a width of %d, more than %d",
                  hp.n_shared_experts, hp.n_ff_expert, int64_t{hp.n_shared_experts} * hp.n_ff_expert, kMaxFf);
  }
  if (!hp.dense_layer.empty() && static_cast<int>(hp.dense_layer.size()) != hp.n_layer) {
    return Errorf(MOE_ERR_FORMAT_HPARAMS, "dense layer list has %d entries for %d layers", hp.dense_layer.size(),
                  hp.n_layer);
  }
  if (!hp.layer_window.empty() && static_cast<int>(hp.layer_window.size()) != hp.n_layer) {
    return Errorf(MOE_ERR_FORMAT_HPARAMS, "layer window list has %d entries for %d layers", hp.layer_window.size(),
                  hp.n_layer);
  }
  // The routed experts' parameter count, in 64 bits (each factor is capped above).
  const int64_t routed = int64_t{hp.n_layer} * hp.n_expert * 3 * hp.n_ff_expert * hp.n_embd;
  if (routed > kMaxRoutedParams) {
    return Errorf(MOE_ERR_FORMAT_HPARAMS, "%d layers x %d experts of %d x %d make %d routed parameters, more than %d",
                  hp.n_layer, hp.n_expert, hp.n_ff_expert, hp.n_embd, routed, kMaxRoutedParams);
  }
  STRATA_RETURN_IF_ERROR(CheckFloat(K("rope.freq_base", "rope_theta"), hp.rope_theta, 0, kMaxRopeTheta, true));
  STRATA_RETURN_IF_ERROR(
      CheckFloat(K("attention.layer_norm_rms_epsilon", "rms_norm_eps"), hp.rms_eps, 0, kMaxEps, true));
  STRATA_RETURN_IF_ERROR(CheckFloat("lora norm epsilon", hp.lora_norm_eps, 0, kMaxEps, true));
  STRATA_RETURN_IF_ERROR(CheckFloat("swiglu_limit", hp.swiglu_limit, 0, kMaxSwigluLimit));
  STRATA_RETURN_IF_ERROR(
      CheckFloat(K("expert_weights_scale", "routed_scaling_factor"), hp.routed_scale, 0, kMaxRoutedScale, true));
  if (hp.yarn) {
    STRATA_RETURN_IF_ERROR(
        CheckFloat(K("rope.scaling.factor", "rope_parameters.factor"), hp.yarn_factor, 1, kMaxYarnFactor));
    STRATA_RETURN_IF_ERROR(CheckRange(K("rope.scaling.original_context_length", "original_max_position_embeddings"),
                                      hp.yarn_orig_ctx, 1, kMaxCtx));
    STRATA_RETURN_IF_ERROR(CheckFloat(K("rope.scaling.yarn_beta_fast", "rope_parameters.beta_fast"),
                                      hp.yarn_beta_fast, 0, kMaxYarnBeta, true));
    STRATA_RETURN_IF_ERROR(CheckFloat(K("rope.scaling.yarn_beta_slow", "rope_parameters.beta_slow"),
                                      hp.yarn_beta_slow, 0, kMaxYarnBeta, true));
    STRATA_RETURN_IF_ERROR(CheckFloat(K("rope.scaling.attn_factor", "rope_parameters.attention_factor"),
                                      hp.yarn_attn_factor, 0, kMaxYarnAttnFactor, true));
  }
  // 0 = 1/sqrt(head dim); else derived from the head width and YaRN's mscale, each checked.
  STRATA_RETURN_IF_ERROR(CheckFloat("attention scale", hp.attn_scale, 0, 1e3));
  return absl::OkStatus();
}

// Checks of the MLA and grouped-routing fields (DeepSeek).
absl::Status ValidateFamily(const HParams &hp, bool gguf) {
  auto K = [gguf](const char *g, const char *h) { return std::string_view(gguf ? g : h); };
  if (hp.mla) {
    STRATA_RETURN_IF_ERROR(CheckRange(K("attention.kv_lora_rank", "kv_lora_rank"), hp.kv_lora_rank, 1, kMaxEmbd));
    STRATA_RETURN_IF_ERROR(CheckRange(K("attention.q_lora_rank", "q_lora_rank"), hp.q_lora_rank, 0, kMaxEmbd));
    STRATA_RETURN_IF_ERROR(CheckRange("qk_rope_head_dim", hp.qk_rope_dim, 2, kMaxHeadDim));
    STRATA_RETURN_IF_ERROR(CheckRange("qk_nope_head_dim", hp.qk_nope_dim, 0, kMaxHeadDim));
    STRATA_RETURN_IF_ERROR(CheckRange("v_head_dim", hp.v_head_dim, 1, kMaxHeadDim));
    if (hp.qk_rope_dim % 2 != 0) {
      return Errorf(MOE_ERR_FORMAT_HPARAMS, "qk_rope_head_dim %d is odd; RoPE needs pairs", hp.qk_rope_dim);
    }
  }
  STRATA_RETURN_IF_ERROR(CheckRange(K("expert_group_count", "n_group"), hp.n_group, 1, std::max(1, hp.n_expert)));
  STRATA_RETURN_IF_ERROR(CheckRange(K("expert_group_used_count", "topk_group"), hp.topk_group, 1, hp.n_group));
  if (hp.n_expert % hp.n_group != 0) {
    return Errorf(MOE_ERR_FORMAT_HPARAMS, "expert_count %d is not a multiple of expert_group_count %d", hp.n_expert,
                  hp.n_group);
  }
  if (hp.n_group > 1 && hp.n_expert_used > hp.topk_group * (hp.n_expert / hp.n_group)) {
    return Errorf(MOE_ERR_FORMAT_HPARAMS, "expert_used_count %d exceeds the experts of the %d selected groups",
                  hp.n_expert_used, hp.topk_group);
  }
  if (hp.n_group > 1 && hp.gating == Gating::kSigmoid && hp.n_expert / hp.n_group < 2) {
    return Errorf(MOE_ERR_FORMAT_HPARAMS, "grouped sigmoid routing needs at least 2 experts per group");
  }
  return absl::OkStatus();
}

// Each tensor of a layer names a layer the hyper-parameters declare: a file with more layers
// than it says would run with some ignored. (Too few are caught by binding: a missing tensor.)
// HF checkpoints may add num_nextn_predict_layers multi-token-prediction layers, which Strata
// does not run.
absl::Status CheckLayerTensors(const ModelFile &mf, const HParams &hp) {
  const bool gguf = mf.kind() == ModelFile::Kind::kGguf;
  const std::string_view prefix = gguf ? "blk." : "model.layers.";
  int64_t extra = 0;
  if (!gguf) {
    if (auto it = mf.config().find("num_nextn_predict_layers"); it != mf.config().end() && it->is_number_integer()) {
      extra = std::clamp<int64_t>(it->get<int64_t>(), 0, kMaxLayers);
    }
  }
  for (const TensorRef &t : mf.tensors()) {
    std::string_view n = t.name;
    if (n.substr(0, prefix.size()) != prefix) continue;
    n.remove_prefix(prefix.size());
    int64_t layer = 0;
    size_t d = 0;
    for (; d < n.size() && d < 10 && n[d] >= '0' && n[d] <= '9'; ++d) layer = layer * 10 + (n[d] - '0');
    if (d == 0) continue;
    if (layer >= hp.n_layer + extra) {
      return Errorf(MOE_ERR_FORMAT_TENSOR, "tensor '%s' is for layer %d, but the model declares %d layers (%s)",
                    SafeText(t.name, 256), layer, hp.n_layer, gguf ? "block_count" : "num_hidden_layers");
    }
  }
  return absl::OkStatus();
}

// ---- GGUF ----------------------------------------------------------------------------------

absl::StatusOr<int64_t> GgufInt(const format::GgufFile &g, const std::string &key) {
  STRATA_ASSIGN_OR_RETURN(uint64_t v, g.GetUint(key));
  if (v > static_cast<uint64_t>(INT32_MAX)) {
    return Errorf(MOE_ERR_FORMAT_HPARAMS, "hyper-parameter '%s' = %u is too large", key, v);
  }
  return static_cast<int64_t>(v);
}

absl::StatusOr<int64_t> GgufIntOr(const format::GgufFile &g, const std::string &key, int64_t dflt) {
  if (g.Find(key) == nullptr) return dflt;
  return GgufInt(g, key);
}

// YaRN factor / window from "<arch>.rope.scaling.*"; nothing when the type is absent or "none".
absl::Status GgufYarn(const format::GgufFile &g, const std::string &p, HParams &hp) {
  if (g.Find(p + "rope.scaling.type") == nullptr) return absl::OkStatus();
  STRATA_ASSIGN_OR_RETURN(std::string st, g.GetString(p + "rope.scaling.type"));
  if (st == "none") return absl::OkStatus();
  if (st != "yarn") return Errorf(MOE_ERR_UNSUPPORTED, "RoPE scaling '%s' is not supported yet", SafeText(st, 256));
  STRATA_ASSIGN_OR_RETURN(double f, g.GetFloat(p + "rope.scaling.factor"));
  STRATA_ASSIGN_OR_RETURN(int64_t orig, GgufInt(g, p + "rope.scaling.original_context_length"));
  if (!(f >= 1.0) || !std::isfinite(f) || orig < 1) {
    return Errorf(MOE_ERR_FORMAT_HPARAMS, "YaRN scaling factor %g / original context %d is out of range", f, orig);
  }
  hp.yarn = f > 1.0;
  hp.yarn_factor = static_cast<float>(f);
  hp.yarn_orig_ctx = static_cast<int>(orig);
  if (g.Find(p + "rope.scaling.yarn_beta_fast") != nullptr) {
    STRATA_ASSIGN_OR_RETURN(double b, g.GetFloat(p + "rope.scaling.yarn_beta_fast"));
    hp.yarn_beta_fast = static_cast<float>(b);
  }
  if (g.Find(p + "rope.scaling.yarn_beta_slow") != nullptr) {
    STRATA_ASSIGN_OR_RETURN(double b, g.GetFloat(p + "rope.scaling.yarn_beta_slow"));
    hp.yarn_beta_slow = static_cast<float>(b);
  }
  return absl::OkStatus();
}

// DeepSeek-V2/V3 (`deepseek2`, multi-head latent attention) and gpt-oss, as llama.cpp's converter
// writes them.
absl::StatusOr<HParams> FromGgufFamily(const ModelFile &mf, const std::string &arch) {
  const format::GgufFile &g = mf.gguf();
  HParams hp;
  hp.arch = arch == "deepseek2" ? Arch::kDeepseek2 : Arch::kGptOss;
  hp.arch_name = std::string(ArchName(hp.arch));
  const std::string p = arch + ".";
  int64_t v;
  STRATA_ASSIGN_OR_RETURN(v, GgufInt(g, p + "block_count")); hp.n_layer = static_cast<int>(v);
  STRATA_ASSIGN_OR_RETURN(v, GgufInt(g, p + "embedding_length")); hp.n_embd = static_cast<int>(v);
  STRATA_ASSIGN_OR_RETURN(v, GgufInt(g, p + "attention.head_count")); hp.n_head = static_cast<int>(v);
  STRATA_ASSIGN_OR_RETURN(v, GgufInt(g, p + "expert_count")); hp.n_expert = static_cast<int>(v);
  STRATA_ASSIGN_OR_RETURN(v, GgufInt(g, p + "expert_used_count")); hp.n_expert_used = static_cast<int>(v);
  STRATA_ASSIGN_OR_RETURN(v, GgufInt(g, p + "expert_feed_forward_length")); hp.n_ff_expert = static_cast<int>(v);
  STRATA_ASSIGN_OR_RETURN(v, GgufIntOr(g, p + "context_length", 4096)); hp.n_ctx_train = static_cast<int>(v);
  if (g.Find(p + "rope.freq_base") != nullptr) {
    STRATA_ASSIGN_OR_RETURN(double th, g.GetFloat(p + "rope.freq_base"));
    hp.rope_theta = static_cast<float>(th);
  }
  STRATA_ASSIGN_OR_RETURN(double eps, g.GetFloat(p + "attention.layer_norm_rms_epsilon"));
  hp.rms_eps = static_cast<float>(eps);
  STRATA_RETURN_IF_ERROR(GgufYarn(g, p, hp));
  STRATA_RETURN_IF_ERROR(CheckRange("block_count", hp.n_layer, 1, kMaxLayers));
  if (hp.arch == Arch::kDeepseek2) {
    hp.mla = true;
    hp.rope_style = RopeStyle::kNormal;  // the converter keeps DeepSeek's interleaved pairs
    hp.n_head_kv = hp.n_head;            // the file's head_count_kv (1) describes the latent MQA form
    hp.lora_norm_eps = hp.rms_eps;       // llama.cpp normalises the latents with the model's epsilon
    STRATA_ASSIGN_OR_RETURN(v, GgufIntOr(g, p + "attention.q_lora_rank", 0)); hp.q_lora_rank = static_cast<int>(v);
    STRATA_ASSIGN_OR_RETURN(v, GgufInt(g, p + "attention.kv_lora_rank")); hp.kv_lora_rank = static_cast<int>(v);
    STRATA_ASSIGN_OR_RETURN(v, GgufInt(g, p + "rope.dimension_count")); hp.qk_rope_dim = static_cast<int>(v);
    // Newer converters describe the latent form in key/value_length and the per-head widths in
    // the *_mla keys; older ones wrote the per-head widths as key/value_length.
    const bool mla_keys = g.Find(p + "attention.key_length_mla") != nullptr;
    STRATA_ASSIGN_OR_RETURN(v, GgufInt(g, p + (mla_keys ? "attention.key_length_mla" : "attention.key_length")));
    hp.head_dim = static_cast<int>(v);
    STRATA_ASSIGN_OR_RETURN(v, GgufInt(g, p + (mla_keys ? "attention.value_length_mla" : "attention.value_length")));
    hp.v_head_dim = static_cast<int>(v);
    hp.qk_nope_dim = hp.head_dim - hp.qk_rope_dim;
    STRATA_ASSIGN_OR_RETURN(v, GgufIntOr(g, p + "expert_shared_count", 0)); hp.n_shared_experts = static_cast<int>(v);
    hp.n_ff_shared = SizeProduct(hp.n_shared_experts, hp.n_ff_expert);
    STRATA_ASSIGN_OR_RETURN(int64_t lead, GgufIntOr(g, p + "leading_dense_block_count", 0));
    STRATA_RETURN_IF_ERROR(CheckRange("leading_dense_block_count", lead, 0, hp.n_layer));
    if (lead > 0) {
      hp.dense_layer.assign(hp.n_layer, 0);
      for (int l = 0; l < lead; ++l) hp.dense_layer[l] = 1;
      STRATA_ASSIGN_OR_RETURN(v, GgufInt(g, p + "feed_forward_length")); hp.n_ff_dense = static_cast<int>(v);
    }
    if (g.Find(p + "expert_weights_scale") != nullptr) {
      STRATA_ASSIGN_OR_RETURN(double sc, g.GetFloat(p + "expert_weights_scale"));
      hp.routed_scale = static_cast<float>(sc);
    }
    hp.norm_topk_prob = false;
    if (g.Find(p + "expert_weights_norm") != nullptr) {
      STRATA_ASSIGN_OR_RETURN(hp.norm_topk_prob, g.GetBool(p + "expert_weights_norm"));
    }
    STRATA_ASSIGN_OR_RETURN(int64_t gating, GgufIntOr(g, p + "expert_gating_func", 1));
    if (gating != 1 && gating != 2) {
      return Errorf(MOE_ERR_UNSUPPORTED, "%sexpert_gating_func %d is not supported (1 softmax, 2 sigmoid)", p, gating);
    }
    hp.gating = gating == 2 ? Gating::kSigmoid : Gating::kSoftmax;
    STRATA_ASSIGN_OR_RETURN(v, GgufIntOr(g, p + "expert_group_count", 1)); hp.n_group = static_cast<int>(v);
    STRATA_ASSIGN_OR_RETURN(v, GgufIntOr(g, p + "expert_group_used_count", hp.n_group));
    hp.topk_group = static_cast<int>(v);
    hp.expert_select_bias = mf.Find(strata::StrFormat("blk.%d.exp_probs_b.bias", hp.n_layer - 1)) != nullptr;
    // Attention scale: 1/sqrt(key head width), times YaRN's mscale^2 (0.1 * mscale_all_dim is
    // stored as yarn_log_multiplier); cos/sin keep their unit scale.
    double scale = 1.0 / std::sqrt(static_cast<double>(hp.head_dim));
    if (hp.yarn && g.Find(p + "rope.scaling.yarn_log_multiplier") != nullptr) {
      STRATA_ASSIGN_OR_RETURN(double lm, g.GetFloat(p + "rope.scaling.yarn_log_multiplier"));
      STRATA_RETURN_IF_ERROR(CheckFloat(p + "rope.scaling.yarn_log_multiplier", lm, 0, 0.1 * kMaxMscale));
      const double m = 1.0 + lm * std::log(static_cast<double>(hp.yarn_factor));
      scale *= m * m;
    }
    hp.attn_scale = static_cast<float>(scale);
    hp.yarn_attn_factor = 1.f;
  } else {
    hp.rope_style = RopeStyle::kNeox;
    STRATA_ASSIGN_OR_RETURN(v, GgufIntOr(g, p + "attention.head_count_kv", hp.n_head)); hp.n_head_kv = static_cast<int>(v);
    STRATA_ASSIGN_OR_RETURN(v, GgufIntOr(g, p + "attention.key_length", hp.n_head ? hp.n_embd / hp.n_head : 0));
    hp.head_dim = static_cast<int>(v);
    STRATA_ASSIGN_OR_RETURN(int64_t vlen, GgufIntOr(g, p + "attention.value_length", hp.head_dim));
    if (vlen != hp.head_dim) {
      return Errorf(MOE_ERR_UNSUPPORTED, "value_length %d differs from key_length %d", vlen, hp.head_dim);
    }
    hp.attn_bias = hp.attn_out_bias = hp.attn_sinks = hp.expert_bias = true;
    hp.gating = Gating::kSoftmaxSelected;
    hp.swiglu_limit = 7.0f;  // llama.cpp hard-codes gpt-oss's clamp (alpha 1.702, limit 7)
    STRATA_ASSIGN_OR_RETURN(v, GgufIntOr(g, p + "attention.sliding_window", 0));
    // Sliding-window attention on the even layers, full attention on the odd ones.
    hp.layer_window.assign(hp.n_layer, 0);
    for (int l = 0; l < hp.n_layer; l += 2) hp.layer_window[l] = static_cast<int>(v);
    // YaRN as gpt-oss applies it: cos/sin scaled by 0.1 ln(factor) + 1, no truncation of the ramp.
    hp.yarn_truncate = false;
    if (hp.yarn) hp.yarn_attn_factor = 0.1f * std::log(hp.yarn_factor) + 1.f;
  }
  const TensorRef *emb = mf.Find("token_embd.weight");
  if (emb == nullptr) return Errorf(MOE_ERR_FORMAT_TENSOR, "missing tensor 'token_embd.weight'");
  if (emb->ne[1] > kMaxVocab) {
    return Errorf(MOE_ERR_FORMAT_HPARAMS, "token_embd.weight has %d rows, more than %d", emb->ne[1], kMaxVocab);
  }
  hp.n_vocab = static_cast<int>(emb->ne[1]);
  if (g.Find(p + "vocab_size") != nullptr) {
    STRATA_ASSIGN_OR_RETURN(v, GgufInt(g, p + "vocab_size"));
    if (v != hp.n_vocab) {
      return Errorf(MOE_ERR_FORMAT_HPARAMS, "%svocab_size = %d but token_embd.weight has %d rows", p, v, hp.n_vocab);
    }
  }
  hp.tied_embeddings = mf.Find("output.weight") == nullptr;
  STRATA_RETURN_IF_ERROR(Validate(hp, /*gguf=*/true));
  return hp;
}

absl::StatusOr<HParams> FromGguf(const ModelFile &mf) {
  const format::GgufFile &g = mf.gguf();
  STRATA_ASSIGN_OR_RETURN(std::string arch, g.GetString("general.architecture"));
  if (arch == "deepseek2" || arch == "gpt-oss") return FromGgufFamily(mf, arch);
  HParams hp;
  if (arch == "qwen3moe") {
    hp.arch = Arch::kQwen3Moe;
    hp.qk_norm = true;
    hp.rope_style = RopeStyle::kNeox;
  } else if (arch == "olmoe") {
    hp.arch = Arch::kOlmoe;
    hp.qk_norm = hp.qk_norm_full = true;
    hp.rope_style = RopeStyle::kNeox;
  } else if (arch == "qwen2moe") {
    hp.arch = Arch::kQwen2Moe;
    hp.rope_style = RopeStyle::kNeox;
  } else if (arch == "llama") {
    hp.arch = Arch::kMixtral;
    hp.rope_style = RopeStyle::kNormal;
    if (g.Find("llama.expert_count") == nullptr) {
      return Errorf(MOE_ERR_UNSUPPORTED_ARCH,
                    "GGUF architecture 'llama' without llama.expert_count is a dense model; Strata runs "
                    "Mixture-of-Experts models");
    }
  } else {
    return Errorf(MOE_ERR_UNSUPPORTED_ARCH, "GGUF architecture '%s' is not supported", SafeText(arch, 256));
  }
  hp.arch_name = std::string(ArchName(hp.arch));
  const std::string p = arch + ".";
  int64_t v;
  STRATA_ASSIGN_OR_RETURN(v, GgufInt(g, p + "block_count")); hp.n_layer = static_cast<int>(v);
  STRATA_ASSIGN_OR_RETURN(v, GgufInt(g, p + "embedding_length")); hp.n_embd = static_cast<int>(v);
  STRATA_ASSIGN_OR_RETURN(v, GgufInt(g, p + "attention.head_count")); hp.n_head = static_cast<int>(v);
  STRATA_ASSIGN_OR_RETURN(v, GgufIntOr(g, p + "attention.head_count_kv", hp.n_head));
  hp.n_head_kv = static_cast<int>(v);
  int64_t default_head_dim = hp.n_head > 0 ? hp.n_embd / hp.n_head : 0;
  STRATA_ASSIGN_OR_RETURN(v, GgufIntOr(g, p + "attention.key_length", default_head_dim));
  hp.head_dim = static_cast<int>(v);
  STRATA_ASSIGN_OR_RETURN(int64_t vlen, GgufIntOr(g, p + "attention.value_length", hp.head_dim));
  if (vlen != hp.head_dim) {
    return Errorf(MOE_ERR_UNSUPPORTED, "value_length %d differs from key_length %d", vlen, hp.head_dim);
  }
  if (hp.arch == Arch::kMixtral) {
    STRATA_ASSIGN_OR_RETURN(int64_t rot, GgufIntOr(g, p + "rope.dimension_count", hp.head_dim));
    if (rot != hp.head_dim) {
      return Errorf(MOE_ERR_UNSUPPORTED, "partial RoPE (rope.dimension_count %d of head dimension %d)",
                    rot, hp.head_dim);
    }
  }
  STRATA_ASSIGN_OR_RETURN(v, GgufInt(g, p + "expert_count")); hp.n_expert = static_cast<int>(v);
  STRATA_ASSIGN_OR_RETURN(v, GgufInt(g, p + "expert_used_count")); hp.n_expert_used = static_cast<int>(v);
  if (hp.arch == Arch::kQwen3Moe || hp.arch == Arch::kQwen2Moe) {
    STRATA_ASSIGN_OR_RETURN(v, GgufInt(g, p + "expert_feed_forward_length"));
  } else if (hp.arch == Arch::kOlmoe && g.Find(p + "expert_feed_forward_length") != nullptr) {
    STRATA_ASSIGN_OR_RETURN(v, GgufInt(g, p + "expert_feed_forward_length"));
  } else {
    STRATA_ASSIGN_OR_RETURN(v, GgufInt(g, p + "feed_forward_length"));
  }
  hp.n_ff_expert = static_cast<int>(v);
  if (hp.arch == Arch::kQwen2Moe) {
    // Shared expert (with its sigmoid gate) on every MoE layer; layers without a router are dense.
    STRATA_ASSIGN_OR_RETURN(v, GgufIntOr(g, p + "expert_shared_feed_forward_length", 0));
    hp.n_ff_shared = static_cast<int>(v);
    hp.shared_expert_gate = hp.n_ff_shared > 0;
    hp.attn_bias = mf.Find("blk.0.attn_q.bias") != nullptr;
  }
  if (hp.arch == Arch::kOlmoe) hp.attn_bias = hp.attn_out_bias = mf.Find("blk.0.attn_q.bias") != nullptr;
  STRATA_ASSIGN_OR_RETURN(v, GgufIntOr(g, p + "context_length", 4096)); hp.n_ctx_train = static_cast<int>(v);
  if (g.Find(p + "rope.freq_base") != nullptr) {
    STRATA_ASSIGN_OR_RETURN(double th, g.GetFloat(p + "rope.freq_base"));
    hp.rope_theta = static_cast<float>(th);
  }
  STRATA_ASSIGN_OR_RETURN(double eps, g.GetFloat(p + "attention.layer_norm_rms_epsilon"));
  hp.rms_eps = static_cast<float>(eps);
  if (g.Find(p + "expert_weights_norm") != nullptr) {
    STRATA_ASSIGN_OR_RETURN(hp.norm_topk_prob, g.GetBool(p + "expert_weights_norm"));
  } else {
    // llama.cpp renormalises for qwen3moe and llama (Mixtral), not for olmoe and qwen2moe
    hp.norm_topk_prob = hp.arch == Arch::kQwen3Moe || hp.arch == Arch::kMixtral;
  }
  if (g.Find(p + "attention.sliding_window") != nullptr) {
    STRATA_ASSIGN_OR_RETURN(v, GgufInt(g, p + "attention.sliding_window"));
    hp.sliding_window = static_cast<int>(v);
  }
  if (g.Find(p + "rope.scaling.type") != nullptr) {
    STRATA_ASSIGN_OR_RETURN(std::string st, g.GetString(p + "rope.scaling.type"));
    if (st != "none") return Errorf(MOE_ERR_UNSUPPORTED, "RoPE scaling '%s' is not supported yet", SafeText(st, 256));
  }
  // The vocabulary is the embedding's row count; a vocab_size key, when present, must agree.
  const TensorRef *emb = mf.Find("token_embd.weight");
  if (emb == nullptr) return Errorf(MOE_ERR_FORMAT_TENSOR, "missing tensor 'token_embd.weight'");
  if (emb->ne[1] > kMaxVocab) {
    return Errorf(MOE_ERR_FORMAT_HPARAMS, "token_embd.weight has %d rows, more than %d", emb->ne[1], kMaxVocab);
  }
  hp.n_vocab = static_cast<int>(emb->ne[1]);
  if (g.Find(p + "vocab_size") != nullptr) {
    STRATA_ASSIGN_OR_RETURN(v, GgufInt(g, p + "vocab_size"));
    if (v != hp.n_vocab) {
      return Errorf(MOE_ERR_FORMAT_HPARAMS, "%svocab_size = %d but token_embd.weight has %d rows", p, v,
                    hp.n_vocab);
    }
  }
  hp.tied_embeddings = mf.Find("output.weight") == nullptr;
  STRATA_RETURN_IF_ERROR(CheckRange("block_count", hp.n_layer, 1, kMaxLayers));
  if (hp.arch == Arch::kQwen2Moe) {
    // Dense MLP layers (mlp_only_layers / decoder_sparse_step of the checkpoint) have no router.
    hp.dense_layer.assign(hp.n_layer, 0);
    bool any = false;
    for (int l = 0; l < hp.n_layer; ++l) {
      if (mf.Find(strata::StrFormat("blk.%d.ffn_gate_inp.weight", l)) == nullptr &&
          mf.Find(strata::StrFormat("blk.%d.ffn_gate.weight", l)) != nullptr) {
        hp.dense_layer[l] = 1;
        any = true;
      }
    }
    if (any) {
      STRATA_ASSIGN_OR_RETURN(v, GgufInt(g, p + "feed_forward_length"));
      hp.n_ff_dense = static_cast<int>(v);
    } else {
      hp.dense_layer.clear();
    }
  }
  STRATA_RETURN_IF_ERROR(Validate(hp, /*gguf=*/true));
  return hp;
}

// ---- HF config.json --------------------------------------------------------------------------

absl::StatusOr<int64_t> JsonInt(const nlohmann::json &c, const char *key) {
  auto it = c.find(key);
  if (it == c.end() || it->is_null()) {
    return Errorf(MOE_ERR_FORMAT_HPARAMS, "config.json has no '%s'", key);
  }
  if (!it->is_number_integer() || it->get<int64_t>() < 0 || it->get<int64_t>() > INT32_MAX) {
    return Errorf(MOE_ERR_FORMAT_HPARAMS, "config.json '%s' is not a non-negative 32-bit integer", key);
  }
  return it->get<int64_t>();
}

absl::StatusOr<int64_t> JsonIntOr(const nlohmann::json &c, const char *key, int64_t dflt) {
  auto it = c.find(key);
  if (it == c.end() || it->is_null()) return dflt;
  return JsonInt(c, key);
}

absl::StatusOr<double> JsonFloat(const nlohmann::json &c, const char *key) {
  auto it = c.find(key);
  if (it == c.end() || !it->is_number()) {
    return Errorf(MOE_ERR_FORMAT_HPARAMS, "config.json has no numeric '%s'", key);
  }
  return it->get<double>();
}

absl::StatusOr<bool> JsonBoolOr(const nlohmann::json &c, const char *key, bool dflt) {
  auto it = c.find(key);
  if (it == c.end() || it->is_null()) return dflt;
  if (!it->is_boolean()) return Errorf(MOE_ERR_FORMAT_HPARAMS, "config.json '%s' is not a boolean", key);
  return it->get<bool>();
}

absl::StatusOr<double> JsonFloatOr(const nlohmann::json &c, const char *key, double dflt) {
  auto it = c.find(key);
  if (it == c.end() || it->is_null()) return dflt;
  if (!it->is_number()) return Errorf(MOE_ERR_FORMAT_HPARAMS, "config.json '%s' is not a number", key);
  return it->get<double>();
}

// transformers' YaRN magnitude correction: 0.1 * m * ln(factor) + 1 above factor 1.
double YarnMscale(double factor, double m) { return factor <= 1.0 ? 1.0 : 0.1 * m * std::log(factor) + 1.0; }

// RoPE parameters of the issue-7 families: rope_theta and, for rope_type "yarn", the frequency
// blend and the cos/sin factor as transformers computes them. Returns mscale_all_dim (0 if unset).
absl::StatusOr<double> ConfigRope(const nlohmann::json &c, HParams &hp) {
  const nlohmann::json *rp = nullptr;
  if (auto it = c.find("rope_parameters"); it != c.end() && it->is_object()) rp = &*it;
  if (auto it = c.find("rope_scaling"); rp == nullptr && it != c.end() && it->is_object()) rp = &*it;
  if (rp != nullptr && rp->contains("rope_theta")) {
    STRATA_ASSIGN_OR_RETURN(double th, JsonFloat(*rp, "rope_theta"));
    hp.rope_theta = static_cast<float>(th);
  } else {
    STRATA_ASSIGN_OR_RETURN(double th, JsonFloat(c, "rope_theta"));
    hp.rope_theta = static_cast<float>(th);
  }
  if (rp == nullptr) return 0.0;
  std::string type = "default";
  for (const char *k : {"rope_type", "type"}) {
    if (auto it = rp->find(k); it != rp->end() && it->is_string()) type = it->get<std::string>();
  }
  if (type == "default") return 0.0;
  if (type != "yarn") return Errorf(MOE_ERR_UNSUPPORTED, "RoPE scaling '%s' is not supported yet", SafeText(type, 256));
  STRATA_ASSIGN_OR_RETURN(double factor, JsonFloat(*rp, "factor"));
  STRATA_ASSIGN_OR_RETURN(int64_t orig, JsonInt(*rp, "original_max_position_embeddings"));
  STRATA_ASSIGN_OR_RETURN(double bf, JsonFloatOr(*rp, "beta_fast", 32.0));
  STRATA_ASSIGN_OR_RETURN(double bs, JsonFloatOr(*rp, "beta_slow", 1.0));
  STRATA_ASSIGN_OR_RETURN(double mscale, JsonFloatOr(*rp, "mscale", 0.0));
  STRATA_ASSIGN_OR_RETURN(double mscale_all, JsonFloatOr(*rp, "mscale_all_dim", 0.0));
  STRATA_ASSIGN_OR_RETURN(bool truncate, JsonBoolOr(*rp, "truncate", true));
  STRATA_RETURN_IF_ERROR(CheckFloat("rope_parameters.mscale", mscale, 0, kMaxMscale));
  STRATA_RETURN_IF_ERROR(CheckFloat("rope_parameters.mscale_all_dim", mscale_all, 0, kMaxMscale));
  if (!(factor >= 1.0) || !std::isfinite(factor)) {
    return Errorf(MOE_ERR_FORMAT_HPARAMS, "YaRN factor %g is out of range", factor);
  }
  hp.yarn = factor > 1.0;
  hp.yarn_factor = static_cast<float>(factor);
  hp.yarn_orig_ctx = static_cast<int>(orig);
  hp.yarn_beta_fast = static_cast<float>(bf == 0.0 ? 32.0 : bf);
  hp.yarn_beta_slow = static_cast<float>(bs == 0.0 ? 1.0 : bs);
  hp.yarn_truncate = truncate;
  double attn_factor;
  if (auto it = rp->find("attention_factor"); it != rp->end() && it->is_number()) {
    attn_factor = it->get<double>();
  } else if (mscale != 0.0 && mscale_all != 0.0) {
    attn_factor = YarnMscale(factor, mscale) / YarnMscale(factor, mscale_all);
  } else {
    attn_factor = YarnMscale(factor, 1.0);
  }
  hp.yarn_attn_factor = static_cast<float>(attn_factor);
  return mscale_all;
}

// DeepSeek-V2/V3 and gpt-oss checkpoints.
absl::StatusOr<HParams> FromConfigFamily(const nlohmann::json &c, const std::string &model_type) {
  HParams hp;
  hp.arch = model_type == "gpt_oss" ? Arch::kGptOss : Arch::kDeepseek2;
  hp.arch_name = std::string(ArchName(hp.arch));
  int64_t v;
  STRATA_ASSIGN_OR_RETURN(v, JsonInt(c, "num_hidden_layers")); hp.n_layer = static_cast<int>(v);
  STRATA_ASSIGN_OR_RETURN(v, JsonInt(c, "hidden_size")); hp.n_embd = static_cast<int>(v);
  STRATA_ASSIGN_OR_RETURN(v, JsonInt(c, "num_attention_heads")); hp.n_head = static_cast<int>(v);
  STRATA_ASSIGN_OR_RETURN(v, JsonInt(c, "vocab_size")); hp.n_vocab = static_cast<int>(v);
  STRATA_ASSIGN_OR_RETURN(v, JsonInt(c, "num_experts_per_tok")); hp.n_expert_used = static_cast<int>(v);
  STRATA_ASSIGN_OR_RETURN(v, JsonIntOr(c, "max_position_embeddings", 4096)); hp.n_ctx_train = static_cast<int>(v);
  STRATA_ASSIGN_OR_RETURN(double eps, JsonFloat(c, "rms_norm_eps"));
  hp.rms_eps = static_cast<float>(eps);
  STRATA_ASSIGN_OR_RETURN(hp.tied_embeddings, JsonBoolOr(c, "tie_word_embeddings", false));
  STRATA_ASSIGN_OR_RETURN(double mscale_all, ConfigRope(c, hp));
  STRATA_RETURN_IF_ERROR(CheckRange("num_hidden_layers", hp.n_layer, 1, kMaxLayers));
  STRATA_ASSIGN_OR_RETURN(bool attn_bias, JsonBoolOr(c, "attention_bias", hp.arch == Arch::kGptOss));
  int64_t n_expert = -1;
  for (const char *k : {"n_routed_experts", "num_local_experts", "num_experts"}) {
    if (c.contains(k) && !c[k].is_null()) {
      STRATA_ASSIGN_OR_RETURN(n_expert, JsonInt(c, k));
      break;
    }
  }
  if (n_expert < 0) return Errorf(MOE_ERR_FORMAT_HPARAMS, "config.json has no 'n_routed_experts'");
  hp.n_expert = static_cast<int>(n_expert);
  if (hp.arch == Arch::kDeepseek2) {
    if (attn_bias) return Errorf(MOE_ERR_UNSUPPORTED, "%s with attention_bias is not supported yet", model_type);
    STRATA_ASSIGN_OR_RETURN(bool mlp_bias, JsonBoolOr(c, "mlp_bias", false));
    if (mlp_bias) return Errorf(MOE_ERR_UNSUPPORTED, "%s with mlp_bias is not supported yet", model_type);
    if (auto it = c.find("hidden_act"); it != c.end() && (!it->is_string() || it->get<std::string>() != "silu")) {
      return Errorf(MOE_ERR_UNSUPPORTED, "hidden_act %s is not supported (only silu)", format::JsonExcerpt(*it));
    }
    hp.mla = true;
    STRATA_ASSIGN_OR_RETURN(v, JsonIntOr(c, "q_lora_rank", 0)); hp.q_lora_rank = static_cast<int>(v);
    STRATA_ASSIGN_OR_RETURN(v, JsonInt(c, "kv_lora_rank")); hp.kv_lora_rank = static_cast<int>(v);
    STRATA_ASSIGN_OR_RETURN(v, JsonInt(c, "qk_nope_head_dim")); hp.qk_nope_dim = static_cast<int>(v);
    STRATA_ASSIGN_OR_RETURN(v, JsonInt(c, "qk_rope_head_dim")); hp.qk_rope_dim = static_cast<int>(v);
    STRATA_ASSIGN_OR_RETURN(v, JsonInt(c, "v_head_dim")); hp.v_head_dim = static_cast<int>(v);
    hp.head_dim = hp.qk_nope_dim + hp.qk_rope_dim;
    hp.n_head_kv = hp.n_head;
    STRATA_ASSIGN_OR_RETURN(v, JsonInt(c, "moe_intermediate_size")); hp.n_ff_expert = static_cast<int>(v);
    STRATA_ASSIGN_OR_RETURN(v, JsonIntOr(c, "n_shared_experts", 0)); hp.n_shared_experts = static_cast<int>(v);
    hp.n_ff_shared = SizeProduct(hp.n_shared_experts, hp.n_ff_expert);
    STRATA_ASSIGN_OR_RETURN(int64_t lead, JsonIntOr(c, "first_k_dense_replace", 0));
    if (lead > 0) {
      hp.dense_layer.assign(hp.n_layer, 0);
      for (int l = 0; l < std::min<int64_t>(lead, hp.n_layer); ++l) hp.dense_layer[l] = 1;
      STRATA_ASSIGN_OR_RETURN(v, JsonInt(c, "intermediate_size")); hp.n_ff_dense = static_cast<int>(v);
    }
    STRATA_ASSIGN_OR_RETURN(double rs, JsonFloatOr(c, "routed_scaling_factor", 1.0));
    hp.routed_scale = static_cast<float>(rs);
    STRATA_ASSIGN_OR_RETURN(v, JsonIntOr(c, "n_group", 1)); hp.n_group = static_cast<int>(v);
    STRATA_ASSIGN_OR_RETURN(v, JsonIntOr(c, "topk_group", hp.n_group)); hp.topk_group = static_cast<int>(v);
    if (model_type == "deepseek_v3") {
      // Sigmoid scores, e_score_correction_bias in the selection, top-2-sum group ranking.
      hp.gating = Gating::kSigmoid;
      hp.expert_select_bias = true;
      STRATA_ASSIGN_OR_RETURN(hp.norm_topk_prob, JsonBoolOr(c, "norm_topk_prob", true));
      STRATA_ASSIGN_OR_RETURN(bool interleave, JsonBoolOr(c, "rope_interleave", true));
      hp.rope_style = interleave ? RopeStyle::kNormal : RopeStyle::kNeox;
    } else {
      // transformers' DeepSeek-V2 router: softmax, greedy or group-limited (group max) top-k, no
      // renormalisation.
      hp.gating = Gating::kSoftmax;
      hp.norm_topk_prob = false;
      hp.rope_style = RopeStyle::kNormal;
      std::string method = "greedy";
      if (auto it = c.find("topk_method"); it != c.end() && it->is_string()) method = it->get<std::string>();
      if (method == "greedy") {
        hp.n_group = hp.topk_group = 1;
      } else if (method != "group_limited_greedy") {
        return Errorf(MOE_ERR_UNSUPPORTED, "deepseek_v2 topk_method '%s' is not supported", SafeText(method, 256));
      }
    }
    double scale = 1.0 / std::sqrt(static_cast<double>(hp.head_dim));
    if (hp.yarn && mscale_all != 0.0) {
      const double m = YarnMscale(hp.yarn_factor, mscale_all);
      scale *= m * m;
    }
    hp.attn_scale = static_cast<float>(scale);
  } else {
    STRATA_ASSIGN_OR_RETURN(v, JsonIntOr(c, "num_key_value_heads", hp.n_head)); hp.n_head_kv = static_cast<int>(v);
    STRATA_ASSIGN_OR_RETURN(v, JsonIntOr(c, "head_dim", hp.n_head > 0 ? hp.n_embd / hp.n_head : 0));
    hp.head_dim = static_cast<int>(v);
    STRATA_ASSIGN_OR_RETURN(v, JsonInt(c, "intermediate_size")); hp.n_ff_expert = static_cast<int>(v);
    hp.rope_style = RopeStyle::kNeox;
    hp.attn_bias = hp.attn_out_bias = attn_bias;
    hp.attn_sinks = hp.expert_bias = true;
    hp.gating = Gating::kSoftmaxSelected;
    STRATA_ASSIGN_OR_RETURN(double limit, JsonFloatOr(c, "swiglu_limit", 7.0));
    STRATA_ASSIGN_OR_RETURN(double alpha, JsonFloatOr(c, "swiglu_alpha", 1.702));
    if (std::fabs(alpha - 1.702) > 1e-6 || !(limit > 0.0)) {
      return Errorf(MOE_ERR_UNSUPPORTED, "gpt_oss SwiGLU alpha %g / limit %g is not supported (1.702, > 0)", alpha,
                    limit);
    }
    hp.swiglu_limit = static_cast<float>(limit);
    STRATA_ASSIGN_OR_RETURN(v, JsonIntOr(c, "sliding_window", 0));
    const int window = static_cast<int>(v);
    hp.layer_window.assign(hp.n_layer, 0);
    auto lt = c.find("layer_types");
    if (lt != c.end() && lt->is_array()) {
      if (static_cast<int>(lt->size()) != hp.n_layer) {
        return Errorf(MOE_ERR_FORMAT_HPARAMS, "layer_types has %d entries for %d layers", lt->size(), hp.n_layer);
      }
      for (int l = 0; l < hp.n_layer; ++l) {
        const auto &t = (*lt)[l];
        if (!t.is_string()) return Errorf(MOE_ERR_FORMAT_HPARAMS, "layer_types[%d] is not a string", l);
        if (t.get<std::string>() == "sliding_attention") {
          hp.layer_window[l] = window;
        } else if (t.get<std::string>() != "full_attention") {
          return Errorf(MOE_ERR_UNSUPPORTED, "layer type '%s' is not supported", SafeText(t.get<std::string>(), 256));
        }
      }
    } else {
      for (int l = 0; l < hp.n_layer; l += 2) hp.layer_window[l] = window;
    }
  }
  STRATA_RETURN_IF_ERROR(Validate(hp, /*gguf=*/false));
  return hp;
}

absl::StatusOr<HParams> FromConfig(const nlohmann::json &c) {
  if (!c.is_object()) return Errorf(MOE_ERR_FORMAT_CONFIG, "config.json is not a JSON object");
  auto mt = c.find("model_type");
  if (mt == c.end() || !mt->is_string()) {
    return Errorf(MOE_ERR_FORMAT_CONFIG, "config.json has no string 'model_type'");
  }
  const std::string model_type = mt->get<std::string>();
  if (model_type == "deepseek_v2" || model_type == "deepseek_v3" || model_type == "gpt_oss") {
    return FromConfigFamily(c, model_type);
  }
  HParams hp;
  if (model_type == "qwen3_moe") {
    hp.arch = Arch::kQwen3Moe;
    hp.qk_norm = true;
  } else if (model_type == "olmoe") {
    hp.arch = Arch::kOlmoe;
    hp.qk_norm = hp.qk_norm_full = true;
  } else if (model_type == "qwen2_moe") {
    hp.arch = Arch::kQwen2Moe;
  } else if (model_type == "mixtral") {
    hp.arch = Arch::kMixtral;
  } else {
    return Errorf(MOE_ERR_UNSUPPORTED_ARCH, "model_type '%s' is not supported", SafeText(model_type, 256));
  }
  hp.arch_name = std::string(ArchName(hp.arch));
  hp.rope_style = RopeStyle::kNeox;  // HF checkpoints keep Q/K rows in rotate-half order
  int64_t v;
  STRATA_ASSIGN_OR_RETURN(v, JsonInt(c, "num_hidden_layers")); hp.n_layer = static_cast<int>(v);
  STRATA_ASSIGN_OR_RETURN(v, JsonInt(c, "hidden_size")); hp.n_embd = static_cast<int>(v);
  STRATA_ASSIGN_OR_RETURN(v, JsonInt(c, "num_attention_heads")); hp.n_head = static_cast<int>(v);
  STRATA_ASSIGN_OR_RETURN(v, JsonIntOr(c, "num_key_value_heads", hp.n_head)); hp.n_head_kv = static_cast<int>(v);
  STRATA_ASSIGN_OR_RETURN(v, JsonIntOr(c, "head_dim", hp.n_head > 0 ? hp.n_embd / hp.n_head : 0));
  hp.head_dim = static_cast<int>(v);
  STRATA_ASSIGN_OR_RETURN(v, JsonInt(c, "vocab_size")); hp.n_vocab = static_cast<int>(v);
  if (c.contains("num_experts") && !c["num_experts"].is_null()) {
    STRATA_ASSIGN_OR_RETURN(v, JsonInt(c, "num_experts"));
  } else {
    STRATA_ASSIGN_OR_RETURN(v, JsonInt(c, "num_local_experts"));
  }
  hp.n_expert = static_cast<int>(v);
  STRATA_ASSIGN_OR_RETURN(v, JsonInt(c, "num_experts_per_tok")); hp.n_expert_used = static_cast<int>(v);
  const bool moe_width_key = hp.arch == Arch::kQwen3Moe || hp.arch == Arch::kQwen2Moe;
  STRATA_ASSIGN_OR_RETURN(v, JsonInt(c, moe_width_key ? "moe_intermediate_size" : "intermediate_size"));
  hp.n_ff_expert = static_cast<int>(v);
  STRATA_ASSIGN_OR_RETURN(v, JsonIntOr(c, "max_position_embeddings", 4096)); hp.n_ctx_train = static_cast<int>(v);
  STRATA_ASSIGN_OR_RETURN(v, JsonIntOr(c, "sliding_window", 0)); hp.sliding_window = static_cast<int>(v);
  if (hp.arch == Arch::kQwen3Moe || hp.arch == Arch::kQwen2Moe) {
    STRATA_ASSIGN_OR_RETURN(bool use_sw, JsonBoolOr(c, "use_sliding_window", false));
    if (!use_sw) hp.sliding_window = 0;
    if (use_sw && hp.arch == Arch::kQwen2Moe) {
      return Errorf(MOE_ERR_UNSUPPORTED, "qwen2_moe with use_sliding_window is not supported yet");
    }
  }
  if (hp.arch == Arch::kOlmoe) hp.sliding_window = 0;
  STRATA_ASSIGN_OR_RETURN(double eps, JsonFloat(c, "rms_norm_eps"));
  hp.rms_eps = static_cast<float>(eps);

  // RoPE: top-level rope_theta (older configs) or rope_parameters {rope_theta, rope_type}.
  const nlohmann::json *rope_params = nullptr;
  if (auto it = c.find("rope_parameters"); it != c.end() && it->is_object()) rope_params = &*it;
  if (rope_params != nullptr && rope_params->contains("rope_theta")) {
    STRATA_ASSIGN_OR_RETURN(double th, JsonFloat(*rope_params, "rope_theta"));
    hp.rope_theta = static_cast<float>(th);
  } else if (c.contains("rope_theta")) {
    STRATA_ASSIGN_OR_RETURN(double th, JsonFloat(c, "rope_theta"));
    hp.rope_theta = static_cast<float>(th);
  } else {
    return Errorf(MOE_ERR_FORMAT_HPARAMS, "config.json has neither 'rope_theta' nor 'rope_parameters.rope_theta'");
  }
  const nlohmann::json *scaling = rope_params;
  if (auto it = c.find("rope_scaling"); it != c.end() && it->is_object()) scaling = &*it;
  if (scaling != nullptr) {
    auto rt = scaling->find("rope_type");
    if (rt == scaling->end()) rt = scaling->find("type");
    if (rt != scaling->end() && rt->is_string() && rt->get<std::string>() != "default") {
      return Errorf(MOE_ERR_UNSUPPORTED, "RoPE scaling '%s' is not supported yet", SafeText(rt->get<std::string>(), 256));
    }
  }
  if (auto it = c.find("hidden_act"); it != c.end() && (!it->is_string() || it->get<std::string>() != "silu")) {
    return Errorf(MOE_ERR_UNSUPPORTED, "hidden_act %s is not supported (only silu)", format::JsonExcerpt(*it));
  }
  STRATA_ASSIGN_OR_RETURN(bool attn_bias, JsonBoolOr(c, "attention_bias", false));
  if (hp.arch == Arch::kOlmoe) {
    hp.attn_bias = hp.attn_out_bias = attn_bias;  // OLMoE's attention_bias covers q, k, v and o
    STRATA_ASSIGN_OR_RETURN(hp.norm_topk_prob, JsonBoolOr(c, "norm_topk_prob", false));
    if (auto it = c.find("clip_qkv"); it != c.end() && !it->is_null()) {
      return Errorf(MOE_ERR_UNSUPPORTED, "olmoe with clip_qkv is not supported yet");
    }
    // transformers sizes k_norm as (hidden_size / num_attention_heads) * num_key_value_heads
    if (hp.n_head > 0 && hp.head_dim != hp.n_embd / hp.n_head) {
      return Errorf(MOE_ERR_UNSUPPORTED, "olmoe with head_dim %d != hidden_size / heads", hp.head_dim);
    }
  } else if (hp.arch == Arch::kQwen2Moe) {
    // Older transformers hard-code q/k/v biases for Qwen2-MoE; newer ones read qkv_bias.
    STRATA_ASSIGN_OR_RETURN(hp.attn_bias, JsonBoolOr(c, "qkv_bias", true));
    STRATA_ASSIGN_OR_RETURN(hp.norm_topk_prob, JsonBoolOr(c, "norm_topk_prob", false));
    STRATA_ASSIGN_OR_RETURN(v, JsonInt(c, "shared_expert_intermediate_size"));
    hp.n_ff_shared = static_cast<int>(v);
    hp.shared_expert_gate = hp.n_ff_shared > 0;
    STRATA_ASSIGN_OR_RETURN(v, JsonInt(c, "intermediate_size"));
    hp.n_ff_dense = static_cast<int>(v);
    STRATA_ASSIGN_OR_RETURN(int64_t step, JsonIntOr(c, "decoder_sparse_step", 1));
    if (step < 1) return Errorf(MOE_ERR_FORMAT_HPARAMS, "decoder_sparse_step %d is below 1", step);
    STRATA_RETURN_IF_ERROR(CheckRange("num_hidden_layers", hp.n_layer, 1, kMaxLayers));
    hp.dense_layer.assign(hp.n_layer, 0);
    for (int l = 0; l < hp.n_layer; ++l) hp.dense_layer[l] = (l + 1) % step != 0;
    if (auto it = c.find("mlp_only_layers"); it != c.end() && it->is_array()) {
      for (const auto &e : *it) {
        if (!e.is_number_integer()) return Errorf(MOE_ERR_FORMAT_HPARAMS, "mlp_only_layers holds a non-integer");
        const int64_t l = e.get<int64_t>();
        if (l >= 0 && l < hp.n_layer) hp.dense_layer[l] = 1;
      }
    }
    if (std::find(hp.dense_layer.begin(), hp.dense_layer.end(), 1) == hp.dense_layer.end()) hp.dense_layer.clear();
  } else if (attn_bias) {
    return Errorf(MOE_ERR_UNSUPPORTED, "attention_bias is not supported for %s", model_type);
  }
  if (hp.arch == Arch::kOlmoe || hp.arch == Arch::kQwen2Moe) {
    // handled above
  } else if (hp.arch == Arch::kQwen3Moe) {
    STRATA_ASSIGN_OR_RETURN(hp.norm_topk_prob, JsonBoolOr(c, "norm_topk_prob", false));
    STRATA_ASSIGN_OR_RETURN(int64_t step, JsonIntOr(c, "decoder_sparse_step", 1));
    auto mlp_only = c.find("mlp_only_layers");
    bool has_dense = mlp_only != c.end() && mlp_only->is_array() && !mlp_only->empty();
    if (step != 1 || has_dense) {
      return Errorf(MOE_ERR_UNSUPPORTED, "qwen3_moe with dense MLP layers (decoder_sparse_step %d, "
                    "mlp_only_layers) is not supported yet", step);
    }
  } else {
    hp.norm_topk_prob = true;  // Mixtral always renormalises its top-k weights
  }
  STRATA_ASSIGN_OR_RETURN(hp.tied_embeddings, JsonBoolOr(c, "tie_word_embeddings", false));
  STRATA_RETURN_IF_ERROR(Validate(hp, /*gguf=*/false));
  return hp;
}

}  // namespace

std::string_view ArchName(Arch a) {
  switch (a) {
    case Arch::kQwen3Moe: return "qwen3moe";
    case Arch::kMixtral: return "mixtral";
    case Arch::kOlmoe: return "olmoe";
    case Arch::kQwen2Moe: return "qwen2moe";
    case Arch::kGptOss: return "gpt-oss";
    case Arch::kDeepseek2: return "deepseek2";
  }
  return "unknown";
}

absl::StatusOr<HParams> HParamsFromConfig(const nlohmann::json &config) { return FromConfig(config); }

absl::StatusOr<HParams> ReadHParams(const ModelFile &mf) {
  STRATA_ASSIGN_OR_RETURN(HParams hp, mf.kind() == ModelFile::Kind::kGguf ? FromGguf(mf) : FromConfig(mf.config()));
  STRATA_RETURN_IF_ERROR(CheckLayerTensors(mf, hp));
  return hp;
}

}  // namespace strata::model
