// Forward pass. Shapes in comments are (rows, cols) of float32 row-major buffers; T = tokens in the
// call. Expert outputs are kept per (token, slot) and summed in slot order, so a token's result does
// not depend on which other tokens share the batch.
#include "lib/model/forward.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <numeric>

#include "lib/util/crc32c.h"

namespace strata::model {

KvCache::Widths KvCache::WidthsFor(const HParams &hp) {
  if (hp.mla) return Widths{hp.kv_lora_rank + hp.qk_rope_dim, 0};
  return Widths{hp.kv_dim(), hp.kv_dim()};
}

KvCache::~KvCache() { FreeAll(); }

void KvCache::FreeAll() {
  if (budget_ != nullptr) budget_->Give(resident_bytes());
  blocks_.clear();
  for (auto &t : k_tab_) t.clear();
  for (auto &t : v_tab_) t.clear();
  masked_.clear();
  if (spill_fd_ >= 0) close(spill_fd_);
  spill_fd_ = -1;
  spill_blocks_ = 0;
}

bool KvBudget::Take(uint64_t bytes) {
  uint64_t cur = used_.load();
  do {
    if (cur + bytes > limit_) return false;
  } while (!used_.compare_exchange_weak(cur, cur + bytes));
  return true;
}

absl::Status KvCache::Init(const HParams &hp, int n_ctx, KvBudget *budget) {
  if (n_ctx <= 0) return Errorf(MOE_ERR_INVALID_ARGUMENT, "a KV cache of %d positions", n_ctx);
  FreeAll();
  n_ctx_ = n_ctx;
  n_layer_ = hp.n_layer;
  w_ = WidthsFor(hp);
  budget_ = budget;
  k_tab_.assign(n_layer_, {});
  v_tab_.assign(n_layer_, {});
  return absl::OkStatus();
}

void KvCache::SetMask(int window, std::vector<int32_t> blocked) {
  window_ = std::max(0, window);
  std::sort(blocked.begin(), blocked.end());
  blocked.erase(std::unique(blocked.begin(), blocked.end()), blocked.end());
  blocked_ = std::move(blocked);
}

int KvCache::WindowFor(const HParams &hp, int l) const {
  const int m = hp.window(l);
  if (m <= 0) return window_;
  if (window_ <= 0) return m;
  return std::min(m, window_);
}

// Allocates n blocks (zeroed) against the budget, into *out; all or nothing.
absl::Status KvCache::AddBlocks(int n, std::vector<std::unique_ptr<float[]>> *out) {
  const uint64_t bytes = static_cast<uint64_t>(n) * block_bytes();
  if (budget_ != nullptr && !budget_->Take(bytes)) {
    return Errorf(MOE_ERR_LIMIT_KV,
                  "the context's KV budget of %u bytes cannot hold %d more block(s) of %u bytes (%u bytes in use); "
                  "raise moe_params.kv_budget_bytes or max_sessions, close or evict sessions",
                  budget_->limit(), n, block_bytes(), budget_->used());
  }
  const size_t floats = block_bytes() / sizeof(float);
  try {
    for (int i = 0; i < n; ++i) out->emplace_back(new float[floats]());
  } catch (const std::bad_alloc &) {
    out->clear();
    if (budget_ != nullptr) budget_->Give(bytes);
    return Errorf(MOE_ERR_NO_MEMORY, "cannot allocate %d KV block(s) of %u bytes", n, block_bytes());
  }
  return absl::OkStatus();
}

// Appends allocated blocks to the tables.
void KvCache::Adopt(std::vector<std::unique_ptr<float[]>> *blocks) {
  const size_t per_layer = static_cast<size_t>(kKvBlockTokens) * (w_.k + w_.v);
  for (auto &b : *blocks) {
    float *base = b.get();
    for (int l = 0; l < n_layer_; ++l) {
      float *k = base + l * per_layer;
      k_tab_[l].push_back(k);
      v_tab_[l].push_back(k + static_cast<size_t>(kKvBlockTokens) * w_.k);
    }
    blocks_.push_back(std::move(b));
  }
  blocks->clear();
  masked_.resize(capacity(), 0);
}

absl::Status KvCache::Reserve(int n) {
  if (n > n_ctx_) {
    return Errorf(MOE_ERR_LIMIT_CONTEXT, "position %d does not fit the session's context of %d tokens", n - 1,
                  n_ctx_);
  }
  if (n <= capacity()) return absl::OkStatus();
  if (spilled()) return Errorf(MOE_ERR_STATE, "the KV cache is spilled to disk");
  const int need = (n + kKvBlockTokens - 1) / kKvBlockTokens - n_blocks();
  std::vector<std::unique_ptr<float[]>> fresh;
  STRATA_RETURN_IF_ERROR(AddBlocks(need, &fresh));
  Adopt(&fresh);
  return absl::OkStatus();
}

absl::Status KvCache::Prepare(int pos0, const int32_t *tokens, int64_t n) {
  if (pos0 < 0 || n < 0 || pos0 + n > n_ctx_) {
    return Errorf(MOE_ERR_LIMIT_CONTEXT, "positions %d..%d do not fit the context of %d tokens", pos0,
                  pos0 + n - 1, n_ctx_);
  }
  STRATA_RETURN_IF_ERROR(Reserve(static_cast<int>(pos0 + n)));
  for (int64_t t = 0; t < n; ++t) {
    masked_[pos0 + t] = std::binary_search(blocked_.begin(), blocked_.end(), tokens[t]) ? 1 : 0;
  }
  return absl::OkStatus();
}

void KvCache::Trim(int n) {
  if (spilled()) return;
  const int keep = (std::max(0, n) + kKvBlockTokens - 1) / kKvBlockTokens;
  if (keep >= n_blocks()) return;
  if (budget_ != nullptr) budget_->Give(static_cast<uint64_t>(n_blocks() - keep) * block_bytes());
  blocks_.resize(keep);
  for (auto &t : k_tab_) t.resize(keep);
  for (auto &t : v_tab_) t.resize(keep);
  masked_.resize(capacity());
}

absl::Status KvCache::Spill(const std::string &dir, int n) {
  if (spilled()) return absl::OkStatus();
  const int keep = std::min(n_blocks(), (std::max(0, n) + kKvBlockTokens - 1) / kKvBlockTokens);
  std::string tmpl = (dir.empty() ? std::string(".") : dir) + "/strata-kv-XXXXXX";
  int fd = mkstemp(tmpl.data());
  if (fd < 0) {
    return Errorf(MOE_ERR_IO_OPEN, "cannot create a KV spill file in '%s': %s", dir, std::strerror(errno));
  }
  unlink(tmpl.c_str());  // the file lives while fd is open; nothing stays behind after a crash
  uint32_t crc = 0;
  for (int b = 0; b < keep; ++b) {
    const char *p = reinterpret_cast<const char *>(blocks_[b].get());
    const uint64_t bytes = block_bytes();
    crc = Crc32c(crc, p, bytes);
    uint64_t done = 0;
    while (done < bytes) {
      ssize_t w = pwrite(fd, p + done, bytes - done, static_cast<off_t>(b * bytes + done));
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) {
        const int err = errno;
        close(fd);
        return Errorf(MOE_ERR_IO_WRITE, "writing the KV spill file in '%s': %s", dir,
                      w < 0 ? std::strerror(err) : "no space written");
      }
      done += static_cast<uint64_t>(w);
    }
  }
  std::vector<uint8_t> mask(masked_.begin(), masked_.begin() + keep * kKvBlockTokens);
  FreeAll();
  masked_ = std::move(mask);  // the mask stays in RAM (one byte per position)
  spill_fd_ = fd;
  spill_blocks_ = keep;
  spill_crc_ = crc;
  return absl::OkStatus();
}

