// CPU backend kernels. MatMul hands each weight row to a row-dot kernel kMaxTokens tokens at a time
// (the row is read from memory once per call); every (row, token) result comes from the same kernel
// operations whatever the batch size or thread split. Other ops reduce in a fixed order (8 lanes).
#include "backends/cpu/cpu_backend.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "backends/cpu/attention.h"
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
  // Without device tables: the layer's own weights only.
  if (a.weights == nullptr || a.tables_only || n <= 0 || a.n_embd <= 0) return false;
  Route(a.route, a.logits, a.n_tok, a.sel, a.wts);
  const model::ExpertGroups g = model::GroupByExpert(a.sel, a.n_tok, k, a.route.n_expert);
  std::copy(g.idx.begin(), g.idx.end(), a.idx);
  GatherRows(a.h, a.n_embd, a.idx, n, a.xg);
  std::vector<const model::ExpertWeights *> ew(g.used.size());
  for (size_t u = 0; u < g.used.size(); ++u) ew[u] = &a.weights->experts[g.used[u]];
  ExpertsFfn(ew.data(), static_cast<int>(ew.size()), g.first.data(), a.xg, a.yg, a.n_embd);
  WeightedRowSum(a.yg, a.idx + n, a.wts, a.n_tok, k, a.n_embd, a.out);
  return true;
}

void CpuBackend::MatMulInputMajor(const model::Matrix &w, const float *x, int64_t n_tok, float *y) {
  std::vector<float> row(w.cols);
  MatMulInputMajor(w, x, n_tok, y, row.data());
}

CpuBackend::CpuBackend(int n_threads, MatMulMode mode, kernels::Isa isa, int pool_spin)
    : pool_(n_threads, pool_spin), mode_(mode), isa_(isa == kernels::Isa::kAvx2 ? kernels::BestIsa() : isa) {}

CpuBackend::MatOp CpuBackend::PrepareMatOp(const model::Matrix &w, const float *x, int64_t n_tok, float *y) const {
  MatOp op;
  op.w = &w;
  op.k = kernels::FindRowKernels(*w.codec, isa_);
  op.q8 = mode_ == MatMulMode::kQ8Activations && op.k.dot_q8 != nullptr;
  op.x = x;
  op.n_tok = n_tok;
  op.y = y;
  op.xq_stride = op.q8 ? kernels::ActRowBytes(op.k.act, w.cols) : 0;
  return op;
}

// q8 mode: each token's activations are quantized once, by one scalar routine, so a token gets the
// same codes alone or in a batch.
void CpuBackend::QuantizeRows(const MatOp &op, int64_t t0, int64_t t1) {
  for (int64_t t = t0; t < t1; ++t) {
    kernels::QuantizeActivations(op.k.act, op.x + t * op.w->cols, op.w->cols, op.xq + t * op.xq_stride);
  }
}

void CpuBackend::RunRow(const MatOp &op, int64_t r, int64_t t_begin, int64_t t_end) {
  const model::Matrix &w = *op.w;
  const int64_t rows = w.rows, cols = w.cols;
  float out[kernels::kMaxTokens];
  const uint8_t *row = w.row(r);
  for (int64_t t0 = t_begin; t0 < t_end; t0 += kernels::kMaxTokens) {
    const int nt = static_cast<int>(std::min<int64_t>(kernels::kMaxTokens, t_end - t0));
    if (op.q8) {
      op.k.dot_q8(*w.codec, row, op.xq + t0 * op.xq_stride, op.xq_stride, nt, cols, out);
    } else {
      op.k.dot_float(*w.codec, row, op.x + t0 * cols, cols, nt, cols, out);
    }
    for (int t = 0; t < nt; ++t) op.y[(t0 + t) * rows + r] = out[t];
  }
}

