// Forward pass. Shapes in comments are (rows, cols) of float32 row-major buffers; T = tokens in the
// call. Expert outputs are kept per (token, slot) and summed in slot order, so a token's result does
// not depend on which other tokens share the batch.
#include "lib/model/forward.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace strata::model {

KvCache::Widths KvCache::WidthsFor(const HParams &hp) {
  if (hp.mla) return Widths{hp.kv_lora_rank + hp.qk_rope_dim, 0};
  return Widths{hp.kv_dim(), hp.kv_dim()};
}

absl::Status KvCache::Init(const HParams &hp, int n_ctx) {
  n_ctx_ = n_ctx;
  w_ = WidthsFor(hp);
  const size_t rows = static_cast<size_t>(hp.n_layer) * n_ctx;
  try {
    k_.assign(rows * w_.k, 0.f);
    v_.assign(rows * w_.v, 0.f);
  } catch (const std::bad_alloc &) {
    return Errorf(MOE_ERR_NO_MEMORY, "cannot allocate a KV cache of %u bytes", BytesFor(hp, n_ctx));
  }
  return absl::OkStatus();
}

namespace {

// Softmax over the router logits, then the k largest (ties to the lower index), optionally
// renormalised to sum to one — as transformers' Qwen3-MoE and Mixtral blocks do, in float32.
void Route(const float *logits, int n_expert, int k, bool renorm, int32_t *sel, float *wts) {
  std::vector<float> p(logits, logits + n_expert);
  float mx = *std::max_element(p.begin(), p.end());
  float sum = 0.f;
  for (auto &v : p) {
    v = std::exp(v - mx);
    sum += v;
  }
  for (auto &v : p) v /= sum;
  std::vector<int32_t> idx(n_expert);
  std::iota(idx.begin(), idx.end(), 0);
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                    [&](int32_t a, int32_t b) { return p[a] > p[b] || (p[a] == p[b] && a < b); });
  float s = 0.f;
  for (int j = 0; j < k; ++j) {
    sel[j] = idx[j];
    wts[j] = p[idx[j]];
    s += wts[j];
  }
  if (renorm) {
    for (int j = 0; j < k; ++j) wts[j] /= s;
  }
}

// x (n_tok, n) += bias, per row.
void AddBias(float *x, int64_t n_tok, int64_t n, const Vec &bias) {
  const float *b = bias.values.data();
  for (int64_t t = 0; t < n_tok; ++t)
    for (int64_t i = 0; i < n; ++i) x[t * n + i] += b[i];
}

