// Hyper-parameters from GGUF metadata (llama.cpp's keys) and from HF config.json.
#include "lib/model/hparams.h"

#include <algorithm>
#include <cmath>

namespace strata::model {
namespace {

// Caps that keep every derived size far from overflow; real models sit well inside them.
constexpr int64_t kMaxLayers = 1024;
constexpr int64_t kMaxEmbd = 1 << 16;
constexpr int64_t kMaxHeads = 1024;
constexpr int64_t kMaxHeadDim = 1024;
constexpr int64_t kMaxVocab = 1 << 22;
constexpr int64_t kMaxExperts = 4096;
constexpr int64_t kMaxFf = 1 << 18;
constexpr int64_t kMaxCtx = 1 << 24;

absl::Status CheckRange(const char *key, int64_t v, int64_t lo, int64_t hi) {
  if (v < lo || v > hi) {
    return Errorf(MOE_ERR_FORMAT_HPARAMS, "hyper-parameter '%s' = %d is outside [%d, %d]", key, v, lo, hi);
  }
  return absl::OkStatus();
}

absl::Status Validate(HParams &hp) {
  STRATA_RETURN_IF_ERROR(CheckRange("block_count", hp.n_layer, 1, kMaxLayers));
  STRATA_RETURN_IF_ERROR(CheckRange("embedding_length", hp.n_embd, 1, kMaxEmbd));
  STRATA_RETURN_IF_ERROR(CheckRange("head_count", hp.n_head, 1, kMaxHeads));
  STRATA_RETURN_IF_ERROR(CheckRange("head_count_kv", hp.n_head_kv, 1, hp.n_head));
  if (hp.n_head % hp.n_head_kv != 0) {
    return Errorf(MOE_ERR_FORMAT_HPARAMS, "head_count %d is not a multiple of head_count_kv %d",
                  hp.n_head, hp.n_head_kv);
  }
  STRATA_RETURN_IF_ERROR(CheckRange("key_length", hp.head_dim, 2, kMaxHeadDim));
  if (hp.head_dim % 2 != 0) {
    return Errorf(MOE_ERR_FORMAT_HPARAMS, "head dimension %d is odd; RoPE needs pairs", hp.head_dim);
  }
  STRATA_RETURN_IF_ERROR(CheckRange("vocab_size", hp.n_vocab, 1, kMaxVocab));
  STRATA_RETURN_IF_ERROR(CheckRange("expert_count", hp.n_expert, 1, kMaxExperts));
  STRATA_RETURN_IF_ERROR(CheckRange("expert_used_count", hp.n_expert_used, 1, hp.n_expert));
  STRATA_RETURN_IF_ERROR(CheckRange("expert_feed_forward_length", hp.n_ff_expert, 1, kMaxFf));
  STRATA_RETURN_IF_ERROR(CheckRange("context_length", hp.n_ctx_train, 1, kMaxCtx));
  STRATA_RETURN_IF_ERROR(CheckRange("sliding_window", hp.sliding_window, 0, kMaxCtx));
  STRATA_RETURN_IF_ERROR(CheckRange("dense feed_forward_length", hp.n_ff_dense, hp.dense_layer.empty() ? 0 : 1, kMaxFf));
  STRATA_RETURN_IF_ERROR(CheckRange("expert_shared_feed_forward_length", hp.n_ff_shared, 0, kMaxFf));
  if (!hp.dense_layer.empty() && static_cast<int>(hp.dense_layer.size()) != hp.n_layer) {
    return Errorf(MOE_ERR_FORMAT_HPARAMS, "dense layer list has %d entries for %d layers", hp.dense_layer.size(),
                  hp.n_layer);
  }
  if (!hp.layer_window.empty() && static_cast<int>(hp.layer_window.size()) != hp.n_layer) {
    return Errorf(MOE_ERR_FORMAT_HPARAMS, "layer window list has %d entries for %d layers", hp.layer_window.size(),
                  hp.n_layer);
  }
  if (!(hp.rope_theta > 0.f) || !std::isfinite(hp.rope_theta)) {
    return Errorf(MOE_ERR_FORMAT_HPARAMS, "rope theta %g is not a positive finite number", hp.rope_theta);
  }
  if (!(hp.rms_eps > 0.f) || !(hp.rms_eps < 1.f)) {
    return Errorf(MOE_ERR_FORMAT_HPARAMS, "RMS norm epsilon %g is outside (0, 1)", hp.rms_eps);
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

absl::StatusOr<HParams> FromGguf(const ModelFile &mf) {
  const format::GgufFile &g = mf.gguf();
  STRATA_ASSIGN_OR_RETURN(std::string arch, g.GetString("general.architecture"));
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
    return Errorf(MOE_ERR_UNSUPPORTED_ARCH, "GGUF architecture '%s' is not supported", arch);
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
    if (st != "none") return Errorf(MOE_ERR_UNSUPPORTED, "RoPE scaling '%s' is not supported yet", st);
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
      if (mf.Find(absl::StrFormat("blk.%d.ffn_gate_inp.weight", l)) == nullptr &&
          mf.Find(absl::StrFormat("blk.%d.ffn_gate.weight", l)) != nullptr) {
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
  STRATA_RETURN_IF_ERROR(Validate(hp));
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

absl::StatusOr<HParams> FromConfig(const ModelFile &mf) {
  const nlohmann::json &c = mf.config();
  if (!c.is_object()) return Errorf(MOE_ERR_FORMAT_CONFIG, "config.json is not a JSON object");
  auto mt = c.find("model_type");
  if (mt == c.end() || !mt->is_string()) {
    return Errorf(MOE_ERR_FORMAT_CONFIG, "config.json has no string 'model_type'");
  }
  const std::string model_type = mt->get<std::string>();
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
    return Errorf(MOE_ERR_UNSUPPORTED_ARCH, "model_type '%s' is not supported", model_type);
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
      return Errorf(MOE_ERR_UNSUPPORTED, "RoPE scaling '%s' is not supported yet", rt->get<std::string>());
    }
  }
  if (auto it = c.find("hidden_act"); it != c.end() && (!it->is_string() || it->get<std::string>() != "silu")) {
    return Errorf(MOE_ERR_UNSUPPORTED, "hidden_act '%s' is not supported (only silu)", it->dump());
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
  STRATA_RETURN_IF_ERROR(Validate(hp));
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

absl::StatusOr<HParams> ReadHParams(const ModelFile &mf) {
  return mf.kind() == ModelFile::Kind::kGguf ? FromGguf(mf) : FromConfig(mf);
}

}  // namespace strata::model
