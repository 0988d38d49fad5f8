// The backend interface: the operations the forward pass needs, implemented once per device
// (backends/cpu, backends/cuda). All tensors are float32 row-major with the shapes in comments;
// weight matrices are codec-encoded Matrix views. Per-element results must not depend on how many
// tokens are in a call, so a session's numbers are the same alone or batched.
#pragma once

#include <cstdint>
#include <string_view>

#include "lib/model/hparams.h"
#include "lib/model/weights.h"

namespace strata::model {

// One layer's slice of a session's KV cache: n_ctx rows of k_width keys and v_width values. Code
// reaches rows only through k_row / v_row, so the storage behind a view may change (blocks).
struct KvView {
  float *k = nullptr;
  float *v = nullptr;
  int n_ctx = 0;
  int k_width = 0;
  int v_width = 0;
  float *k_row(int pos) const { return k + static_cast<int64_t>(pos) * k_width; }
  float *v_row(int pos) const { return v + static_cast<int64_t>(pos) * v_width; }
};

// Frequencies of a RoPE call. inv_freq (head_dim / 2 values) replaces theta^(-2i / head_dim) when set
// (YaRN); cos and sin are multiplied by mscale (YaRN's attention factor).
struct RopeParams {
  const float *inv_freq = nullptr;
  float mscale = 1.f;
};

// Family options of an attention call (defaults: grouped-query attention as Qwen3 / Mixtral).
struct AttentionParams {
  float scale = 0.f;             // score scale; 0 = 1 / sqrt(head_dim)
  const float *sinks = nullptr;  // (n_head) learned sink logits joining each softmax (gpt-oss)
  // Multi-head latent attention: the values are the first v_dim floats of the k rows (the latent),
  // so out is (n_tok, n_head, v_dim). With latent false, values come from the v rows (head_dim).
  bool latent = false;
  int v_dim = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string_view name() const = 0;

  // y (n_tok, w.rows) = x (n_tok, w.cols) · wᵀ
  virtual void MatMul(const Matrix &w, const float *x, int64_t n_tok, float *y) = 0;
  // out (n, w.cols) = rows ids[i] of w
  virtual void GetRows(const Matrix &w, const int32_t *ids, int64_t n, float *out) = 0;
  // y (n_rows, n) = x / rms(x) * weight, per row; y may alias x
  virtual void RmsNorm(const float *x, const float *weight, int64_t n_rows, int64_t n, float eps,
                       float *y) = 0;
  // Rotates x (n_tok, n_heads, head_dim) in place; token t is at position pos[t].
  virtual void Rope(float *x, int64_t n_tok, int n_heads, int head_dim, const int32_t *pos, float theta,
                    RopeStyle style, const RopeParams &p) = 0;
  void Rope(float *x, int64_t n_tok, int n_heads, int head_dim, const int32_t *pos, float theta, RopeStyle style) {
    Rope(x, n_tok, n_heads, head_dim, pos, theta, style, RopeParams{});
  }
  // Causal attention for n_tok new tokens at positions pos0..pos0+n_tok-1, whose K/V rows are already
  // in kv. q (n_tok, n_head, head_dim) -> out (n_tok, n_head, head_dim, or v_dim when p.latent).
  // window 0 = unlimited.
  virtual void Attention(const float *q, const KvView &kv, int64_t n_tok, int pos0, int n_head,
                         int n_head_kv, int head_dim, int window, float *out, const AttentionParams &p) = 0;
  void Attention(const float *q, const KvView &kv, int64_t n_tok, int pos0, int n_head, int n_head_kv,
                 int head_dim, int window, float *out) {
    Attention(q, kv, n_tok, pos0, n_head, n_head_kv, head_dim, window, out, AttentionParams{});
  }
  // y (n_tok, n_embd) = down(act(gate x + gate_bias, up x + up_bias)) + down_bias for one expert over a
  // group of tokens; act is silu(g) * u, or gpt-oss's clamped form when e.swiglu_limit > 0; an
  // input-major expert (e.input_major) is computed from its fused gate/up block.
  virtual void ExpertFfn(const ExpertWeights &e, const float *x, int64_t n_tok, float *y) = 0;
};

}  // namespace strata::model
