// CPU backend kernels. MatMul hands each weight row to a row-dot kernel kMaxTokens tokens at a time
// (the row is read from memory once per call); every (row, token) result comes from the same kernel
// operations whatever the batch size or thread split. Other ops reduce in a fixed order (8 lanes).
#include "backends/cpu/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "lib/model/routing.h"

namespace strata::cpu {
namespace {

float Dot(const float *a, const float *b, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
  }
  for (; i < n; ++i) acc[i & 7] += a[i] * b[i];
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

// Host memory from calloc (zero-filled, as the std::vector buffers it replaced).
class HostBuffer final : public model::Buffer {
 public:
  HostBuffer(void *p, size_t bytes) {
    data_ = p;
    bytes_ = bytes;
  }
  ~HostBuffer() override { std::free(data_); }
};

}  // namespace

absl::StatusOr<std::unique_ptr<model::Buffer>> CpuBackend::Allocate(size_t bytes) {
  void *p = std::calloc(std::max<size_t>(bytes, 1), 1);
  if (p == nullptr) return Errorf(MOE_ERR_NO_MEMORY, "cannot allocate %u bytes of host memory", bytes);
  return std::unique_ptr<model::Buffer>(new HostBuffer(p, bytes));
}

void CpuBackend::Upload(void *dst, const void *src, size_t bytes) {
  if (bytes > 0) std::memcpy(dst, src, bytes);
}

void CpuBackend::Download(void *dst, const void *src, size_t bytes) {
  if (bytes > 0) std::memcpy(dst, src, bytes);
}

void CpuBackend::CopyRows(float *dst, int64_t dst_stride, const float *src, int64_t src_stride, int64_t rows,
                          int64_t width) {
  for (int64_t r = 0; r < rows; ++r) std::copy(src + r * src_stride, src + r * src_stride + width, dst + r * dst_stride);
}

void CpuBackend::Add(float *x, const float *y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] += y[i];
}

void CpuBackend::AddBias(float *x, int64_t n_rows, int64_t n, const float *bias) {
  for (int64_t t = 0; t < n_rows; ++t)
    for (int64_t i = 0; i < n; ++i) x[t * n + i] += bias[i];
}

void CpuBackend::SigmoidScaleRows(float *x, const float *g, int64_t n_rows, int64_t n) {
  for (int64_t t = 0; t < n_rows; ++t) {
    const float s = 1.0f / (1.0f + std::exp(-g[t]));
    for (int64_t d = 0; d < n; ++d) x[t * n + d] *= s;
  }
}

void CpuBackend::GatherRows(const float *src, int64_t width, const int32_t *idx, int64_t n, float *dst) {
  for (int64_t i = 0; i < n; ++i) std::copy(src + idx[i] * width, src + (idx[i] + 1) * width, dst + i * width);
}

void CpuBackend::WeightedRowSum(const float *rows, const int32_t *idx, const float *wts, int64_t n_tok, int k,
                                int64_t width, float *out) {
  for (int64_t t = 0; t < n_tok; ++t) {
    float *o = out + t * width;
    std::fill(o, o + width, 0.f);
    for (int64_t j = 0; j < k; ++j) {
      const float wt = wts[t * k + j];
      const float *y = rows + static_cast<int64_t>(idx[t * k + j]) * width;
      for (int64_t d = 0; d < width; ++d) o[d] += wt * y[d];
    }
  }
}

void CpuBackend::Route(const model::RouteParams &p, const float *logits, int64_t n_tok, int32_t *sel_host,
                       float *wts) {
  for (int64_t t = 0; t < n_tok; ++t) model::RouteToken(p, logits + t * p.n_expert, sel_host + t * p.k, wts + t * p.k);
}

