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

absl::Status Forward(const HParams &hp, const ModelWeights &w, Backend &be, const ForwardArgs &a,
                     std::vector<std::vector<float>> *logits) {
  const size_t n_seq = a.seqs.size();
  if (n_seq == 0) return Errorf(MOE_ERR_INVALID_ARGUMENT, "forward pass over no sequence");
  // Row offsets of each sequence in the concatenated batch.
  std::vector<int64_t> row0(n_seq + 1, 0);
  for (size_t s = 0; s < n_seq; ++s) {
    const SequenceArgs &q = a.seqs[s];
    if (q.kv == nullptr || q.n_tok <= 0 || q.tokens == nullptr) {
      return Errorf(MOE_ERR_INVALID_ARGUMENT, "sequence %u of the batch: no cache or %d tokens", s, q.n_tok);
    }
    if (q.pos0 < 0 || q.pos0 + q.n_tok > q.kv->n_ctx()) {
      return Errorf(MOE_ERR_LIMIT_CONTEXT, "positions %d..%d do not fit the context of %d tokens", q.pos0,
                    q.pos0 + q.n_tok - 1, q.kv->n_ctx());
    }
    for (int64_t t = 0; t < q.n_tok; ++t) {
      if (q.tokens[t] < 0 || q.tokens[t] >= hp.n_vocab) {
        return Errorf(MOE_ERR_INVALID_ARGUMENT, "token id %d is outside the vocabulary of %d", q.tokens[t],
                      hp.n_vocab);
      }
    }
    for (size_t r = 0; r < s; ++r) {
      if (a.seqs[r].kv == q.kv) return Errorf(MOE_ERR_INVALID_ARGUMENT, "sequences %u and %u share a cache", r, s);
    }
    row0[s + 1] = row0[s] + q.n_tok;
  }
  const int64_t T = row0[n_seq], D = hp.n_embd;
  std::vector<int32_t> tokens(T);
  for (size_t s = 0; s < n_seq; ++s) std::copy(a.seqs[s].tokens, a.seqs[s].tokens + a.seqs[s].n_tok, tokens.begin() + row0[s]);
  std::vector<float> x(T * D), h(T * D), o(T * D);
  be.GetRows(w.tok_embd, tokens.data(), T, x.data());  // x (T, D): every sequence's rows in order

  for (int l = 0; l < hp.n_layer; ++l) {
    const LayerWeights &L = w.layers[l];
    be.RmsNorm(x.data(), L.attn_norm.values.data(), T, D, hp.rms_eps, h.data());
    for (size_t s = 0; s < n_seq; ++s) {  // attention: each sequence over its own cache
      const SequenceArgs &q = a.seqs[s];
      SelfAttention(hp, L, l, be, *q.kv, h.data() + row0[s] * D, q.n_tok, q.pos0, o.data() + row0[s] * D);
    }
    for (int64_t i = 0; i < T * D; ++i) x[i] += o[i];
    be.RmsNorm(x.data(), L.ffn_norm.values.data(), T, D, hp.rms_eps, h.data());
    STRATA_RETURN_IF_ERROR(FeedForward(hp, L, l, be, a.experts, h.data(), T, o.data()));  // all tokens at once
    for (int64_t i = 0; i < T * D; ++i) x[i] += o[i];
  }

  // --- output head: the rows each sequence wants, gathered into one matrix ---
  std::vector<int64_t> out_rows;
  for (size_t s = 0; s < n_seq; ++s) {
    const int64_t first = a.seqs[s].all_logits ? row0[s] : row0[s + 1] - 1;
    for (int64_t r = first; r < row0[s + 1]; ++r) out_rows.push_back(r);
  }
  const int64_t n_out = static_cast<int64_t>(out_rows.size());
  std::vector<float> xo(n_out * D), all(n_out * hp.n_vocab);
  for (int64_t i = 0; i < n_out; ++i) std::copy(x.begin() + out_rows[i] * D, x.begin() + (out_rows[i] + 1) * D, xo.begin() + i * D);
  be.RmsNorm(xo.data(), w.output_norm.values.data(), n_out, D, hp.rms_eps, h.data());
  be.MatMul(w.output, h.data(), n_out, all.data());  // (n_out, n_vocab)
  logits->resize(n_seq);
  int64_t done = 0;
  for (size_t s = 0; s < n_seq; ++s) {
    const int64_t n = a.seqs[s].all_logits ? a.seqs[s].n_tok : 1;
    (*logits)[s].assign(all.begin() + done * hp.n_vocab, all.begin() + (done + n) * hp.n_vocab);
    done += n;
  }
  return absl::OkStatus();
}

absl::Status Forward(const HParams &hp, const ModelWeights &w, Backend &be, KvCache &kv, const int32_t *tokens,
                     int64_t n_tok, int pos0, bool all_logits, ExpertSource *experts, std::vector<float> *logits) {
  ForwardArgs a;
  a.seqs.push_back(SequenceArgs{&kv, tokens, n_tok, pos0, all_logits});
  a.experts = experts;
  std::vector<std::vector<float>> out;
  STRATA_RETURN_IF_ERROR(Forward(hp, w, be, a, &out));
  *logits = std::move(out[0]);
  return absl::OkStatus();
}

}  // namespace strata::model