absl::Status KvCache::Unspill() {
  if (!spilled()) return absl::OkStatus();
  std::vector<std::unique_ptr<float[]>> fresh;
  STRATA_RETURN_IF_ERROR(AddBlocks(spill_blocks_, &fresh));
  const uint64_t bytes = block_bytes();
  uint32_t crc = 0;
  for (int b = 0; b < spill_blocks_; ++b) {
    char *p = reinterpret_cast<char *>(fresh[b].get());
    uint64_t done = 0;
    while (done < bytes) {
      ssize_t r = pread(spill_fd_, p + done, bytes - done, static_cast<off_t>(b * bytes + done));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) {
        const int err = errno;
        if (budget_ != nullptr) budget_->Give(static_cast<uint64_t>(spill_blocks_) * bytes);
        return Errorf(MOE_ERR_IO_READ, "reading the KV spill file back: %s", r < 0 ? std::strerror(err) : "end of file");
      }
      done += static_cast<uint64_t>(r);
    }
    crc = Crc32c(crc, p, bytes);
  }
  if (crc != spill_crc_) {
    if (budget_ != nullptr) budget_->Give(static_cast<uint64_t>(spill_blocks_) * bytes);
    return Errorf(MOE_ERR_IO_READ, "the KV spill file came back different from what was written (checksum)");
  }
  std::vector<uint8_t> mask = std::move(masked_);
  close(spill_fd_);
  spill_fd_ = -1;
  spill_blocks_ = 0;
  Adopt(&fresh);
  std::copy(mask.begin(), mask.begin() + std::min(mask.size(), masked_.size()), masked_.begin());
  return absl::OkStatus();
}