// Host memory is the backend's memory: route, group and run the experts in place, the host path's
// operations in its order (so the numbers are the same), the selections left in a.sel.
bool CpuBackend::RoutedExperts(const model::RoutedExpertsArgs &a) {
  const int k = a.route.k;
  const int64_t n = a.n_tok * k;
  if (a.weights == nullptr || n <= 0 || a.n_embd <= 0) return false;
  Route(a.route, a.logits, a.n_tok, a.sel, a.wts);
  const model::ExpertGroups g = model::GroupByExpert(a.sel, a.n_tok, k, a.route.n_expert);
  std::copy(g.idx.begin(), g.idx.end(), a.idx);
  GatherRows(a.h, a.n_embd, a.idx, n, a.xg);
  for (size_t u = 0; u < g.used.size(); ++u) {
    ExpertFfn(a.weights->experts[g.used[u]], a.xg + g.first[u] * a.n_embd, g.first[u + 1] - g.first[u],
              a.yg + g.first[u] * a.n_embd);
  }
  WeightedRowSum(a.yg, a.idx + n, a.wts, a.n_tok, k, a.n_embd, a.out);
  return true;
}

void CpuBackend::MatMulInputMajor(const model::Matrix &w, const float *x, int64_t n_tok, float *y) {
  std::vector<float> row(w.cols);
  MatMulInputMajor(w, x, n_tok, y, row.data());
}

CpuBackend::CpuBackend(int n_threads, MatMulMode mode, kernels::Isa isa)
    : pool_(n_threads), mode_(mode), isa_(isa == kernels::Isa::kAvx2 ? kernels::BestIsa() : isa) {}

void CpuBackend::MatMul(const model::Matrix &w, const float *x, int64_t n_tok, float *y) {
  const int64_t rows = w.rows, cols = w.cols;
  if (rows <= 0 || n_tok <= 0) return;
  const quant::Codec &codec = *w.codec;
  const kernels::RowKernels k = kernels::FindRowKernels(codec, isa_);
  const bool q8 = mode_ == MatMulMode::kQ8Activations && k.dot_q8 != nullptr;
  // q8 mode: each token's activations are quantized once here, by one scalar routine, so a token
  // gets the same codes alone or in a batch.
  std::vector<uint8_t> xq;
  const int64_t xq_stride = q8 ? kernels::ActRowBytes(k.act, cols) : 0;
  if (q8) {
    xq.resize(static_cast<size_t>(xq_stride * n_tok));
    pool_.ParallelFor(n_tok, 8, [&](int64_t t0, int64_t t1, int) {
      for (int64_t t = t0; t < t1; ++t) {
        kernels::QuantizeActivations(k.act, x + t * cols, cols, xq.data() + t * xq_stride);
      }
    });
  }
  // Enough rows per chunk that waking threads pays off.
  const int64_t min_chunk = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, cols * n_tok));
  pool_.ParallelFor(rows, min_chunk, [&](int64_t r0, int64_t r1, int) {
    float out[kernels::kMaxTokens];
    for (int64_t r = r0; r < r1; ++r) {
      const uint8_t *row = w.row(r);
      for (int64_t t0 = 0; t0 < n_tok; t0 += kernels::kMaxTokens) {
        const int nt = static_cast<int>(std::min<int64_t>(kernels::kMaxTokens, n_tok - t0));
        if (q8) {
          k.dot_q8(codec, row, xq.data() + t0 * xq_stride, xq_stride, nt, cols, out);
        } else {
          k.dot_float(codec, row, x + t0 * cols, cols, nt, cols, out);
        }
        for (int t = 0; t < nt; ++t) y[(t0 + t) * rows + r] = out[t];
      }
    }
  });
}

void CpuBackend::GetRows(const model::Matrix &w, const int32_t *ids, int64_t n, float *out) {
  for (int64_t i = 0; i < n; ++i) w.codec->dequantize(w.row(ids[i]), out + i * w.cols, w.cols);
}

void CpuBackend::RmsNorm(const float *x, const float *weight, int64_t n_rows, int64_t n, float eps,
                         float *y) {
  for (int64_t r = 0; r < n_rows; ++r) {
    const float *xr = x + r * n;
    float *yr = y + r * n;
    float ss = Dot(xr, xr, n);
    // As transformers does in float32: x * rsqrt(mean(x^2) + eps), then times the weight.
    float inv = 1.0f / std::sqrt(ss / static_cast<float>(n) + eps);
    for (int64_t i = 0; i < n; ++i) yr[i] = weight[i] * (xr[i] * inv);
  }
}