// Rows [r0, r1) of op for every token. With many tokens a row does not sweep all of their
// activations (megabytes for a prompt's projections, read again for every row): rows go in blocks
// whose weights stay in the cache, and each block meets the tokens a tile at a time, a tile's
// activations staying in the cache across the block's rows. A token's sums are the kernel's
// whatever the order (its operations do not depend on which tokens share a call).
void CpuBackend::RunRows(const MatOp &op, int64_t r0, int64_t r1) {
  constexpr int64_t kRowBlock = 32, kTileBytes = 128 * 1024;
  const int64_t token_bytes = op.q8 ? op.xq_stride : op.w->cols * static_cast<int64_t>(sizeof(float));
  const int64_t tile = std::max<int64_t>(kernels::kMaxTokens, kTileBytes / std::max<int64_t>(1, token_bytes)) /
                       kernels::kMaxTokens * kernels::kMaxTokens;
  if (op.n_tok <= tile) {
    for (int64_t r = r0; r < r1; ++r) RunRow(op, r, 0, op.n_tok);
    return;
  }
  for (int64_t rb = r0; rb < r1; rb += kRowBlock) {
    const int64_t re = std::min(r1, rb + kRowBlock);
    for (int64_t t0 = 0; t0 < op.n_tok; t0 += tile) {
      const int64_t t1 = std::min(op.n_tok, t0 + tile);
      for (int64_t r = rb; r < re; ++r) RunRow(op, r, t0, t1);
    }
  }
}

namespace {

// The part p of a flattened range that item i falls in: start[p] <= i < start[p + 1].
size_t PartOf(const std::vector<int64_t> &start, int64_t i) {
  return static_cast<size_t>(std::upper_bound(start.begin(), start.end(), i) - start.begin()) - 1;
}

}  // namespace

// Gives each operation its quantized-activation space in `store`; an operation whose input and
// activation format match an earlier one's (in q8 mode) shares that one's codes instead.
void CpuBackend::PlaceActivations(const std::vector<MatOp *> &ops, std::vector<uint8_t> *store) {
  size_t bytes = 0;
  for (const MatOp *op : ops) bytes += static_cast<size_t>(op->xq_stride * op->n_tok);
  store->resize(bytes);
  size_t at = 0;
  for (size_t i = 0; i < ops.size(); ++i) {
    MatOp &op = *ops[i];
    if (!op.q8) continue;
    for (size_t j = 0; j < i && !op.xq_shared; ++j) {
      const MatOp &o = *ops[j];
      if (o.q8 && !o.xq_shared && o.x == op.x && o.n_tok == op.n_tok && o.k.act == op.k.act &&
          o.w->cols == op.w->cols) {
        op.xq = o.xq;
        op.xq_shared = true;
      }
    }
    if (op.xq_shared) continue;
    op.xq = store->data() + at;
    at += static_cast<size_t>(op.xq_stride * op.n_tok);
  }
}

// Quantizes the operations' activations (q8 mode), then runs every output row of all of them in one
// parallel loop.
void CpuBackend::RunOps(const std::vector<MatOp *> &ops) {
  if (observer_ != nullptr) {
    for (const MatOp *op : ops) observer_->OnProduct(*op->w, op->x, op->n_tok);
  }
  std::vector<const MatOp *> qlist;
  std::vector<int64_t> qstart{0}, start{0};
  int64_t max_cols_tok = 1;  // the most multiply-adds a row takes
  for (const MatOp *op : ops) {
    start.push_back(start.back() + op->w->rows);
    max_cols_tok = std::max(max_cols_tok, op->w->cols * op->n_tok);
    if (!op->q8 || op->xq_shared) continue;
    qlist.push_back(op);
    qstart.push_back(qstart.back() + op->n_tok);
  }
  if (qstart.back() > 0) {
    pool_.ParallelFor(qstart.back(), 8, [&](int64_t i0, int64_t i1, int) {
      for (int64_t i = i0; i < i1; ++i) {
        const size_t o = PartOf(qstart, i);
        QuantizeRows(*qlist[o], i - qstart[o], i - qstart[o] + 1);
      }
    });
  }
  if (start.back() == 0) return;
  // Enough rows per chunk that waking threads pays off.
  const int64_t min_chunk = std::max<int64_t>(1, 16384 / max_cols_tok);
  pool_.ParallelFor(start.back(), min_chunk, [&](int64_t i0, int64_t i1, int) {
    for (size_t o = PartOf(start, i0); i0 < i1; ++o) {
      const int64_t stop = std::min(i1, start[o + 1]);
      if (stop > i0) RunRows(*ops[o], i0 - start[o], stop - start[o]);
      i0 = stop;
    }
  });
}

