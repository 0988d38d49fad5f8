// The CPU backend's attention over a KV cache of any KvType (backends/cpu/attention.cc), with its
// per-tile kernels: a baseline x86-64 set and an AVX2 + F16C set (kernels/attention_avx2.cc) that
// gives the same bits.
#pragma once

#include <cstdint>

#include "backends/cpu/kernels/kernels.h"
#include "lib/model/backend.h"
#include "lib/util/thread_pool.h"

namespace strata::cpu {

// Backend::Attention on the host: q (n_tok, n_head, head_dim) at positions pos0.. -> out (n_tok,
// n_head, head_dim or p.v_dim when p.latent), over kv's rows in their types, tiled (query blocks x
// key tiles, online softmax) and threaded over pool. A row's numbers depend only on its own query,
// position and keys: not on n_tok, on where the call starts, on the thread count or on the isa.
// isa: kScalar runs the baseline kernels; kAvx2 or kAvx512 the AVX2 + F16C ones, which only a
// machine whose kernels::BestIsa() is kAvx2 or kAvx512 may ask for. The overload without it takes
// kernels::BestIsa().
void TiledAttention(ThreadPool &pool, const float *q, const model::KvView &kv, int64_t n_tok, int pos0, int n_head,
                    int n_head_kv, int head_dim, int window, float *out, const model::AttentionParams &p,
                    kernels::Isa isa);
void TiledAttention(ThreadPool &pool, const float *q, const model::KvView &kv, int64_t n_tok, int pos0, int n_head,
                    int n_head_kv, int head_dim, int window, float *out, const model::AttentionParams &p);

namespace internal {

// The operations TiledAttention runs on a key tile, one set per instruction set. A tile's rows are
// handed over as row addresses in the cache's type t (a row of `width` columns from column col on);
// every set computes the same numbers, operation for operation.
struct AttentionKernels {
  // out (n floats) = columns [c0, c0 + n) of a row stored in type t, as model::DecodeKvCols gives them.
  void (*decode)(model::KvType t, const uint8_t *row, int c0, int n, float *out);
  // s[i] = Dot8(q, row i) * scale for i < n (Dot8: element e of the width into partial sum e % 8,
  // in ascending e, then ((p0 + p4) + (p1 + p5)) + ((p2 + p6) + (p3 + p7))).
  void (*scores)(const float *q, const uint8_t *const *rows, int n, model::KvType t, int col, int width, float scale,
                 float *s);
  // o[d] += e[i] * row i [d] for i = 0, 1, .., n - 1 in turn (d < width): one rounded product and
  // one rounded sum each.
  void (*accumulate)(float *o, const float *e, const uint8_t *const *rows, int n, model::KvType t, int col,
                     int width);
  // Whether scores and accumulate read f16 and q8_0 rows themselves (false: f32 rows only, so
  // TiledAttention decodes every other tile first).
  bool reads_any_type;
};

// The AVX2 + F16C set (kernels/attention_avx2.cc, built with -mavx2 -mfma -mf16c): only for a
// machine whose kernels::BestIsa() is kAvx2 or kAvx512.
const AttentionKernels &Avx2AttentionKernels();

}  // namespace internal

}  // namespace strata::cpu