void CpuBackend::Rope(float *x, int64_t n_tok, int n_heads, int head_dim, const int32_t *pos, float theta,
                      model::RopeStyle style, const model::RopeParams &p) {
  const int half = head_dim / 2;
  std::vector<float> inv_freq(half), c(half), s(half);
  for (int i = 0; i < half; ++i) {
    inv_freq[i] = p.inv_freq != nullptr
                      ? p.inv_freq[i]
                      : 1.0f / std::pow(theta, static_cast<float>(2 * i) / static_cast<float>(head_dim));
  }
  for (int64_t t = 0; t < n_tok; ++t) {
    for (int i = 0; i < half; ++i) {
      float angle = static_cast<float>(pos[t]) * inv_freq[i];
      c[i] = static_cast<float>(std::cos(static_cast<double>(angle)));
      s[i] = static_cast<float>(std::sin(static_cast<double>(angle)));
      if (p.mscale != 1.f) {
        c[i] *= p.mscale;
        s[i] *= p.mscale;
      }
    }
    for (int h = 0; h < n_heads; ++h) {
      float *v = x + (t * n_heads + h) * head_dim;
      if (style == model::RopeStyle::kNeox) {
        for (int i = 0; i < half; ++i) {
          float x0 = v[i], x1 = v[i + half];
          v[i] = x0 * c[i] - x1 * s[i];
          v[i + half] = x1 * c[i] + x0 * s[i];
        }
      } else {
        for (int i = 0; i < half; ++i) {
          float x0 = v[2 * i], x1 = v[2 * i + 1];
          v[2 * i] = x0 * c[i] - x1 * s[i];
          v[2 * i + 1] = x1 * c[i] + x0 * s[i];
        }
      }
    }
  }
}

void CpuBackend::Attention(const float *q, const model::KvView &kv, int64_t n_tok, int pos0, int n_head,
                           int n_head_kv, int head_dim, int window, float *out, const model::AttentionParams &p) {
  const int group = n_head / n_head_kv;
  const float scale = p.scale != 0.f ? p.scale : 1.0f / std::sqrt(static_cast<float>(head_dim));
  // Latent attention reads its values from the k rows (the first v_dim floats, shared by all heads).
  const int v_dim = p.latent ? p.v_dim : head_dim;
  pool_.ParallelFor(n_tok * n_head, 1, [&](int64_t i0, int64_t i1, int) {
    std::vector<float> scores;
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t t = i / n_head;
      const int h = static_cast<int>(i % n_head);
      const int kvh = h / group;
      const int pos = pos0 + static_cast<int>(t);
      const int first = window > 0 ? std::max(0, pos - window + 1) : 0;
      const float *qh = q + (t * n_head + h) * head_dim;
      scores.resize(pos + 1 - first);
      float mx = -INFINITY;
      // A masked position takes no part: no score, no weight, no value (the same numbers as if
      // it were absent from the sequence's keys).
      for (int j = first; j <= pos; ++j) {
        if (j != pos && kv.is_masked(j)) continue;
        float sc = Dot(qh, kv.k_row(j) + kvh * head_dim, head_dim) * scale;
        scores[j - first] = sc;
        mx = std::max(mx, sc);
      }
      // A sink is one more logit in the softmax whose value row is zero.
      const float sink = p.sinks != nullptr ? p.sinks[h] : -INFINITY;
      mx = std::max(mx, sink);
      float sum = 0.f;
      for (int j = first; j <= pos; ++j) {
        if (j != pos && kv.is_masked(j)) continue;
        float &sc = scores[j - first];
        sc = std::exp(sc - mx);
        sum += sc;
      }
      if (p.sinks != nullptr) sum += std::exp(sink - mx);
      const float inv = 1.0f / sum;
      float *o = out + (t * n_head + h) * v_dim;
      std::fill(o, o + v_dim, 0.f);
      for (int j = first; j <= pos; ++j) {
        if (j != pos && kv.is_masked(j)) continue;
        const float pj = scores[j - first] * inv;
        const float *vj = p.latent ? kv.k_row(j) : kv.v_row(j) + kvh * head_dim;
        for (int d = 0; d < v_dim; ++d) o[d] += pj * vj[d];
      }
    }
  });
}

