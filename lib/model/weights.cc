// Weight binding for GGUF (llama.cpp names, 3-D or per-expert tensors) and HF checkpoints (per-expert
// tensors, or fused 3-D gate_up/down tensors), and the loader of resident bytes.
#include "lib/util/str_format.h"
#include "lib/util/hash_containers.h"
#include "lib/model/weights.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <system_error>
#include <thread>

#include "lib/util/large_alloc.h"
#include "lib/util/numa.h"

namespace strata::model {
namespace {

std::string Shape(const TensorRef &t) {
  std::string s = "[";
  for (int d = 0; d < t.n_dims; ++d) absl::StrAppend(&s, d ? ", " : "", t.ne[d]);
  return s + "]";
}

absl::StatusOr<const TensorRef *> Require(const ModelFile &mf, const std::string &name) {
  const TensorRef *t = mf.Find(name);
  if (t == nullptr) return Errorf(MOE_ERR_FORMAT_TENSOR, "missing tensor '%s'", name);
  return t;
}

absl::StatusOr<const quant::Codec *> CodecOf(const TensorRef &t) {
  const quant::Codec *c = quant::FindCodec(t.type);
  if (c == nullptr || c->dequantize == nullptr) {
    return Errorf(MOE_ERR_UNSUPPORTED_TYPE, "tensor '%s' has type %s, which Strata cannot decode", t.name,
                  std::string(quant::TypeName(t.type)));
  }
  return c;
}

// Checks that tensor t has exactly the dims `want` (GGUF order, innermost first).
absl::Status CheckDims(const TensorRef &t, std::initializer_list<int64_t> want) {
  bool ok = static_cast<int>(want.size()) == t.n_dims;
  int d = 0;
  for (int64_t w : want) {
    if (!ok) break;
    ok = t.ne[d++] == w;
  }
  if (!ok) {
    std::string exp = "[";
    d = 0;
    for (int64_t w : want) absl::StrAppend(&exp, d++ ? ", " : "", w);
    exp += "]";
    return Errorf(MOE_ERR_FORMAT_HPARAMS,
                  "tensor '%s' has shape %s but the hyper-parameters need %s (innermost first)", t.name,
                  Shape(t), exp);
  }
  return absl::OkStatus();
}

absl::StatusOr<Matrix> BindMatrix(const ModelFile &mf, const std::string &name, int64_t rows, int64_t cols) {
  STRATA_ASSIGN_OR_RETURN(const TensorRef *t, Require(mf, name));
  STRATA_RETURN_IF_ERROR(CheckDims(*t, {cols, rows}));
  Matrix m;
  m.name = name;
  m.tensor = t;
  STRATA_ASSIGN_OR_RETURN(m.codec, CodecOf(*t));
  m.cols = cols;
  m.rows = rows;
  STRATA_ASSIGN_OR_RETURN(m.row_bytes, quant::RowBytes(t->type, cols));
  return m;
}

absl::StatusOr<Vec> BindVec(const ModelFile &mf, const std::string &name, int64_t n) {
  STRATA_ASSIGN_OR_RETURN(const TensorRef *t, Require(mf, name));
  STRATA_RETURN_IF_ERROR(CheckDims(*t, {n}));
  Vec v;
  v.name = name;
  v.tensor = t;
  STRATA_ASSIGN_OR_RETURN(v.codec, CodecOf(*t));
  STRATA_ASSIGN_OR_RETURN(v.bytes, quant::RowBytes(t->type, n));
  v.n = n;
  return v;
}

// A SwiGLU FFN from three 2-D tensors (a dense MLP or a shared expert).
absl::StatusOr<ExpertWeights> BindFfn(const ModelFile &mf, const std::string &gate, const std::string &up,
                                      const std::string &down, int64_t n_ff, int64_t n_embd) {
  ExpertWeights f;
  STRATA_ASSIGN_OR_RETURN(f.gate, BindMatrix(mf, gate, n_ff, n_embd));
  STRATA_ASSIGN_OR_RETURN(f.up, BindMatrix(mf, up, n_ff, n_embd));
  STRATA_ASSIGN_OR_RETURN(f.down, BindMatrix(mf, down, n_embd, n_ff));
  return f;
}

// A one-row matrix stored either 2-D (n_embd, 1) or 1-D (n_embd) (llama.cpp accepts both).
absl::StatusOr<Matrix> BindRow(const ModelFile &mf, const std::string &name, int64_t cols) {
  STRATA_ASSIGN_OR_RETURN(const TensorRef *t, Require(mf, name));
  if (t->n_dims == 1 && t->ne[0] == cols) {
    Matrix m;
    m.name = name;
    m.tensor = t;
    STRATA_ASSIGN_OR_RETURN(m.codec, CodecOf(*t));
    m.cols = cols;
    m.rows = 1;
    STRATA_ASSIGN_OR_RETURN(m.row_bytes, quant::RowBytes(t->type, cols));
    return m;
  }
  return BindMatrix(mf, name, 1, cols);
}

// A 3-D tensor (cols, rows, n) read as one matrix of n * rows rows (per-head latent projections).
absl::StatusOr<Matrix> BindMatrix3(const ModelFile &mf, const std::string &name, int64_t n, int64_t rows,
                                   int64_t cols) {
  STRATA_ASSIGN_OR_RETURN(const TensorRef *t, Require(mf, name));
  STRATA_RETURN_IF_ERROR(CheckDims(*t, {cols, rows, n}));
  Matrix m;
  m.name = name;
  m.tensor = t;
  STRATA_ASSIGN_OR_RETURN(m.codec, CodecOf(*t));
  m.cols = cols;
  m.rows = n * rows;
  STRATA_ASSIGN_OR_RETURN(m.row_bytes, quant::RowBytes(t->type, cols));
  return m;
}

// Multi-head latent attention of one layer. `n` maps a llama.cpp tensor base name (attn_q_a, ...)
// to the file's name. The latent up-projection is fused (kv_b) or split (k_b + v_b).
absl::Status BindMla(const ModelFile &mf, const HParams &hp, const std::function<std::string(const char *)> &n,
                     LayerWeights &L) {
  const int64_t D = hp.n_embd, H = hp.n_head, QK = hp.head_dim, R = hp.kv_lora_rank;
  if (hp.q_lora_rank > 0) {
    STRATA_ASSIGN_OR_RETURN(L.wq_a, BindMatrix(mf, n("attn_q_a"), hp.q_lora_rank, D));
    STRATA_ASSIGN_OR_RETURN(L.q_a_norm, BindVec(mf, n("attn_q_a_norm"), hp.q_lora_rank));
    STRATA_ASSIGN_OR_RETURN(L.wq_b, BindMatrix(mf, n("attn_q_b"), H * QK, hp.q_lora_rank));
  } else {
    STRATA_ASSIGN_OR_RETURN(L.wq, BindMatrix(mf, n("attn_q"), H * QK, D));
  }
  STRATA_ASSIGN_OR_RETURN(L.wkv_a, BindMatrix(mf, n("attn_kv_a_mqa"), R + hp.qk_rope_dim, D));
  STRATA_ASSIGN_OR_RETURN(L.kv_a_norm, BindVec(mf, n("attn_kv_a_norm"), R));
  if (mf.Find(n("attn_kv_b")) != nullptr || mf.Find(n("attn_k_b")) == nullptr) {
    STRATA_ASSIGN_OR_RETURN(L.wkv_b, BindMatrix(mf, n("attn_kv_b"), H * (hp.qk_nope_dim + hp.v_head_dim), R));
  } else {
    STRATA_ASSIGN_OR_RETURN(L.wk_b, BindMatrix3(mf, n("attn_k_b"), H, R, hp.qk_nope_dim));
    STRATA_ASSIGN_OR_RETURN(L.wv_b, BindMatrix3(mf, n("attn_v_b"), H, hp.v_head_dim, R));
  }
  STRATA_ASSIGN_OR_RETURN(L.wo, BindMatrix(mf, n("attn_output"), D, H * hp.v_head_dim));
  return absl::OkStatus();
}

// A (n, n_expert) bias tensor sliced into one Vec per expert.
absl::Status BindExpertBias(const ModelFile &mf, const std::string &name, int64_t n, int n_expert,
                            std::vector<ExpertWeights> &experts, Vec ExpertWeights::*field) {
  STRATA_ASSIGN_OR_RETURN(const TensorRef *t, Require(mf, name));
  STRATA_RETURN_IF_ERROR(CheckDims(*t, {n, n_expert}));
  STRATA_ASSIGN_OR_RETURN(const quant::Codec *codec, CodecOf(*t));
  STRATA_ASSIGN_OR_RETURN(uint64_t row_bytes, quant::RowBytes(t->type, n));
  for (int e = 0; e < n_expert; ++e) {
    Vec &v = experts[e].*field;
    v.name = strata::StrFormat("%s[expert %d]", name, e);
    v.tensor = t;
    v.codec = codec;
    v.n = n;
    v.bytes = row_bytes;
    v.sub_offset = row_bytes * static_cast<uint64_t>(e);
  }
  return absl::OkStatus();
}

// Tensor names of the family-specific resident parts of one layer.
struct ExtraNames {
  std::string bq, bk, bv, bo;
  std::string sh_gate, sh_up, sh_down, sh_inp;
};

// Attention biases, and on a MoE layer the shared expert (+ its gate), as the family has them.
absl::Status BindLayerExtras(const ModelFile &mf, const HParams &hp, const ExtraNames &n, LayerWeights &L,
                             bool moe_layer) {
  if (hp.attn_bias) {
    STRATA_ASSIGN_OR_RETURN(L.bq, BindVec(mf, n.bq, hp.q_dim()));
    STRATA_ASSIGN_OR_RETURN(L.bk, BindVec(mf, n.bk, hp.kv_dim()));
    STRATA_ASSIGN_OR_RETURN(L.bv, BindVec(mf, n.bv, hp.kv_dim()));
  }
  if (hp.attn_out_bias) {
    STRATA_ASSIGN_OR_RETURN(L.bo, BindVec(mf, n.bo, hp.n_embd));
  }
  if (moe_layer && hp.n_ff_shared > 0) {
    STRATA_ASSIGN_OR_RETURN(L.shared, BindFfn(mf, n.sh_gate, n.sh_up, n.sh_down, hp.n_ff_shared, hp.n_embd));
    if (hp.shared_expert_gate) {
      STRATA_ASSIGN_OR_RETURN(L.shared_gate, BindRow(mf, n.sh_inp, hp.n_embd));
    }
  }
  return absl::OkStatus();
}

// A view of rows [row0, row0 + rows) of slice e of a 3-D tensor (cols, total_rows, n_expert).
absl::StatusOr<Matrix> SliceExpert(const TensorRef *t, int e, int64_t row0, int64_t rows) {
  Matrix m;
  m.tensor = t;
  m.name = strata::StrFormat("%s[expert %d]", t->name, e);
  STRATA_ASSIGN_OR_RETURN(m.codec, CodecOf(*t));
  m.cols = t->ne[0];
  m.rows = rows;
  STRATA_ASSIGN_OR_RETURN(m.row_bytes, quant::RowBytes(t->type, m.cols));
  m.sub_offset = m.row_bytes * static_cast<uint64_t>(t->ne[1]) * static_cast<uint64_t>(e) +
                 m.row_bytes * static_cast<uint64_t>(row0);
  return m;
}

absl::Status BindExperts3D(const ModelFile &mf, const HParams &hp, const std::string &gate,
                           const std::string &up, const std::string &down, LayerWeights &L) {
  STRATA_ASSIGN_OR_RETURN(const TensorRef *g, Require(mf, gate));
  STRATA_ASSIGN_OR_RETURN(const TensorRef *u, Require(mf, up));
  STRATA_ASSIGN_OR_RETURN(const TensorRef *d, Require(mf, down));
  STRATA_RETURN_IF_ERROR(CheckDims(*g, {hp.n_embd, hp.n_ff_expert, hp.n_expert}));
  STRATA_RETURN_IF_ERROR(CheckDims(*u, {hp.n_embd, hp.n_ff_expert, hp.n_expert}));
  STRATA_RETURN_IF_ERROR(CheckDims(*d, {hp.n_ff_expert, hp.n_embd, hp.n_expert}));
  L.experts.resize(hp.n_expert);
  for (int e = 0; e < hp.n_expert; ++e) {
    STRATA_ASSIGN_OR_RETURN(L.experts[e].gate, SliceExpert(g, e, 0, hp.n_ff_expert));
    STRATA_ASSIGN_OR_RETURN(L.experts[e].up, SliceExpert(u, e, 0, hp.n_ff_expert));
    STRATA_ASSIGN_OR_RETURN(L.experts[e].down, SliceExpert(d, e, 0, hp.n_embd));
  }
  return absl::OkStatus();
}

// Per-expert 2-D tensors `blk.L.ffn_{gate,up,down}.E.weight` (written by `strata pack`, and by old
// llama.cpp Mixtral files); each expert may have its own type.
absl::Status BindExpertsPerTensor(const ModelFile &mf, const HParams &hp, int layer, LayerWeights &L) {
  L.experts.resize(hp.n_expert);
  for (int e = 0; e < hp.n_expert; ++e) {
    auto en = [&](const char *s) { return strata::StrFormat("blk.%d.%s.%d.weight", layer, s, e); };
    STRATA_ASSIGN_OR_RETURN(L.experts[e].gate, BindMatrix(mf, en("ffn_gate"), hp.n_ff_expert, hp.n_embd));
    STRATA_ASSIGN_OR_RETURN(L.experts[e].up, BindMatrix(mf, en("ffn_up"), hp.n_ff_expert, hp.n_embd));
    STRATA_ASSIGN_OR_RETURN(L.experts[e].down, BindMatrix(mf, en("ffn_down"), hp.n_embd, hp.n_ff_expert));
  }
  return absl::OkStatus();
}

// gpt-oss checkpoints keep each layer's experts input-major: gate_up_proj (n_expert, n_embd,
// 2 * n_ff) with gate and up in alternating columns, down_proj (n_expert, n_ff, n_embd), biases
// gate_up_proj_bias (n_expert, 2 * n_ff) and down_proj_bias (n_expert, n_embd). An expert is bound
// as gate = its (n_embd, 2 * n_ff) block, up = an empty view after it, down = its (n_ff, n_embd)
// block, with `input_major` set; gate_bias holds the interleaved gate/up bias.
absl::Status BindGptOssExpertsHf(const ModelFile &mf, const HParams &hp, const std::string &moe, LayerWeights &L) {
  const int64_t D = hp.n_embd, F = hp.n_ff_expert, E = hp.n_expert;
  STRATA_ASSIGN_OR_RETURN(L.router, BindMatrix(mf, moe + "router.weight", E, D));
  STRATA_ASSIGN_OR_RETURN(L.router_bias, BindVec(mf, moe + "router.bias", E));
  STRATA_ASSIGN_OR_RETURN(const TensorRef *gu, Require(mf, moe + "experts.gate_up_proj"));
  STRATA_RETURN_IF_ERROR(CheckDims(*gu, {2 * F, D, E}));
  STRATA_ASSIGN_OR_RETURN(const TensorRef *dn, Require(mf, moe + "experts.down_proj"));
  STRATA_RETURN_IF_ERROR(CheckDims(*dn, {D, F, E}));
  L.experts.resize(E);
  for (int e = 0; e < E; ++e) {
    ExpertWeights &x = L.experts[e];
    STRATA_ASSIGN_OR_RETURN(x.gate, SliceExpert(gu, e, 0, D));
    x.up = x.gate;
    x.up.rows = 0;
    x.up.sub_offset = x.gate.sub_offset + x.gate.nbytes();
    STRATA_ASSIGN_OR_RETURN(x.down, SliceExpert(dn, e, 0, F));
    x.input_major = true;
    x.swiglu_limit = hp.swiglu_limit;
  }
  STRATA_RETURN_IF_ERROR(
      BindExpertBias(mf, moe + "experts.gate_up_proj_bias", 2 * F, E, L.experts, &ExpertWeights::gate_bias));
  STRATA_RETURN_IF_ERROR(
      BindExpertBias(mf, moe + "experts.down_proj_bias", D, E, L.experts, &ExpertWeights::down_bias));
  return absl::OkStatus();
}

absl::StatusOr<ModelWeights> BindGguf(const ModelFile &mf, const HParams &hp) {
  ModelWeights w;
  STRATA_ASSIGN_OR_RETURN(w.tok_embd, BindMatrix(mf, "token_embd.weight", hp.n_vocab, hp.n_embd));
  STRATA_ASSIGN_OR_RETURN(w.output_norm, BindVec(mf, "output_norm.weight", hp.n_embd));
  if (hp.tied_embeddings) {
    w.output = w.tok_embd;
  } else {
    STRATA_ASSIGN_OR_RETURN(w.output, BindMatrix(mf, "output.weight", hp.n_vocab, hp.n_embd));
  }
  w.layers.resize(hp.n_layer);
  for (int i = 0; i < hp.n_layer; ++i) {
    LayerWeights &L = w.layers[i];
    auto n = [i](const char *s) { return strata::StrFormat("blk.%d.%s.weight", i, s); };
    STRATA_ASSIGN_OR_RETURN(L.attn_norm, BindVec(mf, n("attn_norm"), hp.n_embd));
    if (hp.mla) {
      STRATA_RETURN_IF_ERROR(BindMla(mf, hp, [&](const char *s) { return n(s); }, L));
    } else {
      STRATA_ASSIGN_OR_RETURN(L.wq, BindMatrix(mf, n("attn_q"), hp.q_dim(), hp.n_embd));
      STRATA_ASSIGN_OR_RETURN(L.wk, BindMatrix(mf, n("attn_k"), hp.kv_dim(), hp.n_embd));
      STRATA_ASSIGN_OR_RETURN(L.wv, BindMatrix(mf, n("attn_v"), hp.kv_dim(), hp.n_embd));
      STRATA_ASSIGN_OR_RETURN(L.wo, BindMatrix(mf, n("attn_output"), hp.n_embd, hp.q_dim()));
    }
    if (hp.attn_sinks) {
      STRATA_ASSIGN_OR_RETURN(L.sinks, BindVec(mf, n("attn_sinks"), hp.n_head));
    }
    if (hp.qk_norm) {
      STRATA_ASSIGN_OR_RETURN(L.q_norm, BindVec(mf, n("attn_q_norm"), hp.qk_norm_full ? hp.q_dim() : hp.head_dim));
      STRATA_ASSIGN_OR_RETURN(L.k_norm, BindVec(mf, n("attn_k_norm"), hp.qk_norm_full ? hp.kv_dim() : hp.head_dim));
    }
    STRATA_ASSIGN_OR_RETURN(L.ffn_norm, BindVec(mf, n(hp.arch == Arch::kGptOss ? "post_attention_norm" : "ffn_norm"),
                                                hp.n_embd));
    {
      auto b = [i](const char *s) { return strata::StrFormat("blk.%d.%s.bias", i, s); };
      ExtraNames en{b("attn_q"), b("attn_k"), b("attn_v"), b("attn_output"),
                    n("ffn_gate_shexp"), n("ffn_up_shexp"), n("ffn_down_shexp"), n("ffn_gate_inp_shexp")};
      STRATA_RETURN_IF_ERROR(BindLayerExtras(mf, hp, en, L, !hp.is_dense(i)));
    }
    if (hp.is_dense(i)) {
      STRATA_ASSIGN_OR_RETURN(L.dense, BindFfn(mf, n("ffn_gate"), n("ffn_up"), n("ffn_down"), hp.n_ff_dense, hp.n_embd));
      continue;
    }
    STRATA_ASSIGN_OR_RETURN(L.router, BindMatrix(mf, n("ffn_gate_inp"), hp.n_expert, hp.n_embd));
    const std::string bias_of = strata::StrFormat("blk.%d.", i);
    if (hp.expert_bias) {
      STRATA_ASSIGN_OR_RETURN(L.router_bias, BindVec(mf, bias_of + "ffn_gate_inp.bias", hp.n_expert));
    }
    if (hp.expert_select_bias) {
      STRATA_ASSIGN_OR_RETURN(L.expert_select_bias, BindVec(mf, bias_of + "exp_probs_b.bias", hp.n_expert));
    }
    if (hp.expert_bias) {
      STRATA_RETURN_IF_ERROR(
          BindExperts3D(mf, hp, n("ffn_gate_exps"), n("ffn_up_exps"), n("ffn_down_exps"), L));
      STRATA_RETURN_IF_ERROR(BindExpertBias(mf, bias_of + "ffn_gate_exps.bias", hp.n_ff_expert, hp.n_expert,
                                            L.experts, &ExpertWeights::gate_bias));
      STRATA_RETURN_IF_ERROR(BindExpertBias(mf, bias_of + "ffn_up_exps.bias", hp.n_ff_expert, hp.n_expert,
                                            L.experts, &ExpertWeights::up_bias));
      STRATA_RETURN_IF_ERROR(BindExpertBias(mf, bias_of + "ffn_down_exps.bias", hp.n_embd, hp.n_expert,
                                            L.experts, &ExpertWeights::down_bias));
      for (auto &e : L.experts) e.swiglu_limit = hp.swiglu_limit;
      continue;
    }
    if (mf.Find(n("ffn_gate_exps")) == nullptr &&
        mf.Find(strata::StrFormat("blk.%d.ffn_gate.0.weight", i)) != nullptr) {
      STRATA_RETURN_IF_ERROR(BindExpertsPerTensor(mf, hp, i, L));
      continue;
    }
    STRATA_RETURN_IF_ERROR(
        BindExperts3D(mf, hp, n("ffn_gate_exps"), n("ffn_up_exps"), n("ffn_down_exps"), L));
  }
  return w;
}

absl::StatusOr<ModelWeights> BindHf(const ModelFile &mf, const HParams &hp) {
  ModelWeights w;
  STRATA_ASSIGN_OR_RETURN(w.tok_embd, BindMatrix(mf, "model.embed_tokens.weight", hp.n_vocab, hp.n_embd));
  STRATA_ASSIGN_OR_RETURN(w.output_norm, BindVec(mf, "model.norm.weight", hp.n_embd));
  if (hp.tied_embeddings) {
    w.output = w.tok_embd;
  } else {
    STRATA_ASSIGN_OR_RETURN(w.output, BindMatrix(mf, "lm_head.weight", hp.n_vocab, hp.n_embd));
  }
  w.layers.resize(hp.n_layer);
  for (int i = 0; i < hp.n_layer; ++i) {
    LayerWeights &L = w.layers[i];
    const std::string p = strata::StrFormat("model.layers.%d.", i);
    STRATA_ASSIGN_OR_RETURN(L.attn_norm, BindVec(mf, p + "input_layernorm.weight", hp.n_embd));
    if (hp.mla) {
      auto hf = [&](const char *g) -> std::string {
        static const std::pair<const char *, const char *> kNames[] = {
            {"attn_q_a", "q_a_proj.weight"},        {"attn_q_a_norm", "q_a_layernorm.weight"},
            {"attn_q_b", "q_b_proj.weight"},        {"attn_q", "q_proj.weight"},
            {"attn_kv_a_mqa", "kv_a_proj_with_mqa.weight"}, {"attn_kv_a_norm", "kv_a_layernorm.weight"},
            {"attn_kv_b", "kv_b_proj.weight"},      {"attn_output", "o_proj.weight"}};
        for (const auto &[gn, hn] : kNames) {
          if (std::strcmp(gn, g) == 0) return p + "self_attn." + hn;
        }
        return p + "self_attn.(" + g + ")";  // no split k_b / v_b in HF checkpoints
      };
      STRATA_RETURN_IF_ERROR(BindMla(mf, hp, hf, L));
    } else {
      STRATA_ASSIGN_OR_RETURN(L.wq, BindMatrix(mf, p + "self_attn.q_proj.weight", hp.q_dim(), hp.n_embd));
      STRATA_ASSIGN_OR_RETURN(L.wk, BindMatrix(mf, p + "self_attn.k_proj.weight", hp.kv_dim(), hp.n_embd));
      STRATA_ASSIGN_OR_RETURN(L.wv, BindMatrix(mf, p + "self_attn.v_proj.weight", hp.kv_dim(), hp.n_embd));
      STRATA_ASSIGN_OR_RETURN(L.wo, BindMatrix(mf, p + "self_attn.o_proj.weight", hp.n_embd, hp.q_dim()));
    }
    if (hp.attn_sinks) {
      STRATA_ASSIGN_OR_RETURN(L.sinks, BindVec(mf, p + "self_attn.sinks", hp.n_head));
    }
    if (hp.qk_norm) {
      STRATA_ASSIGN_OR_RETURN(L.q_norm, BindVec(mf, p + "self_attn.q_norm.weight",
                                                hp.qk_norm_full ? hp.q_dim() : hp.head_dim));
      STRATA_ASSIGN_OR_RETURN(L.k_norm, BindVec(mf, p + "self_attn.k_norm.weight",
                                                hp.qk_norm_full ? hp.kv_dim() : hp.head_dim));
    }
    STRATA_ASSIGN_OR_RETURN(L.ffn_norm, BindVec(mf, p + "post_attention_layernorm.weight", hp.n_embd));
    {
      const std::string a = p + "self_attn.", m = p + "mlp.";
      // Qwen2-MoE names its shared expert mlp.shared_expert, DeepSeek mlp.shared_experts.
      const std::string sh = m + (hp.arch == Arch::kDeepseek2 ? "shared_experts." : "shared_expert.");
      ExtraNames en{a + "q_proj.bias", a + "k_proj.bias", a + "v_proj.bias", a + "o_proj.bias",
                    sh + "gate_proj.weight", sh + "up_proj.weight", sh + "down_proj.weight",
                    m + "shared_expert_gate.weight"};
      STRATA_RETURN_IF_ERROR(BindLayerExtras(mf, hp, en, L, !hp.is_dense(i)));
    }
    if (hp.is_dense(i)) {
      const std::string m = p + "mlp.";
      STRATA_ASSIGN_OR_RETURN(L.dense, BindFfn(mf, m + "gate_proj.weight", m + "up_proj.weight",
                                               m + "down_proj.weight", hp.n_ff_dense, hp.n_embd));
      continue;
    }
    // Mixtral checkpoints name the MoE block block_sparse_moe (w1 gate, w3 up, w2 down); Qwen3 and
    // newer layouts name it mlp (gate_proj, up_proj, down_proj).
    std::string moe = p + "mlp.";
    const char *gn = "gate_proj", *un = "up_proj", *dn = "down_proj";
    if (hp.arch == Arch::kMixtral && mf.Find(p + "block_sparse_moe.gate.weight") != nullptr) {
      moe = p + "block_sparse_moe.";
      gn = "w1", un = "w3", dn = "w2";
    }
    if (hp.arch == Arch::kGptOss) {
      STRATA_RETURN_IF_ERROR(BindGptOssExpertsHf(mf, hp, moe, L));
      continue;
    }
    STRATA_ASSIGN_OR_RETURN(L.router, BindMatrix(mf, moe + "gate.weight", hp.n_expert, hp.n_embd));
    if (hp.expert_select_bias) {
      STRATA_ASSIGN_OR_RETURN(L.expert_select_bias,
                              BindVec(mf, moe + "gate.e_score_correction_bias", hp.n_expert));
    }
    if (const TensorRef *gu = mf.Find(moe + "experts.gate_up_proj"); gu != nullptr) {
      // Fused layout: gate_up_proj (n_expert, 2*n_ff, n_embd) with gate rows first; down_proj
      // (n_expert, n_embd, n_ff).
      STRATA_RETURN_IF_ERROR(CheckDims(*gu, {hp.n_embd, 2 * int64_t{hp.n_ff_expert}, hp.n_expert}));
      STRATA_ASSIGN_OR_RETURN(const TensorRef *dt, Require(mf, moe + "experts.down_proj"));
      STRATA_RETURN_IF_ERROR(CheckDims(*dt, {hp.n_ff_expert, hp.n_embd, hp.n_expert}));
      L.experts.resize(hp.n_expert);
      for (int e = 0; e < hp.n_expert; ++e) {
        STRATA_ASSIGN_OR_RETURN(L.experts[e].gate, SliceExpert(gu, e, 0, hp.n_ff_expert));
        STRATA_ASSIGN_OR_RETURN(L.experts[e].up, SliceExpert(gu, e, hp.n_ff_expert, hp.n_ff_expert));
        STRATA_ASSIGN_OR_RETURN(L.experts[e].down, SliceExpert(dt, e, 0, hp.n_embd));
      }
      continue;
    }
    L.experts.resize(hp.n_expert);
    for (int e = 0; e < hp.n_expert; ++e) {
      auto en = [&](const char *s) { return strata::StrFormat("%sexperts.%d.%s.weight", moe, e, s); };
      STRATA_ASSIGN_OR_RETURN(L.experts[e].gate, BindMatrix(mf, en(gn), hp.n_ff_expert, hp.n_embd));
      STRATA_ASSIGN_OR_RETURN(L.experts[e].up, BindMatrix(mf, en(un), hp.n_ff_expert, hp.n_embd));
      STRATA_ASSIGN_OR_RETURN(L.experts[e].down, BindMatrix(mf, en(dn), hp.n_embd, hp.n_ff_expert));
    }
  }
  return w;
}

template <typename F>
void ForEachMatrix(ModelWeights &w, F &&f, bool routed_experts = true) {
  f(w.tok_embd);
  f(w.output);
  for (auto &L : w.layers) {
    for (Matrix *m : {&L.wq, &L.wk, &L.wv, &L.wo, &L.router, &L.wq_a, &L.wq_b, &L.wkv_a, &L.wkv_b, &L.wk_b,
                      &L.wv_b}) {
      if (m->tensor != nullptr) f(*m);
    }
    // Dense MLPs, shared experts and their gate are resident like attention.
    for (ExpertWeights *e : {&L.dense, &L.shared}) {
      if (!e->present()) continue;
      f(e->gate);
      f(e->up);
      f(e->down);
    }
    if (L.shared_gate.tensor != nullptr) f(L.shared_gate);
    if (!routed_experts) continue;
    for (auto &e : L.experts) {
      f(e.gate);
      f(e.up);
      f(e.down);
    }
  }
}

template <typename F>
void ForEachVec(ModelWeights &w, F &&f) {
  f(w.output_norm);
  for (auto &L : w.layers) {
    for (Vec *v : {&L.attn_norm, &L.q_norm, &L.k_norm, &L.ffn_norm, &L.bq, &L.bk, &L.bv, &L.bo, &L.sinks,
                   &L.router_bias, &L.expert_select_bias, &L.q_a_norm, &L.kv_a_norm}) {
      if (v->tensor != nullptr) f(*v);
    }
    for (auto &e : L.experts) {
      for (Vec *v : {&e.gate_bias, &e.up_bias, &e.down_bias}) {
        if (v->tensor != nullptr) f(*v);
      }
    }
  }
}

}  // namespace

absl::StatusOr<ModelWeights> BindWeights(const ModelFile &mf, const HParams &hp) {
  return mf.kind() == ModelFile::Kind::kGguf ? BindGguf(mf, hp) : BindHf(mf, hp);
}

uint64_t RoutedExpertBytes(const ModelWeights &w) {
  uint64_t s = 0;
  for (const auto &L : w.layers)
    for (const auto &e : L.experts) s += e.nbytes();
  return s;
}

uint64_t NonRoutedBytes(const ModelWeights &w) {
  uint64_t s = w.tok_embd.nbytes();
  if (w.output.tensor != w.tok_embd.tensor) s += w.output.nbytes();
  auto vec_bytes = [](const Vec &v) { return v.tensor ? v.tensor->nbytes : 0; };
  s += vec_bytes(w.output_norm);
  for (const auto &L : w.layers) {
    s += L.wq.nbytes() + L.wk.nbytes() + L.wv.nbytes() + L.wo.nbytes() + L.router.nbytes();
    for (const Matrix *m : {&L.wq_a, &L.wq_b, &L.wkv_a, &L.wkv_b, &L.wk_b, &L.wv_b}) s += m->nbytes();
    s += vec_bytes(L.q_a_norm) + vec_bytes(L.kv_a_norm);
    s += vec_bytes(L.attn_norm) + vec_bytes(L.q_norm) + vec_bytes(L.k_norm) + vec_bytes(L.ffn_norm);
    // Family extras: biases, sinks, dense MLPs and shared experts are resident, never streamed.
    for (const Vec *v : {&L.bq, &L.bk, &L.bv, &L.bo, &L.sinks, &L.router_bias, &L.expert_select_bias}) {
      s += v->nbytes();
    }
    s += L.dense.nbytes() + L.shared.nbytes();
    if (L.shared_gate.tensor != nullptr) s += L.shared_gate.nbytes();
  }
  return s;
}

WeightStore::~WeightStore() { FreeLarge(arena_); }

absl::Status WeightStore::Load(const ModelFile &mf, ModelWeights &w, bool routed_experts, const LoadOptions &lo) {
  // Every tensor any view points into, read once.
  HashMap<const TensorRef *, uint64_t> placement;
  std::vector<const TensorRef *> order;
  uint64_t total = 0;
  auto place = [&](const TensorRef *t) {
    if (t == nullptr || placement.count(t) != 0) return;
    placement[t] = total;
    order.push_back(t);
    total += (t->nbytes + 63) & ~uint64_t{63};
  };
  ForEachMatrix(w, [&](Matrix &m) { place(m.tensor); }, routed_experts);
  FreeLarge(arena_);
  arena_ = nullptr;
  size_ = 0;
  if (total > 0) {
    arena_ = static_cast<uint8_t *>(AllocateLarge(total, lo.huge_pages.value_or(LargeAllocHugePages())));
    if (arena_ == nullptr) {
      return Errorf(MOE_ERR_NO_MEMORY, "cannot allocate %u bytes for the model weights", total);
    }
  }
  size_ = total;
  // Pieces of at most kPiece bytes, in file order; readers claim them in turn.
  const uint64_t kPiece = std::max<uint64_t>(1, lo.piece_bytes);
  struct Piece {
    const TensorRef *t;
    uint64_t at, n;  // within the tensor
    uint8_t *dst;
  };
  std::vector<Piece> pieces;
  uint64_t to_read = 0;
  for (const TensorRef *t : order) {
    uint8_t *dst = arena_ + placement[t];
    for (uint64_t at = 0; at < t->nbytes; at += kPiece) {
      pieces.push_back({t, at, std::min(kPiece, t->nbytes - at), dst + at});
    }
    to_read += t->nbytes;
  }
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int n_threads = static_cast<int>(
      std::min<size_t>(static_cast<size_t>(std::min(lo.n_threads > 0 ? lo.n_threads : cores, kMaxLoadThreads)),
                       pieces.size()));
  std::atomic<size_t> next{0};
  std::atomic<uint64_t> done{0};
  std::atomic<bool> failed{false};
  std::mutex mu;
  auto cancelled = [&](uint64_t d) {
    return Errorf(MOE_ERR_CANCELLED, "the load was cancelled by the host's callback at %u of %u bytes", d, to_read);
  };
  if (lo.keep_going && !lo.keep_going(0, to_read)) return cancelled(0);
  size_t failed_at = pieces.size();  // the first failing piece (under mu)
  absl::Status failure;
  using Clock = std::chrono::steady_clock;
  Clock::time_point last = Clock::now();
  // Each reader claims pieces until none is left or one failed; the loading thread (reader 0) also
  // reports progress between its pieces.
  auto read = [&](bool reporter) {
    for (;;) {
      const size_t i = next.fetch_add(1, std::memory_order_relaxed);
      if (i >= pieces.size() || failed.load(std::memory_order_relaxed)) return;
      const Piece &p = pieces[i];
      absl::Status st = mf.file(p.t->file_index).ReadAt(p.t->offset + p.at, p.dst, p.n);
      if (!st.ok()) {
        std::lock_guard<std::mutex> lk(mu);
        if (i < failed_at) {
          failed_at = i;
          failure = Annotate(st, absl::StrCat("reading tensor '", p.t->name, "'"));
        }
        failed.store(true, std::memory_order_relaxed);
        return;
      }
      const uint64_t d = done.fetch_add(p.n, std::memory_order_relaxed) + p.n;
      if (reporter && (lo.progress || lo.keep_going) && d < to_read) {
        const Clock::time_point now = Clock::now();
        if (std::chrono::duration<double>(now - last).count() >= kLoadProgressSeconds) {
          last = now;
          if (lo.progress) lo.progress(d, to_read);
          if (lo.keep_going && !lo.keep_going(d, to_read)) {
            std::lock_guard<std::mutex> lk(mu);
            failed_at = 0;
            failure = cancelled(d);
            failed.store(true, std::memory_order_relaxed);
            return;
          }
        }
      }
    }
  };
  std::vector<std::thread> readers;
  readers.reserve(static_cast<size_t>(std::max(0, n_threads - 1)));
  for (int r = 1; r < n_threads; ++r) {
    try {
      readers.emplace_back([&] {
        numa::ScopedNodeBinding bind(lo.numa_node);
        read(false);
      });
    } catch (const std::system_error &) {
      break;  // the host gives no more threads: fewer readers
    }
  }
  read(true);
  for (std::thread &t : readers) t.join();
  if (failed.load()) return failure;
  if (lo.progress) lo.progress(to_read, to_read);
  if (lo.keep_going && !lo.keep_going(to_read, to_read)) return cancelled(to_read);
  ForEachMatrix(w, [&](Matrix &m) { m.data = arena_ + placement[m.tensor] + m.sub_offset; }, routed_experts);
  // Norm vectors are small: convert them to float once.
  absl::Status status = absl::OkStatus();
  ForEachVec(w, [&](Vec &v) {
    if (!status.ok()) return;
    std::vector<uint8_t> raw(v.bytes);
    absl::Status st =
        mf.file(v.tensor->file_index).ReadAt(v.tensor->offset + v.sub_offset, raw.data(), raw.size());
    if (!st.ok()) {
      status = Annotate(st, absl::StrCat("reading tensor '", v.name, "'"));
      return;
    }
    v.values.resize(v.n);
    v.codec->dequantize(raw.data(), v.values.data(), v.n);
    // Norm weights, biases and sinks enter every token's numbers: one NaN or Inf would make every
    // logit NaN, so a file holding one is refused here, by name.
    for (size_t k = 0; k < v.values.size(); ++k) {
      if (!std::isfinite(v.values[k])) {
        status = Errorf(MOE_ERR_FORMAT_TENSOR, "tensor '%s' holds %g at element %d (of the %d from byte %d); "
                        "weights must be finite", v.name, v.values[k], k, v.n, v.sub_offset);
        return;
      }
    }
  });
  return status;
}

}  // namespace strata::model
