// AVX2 + F16C kernels of the CPU backend's tiled attention (backends/cpu/attention.cc): scores,
// weighted value sums and tile decoding over f32, f16 and q8_0 cache rows read in place. Entered
// only after BestIsa() said the machine has AVX2 and F16C. Each result is the baseline kernels' bit
// for bit: Dot8's eight partial sums are one register's lanes, reduced in Dot8's order; every
// product and sum is rounded on its own (no fused multiply-add); F16C widens a half exactly, and a
// q8_0 value is the float product of its code and its block's scale, as model::DecodeKvCols gives it.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "backends/cpu/attention.h"
// Last: this file is built with -mfma, and a product contracted into a sum would change the bits.
#include "lib/quant/fp_contract_off.h"

namespace strata::cpu::internal {
namespace {

using model::KvType;

inline float HalfAt(const uint8_t *p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

// Row readers: Load8(row, c) is columns [c, c + 8) of a row as floats, Load1(row, c) column c,
// each as model::DecodeKvCols gives it (c + 8, or c + 1, within the row's width).
struct F32Row {
  static __m256 Load8(const uint8_t *row, int c) { return _mm256_loadu_ps(reinterpret_cast<const float *>(row) + c); }
  static float Load1(const uint8_t *row, int c) { return reinterpret_cast<const float *>(row)[c]; }
};

struct F16Row {
  static __m256 Load8(const uint8_t *row, int c) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i *>(row + 2 * static_cast<size_t>(c))));
  }
  static float Load1(const uint8_t *row, int c) { return HalfAt(row + 2 * static_cast<size_t>(c)); }
};

struct Q8Row {
  static const uint8_t *Block(const uint8_t *row, int c) {
    return row + static_cast<size_t>(c / model::kKvQ8Elems) * model::kKvQ8Bytes;
  }
  static float Load1(const uint8_t *row, int c) {
    const uint8_t *blk = Block(row, c);
    return static_cast<float>(static_cast<int8_t>(blk[2 + c % model::kKvQ8Elems])) * HalfAt(blk);
  }
  static __m256 Load8(const uint8_t *row, int c) {
    const int off = c % model::kKvQ8Elems;
    if (off + 8 > model::kKvQ8Elems) {
      // The eight straddle two blocks (a column offset that is not a multiple of 8).
      float t[8];
      for (int k = 0; k < 8; ++k) t[k] = Load1(row, c + k);
      return _mm256_loadu_ps(t);
    }
    const uint8_t *blk = Block(row, c);
    const __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i *>(blk + 2 + off));
    return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), _mm256_set1_ps(HalfAt(blk)));
  }
};

// Dot8's final reduction of four partial-sum registers at once: lane k of the result is
// ((p0 + p4) + (p1 + p5)) + ((p2 + p6) + (p3 + p7)) of a_k.
inline __m128 Reduce4(__m256 a0, __m256 a1, __m256 a2, __m256 a3) {
  const auto half = [](__m256 v) { return _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1)); };
  return _mm_hadd_ps(_mm_hadd_ps(half(a0), half(a1)), _mm_hadd_ps(half(a2), half(a3)));
}

// Dot8's final reduction of partial sums held in memory.
inline float Reduce8(const float *p) {
  return ((p[0] + p[4]) + (p[1] + p[5])) + ((p[2] + p[6]) + (p[3] + p[7]));
}

// Four keys at a time, each in its own register (independent chains hide the add's latency); a
// short last group repeats its last row and drops those results.
template <typename R>
void ScoresOf(const float *q, const uint8_t *const *rows, int n, int col, int width, float scale, float *s) {
  const int w8 = width & ~7;
  const __m128 vscale = _mm_set1_ps(scale);
  for (int i = 0; i < n; i += 4) {
    const uint8_t *r[4];
    for (int k = 0; k < 4; ++k) r[k] = rows[i + k < n ? i + k : n - 1];
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int e = 0; e < w8; e += 8) {
      const __m256 qv = _mm256_loadu_ps(q + e);
      a0 = _mm256_add_ps(a0, _mm256_mul_ps(qv, R::Load8(r[0], col + e)));
      a1 = _mm256_add_ps(a1, _mm256_mul_ps(qv, R::Load8(r[1], col + e)));
      a2 = _mm256_add_ps(a2, _mm256_mul_ps(qv, R::Load8(r[2], col + e)));
      a3 = _mm256_add_ps(a3, _mm256_mul_ps(qv, R::Load8(r[3], col + e)));
    }
    __m128 dots;
    if (w8 == width) {
      dots = Reduce4(a0, a1, a2, a3);
    } else {
      // A width that is not a multiple of 8: its last elements go into partial sums 0.. in turn.
      alignas(32) float p[4][8];
      _mm256_store_ps(p[0], a0);
      _mm256_store_ps(p[1], a1);
      _mm256_store_ps(p[2], a2);
      _mm256_store_ps(p[3], a3);
      alignas(16) float d[4];
      for (int k = 0; k < 4; ++k) {
        for (int e = w8; e < width; ++e) p[k][e & 7] += q[e] * R::Load1(r[k], col + e);
        d[k] = Reduce8(p[k]);
      }
      dots = _mm_load_ps(d);
    }
    dots = _mm_mul_ps(dots, vscale);
    if (i + 4 <= n) {
      _mm_storeu_ps(s + i, dots);
    } else {
      alignas(16) float d[4];
      _mm_store_ps(d, dots);
      for (int k = 0; i + k < n; ++k) s[i + k] = d[k];
    }
  }
}

