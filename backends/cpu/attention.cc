// The CPU backend's attention: tiled over query blocks and key tiles with an online softmax, so a
// prompt of n tokens never holds an n x n score matrix, threaded over (key/value head, query block,
// group of query heads). Keys and values are read in the cache's type: f32 in place; f16 and q8_0
// in place by kernels that widen them as they go (AVX2 + F16C), else decoded a tile at a time into a
// small float buffer (the baseline kernels, and any tile enough query rows share).
//
// Numbers: every (query row, head) is reduced over the key tiles of a fixed grid (kKeyTile
// positions, aligned to absolute positions) in ascending order, and within a tile over its keys in
// ascending order, whatever the query block, the thread or the number of tokens in the call. So a
// row's output is the same computed alone (a decode step), in a prompt of any length, with any
// thread count and with any memory budget. The kernel sets (internal::AttentionKernels) compute the
// same operations in the same order, and both call std::exp for every weight, so the instruction
// set changes no bit either.
#include "backends/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace strata::cpu {

namespace {

using internal::AttentionKernels;

constexpr int kQueryBlock = 16;  // query rows a task carries
constexpr int kKeyTile = 64;     // keys decoded and scored together; a divisor of kKvBlockTokens
static_assert(model::kKvBlockTokens % kKeyTile == 0, "key tiles never straddle a KV block");
// A task whose (head, query row) pairs number at least this decodes its f16 and q8_0 tiles once
// into floats even when its kernels read those types in place: each widened value then serves
// every pair, where in place it would be widened again for each.
constexpr int kDecodeReuse = 4;

// ---- the baseline kernels (f32 rows only: TiledAttention decodes other tiles for them) ----

// The dot product of the CPU backend's row kernels (8 partial sums, fixed order).
float Dot8(const float *a, const float *b, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
  }
  for (; i < n; ++i) acc[i & 7] += a[i] * b[i];
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

void ScoresBaseline(const float *q, const uint8_t *const *rows, int n, model::KvType, int col, int width,
                    float scale, float *s) {
  for (int i = 0; i < n; ++i) s[i] = Dot8(q, reinterpret_cast<const float *>(rows[i]) + col, width) * scale;
}

void AccumulateBaseline(float *o, const float *e, const uint8_t *const *rows, int n, model::KvType, int col,
                        int width) {
  for (int i = 0; i < n; ++i) {
    const float *v = reinterpret_cast<const float *>(rows[i]) + col;
    for (int d = 0; d < width; ++d) o[d] += e[i] * v[d];
  }
}

constexpr AttentionKernels kBaselineKernels = {&model::DecodeKvCols, &ScoresBaseline, &AccumulateBaseline, false};

// ---- tiles ----

// A tile's rows as the kernels take them: row addresses in `type`, each read from column col.
struct Tile {
  const uint8_t *rows[kKeyTile];
  model::KvType type;
  int col;
};

// Rows [ks, ke) of the keys (values) from column col, width wide: the cache's rows in place when
// they are f32 or in_place, else decoded by kn.decode into buf (f32 rows from column 0).
void GatherTile(const model::KvView &kv, bool values, int ks, int ke, int col, int width, bool in_place,
                const AttentionKernels &kn, std::vector<float> *buf, Tile *tile) {
  const model::KvType type = values ? kv.v_type : kv.k_type;
  if (type == model::KvType::kF32 || in_place) {
    for (int j = ks; j < ke; ++j) tile->rows[j - ks] = values ? kv.v_row(j) : kv.k_row(j);
    tile->type = type;
    tile->col = col;
    return;
  }
  buf->resize(static_cast<size_t>(ke - ks) * width);
  for (int j = ks; j < ke; ++j) {
    float *dst = buf->data() + static_cast<size_t>(j - ks) * width;
    kn.decode(type, values ? kv.v_row(j) : kv.k_row(j), col, width, dst);
    tile->rows[j - ks] = reinterpret_cast<const uint8_t *>(dst);
  }
  tile->type = model::KvType::kF32;
  tile->col = 0;
}

}  // namespace

void TiledAttention(ThreadPool &pool, const float *q, const model::KvView &kv, int64_t n_tok, int pos0, int n_head,
                    int n_head_kv, int head_dim, int window, float *out, const model::AttentionParams &p) {
  TiledAttention(pool, q, kv, n_tok, pos0, n_head, n_head_kv, head_dim, window, out, p, kernels::BestIsa());
}