void CpuBackend::ExpertFfn(const model::ExpertWeights &e, const float *x, int64_t n_tok, float *y) {
  const int64_t n_ff = e.input_major ? e.down.rows : e.gate.rows;
  const int64_t n_embd = e.input_major ? e.gate.rows : e.down.rows;
  std::vector<float> g(n_tok * n_ff), u(n_tok * n_ff);
  if (e.input_major) {
    // gu (n_tok, 2 n_ff) = x · gate_up, gate and up in alternating columns; bias before the split.
    std::vector<float> gu(n_tok * 2 * n_ff), row(2 * n_ff);
    MatMulInputMajor(e.gate, x, n_tok, gu.data(), row.data());
    for (int64_t t = 0; t < n_tok; ++t) {
      for (int64_t f = 0; f < n_ff; ++f) {
        float a = gu[t * 2 * n_ff + 2 * f], b = gu[t * 2 * n_ff + 2 * f + 1];
        if (e.gate_bias.tensor != nullptr) {
          a += e.gate_bias.values[2 * f];
          b += e.gate_bias.values[2 * f + 1];
        }
        g[t * n_ff + f] = a;
        u[t * n_ff + f] = b;
      }
    }
  } else {
    MatMul(e.gate, x, n_tok, g.data());
    MatMul(e.up, x, n_tok, u.data());
    for (int64_t t = 0; t < n_tok; ++t) {
      for (int64_t f = 0; f < n_ff; ++f) {
        if (e.gate_bias.tensor != nullptr) g[t * n_ff + f] += e.gate_bias.values[f];
        if (e.up_bias.tensor != nullptr) u[t * n_ff + f] += e.up_bias.values[f];
      }
    }
  }
  const float limit = e.swiglu_limit;
  for (int64_t i = 0; i < n_tok * n_ff; ++i) {
    if (limit > 0.f) {
      // gpt-oss: gate clamped above, up clamped both ways, sigmoid(1.702 g), (up + 1)
      const float a = std::min(g[i], limit);
      const float b = std::min(std::max(u[i], -limit), limit);
      g[i] = (b + 1.0f) * (a / (1.0f + std::exp(-1.702f * a)));
    } else {
      const float a = g[i];
      g[i] = (a / (1.0f + std::exp(-a))) * u[i];
    }
  }
  if (e.input_major) {
    std::vector<float> row(n_embd);
    MatMulInputMajor(e.down, g.data(), n_tok, y, row.data());
  } else {
    MatMul(e.down, g.data(), n_tok, y);
  }
  if (e.down_bias.tensor != nullptr) {
    for (int64_t t = 0; t < n_tok; ++t)
      for (int64_t d = 0; d < n_embd; ++d) y[t * n_embd + d] += e.down_bias.values[d];
  }
}

// y (n_tok, w.cols) = x (n_tok, w.rows) · w for an input-major matrix: each row is decoded once and
// accumulated into every token's output in row order (same order whatever n_tok).
void CpuBackend::MatMulInputMajor(const model::Matrix &w, const float *x, int64_t n_tok, float *y, float *row) {
  const int64_t rows = w.rows, cols = w.cols;
  std::fill(y, y + n_tok * cols, 0.f);
  for (int64_t r = 0; r < rows; ++r) {
    w.codec->dequantize(w.row(r), row, cols);
    for (int64_t t = 0; t < n_tok; ++t) {
      const float xv = x[t * rows + r];
      float *yt = y + t * cols;
      for (int64_t c = 0; c < cols; ++c) yt[c] += xv * row[c];
    }
  }
}

}  // namespace strata::cpu