absl::Status KvCache::ReadRows(int l, bool values, int n, float *out) const {
  const int width = values ? w_.v : w_.k;
  if (width == 0 || n <= 0) return absl::OkStatus();
  const size_t per_layer = static_cast<size_t>(kKvBlockTokens) * (w_.k + w_.v);
  const size_t within = l * per_layer + (values ? static_cast<size_t>(kKvBlockTokens) * w_.k : 0);
  for (int p0 = 0; p0 < n; p0 += kKvBlockTokens) {
    const int b = p0 / kKvBlockTokens, rows = std::min(kKvBlockTokens, n - p0);
    const size_t floats = static_cast<size_t>(rows) * width;
    float *dst = out + static_cast<size_t>(p0) * width;
    if (!spilled()) {
      if (b >= n_blocks()) return Errorf(MOE_ERR_INTERNAL, "KV rows %d.. are not allocated", p0);
      std::copy(blocks_[b].get() + within, blocks_[b].get() + within + floats, dst);
      continue;
    }
    if (b >= spill_blocks_) return Errorf(MOE_ERR_INTERNAL, "KV rows %d.. are not in the spill file", p0);
    char *p = reinterpret_cast<char *>(dst);
    const uint64_t bytes = floats * sizeof(float), at = b * block_bytes() + within * sizeof(float);
    uint64_t done = 0;
    while (done < bytes) {
      ssize_t r = pread(spill_fd_, p + done, bytes - done, static_cast<off_t>(at + done));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) {
        return Errorf(MOE_ERR_IO_READ, "reading the KV spill file: %s", r < 0 ? std::strerror(errno) : "end of file");
      }
      done += static_cast<uint64_t>(r);
    }
  }
  return absl::OkStatus();
}

void KvCache::WriteRows(int l, bool values, int n, const float *in) {
  const int width = values ? w_.v : w_.k;
  if (width == 0) return;
  for (int p = 0; p < n; ++p) {
    std::copy(in + static_cast<size_t>(p) * width, in + static_cast<size_t>(p + 1) * width,
              values ? layer(l).v_row(p) : layer(l).k_row(p));
  }
}