void TiledAttention(ThreadPool &pool, const float *q, const model::KvView &kv, int64_t n_tok, int pos0, int n_head,
                    int n_head_kv, int head_dim, int window, float *out, const model::AttentionParams &p,
                    kernels::Isa isa) {
  if (n_tok <= 0) return;
#if defined(__x86_64__)
  const AttentionKernels &kn = isa == kernels::Isa::kScalar ? kBaselineKernels : internal::Avx2AttentionKernels();
#else
  const AttentionKernels &kn = kBaselineKernels;
#endif
  const int group = n_head / n_head_kv;
  const float scale = p.scale != 0.f ? p.scale : 1.0f / std::sqrt(static_cast<float>(head_dim));
  // Latent attention reads its values from the k rows (the first v_dim floats, shared by all heads).
  const int v_dim = p.latent ? p.v_dim : head_dim;
  const int64_t n_qb = (n_tok + kQueryBlock - 1) / kQueryBlock;
  // Heads of a group share their decoded tiles; a group is split when that leaves threads idle.
  const int64_t want = 2 * static_cast<int64_t>(pool.size());
  const int splits = static_cast<int>(
      std::min<int64_t>(group, std::max<int64_t>(1, (want + n_head_kv * n_qb - 1) / (n_head_kv * n_qb))));
  const int64_t n_tasks = static_cast<int64_t>(n_head_kv) * n_qb * splits;
  pool.ParallelFor(n_tasks, 1, [&](int64_t i0, int64_t i1, int) {
    std::vector<float> kbuf, vbuf, m, l, acc;
    Tile kt, vt;
    float sc[kKeyTile], ew[kKeyTile];
    const uint8_t *vr[kKeyTile];
    for (int64_t task = i0; task < i1; ++task) {
      const int split = static_cast<int>(task % splits);
      const int64_t qb = task / splits % n_qb;
      const int kvh = static_cast<int>(task / splits / n_qb);
      const int h0 = kvh * group + split * group / splits, h1 = kvh * group + (split + 1) * group / splits;
      const int nh = h1 - h0;
      const int64_t t0 = qb * kQueryBlock, t1 = std::min<int64_t>(n_tok, t0 + kQueryBlock);
      const int nq = static_cast<int>(t1 - t0);
      const bool in_place = kn.reads_any_type && nh * nq < kDecodeReuse;
      // Row state per (head, row): running max m, sum l, weighted values acc. A sink is one more
      // logit in the softmax whose value row is zero: it starts the sum at exp(sink - sink) = 1.
      m.assign(static_cast<size_t>(nh) * nq, -INFINITY);
      l.assign(static_cast<size_t>(nh) * nq, 0.f);
      acc.assign(static_cast<size_t>(nh) * nq * v_dim, 0.f);
      if (p.sinks != nullptr) {
        for (int hh = 0; hh < nh; ++hh) {
          std::fill(m.begin() + hh * nq, m.begin() + (hh + 1) * nq, p.sinks[h0 + hh]);
          std::fill(l.begin() + hh * nq, l.begin() + (hh + 1) * nq, 1.f);
        }
      }
      auto first_of = [&](int pos) { return window > 0 ? std::max(0, pos - window + 1) : 0; };
      const int lo = first_of(pos0 + static_cast<int>(t0)), hi = pos0 + static_cast<int>(t1) - 1;
      const int k_col = p.latent ? 0 : kvh * head_dim, v_col = p.latent ? 0 : kvh * head_dim;
      for (int tile = lo / kKeyTile * kKeyTile; tile <= hi; tile += kKeyTile) {
        const int ks = std::max(tile, lo), ke = std::min(tile + kKeyTile, hi + 1);
        GatherTile(kv, false, ks, ke, k_col, head_dim, in_place, kn, &kbuf, &kt);
        // Latent values are the key rows' first v_dim columns.
        const Tile &vtile = p.latent ? kt : vt;
        if (!p.latent) GatherTile(kv, true, ks, ke, v_col, v_dim, in_place, kn, &vbuf, &vt);
        for (int hh = 0; hh < nh; ++hh) {
          for (int r = 0; r < nq; ++r) {
            const int pos = pos0 + static_cast<int>(t0) + r;
            // This row's keys in the tile; masked positions take no part (no score, no weight, no
            // value: the numbers as if they were absent), its own position always does. Their
            // scores are computed with the rest and left unread.
            const int a = std::max(ks, first_of(pos)), b = std::min(ke, pos + 1);
            if (a >= b) continue;
            const float *qh = q + ((t0 + r) * n_head + h0 + hh) * head_dim;
            kn.scores(qh, kt.rows + (a - ks), b - a, kt.type, kt.col, head_dim, scale, sc + (a - ks));
            float mt = -INFINITY;
            bool any = false;
            for (int j = a; j < b; ++j) {
              if (j != pos && kv.is_masked(j)) continue;
              mt = std::max(mt, sc[j - ks]);
              any = true;
            }
            if (!any) continue;
            const size_t st = static_cast<size_t>(hh) * nq + r;
            float *o = acc.data() + st * v_dim;
            const float m_new = std::max(m[st], mt);
            if (m_new != m[st]) {
              const float alpha = std::exp(m[st] - m_new);
              l[st] *= alpha;
              for (int d = 0; d < v_dim; ++d) o[d] *= alpha;
              m[st] = m_new;
            }
            int n = 0;
            for (int j = a; j < b; ++j) {
              if (j != pos && kv.is_masked(j)) continue;
              const float e = std::exp(sc[j - ks] - m_new);
              l[st] += e;
              ew[n] = e;
              vr[n++] = vtile.rows[j - ks];
            }
            kn.accumulate(o, ew, vr, n, vtile.type, vtile.col, v_dim);
          }
        }
      }
      for (int hh = 0; hh < nh; ++hh) {
        for (int r = 0; r < nq; ++r) {
          const size_t st = static_cast<size_t>(hh) * nq + r;
          const float inv = 1.0f / l[st];
          const float *o = acc.data() + st * v_dim;
          float *dst = out + ((t0 + r) * n_head + h0 + hh) * v_dim;
          for (int d = 0; d < v_dim; ++d) dst[d] = o[d] * inv;
        }
      }
    }
  });
}

}  // namespace strata::cpu