// Columns [c, c + 8 NR) of o held in NR registers while every row's weighted values join them.
template <typename R, int NR>
inline void AccumulateCols(float *o, const float *e, const uint8_t *const *rows, int n, int col, int c) {
  __m256 acc[NR];
  for (int k = 0; k < NR; ++k) acc[k] = _mm256_loadu_ps(o + c + 8 * k);
  for (int i = 0; i < n; ++i) {
    const __m256 ev = _mm256_set1_ps(e[i]);
    for (int k = 0; k < NR; ++k) acc[k] = _mm256_add_ps(acc[k], _mm256_mul_ps(ev, R::Load8(rows[i], col + c + 8 * k)));
  }
  for (int k = 0; k < NR; ++k) _mm256_storeu_ps(o + c + 8 * k, acc[k]);
}

template <typename R>
void AccumulateOf(float *o, const float *e, const uint8_t *const *rows, int n, int col, int width) {
  const int w8 = width & ~7;
  int c = 0;
  for (; c + 64 <= w8; c += 64) AccumulateCols<R, 8>(o, e, rows, n, col, c);
  switch ((w8 - c) / 8) {
    case 1: AccumulateCols<R, 1>(o, e, rows, n, col, c); break;
    case 2: AccumulateCols<R, 2>(o, e, rows, n, col, c); break;
    case 3: AccumulateCols<R, 3>(o, e, rows, n, col, c); break;
    case 4: AccumulateCols<R, 4>(o, e, rows, n, col, c); break;
    case 5: AccumulateCols<R, 5>(o, e, rows, n, col, c); break;
    case 6: AccumulateCols<R, 6>(o, e, rows, n, col, c); break;
    case 7: AccumulateCols<R, 7>(o, e, rows, n, col, c); break;
    default: break;
  }
  for (int d = w8; d < width; ++d) {
    for (int i = 0; i < n; ++i) o[d] += e[i] * R::Load1(rows[i], col + d);
  }
}

template <typename R>
void DecodeOf(const uint8_t *row, int c0, int n, float *out) {
  int i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, R::Load8(row, c0 + i));
  for (; i < n; ++i) out[i] = R::Load1(row, c0 + i);
}

void Decode(KvType t, const uint8_t *row, int c0, int n, float *out) {
  switch (t) {
    case KvType::kF16: DecodeOf<F16Row>(row, c0, n, out); return;
    case KvType::kQ8_0: DecodeOf<Q8Row>(row, c0, n, out); return;
    default: std::memcpy(out, row + static_cast<size_t>(c0) * sizeof(float), static_cast<size_t>(n) * sizeof(float));
  }
}

void Scores(const float *q, const uint8_t *const *rows, int n, KvType t, int col, int width, float scale, float *s) {
  switch (t) {
    case KvType::kF16: ScoresOf<F16Row>(q, rows, n, col, width, scale, s); return;
    case KvType::kQ8_0: ScoresOf<Q8Row>(q, rows, n, col, width, scale, s); return;
    default: ScoresOf<F32Row>(q, rows, n, col, width, scale, s);
  }
}

void Accumulate(float *o, const float *e, const uint8_t *const *rows, int n, KvType t, int col, int width) {
  switch (t) {
    case KvType::kF16: AccumulateOf<F16Row>(o, e, rows, n, col, width); return;
    case KvType::kQ8_0: AccumulateOf<Q8Row>(o, e, rows, n, col, width); return;
    default: AccumulateOf<F32Row>(o, e, rows, n, col, width);
  }
}

}  // namespace

const AttentionKernels &Avx2AttentionKernels() {
  static constexpr AttentionKernels k = {&Decode, &Scores, &Accumulate, true};
  return k;
}

}  // namespace strata::cpu::internal