namespace {

// k largest of v (ties to the lower index), written to idx[0..k).
void TopK(const std::vector<float> &v, int k, int32_t *out) {
  std::vector<int32_t> idx(v.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                    [&](int32_t a, int32_t b) { return v[a] > v[b] || (v[a] == v[b] && a < b); });
  std::copy(idx.begin(), idx.begin() + k, out);
}

// Router logits -> k selected experts and their weights, as transformers computes them in float32:
//  kSoftmax: softmax over all experts, top-k (within the topk_group best groups by their best
//    expert when n_group > 1, DeepSeek-V2), optional renormalisation;
//  kSigmoid: sigmoid scores; the selection ranks score + select_bias within the topk_group groups
//    whose two best biased scores sum highest (DeepSeek-V3); the weights are the unbiased scores;
//  kSoftmaxSelected: top-k of the logits, softmax over those k (gpt-oss).
// The weights are finally multiplied by routed_scale.
void Route(const HParams &hp, const float *logits, const Vec &select_bias, int32_t *sel, float *wts) {
  const int n_expert = hp.n_expert, k = hp.n_expert_used;
  std::vector<float> p(logits, logits + n_expert);
  if (hp.gating == Gating::kSoftmaxSelected) {
    TopK(p, k, sel);
    float mx = p[sel[0]], sum = 0.f;
    for (int j = 0; j < k; ++j) {
      wts[j] = std::exp(p[sel[j]] - mx);
      sum += wts[j];
    }
    for (int j = 0; j < k; ++j) wts[j] /= sum;
    return;
  }
  if (hp.gating == Gating::kSigmoid) {
    for (auto &v : p) v = 1.0f / (1.0f + std::exp(-v));
  } else {
    float mx = *std::max_element(p.begin(), p.end());
    float sum = 0.f;
    for (auto &v : p) {
      v = std::exp(v - mx);
      sum += v;
    }
    for (auto &v : p) v /= sum;
  }
  std::vector<float> choice = p;
  if (hp.gating == Gating::kSigmoid && select_bias.tensor != nullptr) {
    for (int e = 0; e < n_expert; ++e) choice[e] += select_bias.values[e];
  }
  if (hp.n_group > 1) {
    const int per = n_expert / hp.n_group;
    std::vector<float> group(hp.n_group);
    for (int g = 0; g < hp.n_group; ++g) {
      std::vector<float> m(choice.begin() + g * per, choice.begin() + (g + 1) * per);
      std::sort(m.begin(), m.end(), std::greater<float>());
      group[g] = hp.gating == Gating::kSigmoid ? m[0] + m[1] : m[0];
    }
    std::vector<int32_t> keep(hp.topk_group);
    TopK(group, hp.topk_group, keep.data());
    std::vector<uint8_t> kept(hp.n_group, 0);
    for (int32_t g : keep) kept[g] = 1;
    // Experts of the other groups drop out (-inf for sigmoid, 0 probability for softmax, as
    // transformers masks them).
    const float drop = hp.gating == Gating::kSigmoid ? -INFINITY : 0.f;
    for (int e = 0; e < n_expert; ++e) {
      if (!kept[e / per]) choice[e] = drop;
    }
  }
  TopK(choice, k, sel);
  float s = 0.f;
  for (int j = 0; j < k; ++j) {
    wts[j] = p[sel[j]];
    s += wts[j];
  }
  if (hp.norm_topk_prob) {
    if (hp.gating == Gating::kSigmoid) s += 1e-20f;
    for (int j = 0; j < k; ++j) wts[j] /= s;
  }
  if (hp.routed_scale != 1.f) {
    for (int j = 0; j < k; ++j) wts[j] *= hp.routed_scale;
  }
}

// RoPE frequencies of a head of `dim` rotated dimensions: theta^(-2i/dim), or with YaRN the blend of
// interpolated (/ factor) and original frequencies over the correction range, as transformers'
// yarn initialisation computes them. Empty when plain RoPE applies.
std::vector<float> RopeFrequencies(const HParams &hp, int dim) {
  if (!hp.yarn) return {};
  const int half = dim / 2;
  const double base = hp.rope_theta;
  auto corr_dim = [&](double rot) {
    return dim * std::log(hp.yarn_orig_ctx / (rot * 2.0 * M_PI)) / (2.0 * std::log(base));
  };
  double low = corr_dim(hp.yarn_beta_fast), high = corr_dim(hp.yarn_beta_slow);
  if (hp.yarn_truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(dim - 1));
  if (low == high) high += 0.001;
  std::vector<float> inv(half);
  for (int i = 0; i < half; ++i) {
    const float pos_freq = std::pow(static_cast<float>(base), static_cast<float>(2 * i) / static_cast<float>(dim));
    const float extra = 1.0f / pos_freq;
    const float inter = 1.0f / (hp.yarn_factor * pos_freq);
    const float ramp = std::clamp(static_cast<float>((i - low) / (high - low)), 0.0f, 1.0f);
    const float extra_factor = 1.0f - ramp;
    inv[i] = inter * (1.0f - extra_factor) + extra * extra_factor;
  }
  return inv;
}

RopeParams RopeParamsFor(const HParams &hp, const std::vector<float> &inv_freq) {
  RopeParams rp;
  rp.inv_freq = inv_freq.empty() ? nullptr : inv_freq.data();
  rp.mscale = hp.yarn ? hp.yarn_attn_factor : 1.f;
  return rp;
}

// Rows [r0, r0 + n) of a resident matrix, as a matrix.
Matrix RowsOf(const Matrix &m, int64_t r0, int64_t n) {
  Matrix v = m;
  v.rows = n;
  v.sub_offset += static_cast<uint64_t>(r0) * m.row_bytes;
  v.data = m.data + static_cast<uint64_t>(r0) * m.row_bytes;
  return v;
}

// y (T, w.cols) = x (T, w.rows) · w: the transposed product, each row decoded once and accumulated
// in row order.
void MatMulTransposed(const Matrix &w, const float *x, int64_t T, float *y) {
  std::vector<float> row(w.cols);
  std::fill(y, y + T * w.cols, 0.f);
  for (int64_t r = 0; r < w.rows; ++r) {
    w.codec->dequantize(w.row(r), row.data(), w.cols);
    for (int64_t t = 0; t < T; ++t) {
      const float xv = x[t * w.rows + r];
      float *yt = y + t * w.cols;
      for (int64_t c = 0; c < w.cols; ++c) yt[c] += xv * row[c];
    }
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
void LatentAttention(const HParams &hp, const LayerWeights &L, int l, Backend &be, KvCache &kv,
                     const float *h, int64_t T, int pos0, float *o);

void SelfAttention(const HParams &hp, const LayerWeights &L, int l, Backend &be, KvCache &kv,
                   const float *h, int64_t T, int pos0, float *o) {
  if (hp.mla) {
    LatentAttention(hp, L, l, be, kv, h, T, pos0, o);
    return;
  }
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
  const std::vector<float> inv_freq = RopeFrequencies(hp, hp.head_dim);
  const RopeParams rp = RopeParamsFor(hp, inv_freq);
  be.Rope(q.data(), T, hp.n_head, hp.head_dim, pos.data(), hp.rope_theta, hp.rope_style, rp);
  be.Rope(k.data(), T, hp.n_head_kv, hp.head_dim, pos.data(), hp.rope_theta, hp.rope_style, rp);
  KvView cache = kv.layer(l);
  for (int64_t t = 0; t < T; ++t) {
    std::copy(k.begin() + t * KVD, k.begin() + (t + 1) * KVD, cache.k_row(pos0 + static_cast<int>(t)));
    std::copy(v.begin() + t * KVD, v.begin() + (t + 1) * KVD, cache.v_row(pos0 + static_cast<int>(t)));
  }
  AttentionParams ap;
  ap.scale = hp.attn_scale;
  if (L.sinks.tensor != nullptr) ap.sinks = L.sinks.values.data();
  be.Attention(q.data(), cache, T, pos0, hp.n_head, hp.n_head_kv, hp.head_dim, kv.WindowFor(hp, l), att.data(), ap);
  be.MatMul(L.wo, att.data(), T, o);  // o (T, D)
  if (hp.attn_out_bias) AddBias(o, T, D, L.bo);
}

// Multi-head latent attention (DeepSeek-V2/V3) of layer l over T new tokens of one sequence, in the
// absorbed-weights form: the cache row of a token is its normalised latent c (kv_lora_rank) and its
// rotated shared RoPE key (qk_rope_dim); each head's query is taken into the latent space
// (q_nope · W_UK[h]), attention runs over the latent rows as one shared key/value head, and the
// result leaves the latent space through W_UV[h]. Never expands per-head keys or values.
void LatentAttention(const HParams &hp, const LayerWeights &L, int l, Backend &be, KvCache &kv,
                     const float *h, int64_t T, int pos0, float *o) {
  const int64_t H = hp.n_head, QK = hp.head_dim, NOPE = hp.qk_nope_dim, ROPE = hp.qk_rope_dim;
  const int64_t R = hp.kv_lora_rank, V = hp.v_head_dim, W = R + ROPE;
  std::vector<int32_t> pos(T);
  for (int64_t t = 0; t < T; ++t) pos[t] = pos0 + static_cast<int32_t>(t);
  // q (T, H, QK): per head qk_nope_dim plain dims then qk_rope_dim rotated ones.
  std::vector<float> q(T * H * QK);
  if (hp.q_lora_rank > 0) {
    std::vector<float> qa(T * hp.q_lora_rank);
    be.MatMul(L.wq_a, h, T, qa.data());  // (T, q_lora_rank)
    be.RmsNorm(qa.data(), L.q_a_norm.values.data(), T, hp.q_lora_rank, hp.lora_norm_eps, qa.data());
    be.MatMul(L.wq_b, qa.data(), T, q.data());
  } else {
    be.MatMul(L.wq, h, T, q.data());
  }
  // kva (T, kv_lora_rank + qk_rope_dim): the latent then the shared RoPE key.
  std::vector<float> kva(T * W), kpe(T * ROPE), qpe(T * H * ROPE);
  be.MatMul(L.wkv_a, h, T, kva.data());
  for (int64_t t = 0; t < T; ++t) {
    be.RmsNorm(kva.data() + t * W, L.kv_a_norm.values.data(), 1, R, hp.lora_norm_eps, kva.data() + t * W);
    std::copy(kva.begin() + t * W + R, kva.begin() + (t + 1) * W, kpe.begin() + t * ROPE);
    for (int64_t hh = 0; hh < H; ++hh) {
      const float *src = q.data() + (t * H + hh) * QK + NOPE;
      std::copy(src, src + ROPE, qpe.begin() + (t * H + hh) * ROPE);
    }
  }
  const std::vector<float> inv_freq = RopeFrequencies(hp, static_cast<int>(ROPE));
  const RopeParams rp = RopeParamsFor(hp, inv_freq);
  be.Rope(kpe.data(), T, 1, static_cast<int>(ROPE), pos.data(), hp.rope_theta, hp.rope_style, rp);
  be.Rope(qpe.data(), T, static_cast<int>(H), static_cast<int>(ROPE), pos.data(), hp.rope_theta, hp.rope_style, rp);
  KvView cache = kv.layer(l);
  for (int64_t t = 0; t < T; ++t) {
    float *row = cache.k_row(pos0 + static_cast<int>(t));
    std::copy(kva.begin() + t * W, kva.begin() + t * W + R, row);
    std::copy(kpe.begin() + t * ROPE, kpe.begin() + (t + 1) * ROPE, row + R);
  }
  // qlat (T, H, R + ROPE) = [q_nope[h] · W_UK[h] | q_pe[h]]
  const bool fused = L.wkv_b.tensor != nullptr;
  std::vector<float> qlat(T * H * W), qn(T * NOPE), ql(T * R);
  for (int64_t hh = 0; hh < H; ++hh) {
    for (int64_t t = 0; t < T; ++t) {
      const float *src = q.data() + (t * H + hh) * QK;
      std::copy(src, src + NOPE, qn.begin() + t * NOPE);
    }
    if (fused) {  // W_UK[h] is (qk_nope_dim, R): rows [h (NOPE + V), + NOPE) of kv_b
      MatMulTransposed(RowsOf(L.wkv_b, hh * (NOPE + V), NOPE), qn.data(), T, ql.data());
    } else {      // k_b holds W_UK[h] transposed, (R, qk_nope_dim)
      be.MatMul(RowsOf(L.wk_b, hh * R, R), qn.data(), T, ql.data());
    }
    for (int64_t t = 0; t < T; ++t) {
      float *dst = qlat.data() + (t * H + hh) * W;
      std::copy(ql.begin() + t * R, ql.begin() + (t + 1) * R, dst);
      std::copy(qpe.begin() + (t * H + hh) * ROPE, qpe.begin() + (t * H + hh + 1) * ROPE, dst + R);
    }
  }
  // att (T, H, R): each head's softmax-weighted sum of latents
  std::vector<float> att(T * H * R), ah(T * R), oh(T * V), ov(T * H * V);
  AttentionParams ap;
  ap.scale = hp.attn_scale;
  ap.latent = true;
  ap.v_dim = static_cast<int>(R);
  be.Attention(qlat.data(), cache, T, pos0, static_cast<int>(H), 1, static_cast<int>(W), kv.WindowFor(hp, l), att.data(), ap);
  for (int64_t hh = 0; hh < H; ++hh) {
    for (int64_t t = 0; t < T; ++t) {
      const float *src = att.data() + (t * H + hh) * R;
      std::copy(src, src + R, ah.begin() + t * R);
    }
    // W_UV[h] (V, R): rows [h (NOPE + V) + NOPE, + V) of kv_b, or slice h of v_b
    const Matrix wuv = fused ? RowsOf(L.wkv_b, hh * (NOPE + V) + NOPE, V) : RowsOf(L.wv_b, hh * V, V);
    be.MatMul(wuv, ah.data(), T, oh.data());  // (T, V)
    for (int64_t t = 0; t < T; ++t) std::copy(oh.begin() + t * V, oh.begin() + (t + 1) * V, ov.begin() + (t * H + hh) * V);
  }
  be.MatMul(L.wo, ov.data(), T, o);  // o (T, D)
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
  if (L.router_bias.tensor != nullptr) AddBias(router.data(), T, hp.n_expert, L.router_bias);
  for (int64_t t = 0; t < T; ++t) {
    Route(hp, router.data() + t * hp.n_expert, L.expert_select_bias, sel.data() + t * K, wts.data() + t * K);
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
  // Blocks for every sequence's new positions (the budget may refuse: nothing is written then) and
  // their mask.
  for (const SequenceArgs &q : a.seqs) STRATA_RETURN_IF_ERROR(q.kv->Prepare(q.pos0, q.tokens, q.n_tok));
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