void CpuBackend::MatMul(const model::Matrix &w, const float *x, int64_t n_tok, float *y) {
  if (w.rows <= 0 || n_tok <= 0) return;
  MatOp op = PrepareMatOp(w, x, n_tok, y);
  std::vector<uint8_t> xq;
  PlaceActivations({&op}, &xq);
  RunOps({&op});
}

// The attention projections over one input: its activations quantized once, one parallel loop.
void CpuBackend::MatMulMany(const model::Matrix *const *ws, float *const *ys, int n, const float *x, int64_t n_tok) {
  if (n_tok <= 0) return;
  std::vector<MatOp> ops;
  ops.reserve(n);
  for (int i = 0; i < n; ++i) ops.push_back(PrepareMatOp(*ws[i], x, n_tok, ys[i]));
  std::vector<MatOp *> list;
  for (MatOp &op : ops) list.push_back(&op);
  std::vector<uint8_t> xq;
  PlaceActivations(list, &xq);
  RunOps(list);
}

// Every expert's gate and up rows in one parallel loop, the SwiGLU, then every down row in one
// more: the operations ExpertFfn runs per expert, each row by RunRow as MatMul runs it (the same
// bits), in two loops a layer instead of two or three per expert.
void CpuBackend::ExpertsFfn(const model::ExpertWeights *const *ew, int n, const int64_t *first, const float *xg,
                            float *yg, int64_t width) {
  std::vector<int> fused;
  for (int u = 0; u < n; ++u) {
    if (ew[u] == nullptr || first[u + 1] <= first[u]) continue;
    if (ew[u]->input_major) {  // gpt-oss's layout keeps its own path
      ExpertFfn(*ew[u], xg + first[u] * width, first[u + 1] - first[u], yg + first[u] * width);
    } else {
      fused.push_back(u);
    }
  }
  if (fused.empty()) return;
  using Clock = std::chrono::steady_clock;
  Clock::time_point t0, t1, t2, t3;
  if (ffn_times_ != nullptr) t0 = Clock::now();
  // Per fused expert: its gate, up and down operations; h holds gate then up outputs.
  const size_t m = fused.size();
  std::vector<MatOp> ops(3 * m);
  std::vector<size_t> h_at(m + 1, 0);
  for (size_t i = 0; i < m; ++i) {
    const model::ExpertWeights &e = *ew[fused[i]];
    h_at[i + 1] = h_at[i] + static_cast<size_t>(2 * (first[fused[i] + 1] - first[fused[i]]) * e.gate.rows);
  }
  std::vector<float> h(h_at[m]);
  for (size_t i = 0; i < m; ++i) {
    const int u = fused[i];
    const model::ExpertWeights &e = *ew[u];
    const int64_t nt = first[u + 1] - first[u], n_ff = e.gate.rows;
    float *g = h.data() + h_at[i], *up = g + nt * n_ff;
    ops[3 * i] = PrepareMatOp(e.gate, xg + first[u] * width, nt, g);
    ops[3 * i + 1] = PrepareMatOp(e.up, xg + first[u] * width, nt, up);
    ops[3 * i + 2] = PrepareMatOp(e.down, g, nt, yg + first[u] * width);
  }
  std::vector<MatOp *> gate_up, down;
  for (size_t i = 0; i < m; ++i) {
    gate_up.push_back(&ops[3 * i]);
    gate_up.push_back(&ops[3 * i + 1]);  // up shares gate's quantized input
    down.push_back(&ops[3 * i + 2]);
  }
  std::vector<uint8_t> xq_gate_up, xq_down;
  PlaceActivations(gate_up, &xq_gate_up);
  PlaceActivations(down, &xq_down);
  if (ffn_times_ != nullptr) t1 = Clock::now();
  RunOps(gate_up);
  if (ffn_times_ != nullptr) t2 = Clock::now();
  // The SwiGLU of every expert's units in one parallel loop: each unit on its own (the same bits
  // whatever the split), where one thread took ~5 us an expert.
  std::vector<int64_t> act_at(m + 1, 0);
  for (size_t i = 0; i < m; ++i) act_at[i + 1] = act_at[i] + static_cast<int64_t>(h_at[i + 1] - h_at[i]) / 2;
  pool_.ParallelFor(act_at[m], 128, [&](int64_t b, int64_t end, int) {
    for (size_t i = PartOf(act_at, b); b < end; ++i) {
      const model::ExpertWeights &e = *ew[fused[i]];
      const int64_t stop = std::min(end, act_at[i + 1]), units = act_at[i + 1] - act_at[i];
      float *g = h.data() + h_at[i];
      GateUpActivation(e, g, g + units, e.gate.rows, b - act_at[i], stop - act_at[i], false);
      b = stop;
    }
  });
  if (ffn_times_ != nullptr) t3 = Clock::now();
  RunOps(down);
  for (size_t i = 0; i < m; ++i) AddDownBias(*ew[fused[i]], ops[3 * i + 2].y, ops[3 * i].n_tok, width);
  if (ffn_times_ != nullptr) {
    auto secs = [](Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); };
    ExpertsFfnTimes &ft = *ffn_times_;
    ++ft.calls;
    ft.setup_s += secs(t0, t1);
    ft.gate_up_s += secs(t1, t2);
    ft.act_s += secs(t2, t3);
    ft.down_s += secs(t3, Clock::now());
  }
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
  TiledAttention(pool_, q, kv, n_tok, pos0, n_head, n_head_kv, head_dim, window, out, p, isa_);
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
  }
  GateUpActivation(e, g.data(), u.data(), n_ff, 0, n_tok * n_ff, e.input_major);
  if (e.input_major) {
    std::vector<float> row(n_embd);
    MatMulInputMajor(e.down, g.data(), n_tok, y, row.data());
  } else {
    MatMul(e.down, g.data(), n_tok, y);
  }
  AddDownBias(e, y, n_tok, n_embd);
}

