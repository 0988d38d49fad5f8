// The CPU backend's attention: tiled over query blocks and key tiles with an online softmax, so a
// prompt of n tokens never holds an n x n score matrix, threaded over (key/value head, query block,
// group of query heads). Keys and values are read in the cache's type (f32 in place; f16 and q8_0
// decoded a tile at a time into a small float buffer).
//
// Numbers: every (query row, head) is reduced over the key tiles of a fixed grid (kKeyTile
// positions, aligned to absolute positions) in ascending order, and within a tile over its keys in
// ascending order, whatever the query block, the thread or the number of tokens in the call. So a
// row's output is the same computed alone (a decode step), in a prompt of any length, with any
// thread count and with any memory budget.
#include "backends/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace strata::cpu {

namespace {

constexpr int kQueryBlock = 16;  // query rows a task carries
constexpr int kKeyTile = 64;     // keys decoded and scored together; a divisor of kKvBlockTokens
static_assert(model::kKvBlockTokens % kKeyTile == 0, "key tiles never straddle a KV block");

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

// Rows [ks, ke) of a tile as float pointers: in place for f32, else decoded into buf.
void TileRows(const model::KvView &kv, bool values, int ks, int ke, int col, int width, std::vector<float> *buf,
              std::vector<const float *> *rows) {
  const model::KvType type = values ? kv.v_type : kv.k_type;
  rows->assign(static_cast<size_t>(ke - ks), nullptr);
  if (type == model::KvType::kF32) {
    for (int j = ks; j < ke; ++j) (*rows)[j - ks] = (values ? kv.v_row_f32(j) : kv.k_row_f32(j)) + col;
    return;
  }
  buf->resize(static_cast<size_t>(ke - ks) * width);
  for (int j = ks; j < ke; ++j) {
    float *dst = buf->data() + static_cast<size_t>(j - ks) * width;
    model::DecodeKvCols(type, values ? kv.v_row(j) : kv.k_row(j), col, width, dst);
    (*rows)[j - ks] = dst;
  }
}

}  // namespace

void TiledAttention(ThreadPool &pool, const float *q, const model::KvView &kv, int64_t n_tok, int pos0, int n_head,
                    int n_head_kv, int head_dim, int window, float *out, const model::AttentionParams &p) {
  if (n_tok <= 0) return;
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
    std::vector<float> kbuf, vbuf, m, l, acc, sc;
    std::vector<const float *> krows, vrows;
    for (int64_t task = i0; task < i1; ++task) {
      const int split = static_cast<int>(task % splits);
      const int64_t qb = task / splits % n_qb;
      const int kvh = static_cast<int>(task / splits / n_qb);
      const int h0 = kvh * group + split * group / splits, h1 = kvh * group + (split + 1) * group / splits;
      const int nh = h1 - h0;
      const int64_t t0 = qb * kQueryBlock, t1 = std::min<int64_t>(n_tok, t0 + kQueryBlock);
      const int nq = static_cast<int>(t1 - t0);
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
        TileRows(kv, false, ks, ke, k_col, head_dim, &kbuf, &krows);
        if (p.latent) {
          vrows = krows;
        } else {
          TileRows(kv, true, ks, ke, v_col, v_dim, &vbuf, &vrows);
        }
        sc.resize(static_cast<size_t>(ke - ks));
        for (int hh = 0; hh < nh; ++hh) {
          for (int r = 0; r < nq; ++r) {
            const int pos = pos0 + static_cast<int>(t0) + r;
            // This row's keys in the tile; masked positions take no part (no score, no weight, no
            // value: the numbers as if they were absent), its own position always does.
            const int a = std::max(ks, first_of(pos)), b = std::min(ke, pos + 1);
            if (a >= b) continue;
            const float *qh = q + ((t0 + r) * n_head + h0 + hh) * head_dim;
            float mt = -INFINITY;
            bool any = false;
            for (int j = a; j < b; ++j) {
              if (j != pos && kv.is_masked(j)) continue;
              const float s = Dot8(qh, krows[j - ks], head_dim) * scale;
              sc[j - ks] = s;
              mt = std::max(mt, s);
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
            for (int j = a; j < b; ++j) {
              if (j != pos && kv.is_masked(j)) continue;
              const float e = std::exp(sc[j - ks] - m_new);
              l[st] += e;
              const float *vj = vrows[j - ks];
              for (int d = 0; d < v_dim; ++d) o[d] += e * vj[d];
            }
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