// Self-attention of layer l over T new tokens of one sequence at positions pos0..pos0+T-1:
// h (T, D) is the normalised layer input, o (T, D) receives the output projection. The tokens'
// K/V rows are written into the sequence's cache first.
void SelfAttention(const HParams &hp, const LayerWeights &L, int l, Backend &be, KvCache &kv,
                   const float *h, int64_t T, int pos0, float *o) {
  const int64_t D = hp.n_embd, QD = hp.q_dim(), KVD = hp.kv_dim();
  std::vector<float> q(T * QD), k(T * KVD), v(T * KVD), att(T * QD);
  std::vector<int32_t> pos(T);
  for (int64_t t = 0; t < T; ++t) pos[t] = pos0 + static_cast<int32_t>(t);
  be.MatMul(L.wq, h, T, q.data());  // q (T, n_head * head_dim)
  be.MatMul(L.wk, h, T, k.data());  // k (T, n_head_kv * head_dim)
  be.MatMul(L.wv, h, T, v.data());  // v (T, n_head_kv * head_dim)
  if (hp.attn_bias) {
    AddBias(q.data(), T, QD, L.bq);
    AddBias(k.data(), T, KVD, L.bk);
    AddBias(v.data(), T, KVD, L.bv);
  }
  if (hp.qk_norm && hp.qk_norm_full) {  // OLMoE: one norm over the whole projection
    be.RmsNorm(q.data(), L.q_norm.values.data(), T, QD, hp.rms_eps, q.data());
    be.RmsNorm(k.data(), L.k_norm.values.data(), T, KVD, hp.rms_eps, k.data());
  } else if (hp.qk_norm) {
    be.RmsNorm(q.data(), L.q_norm.values.data(), T * hp.n_head, hp.head_dim, hp.rms_eps, q.data());
    be.RmsNorm(k.data(), L.k_norm.values.data(), T * hp.n_head_kv, hp.head_dim, hp.rms_eps, k.data());
  }
  be.Rope(q.data(), T, hp.n_head, hp.head_dim, pos.data(), hp.rope_theta, hp.rope_style);
  be.Rope(k.data(), T, hp.n_head_kv, hp.head_dim, pos.data(), hp.rope_theta, hp.rope_style);
  KvView cache = kv.layer(l);
  for (int64_t t = 0; t < T; ++t) {
    std::copy(k.begin() + t * KVD, k.begin() + (t + 1) * KVD, cache.k_row(pos0 + static_cast<int>(t)));
    std::copy(v.begin() + t * KVD, v.begin() + (t + 1) * KVD, cache.v_row(pos0 + static_cast<int>(t)));
  }
  be.Attention(q.data(), cache, T, pos0, hp.n_head, hp.n_head_kv, hp.head_dim, hp.window(l), att.data());
  be.MatMul(L.wo, att.data(), T, o);  // o (T, D)
  if (hp.attn_out_bias) AddBias(o, T, D, L.bo);
}