// Units [i0, i1) of g (n_tok, n_ff) = act(gate + gate bias, up + up bias), the biases added here
// unless the caller already did: silu(g) * u, or gpt-oss's clamped form. Each unit on its own, so
// any split of the units gives the same bits.
void CpuBackend::GateUpActivation(const model::ExpertWeights &e, float *g, const float *u, int64_t n_ff,
                                  int64_t i0, int64_t i1, bool biases_added) {
  const bool gb = !biases_added && e.gate_bias.tensor != nullptr, ub = !biases_added && e.up_bias.tensor != nullptr;
  const float limit = e.swiglu_limit;
  for (int64_t i = i0; i < i1; ++i) {
    const float gi = gb ? g[i] + e.gate_bias.values[i % n_ff] : g[i];
    const float ui = ub ? u[i] + e.up_bias.values[i % n_ff] : u[i];
    if (limit > 0.f) {
      // gpt-oss: gate clamped above, up clamped both ways, sigmoid(1.702 g), (up + 1)
      const float a = std::min(gi, limit);
      const float b = std::min(std::max(ui, -limit), limit);
      g[i] = (b + 1.0f) * (a / (1.0f + std::exp(-1.702f * a)));
    } else {
      g[i] = (gi / (1.0f + std::exp(-gi))) * ui;
    }
  }
}

void CpuBackend::AddDownBias(const model::ExpertWeights &e, float *y, int64_t n_tok, int64_t n_embd) {
  if (e.down_bias.tensor == nullptr) return;
  for (int64_t t = 0; t < n_tok; ++t)
    for (int64_t d = 0; d < n_embd; ++d) y[t * n_embd + d] += e.down_bias.values[d];
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