// The feed-forward part of layer l for T tokens (of any sequences): h (T, D) normalised input ->
// o (T, D). A dense layer runs its MLP; a MoE layer routes each token, runs the distinct selected
// experts once each over the tokens that chose them, sums each token's slots in slot order, and
// adds the shared expert(s).
absl::Status FeedForward(const HParams &hp, const LayerWeights &L, int l, Backend &be,
                         ExpertSource *source, const float *h, int64_t T, float *o) {
  const int64_t D = hp.n_embd, K = hp.n_expert_used;
  if (hp.is_dense(l)) {
    be.ExpertFfn(L.dense, h, T, o);
    return absl::OkStatus();
  }
  std::vector<float> router(T * hp.n_expert), slots(T * K * D), wts(T * K), xg, yg;
  std::vector<int32_t> sel(T * K);
  be.MatMul(L.router, h, T, router.data());  // router (T, n_expert)
  for (int64_t t = 0; t < T; ++t) {
    Route(router.data() + t * hp.n_expert, hp.n_expert, static_cast<int>(K), hp.norm_topk_prob,
          sel.data() + t * K, wts.data() + t * K);
  }
  if (source != nullptr) source->OnRoute(l, h, T, sel.data(), static_cast<int>(K));
  // Group tokens by expert so each expert's weights are fetched and used once per batch.
  std::vector<std::vector<int64_t>> members(hp.n_expert);  // indices into sel (t * K + slot)
  for (int64_t i = 0; i < T * K; ++i) members[sel[i]].push_back(i);
  std::vector<int32_t> used;
  for (int e = 0; e < hp.n_expert; ++e) {
    if (!members[e].empty()) used.push_back(e);
  }
  std::vector<const ExpertWeights *> ew(used.size());
  if (source != nullptr) {
    absl::Status st = source->Acquire(l, used, &ew);
    if (!st.ok()) return Annotate(st, absl::StrFormat("layer %d experts", l));
  } else {
    for (size_t u = 0; u < used.size(); ++u) ew[u] = &L.experts[used[u]];
  }
  for (size_t u = 0; u < used.size(); ++u) {
    const std::vector<int64_t> &mem = members[used[u]];
    const int64_t n = static_cast<int64_t>(mem.size());
    xg.resize(n * D);
    yg.resize(n * D);
    for (int64_t m = 0; m < n; ++m) {
      const int64_t t = mem[m] / K;
      std::copy(h + t * D, h + (t + 1) * D, xg.begin() + m * D);
    }
    be.ExpertFfn(*ew[u], xg.data(), n, yg.data());
    for (int64_t m = 0; m < n; ++m) {
      std::copy(yg.begin() + m * D, yg.begin() + (m + 1) * D, slots.begin() + mem[m] * D);
    }
  }
  if (source != nullptr) source->Release(l, used);
  // o (T, D) = sum over slots of weight * expert output.
  for (int64_t t = 0; t < T; ++t) {
    std::fill(o + t * D, o + (t + 1) * D, 0.f);
    for (int64_t j = 0; j < K; ++j) {
      const float wt = wts[t * K + j];
      const float *y = slots.data() + (t * K + j) * D;
      for (int64_t d = 0; d < D; ++d) o[t * D + d] += wt * y[d];
    }
  }
  // --- shared expert(s): resident, every token ---
  if (L.shared.present()) {
    std::vector<float> sh(T * D), shg;
    be.ExpertFfn(L.shared, h, T, sh.data());
    if (L.shared_gate.tensor != nullptr) {
      shg.resize(T);
      be.MatMul(L.shared_gate, h, T, shg.data());  // (T, 1)
      for (int64_t t = 0; t < T; ++t) {
        const float g = 1.0f / (1.0f + std::exp(-shg[t]));
        for (int64_t d = 0; d < D; ++d) sh[t * D + d] *= g;
      }
    }
    for (int64_t i = 0; i < T * D; ++i) o[i] += sh[i];
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status Forward(const HParams &hp, const ModelWeights &w, Backend &be, KvCache &kv,
                     const ForwardArgs &a, std::vector<float> *logits) {
  const int64_t T = a.n_tok;
  if (T <= 0) return Errorf(MOE_ERR_INVALID_ARGUMENT, "forward pass over %d tokens", T);
  if (a.pos0 < 0 || a.pos0 + T > kv.n_ctx()) {
    return Errorf(MOE_ERR_LIMIT_CONTEXT, "positions %d..%d do not fit the context of %d tokens", a.pos0,
                  a.pos0 + T - 1, kv.n_ctx());
  }
  for (int64_t t = 0; t < T; ++t) {
    if (a.tokens[t] < 0 || a.tokens[t] >= hp.n_vocab) {
      return Errorf(MOE_ERR_INVALID_ARGUMENT, "token id %d is outside the vocabulary of %d", a.tokens[t],
                    hp.n_vocab);
    }
  }
  const int64_t D = hp.n_embd;
  std::vector<float> x(T * D), h(T * D), o(T * D);
  be.GetRows(w.tok_embd, a.tokens, T, x.data());  // x (T, D)

  for (int l = 0; l < hp.n_layer; ++l) {
    const LayerWeights &L = w.layers[l];
    be.RmsNorm(x.data(), L.attn_norm.values.data(), T, D, hp.rms_eps, h.data());
    SelfAttention(hp, L, l, be, kv, h.data(), T, a.pos0, o.data());
    for (int64_t i = 0; i < T * D; ++i) x[i] += o[i];
    be.RmsNorm(x.data(), L.ffn_norm.values.data(), T, D, hp.rms_eps, h.data());
    STRATA_RETURN_IF_ERROR(FeedForward(hp, L, l, be, a.experts, h.data(), T, o.data()));
    for (int64_t i = 0; i < T * D; ++i) x[i] += o[i];
  }

  // --- output head ---
  const int64_t first = a.all_logits ? 0 : T - 1;
  const int64_t n_out = T - first;
  be.RmsNorm(x.data() + first * D, w.output_norm.values.data(), n_out, D, hp.rms_eps, h.data());
  logits->resize(n_out * hp.n_vocab);
  be.MatMul(w.output, h.data(), n_out, logits->data());
  return absl::OkStatus();
}

}  // namespace strata::model
