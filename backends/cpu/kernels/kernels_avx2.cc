// AVX2 + FMA + F16C row-dot kernels; the only file built with those flags, entered only after
// BestIsa() said the machine has them. Each kernel decodes a weight block once into registers and
// applies it to every token of the call with per-token accumulators, so a token's operations do
// not depend on how many tokens share the call.
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "backends/cpu/kernels/kernels.h"
#include "backends/cpu/kernels/kernels_internal.h"
#include "lib/quant/iq_grids.h"

namespace strata::cpu::kernels::internal {
namespace {

using quant::Codec;
using quant::TypeId;

// Calls f(std::integral_constant<int, NT>) for NT = n_tok, so every kernel body is compiled once
// per token count with its per-token loops fully unrolled.
template <typename F>
inline void ForTokens(int n_tok, F &&f) {
  switch (n_tok) {
    case 1: f(std::integral_constant<int, 1>{}); break;
    case 2: f(std::integral_constant<int, 2>{}); break;
    case 3: f(std::integral_constant<int, 3>{}); break;
    default: f(std::integral_constant<int, 4>{}); break;
  }
}

inline float Reduce8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
// The 16-lane reduction of kernels_internal.h: lanes 0..7 in lo, 8..15 in hi.
inline float Reduce16(__m256 lo, __m256 hi) { return Reduce8(_mm256_add_ps(lo, hi)); }

inline float LoadHalf(const uint8_t *p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

inline __m256 I8ToPs(__m128i v8) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v8)); }

// Sum over each group of 4 bytes of u8 * s8 into 8 int32 lanes (pairs can not saturate here: every
// caller keeps |u| * 127 * 2 below 32767).
inline __m256i DotU8S8(__m256i u, __m256i s) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

// Software prefetch this far ahead of the weight stream: one row pass streams from DRAM, and the
// hardware prefetcher alone keeps too few lines in flight for one core to reach its bandwidth.
constexpr int64_t kPrefetchAhead = 2048;
inline void Prefetch(const uint8_t *p) { _mm_prefetch(reinterpret_cast<const char *>(p + kPrefetchAhead), _MM_HINT_T0); }

// ============================ exact mode ============================
// Shared loop of the float kernels: Decode(i, &lo, &hi) yields the weights of elements i..i+15
// (bit-identical to the codec's dequantize); they are FMA'd into lane i % 16.

template <int NT, typename Decode>
inline void ExactLoop(const float *x, int64_t x_stride, int64_t n16, Decode &&decode, __m256 (*acc)[2]) {
  for (int64_t i = 0; i < n16; i += 16) {
    __m256 w0, w1;
    decode(i, &w0, &w1);
    for (int t = 0; t < NT; ++t) {
      const float *xt = x + t * x_stride + i;
      acc[t][0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xt), acc[t][0]);
      acc[t][1] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xt + 8), acc[t][1]);
    }
  }
}

template <int NT>
inline void StoreExact(__m256 (*acc)[2], float *out) {
  for (int t = 0; t < NT; ++t) out[t] = Reduce16(acc[t][0], acc[t][1]);
}

// Float formats: any n. Tail elements (n % 16) go through masked loads into their lanes.
// w: the row's bytes, elem_bytes per element (for the prefetch).
template <int NT, typename Load8>
void ExactFloatFormat(const uint8_t *w, int elem_bytes, const float *x, int64_t x_stride, int64_t n, Load8 &&load8,
                      float *out) {
  __m256 acc[NT][2];
  for (int t = 0; t < NT; ++t) acc[t][0] = acc[t][1] = _mm256_setzero_ps();
  const int64_t n16 = n & ~int64_t{15};
  ExactLoop<NT>(x, x_stride, n16, [&](int64_t i, __m256 *w0, __m256 *w1) {
    if ((i * elem_bytes) % 64 == 0) Prefetch(w + i * elem_bytes);  // a line of the stream ahead
    *w0 = load8(i);
    *w1 = load8(i + 8);
  }, acc);
  for (int64_t i = n16; i < n; i += 8) {
    const int64_t r = std::min<int64_t>(8, n - i);
    float wt[8] = {}, xtb[8];
    for (int64_t j = 0; j < r; ++j) wt[j] = _mm256_cvtss_f32(load8(i + j));  // r < 8: no over-read
    const __m256 w = _mm256_loadu_ps(wt);
    const int half = static_cast<int>((i - n16) / 8);
    for (int t = 0; t < NT; ++t) {
      std::memset(xtb, 0, sizeof xtb);
      std::memcpy(xtb, x + t * x_stride + i, static_cast<size_t>(r) * sizeof(float));
      acc[t][half] = _mm256_fmadd_ps(w, _mm256_loadu_ps(xtb), acc[t][half]);
    }
  }
  StoreExact<NT>(acc, out);
}

void DotF32(const Codec &, const void *row, const float *x, int64_t xs, int n_tok, int64_t n, float *out) {
  const auto *w = static_cast<const uint8_t *>(row);
  ForTokens(n_tok, [&](auto nt) {
    ExactFloatFormat<decltype(nt)::value>(w, 4, x, xs, n, [&](int64_t i) {
      if (n - i >= 8) return _mm256_loadu_ps(reinterpret_cast<const float *>(w + 4 * i));
      float v;
      std::memcpy(&v, w + 4 * i, 4);
      return _mm256_set1_ps(v);
    }, out);
  });
}

void DotF16(const Codec &, const void *row, const float *x, int64_t xs, int n_tok, int64_t n, float *out) {
  const auto *w = static_cast<const uint8_t *>(row);
  ForTokens(n_tok, [&](auto nt) {
    ExactFloatFormat<decltype(nt)::value>(w, 2, x, xs, n, [&](int64_t i) {
      if (n - i >= 8) return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i *>(w + 2 * i)));
      return _mm256_set1_ps(LoadHalf(w + 2 * i));
    }, out);
  });
}

void DotBF16(const Codec &, const void *row, const float *x, int64_t xs, int n_tok, int64_t n, float *out) {
  const auto *w = static_cast<const uint8_t *>(row);
  ForTokens(n_tok, [&](auto nt) {
    ExactFloatFormat<decltype(nt)::value>(w, 2, x, xs, n, [&](int64_t i) {
      if (n - i >= 8) {
        const __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i *>(w + 2 * i)));
        return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
      }
      uint16_t b;
      std::memcpy(&b, w + 2 * i, 2);
      const uint32_t u = static_cast<uint32_t>(b) << 16;
      float f;
      std::memcpy(&f, &u, 4);
      return _mm256_set1_ps(f);
    }, out);
  });
}

// Q8_0 (34 bytes / 32): w = float(q) * d.
void DotQ8_0Float(const Codec &, const void *row, const float *x, int64_t xs, int n_tok, int64_t n, float *out) {
  const auto *base = static_cast<const uint8_t *>(row);
  ForTokens(n_tok, [&](auto nt) {
    constexpr int NT = decltype(nt)::value;
    __m256 acc[NT][2];
    for (int t = 0; t < NT; ++t) acc[t][0] = acc[t][1] = _mm256_setzero_ps();
    ExactLoop<NT>(x, xs, n, [&](int64_t i, __m256 *w0, __m256 *w1) {
      const uint8_t *b = base + (i / 32) * 34;
      if (i % 64 == 0) Prefetch(b);  // 68 bytes a pair of blocks: about a line
      const __m256 d = _mm256_set1_ps(LoadHalf(b));
      const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i *>(b + 2 + (i % 32)));
      *w0 = _mm256_mul_ps(I8ToPs(q), d);
      *w1 = _mm256_mul_ps(I8ToPs(_mm_srli_si128(q, 8)), d);
    }, acc);
    StoreExact<NT>(acc, out);
  });
}

// Q4_0 (18 bytes / 32): w = d * float(q - 8); element j < 16 low nibble of qs[j], j + 16 high.
void DotQ4_0Float(const Codec &, const void *row, const float *x, int64_t xs, int n_tok, int64_t n, float *out) {
  const auto *base = static_cast<const uint8_t *>(row);
  ForTokens(n_tok, [&](auto nt) {
    constexpr int NT = decltype(nt)::value;
    __m256 acc[NT][2];
    for (int t = 0; t < NT; ++t) acc[t][0] = acc[t][1] = _mm256_setzero_ps();
    ExactLoop<NT>(x, xs, n, [&](int64_t i, __m256 *w0, __m256 *w1) {
      const uint8_t *b = base + (i / 32) * 18;
      if (i % 128 == 0) Prefetch(b);  // 72 bytes a four blocks: about a line
      const __m256 d = _mm256_set1_ps(LoadHalf(b));
      __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i *>(b + 2));
      if (i % 32) q = _mm_srli_epi16(q, 4);
      q = _mm_sub_epi8(_mm_and_si128(q, _mm_set1_epi8(0x0f)), _mm_set1_epi8(8));
      *w0 = _mm256_mul_ps(d, I8ToPs(q));
      *w1 = _mm256_mul_ps(d, I8ToPs(_mm_srli_si128(q, 8)));
    }, acc);
    StoreExact<NT>(acc, out);
  });
}

// Exact-mode skeleton of the 256-element super-block codecs: per-token accumulators, then the
// blocks of kBytes in order, each prefetched ahead, body(nt, b, s, acc) feeding block b (elements
// s .. s + 255) into acc; nt carries the token count as a type.
template <int kBytes, typename Body>
void ExactSuperBlocks(const void *row, int n_tok, int64_t n, float *out, Body &&body) {
  const auto *base = static_cast<const uint8_t *>(row);
  ForTokens(n_tok, [&](auto nt) {
    constexpr int NT = decltype(nt)::value;
    __m256 acc[NT][2];
    for (int t = 0; t < NT; ++t) acc[t][0] = acc[t][1] = _mm256_setzero_ps();
    for (int64_t s = 0; s < n; s += 256) {
      const uint8_t *b = base + (s / 256) * kBytes;
      for (int l = 0; l < kBytes; l += 64) Prefetch(b + l);
      body(nt, b, s, acc);
    }
    StoreExact<NT>(acc, out);
  });
}

// Q4_K/Q5_K: the eight 6-bit scales (bytes 0..7) and mins (bytes 8..15) of a 12-byte field.
inline void KScalesMins(const uint8_t *s, uint8_t out[16]) {
  uint32_t u[4];
  std::memcpy(u, s, 12);
  constexpr uint32_t k1 = 0x3f3f3f3f, k2 = 0x0f0f0f0f, k3 = 0x03030303;
  u[3] = ((u[2] >> 4) & k2) | (((u[1] >> 6) & k3) << 4);
  const uint32_t m_lo = u[1] & k1;
  u[1] = (u[2] & k2) | (((u[0] >> 6) & k3) << 4);
  u[2] = m_lo;
  u[0] &= k1;
  std::memcpy(out, u, 16);
}

// Q4_K (144 bytes / 256): sub-block j of 32: w = (d * sc_j) * q - dmin * m_j.
void DotQ4_KFloat(const Codec &, const void *row, const float *x, int64_t xs, int n_tok, int64_t n, float *out) {
  const __m256i m4 = _mm256_set1_epi32(0x0f);
  ExactSuperBlocks<144>(row, n_tok, n, out, [&](auto nt, const uint8_t *b, int64_t s, __m256 (*acc)[2]) {
    constexpr int NT = decltype(nt)::value;
    const float d = LoadHalf(b), dmin = LoadHalf(b + 2);
    uint8_t sm[16];
    KScalesMins(b + 4, sm);
    // Sub-blocks 2p and 2p + 1 are the low and high nibbles of the same 32 bytes: widen each 8
    // bytes once, then feed sub-block 2p's 32 weights before 2p + 1's (element order per lane).
    for (int p = 0; p < 4; ++p) {
      const uint8_t *qs = b + 16 + 32 * p;
      __m256i q[4];
      for (int c = 0; c < 4; ++c) q[c] = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i *>(qs + 8 * c)));
      for (int h = 0; h < 2; ++h) {
        const int j = 2 * p + h;
        const __m256 dl = _mm256_set1_ps(d * static_cast<float>(sm[j]));
        const __m256 ml = _mm256_set1_ps(dmin * static_cast<float>(sm[8 + j]));
        const float *xj = x + s + 32 * j;
        for (int c = 0; c < 4; ++c) {
          const __m256i v = h == 0 ? _mm256_and_si256(q[c], m4) : _mm256_srli_epi32(q[c], 4);
          const __m256 w = _mm256_sub_ps(_mm256_mul_ps(dl, _mm256_cvtepi32_ps(v)), ml);
          for (int t = 0; t < NT; ++t) {
            acc[t][c & 1] = _mm256_fmadd_ps(w, _mm256_loadu_ps(xj + t * xs + 8 * c), acc[t][c & 1]);
          }
        }
      }
    }
  });
}

// Q6_K: the 32 codes (0..63) of elements 128h + 32k .. + 31, k < 4.
inline __m256i Q6Codes(const uint8_t *ql, const uint8_t *qh, int k) {
  const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(ql + 32 * (k % 2)));
  const __m256i hi = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(qh));
  const __m256i m4 = _mm256_set1_epi8(0x0f), m2 = _mm256_set1_epi8(0x03);
  const __m256i l = _mm256_and_si256(k < 2 ? lo : _mm256_srli_epi16(lo, 4), m4);
  const __m256i h = _mm256_and_si256(_mm256_srli_epi16(hi, 2 * k), m2);
  return _mm256_or_si256(l, _mm256_slli_epi16(h, 4));
}

// Q6_K (210 bytes / 256): sub-block s of 16: w = (d * scale_s) * (q - 32).
void DotQ6_KFloat(const Codec &, const void *row, const float *x, int64_t xs, int n_tok, int64_t n, float *out) {
  ExactSuperBlocks<210>(row, n_tok, n, out, [&](auto nt, const uint8_t *b, int64_t s, __m256 (*acc)[2]) {
    constexpr int NT = decltype(nt)::value;
    const auto *sc = reinterpret_cast<const int8_t *>(b + 192);
    const float d = LoadHalf(b + 208);
    for (int h = 0; h < 2; ++h) {
      for (int k = 0; k < 4; ++k) {
        alignas(32) int8_t q[32];
        _mm256_store_si256(reinterpret_cast<__m256i *>(q),
                           _mm256_sub_epi8(Q6Codes(b + 64 * h, b + 128 + 32 * h, k), _mm256_set1_epi8(32)));
        const int sub = 8 * h + 2 * k;
        const __m256 d0 = _mm256_set1_ps(d * static_cast<float>(sc[sub]));
        const __m256 d1 = _mm256_set1_ps(d * static_cast<float>(sc[sub + 1]));
        ExactLoop<NT>(x + s + 128 * h + 32 * k, xs, 32, [&](int64_t i, __m256 *w0, __m256 *w1) {
          const __m256 dl = i == 0 ? d0 : d1;
          const __m128i v = _mm_load_si128(reinterpret_cast<const __m128i *>(q + i));
          *w0 = _mm256_mul_ps(dl, I8ToPs(v));
          *w1 = _mm256_mul_ps(dl, I8ToPs(_mm_srli_si128(v, 8)));
        }, acc);
      }
    }
  });
}

// Any codec: dequantize up to 256 elements into L1 (dequant(src, w, len)), then the same FMA loop.
// For a codec with a fused kernel this gives bit-identical results (the tests check it).
template <typename Dequant>
void DotFloatVia(const Codec &codec, const void *row, const float *x, int64_t xs, int n_tok, int64_t n, float *out,
                 Dequant &&dequant) {
  const auto *base = static_cast<const uint8_t *>(row);
  ForTokens(n_tok, [&](auto nt) {
    constexpr int NT = decltype(nt)::value;
    __m256 acc[NT][2];
    for (int t = 0; t < NT; ++t) acc[t][0] = acc[t][1] = _mm256_setzero_ps();
    alignas(32) float w[256 + 16];
    for (int64_t s = 0; s < n; s += 256) {
      const int64_t len = std::min<int64_t>(256, n - s);
      dequant(base + (s / codec.block_elems) * codec.block_bytes, w, len);
      const int64_t len16 = len & ~int64_t{15};
      ExactLoop<NT>(x + s, xs, len16, [&](int64_t i, __m256 *w0, __m256 *w1) {
        *w0 = _mm256_load_ps(w + i);
        *w1 = _mm256_load_ps(w + i + 8);
      }, acc);
      for (int64_t i = len16; i < len; i += 8) {  // only float formats have len % 16 != 0
        const int64_t r = std::min<int64_t>(8, len - i);
        float wt[8] = {}, xtb[8];
        std::memcpy(wt, w + i, static_cast<size_t>(r) * sizeof(float));
        const int half = static_cast<int>((i - len16) / 8);
        for (int t = 0; t < NT; ++t) {
          std::memset(xtb, 0, sizeof xtb);
          std::memcpy(xtb, x + t * xs + s + i, static_cast<size_t>(r) * sizeof(float));
          acc[t][half] = _mm256_fmadd_ps(_mm256_loadu_ps(wt), _mm256_loadu_ps(xtb), acc[t][half]);
        }
      }
    }
    StoreExact<NT>(acc, out);
  });
}

void DotFloatViaCodec(const Codec &codec, const void *row, const float *x, int64_t xs, int n_tok, int64_t n,
                      float *out) {
  DotFloatVia(codec, row, x, xs, n_tok, n, out,
              [&](const uint8_t *src, float *w, int64_t len) { codec.dequantize(src, w, len); });
}

// ---- AVX2 dequantizers of one 256-element super block, bit-identical to the codecs' ----
// (lib/quant/codecs_k.cc has the layouts.) Each 8 weights: codes widened to int32, converted, then
// the codec's own multiply and subtract, each rounded.

inline void Store8(float *w, __m256i codes, __m256 dl) { _mm256_store_ps(w, _mm256_mul_ps(dl, _mm256_cvtepi32_ps(codes))); }
inline void Store8(float *w, __m256i codes, __m256 dl, __m256 ml) {
  _mm256_store_ps(w, _mm256_sub_ps(_mm256_mul_ps(dl, _mm256_cvtepi32_ps(codes)), ml));
}
// Bytes 8c .. 8c + 7 of v, widened.
inline __m256i Widen8(__m256i v, int c) {
  const __m128i half = c < 2 ? _mm256_castsi256_si128(v) : _mm256_extracti128_si256(v, 1);
  return _mm256_cvtepi8_epi32(c % 2 == 0 ? half : _mm_srli_si128(half, 8));
}

// Q2_K (84 bytes): u8 scales[16] | u8 qs[64] | f16 d | f16 dmin; element 128h + 32k + l has code
// bits 2k.. of qs[32h + l], sub-block e / 16 with scale (low nibble) and min (high nibble).
void DequantQ2_K(const uint8_t *b, float *w) {
  const float d = LoadHalf(b + 80), dmin = LoadHalf(b + 82);
  for (int h = 0; h < 2; ++h) {
    const __m256i qs = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(b + 16 + 32 * h));
    for (int k = 0; k < 4; ++k) {
      const __m256i q = _mm256_and_si256(_mm256_srli_epi16(qs, 2 * k), _mm256_set1_epi8(3));
      const int e0 = 128 * h + 32 * k;
      for (int c = 0; c < 4; ++c) {
        const uint8_t sc = b[(e0 + 8 * c) / 16];
        Store8(w + e0 + 8 * c, Widen8(q, c), _mm256_set1_ps(d * static_cast<float>(sc & 0x0f)),
               _mm256_set1_ps(dmin * static_cast<float>(sc >> 4)));
      }
    }
  }
}

// Q3_K (110 bytes): u8 hmask[32] | u8 qs[64] | u8 scales[12] | f16 d; low two bits as Q2_K, the
// third bit of element 32b + l is bit b of hmask[l] (clear: minus 4); sixteen 6-bit scales, +32.
void DequantQ3_K(const uint8_t *b, float *w) {
  const float d = LoadHalf(b + 108);
  const uint8_t *s = b + 96;
  float dl[16];
  for (int i = 0; i < 16; ++i) {
    const int lo = i < 8 ? (s[i] & 0x0f) : (s[i - 8] >> 4);
    const int hi = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
    dl[i] = d * static_cast<float>((lo | (hi << 4)) - 32);
  }
  const __m256i hmask = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(b));
  for (int h = 0; h < 2; ++h) {
    const __m256i qs = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(b + 32 + 32 * h));
    for (int k = 0; k < 4; ++k) {
      const int bit = 4 * h + k;  // e / 32
      const __m256i lo = _mm256_and_si256(_mm256_srli_epi16(qs, 2 * k), _mm256_set1_epi8(3));
      const __m256i hb = _mm256_and_si256(_mm256_srli_epi16(hmask, bit), _mm256_set1_epi8(1));
      // lo - 4 when the bit is clear: lo - 4 + 4 * bit
      const __m256i q = _mm256_add_epi8(_mm256_sub_epi8(lo, _mm256_set1_epi8(4)), _mm256_slli_epi16(hb, 2));
      const int e0 = 32 * bit;
      for (int c = 0; c < 4; ++c) Store8(w + e0 + 8 * c, Widen8(q, c), _mm256_set1_ps(dl[(e0 + 8 * c) / 16]));
    }
  }
}

// Q5_K (176 bytes): f16 d | f16 dmin | u8 scales[12] | u8 qh[32] | u8 qs[128]; as Q4_K with a fifth
// code bit: element 32j + l takes bit j of qh[l].
void DequantQ5_K(const uint8_t *b, float *w) {
  const float d = LoadHalf(b), dmin = LoadHalf(b + 2);
  uint8_t sm[16];
  KScalesMins(b + 4, sm);
  const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(b + 16));
  for (int j = 0; j < 8; ++j) {
    const __m256i qs = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(b + 48 + 32 * (j / 2)));
    const __m256i lo = _mm256_and_si256(j % 2 ? _mm256_srli_epi16(qs, 4) : qs, _mm256_set1_epi8(0x0f));
    const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(qh, j), _mm256_set1_epi8(1));
    const __m256i q = _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4));  // 0..31: no carry between bytes
    const __m256 dl = _mm256_set1_ps(d * static_cast<float>(sm[j]));
    const __m256 ml = _mm256_set1_ps(dmin * static_cast<float>(sm[8 + j]));
    for (int c = 0; c < 4; ++c) Store8(w + 32 * j + 8 * c, Widen8(q, c), dl, ml);
  }
}

// ---- the lattice i-quants (lib/quant/codecs_iq.cc has the layouts) ----
// Each grid entry's levels as bytes (IQ1's as signed bytes), built once from the packed grids.
template <int kEntries, int kElems>
struct ByteGrid {
  alignas(8) uint8_t v[kEntries][8] = {};
  ByteGrid(const uint16_t *packed, int bits, const int8_t *levels) {
    for (int r = 0; r < kEntries; ++r) {
      for (int j = 0; j < kElems; ++j) {
        v[r][j] = static_cast<uint8_t>(levels[(packed[r] >> (j * bits)) & ((1 << bits) - 1)]);
      }
    }
  }
};
namespace q = strata::quant::internal;
const ByteGrid<256, 8> kIq2xxs(q::kIQ2XXSGrid, q::kIQ2XXSGridBits, q::kIQ2XXSGridLevels);
const ByteGrid<512, 8> kIq2xs(q::kIQ2XSGrid, q::kIQ2XSGridBits, q::kIQ2XSGridLevels);
const ByteGrid<1024, 8> kIq2s(q::kIQ2SGrid, q::kIQ2SGridBits, q::kIQ2SGridLevels);
const ByteGrid<256, 4> kIq3xxs(q::kIQ3XXSGrid, q::kIQ3XXSGridBits, q::kIQ3XXSGridLevels);
const ByteGrid<512, 4> kIq3s(q::kIQ3SGrid, q::kIQ3SGridBits, q::kIQ3SGridLevels);
const ByteGrid<2048, 8> kIq1s(q::kIQ1SGrid, q::kIQ1SGridBits, q::kIQ1SGridLevels);

// The 7-bit sign index k as its byte: bit 7 set where k has an odd number of set bits.
inline uint32_t IqSigns(uint32_t k) { return k | ((__builtin_popcount(k) & 1u) << 7); }
// Lane j's float sign bit: bit j of s.
inline __m256 SignBits8(uint32_t s) {
  const __m256i bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  const __m256i on = _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32(static_cast<int>(s)), bit), bit);
  return _mm256_castsi256_ps(_mm256_and_si256(on, _mm256_set1_epi32(INT32_MIN)));
}
// 8 weights (db * level) * (+-1): the levels' 8 bytes at lo, signed by s.
inline void PutIq8(float *w, __m128i lo, __m256 db, uint32_t s) {
  const __m256 g = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo));
  _mm256_store_ps(w, _mm256_xor_ps(_mm256_mul_ps(db, g), SignBits8(s)));
}
inline __m128i Entry8(const uint8_t *e) { return _mm_loadl_epi64(reinterpret_cast<const __m128i *>(e)); }
inline __m128i Entries4(const uint8_t *e0, const uint8_t *e1) {
  uint32_t a, b;
  std::memcpy(&a, e0, 4);
  std::memcpy(&b, e1, 4);
  return _mm_setr_epi32(static_cast<int>(a), static_cast<int>(b), 0, 0);
}

void DequantIQ2_XXS(const uint8_t *b, float *w) {
  const float d = LoadHalf(b);
  for (int g = 0; g < 8; ++g) {
    const uint8_t *q8 = b + 2 + 8 * g;
    uint32_t aux;
    std::memcpy(&aux, q8 + 4, 4);
    const __m256 db = _mm256_set1_ps(d * (0.5f + static_cast<float>(aux >> 28)) * 0.25f);
    for (int c = 0; c < 4; ++c) PutIq8(w + 32 * g + 8 * c, Entry8(kIq2xxs.v[q8[c]]), db, IqSigns((aux >> (7 * c)) & 127));
  }
}

void DequantIQ2_XS(const uint8_t *b, float *w) {
  const float d = LoadHalf(b);
  for (int e = 0; e < 32; ++e) {
    uint16_t q2;
    std::memcpy(&q2, b + 2 + 2 * e, 2);
    const int s = (b[66 + e / 4] >> (4 * ((e / 2) % 2))) & 0x0f;
    const __m256 db = _mm256_set1_ps(d * (0.5f + static_cast<float>(s)) * 0.25f);
    PutIq8(w + 8 * e, Entry8(kIq2xs.v[q2 & 511]), db, IqSigns(q2 >> 9));
  }
}

void DequantIQ2_S(const uint8_t *b, float *w) {
  const float d = LoadHalf(b);
  const uint8_t *qs = b + 2, *signs = b + 34, *qh = b + 66, *scales = b + 74;
  for (int e = 0; e < 32; ++e) {
    const uint32_t r = qs[e] | (((qh[e / 4] >> (2 * (e % 4))) & 3u) << 8);
    const int s = (scales[e / 4] >> (4 * ((e / 2) % 2))) & 0x0f;
    const __m256 db = _mm256_set1_ps(d * (0.5f + static_cast<float>(s)) * 0.25f);
    PutIq8(w + 8 * e, Entry8(kIq2s.v[r]), db, signs[e]);
  }
}

void DequantIQ3_XXS(const uint8_t *b, float *w) {
  const float d = LoadHalf(b);
  const uint8_t *qs = b + 2;
  for (int g = 0; g < 8; ++g) {
    uint32_t aux;
    std::memcpy(&aux, b + 66 + 4 * g, 4);
    const __m256 db = _mm256_set1_ps(d * (0.5f + static_cast<float>(aux >> 28)) * 0.5f);
    for (int c = 0; c < 4; ++c) {
      const uint8_t *e = qs + 8 * g + 2 * c;
      PutIq8(w + 32 * g + 8 * c, Entries4(kIq3xxs.v[e[0]], kIq3xxs.v[e[1]]), db, IqSigns((aux >> (7 * c)) & 127));
    }
  }
}

void DequantIQ3_S(const uint8_t *b, float *w) {
  const float d = LoadHalf(b);
  const uint8_t *qs = b + 2, *qh = b + 66, *signs = b + 74, *scales = b + 106;
  for (int c = 0; c < 32; ++c) {  // 8 weights: entries 2c and 2c + 1
    const uint32_t r0 = qs[2 * c] | (((qh[c / 4] >> ((2 * c) % 8)) & 1u) << 8);
    const uint32_t r1 = qs[2 * c + 1] | (((qh[c / 4] >> ((2 * c + 1) % 8)) & 1u) << 8);
    const int s = (scales[c / 8] >> (4 * ((c / 4) % 2))) & 0x0f;
    const __m256 db = _mm256_set1_ps(d * static_cast<float>(1 + 2 * s));
    PutIq8(w + 8 * c, Entries4(kIq3s.v[r0], kIq3s.v[r1]), db, signs[c]);
  }
}

// IQ1: (d (2 s + 1)) (level + delta), the levels -1, 0, 1.
inline void PutIq1(float *w, const uint8_t *e, __m256 dl, __m256 delta) {
  const __m256 g = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(Entry8(e)));
  _mm256_store_ps(w, _mm256_mul_ps(dl, _mm256_add_ps(g, delta)));
}

void DequantIQ1_S(const uint8_t *b, float *w) {
  const float d = LoadHalf(b);
  const uint8_t *qs = b + 2;
  for (int g = 0; g < 8; ++g) {
    uint16_t qh;
    std::memcpy(&qh, b + 34 + 2 * g, 2);
    const __m256 dl = _mm256_set1_ps(d * static_cast<float>(2 * ((qh >> 12) & 7) + 1));
    const __m256 delta = _mm256_set1_ps((qh & 0x8000) == 0 ? 0.125f : -0.125f);
    for (int l = 0; l < 4; ++l) {
      PutIq1(w + 32 * g + 8 * l, kIq1s.v[qs[4 * g + l] | (((qh >> (3 * l)) & 7u) << 8)], dl, delta);
    }
  }
}

void DequantIQ1_M(const uint8_t *b, float *w) {
  const uint8_t *qs = b, *qh = b + 32;
  uint16_t sc[4];
  std::memcpy(sc, b + 48, 8);
  const float d = quant::HalfToFloat(quant::IQ1_MScaleBits(b));
  for (int e = 0; e < 32; ++e) {
    const int nib = (qh[e / 2] >> (4 * (e % 2))) & 0x0f;
    const int k = e / 2;
    const __m256 dl = _mm256_set1_ps(d * static_cast<float>(2 * ((sc[k / 4] >> (3 * (k % 4))) & 7) + 1));
    const __m256 delta = _mm256_set1_ps((nib & 8) == 0 ? 0.125f : -0.125f);
    PutIq1(w + 8 * e, kIq1s.v[qs[e] | (static_cast<uint32_t>(nib & 7) << 8)], dl, delta);
  }
}

template <void (*Block)(const uint8_t *, float *)>
void DotFloatViaBlock(const Codec &codec, const void *row, const float *x, int64_t xs, int n_tok, int64_t n,
                      float *out) {
  DotFloatVia(codec, row, x, xs, n_tok, n, out, [](const uint8_t *src, float *w, int64_t) { Block(src, w); });
}

// ============================ q8 mode ============================

template <int NT>
inline const ActBlock32 *Act32(const void *xq, int64_t stride, int t) {
  return reinterpret_cast<const ActBlock32 *>(static_cast<const uint8_t *>(xq) + t * stride);
}
template <int NT>
inline const ActBlock256 *Act256(const void *xq, int64_t stride, int t) {
  return reinterpret_cast<const ActBlock256 *>(static_cast<const uint8_t *>(xq) + t * stride);
}

// Signed 32-byte weight codes w against activation codes: sum over 4-byte groups of w * q.
inline __m256i DotS8S8(__m256i w_abs, __m256i w, __m256i q) {
  return DotU8S8(w_abs, _mm256_sign_epi8(q, w));
}

// 32-element-block codecs whose weights are d_w * c with signed codes c (|c| <= 128): Q8_0, Q4_0,
// Q5_0, IQ4_NL, MXFP4. Codes(b, &c) decodes block b; Scale(b) is d_w. Per block and token:
// acc += (d_w * d_x) * float(integer dot), 8 lanes, one FMA per block.
template <int NT, typename Codes, typename Scale>
void Q8Signed32(const uint8_t *prefetch_base, int64_t block_bytes, const void *xq, int64_t xqs, int64_t n,
                Codes &&codes, Scale &&scale, float *out) {
  __m256 acc[NT];
  const ActBlock32 *a[NT];
  for (int t = 0; t < NT; ++t) {
    acc[t] = _mm256_setzero_ps();
    a[t] = Act32<NT>(xq, xqs, t);
  }
  const int64_t nb = n / 32;
  for (int64_t b = 0; b < nb; ++b) {
    Prefetch(prefetch_base + b * block_bytes);
    const __m256i c = codes(b);
    const __m256i c_abs = _mm256_sign_epi8(c, c);
    const float dw = scale(b);
    for (int t = 0; t < NT; ++t) {
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(a[t][b].q));
      const __m256 p = _mm256_cvtepi32_ps(DotS8S8(c_abs, c, q));
      acc[t] = _mm256_fmadd_ps(p, _mm256_set1_ps(dw * a[t][b].d), acc[t]);
    }
  }
  for (int t = 0; t < NT; ++t) out[t] = Reduce8(acc[t]);
}

// 32 nibbles of 16 bytes: element j < 16 low nibble of p[j], j + 16 high nibble.
inline __m256i Nibbles32(const uint8_t *p) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i *>(p));
  const __m128i m = _mm_set1_epi8(0x0f);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), m), _mm_and_si128(v, m));
}

void DotQ8_0Q8(const Codec &, const void *row, const void *xq, int64_t xqs, int n_tok, int64_t n, float *out) {
  const auto *base = static_cast<const uint8_t *>(row);
  ForTokens(n_tok, [&](auto nt) {
    Q8Signed32<decltype(nt)::value>(base, 34, xq, xqs, n,
        [&](int64_t b) { return _mm256_loadu_si256(reinterpret_cast<const __m256i *>(base + 34 * b + 2)); },
        [&](int64_t b) { return LoadHalf(base + 34 * b); }, out);
  });
}

void DotQ4_0Q8(const Codec &, const void *row, const void *xq, int64_t xqs, int n_tok, int64_t n, float *out) {
  const auto *base = static_cast<const uint8_t *>(row);
  ForTokens(n_tok, [&](auto nt) {
    Q8Signed32<decltype(nt)::value>(base, 18, xq, xqs, n,
        [&](int64_t b) { return _mm256_sub_epi8(Nibbles32(base + 18 * b + 2), _mm256_set1_epi8(8)); },
        [&](int64_t b) { return LoadHalf(base + 18 * b); }, out);
  });
}

// Q5_0 (22 bytes): code = nibble | bit j of qh << 4, minus 16.
inline __m256i Q5HighBits(uint32_t qh) {
  // Byte j of the result is 0x10 when bit j of qh is set.
  const __m256i shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
  __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(qh)), shuf);
  const __m256i bit = _mm256_set1_epi64x(0x8040201008040201);
  v = _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);
  return _mm256_and_si256(v, _mm256_set1_epi8(0x10));
}

// 32-element legacy blocks in exact mode: codes(b) gives block b's 32 codes in element order (from
// the q8 kernels' decoders); w = d * code, plus the block's min when kMin (the product rounded, then
// the min added), as the codecs dequantize.
template <int kBlockBytes, bool kMin, typename Codes>
void ExactLegacy32(const uint8_t *base, const float *x, int64_t xs, int n_tok, int64_t n, Codes &&codes, float *out) {
  ForTokens(n_tok, [&](auto nt) {
    constexpr int NT = decltype(nt)::value;
    __m256 acc[NT][2];
    for (int t = 0; t < NT; ++t) acc[t][0] = acc[t][1] = _mm256_setzero_ps();
    __m256i c = _mm256_setzero_si256();  // the current block's codes (ExactLoop walks i in order)
    ExactLoop<NT>(x, xs, n, [&](int64_t i, __m256 *w0, __m256 *w1) {
      const uint8_t *b = base + (i / 32) * kBlockBytes;
      if (i % 32 == 0) {
        if (i % 128 == 0) Prefetch(b);
        c = codes(b);
      }
      const __m128i h = i % 32 != 0 ? _mm256_extracti128_si256(c, 1) : _mm256_castsi256_si128(c);
      const __m256 d = _mm256_set1_ps(LoadHalf(b));
      __m256 p0 = _mm256_mul_ps(d, I8ToPs(h)), p1 = _mm256_mul_ps(d, I8ToPs(_mm_srli_si128(h, 8)));
      if (kMin) {
        const __m256 m = _mm256_set1_ps(LoadHalf(b + 2));
        p0 = _mm256_add_ps(p0, m);
        p1 = _mm256_add_ps(p1, m);
      }
      *w0 = p0;
      *w1 = p1;
    }, acc);
    StoreExact<NT>(acc, out);
  });
}

// The 32 codes of a legacy block in element order, shared by the exact and q8 kernels. Q4_1 (20
// bytes): f16 d | f16 m | qs[16]. Q5_0 (22): f16 d | u32 qh | qs[16], codes - 16. Q5_1 (24): f16 d |
// f16 m | u32 qh | qs[16].
inline uint32_t LoadU32(const uint8_t *p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
inline __m256i Q4_1Codes(const uint8_t *b) { return Nibbles32(b + 4); }
inline __m256i Q5_0Codes(const uint8_t *b) {
  return _mm256_sub_epi8(_mm256_or_si256(Nibbles32(b + 6), Q5HighBits(LoadU32(b + 2))), _mm256_set1_epi8(16));
}
inline __m256i Q5_1Codes(const uint8_t *b) { return _mm256_or_si256(Nibbles32(b + 8), Q5HighBits(LoadU32(b + 4))); }

void DotQ4_1Float(const Codec &, const void *row, const float *x, int64_t xs, int n_tok, int64_t n, float *out) {
  ExactLegacy32<20, true>(static_cast<const uint8_t *>(row), x, xs, n_tok, n, [](const uint8_t *b) { return Q4_1Codes(b); }, out);
}
void DotQ5_0Float(const Codec &, const void *row, const float *x, int64_t xs, int n_tok, int64_t n, float *out) {
  ExactLegacy32<22, false>(static_cast<const uint8_t *>(row), x, xs, n_tok, n, [](const uint8_t *b) { return Q5_0Codes(b); }, out);
}
void DotQ5_1Float(const Codec &, const void *row, const float *x, int64_t xs, int n_tok, int64_t n, float *out) {
  ExactLegacy32<24, true>(static_cast<const uint8_t *>(row), x, xs, n_tok, n, [](const uint8_t *b) { return Q5_1Codes(b); }, out);
}

void DotQ5_0Q8(const Codec &, const void *row, const void *xq, int64_t xqs, int n_tok, int64_t n, float *out) {
  const auto *base = static_cast<const uint8_t *>(row);
  ForTokens(n_tok, [&](auto nt) {
    Q8Signed32<decltype(nt)::value>(base, 22, xq, xqs, n,
        [&](int64_t b) { return Q5_0Codes(base + 22 * b); },
        [&](int64_t b) { return LoadHalf(base + 22 * b); }, out);
  });
}

// The IQ4 levels (ggml's kvalues_iq4nl) and the doubled E2M1 levels of MXFP4.
const int8_t kIq4Levels[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
const int8_t kMxfp4Levels[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

inline __m256i Lookup16(const int8_t *table, __m256i nibbles) {
  const __m256i t = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i *>(table)));
  return _mm256_shuffle_epi8(t, nibbles);
}

void DotIQ4_NLQ8(const Codec &, const void *row, const void *xq, int64_t xqs, int n_tok, int64_t n, float *out) {
  const auto *base = static_cast<const uint8_t *>(row);
  ForTokens(n_tok, [&](auto nt) {
    Q8Signed32<decltype(nt)::value>(base, 18, xq, xqs, n,
        [&](int64_t b) { return Lookup16(kIq4Levels, Nibbles32(base + 18 * b + 2)); },
        [&](int64_t b) { return LoadHalf(base + 18 * b); }, out);
  });
}

// IQ4_XS in q8 mode: per 256-element block, each sub-block j of 32 a signed-code integer dot
// (as IQ4_NL) weighted by its own scale d * (scale_j - 32).
void DotIQ4_XSQ8(const Codec &, const void *row, const void *xq, int64_t xqs, int n_tok, int64_t n, float *out) {
  const auto *base = static_cast<const uint8_t *>(row);
  ForTokens(n_tok, [&](auto nt) {
    constexpr int NT = decltype(nt)::value;
    __m256 acc[NT];
    const ActBlock256 *a[NT];
    for (int t = 0; t < NT; ++t) {
      acc[t] = _mm256_setzero_ps();
      a[t] = Act256<NT>(xq, xqs, t);
    }
    for (int64_t b = 0; b < n / 256; ++b) {
      const uint8_t *p = base + 136 * b;
      for (int l = 0; l < 136; l += 64) Prefetch(p + l);
      const float d = LoadHalf(p);
      uint16_t scales_h;
      std::memcpy(&scales_h, p + 2, 2);
      for (int j = 0; j < 8; ++j) {
        const int lo = (p[4 + j / 2] >> (4 * (j % 2))) & 0x0f, hi = (scales_h >> (2 * j)) & 3;
        const float dl = d * static_cast<float>((lo | (hi << 4)) - 32);
        const __m256i c = Lookup16(kIq4Levels, Nibbles32(p + 8 + 16 * j));
        const __m256i c_abs = _mm256_sign_epi8(c, c);
        for (int t = 0; t < NT; ++t) {
          const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(a[t][b].q + 32 * j));
          acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(DotS8S8(c_abs, c, q)), _mm256_set1_ps(dl * a[t][b].d), acc[t]);
        }
      }
    }
    for (int t = 0; t < NT; ++t) out[t] = Reduce8(acc[t]);
  });
}

inline float Mxfp4Scale(uint8_t e) {
  const uint32_t bits = e < 2 ? (0x00200000u << e) : (static_cast<uint32_t>(e) - 1u) << 23;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

void DotMXFP4Q8(const Codec &, const void *row, const void *xq, int64_t xqs, int n_tok, int64_t n, float *out) {
  const auto *base = static_cast<const uint8_t *>(row);
  ForTokens(n_tok, [&](auto nt) {
    Q8Signed32<decltype(nt)::value>(base, 17, xq, xqs, n,
        [&](int64_t b) { return Lookup16(kMxfp4Levels, Nibbles32(base + 17 * b + 1)); },
        [&](int64_t b) { return Mxfp4Scale(base[17 * b]); }, out);
  });
}

// ---- exact-mode kernels of the level-table codecs (after the tables they share with q8 mode) ----

// 16 weights of a 32-element table block: element j < 16 is the low nibble of qs[j], j + 16 the
// high one (high: elements 16..31); w = d * level[q], one rounding, as the codecs dequantize.
inline void TableWeights16(const int8_t *table, const uint8_t *qs, bool high, __m256 d, __m256 *w0, __m256 *w1) {
  __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i *>(qs));
  if (high) q = _mm_srli_epi16(q, 4);
  q = _mm_and_si128(q, _mm_set1_epi8(0x0f));
  q = _mm_shuffle_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i *>(table)), q);
  *w0 = _mm256_mul_ps(d, I8ToPs(q));
  *w1 = _mm256_mul_ps(d, I8ToPs(_mm_srli_si128(q, 8)));
}

// IQ4_NL (18 bytes / 32): f16 d | qs[16]. MXFP4 (17 bytes / 32): e8m0 e | qs[16].
template <int kBlockBytes, int kQsOffset, typename Scale>
void ExactTable32(const int8_t *table, const uint8_t *base, const float *x, int64_t xs, int n_tok, int64_t n,
                  Scale &&scale, float *out) {
  ForTokens(n_tok, [&](auto nt) {
    constexpr int NT = decltype(nt)::value;
    __m256 acc[NT][2];
    for (int t = 0; t < NT; ++t) acc[t][0] = acc[t][1] = _mm256_setzero_ps();
    ExactLoop<NT>(x, xs, n, [&](int64_t i, __m256 *w0, __m256 *w1) {
      const uint8_t *b = base + (i / 32) * kBlockBytes;
      if (i % 128 == 0) Prefetch(b);  // about a line every four blocks
      TableWeights16(table, b + kQsOffset, i % 32 != 0, _mm256_set1_ps(scale(b)), w0, w1);
    }, acc);
    StoreExact<NT>(acc, out);
  });
}

void DotIQ4_NLFloat(const Codec &, const void *row, const float *x, int64_t xs, int n_tok, int64_t n, float *out) {
  ExactTable32<18, 2>(kIq4Levels, static_cast<const uint8_t *>(row), x, xs, n_tok, n,
                      [](const uint8_t *b) { return LoadHalf(b); }, out);
}

void DotMXFP4Float(const Codec &, const void *row, const float *x, int64_t xs, int n_tok, int64_t n, float *out) {
  ExactTable32<17, 1>(kMxfp4Levels, static_cast<const uint8_t *>(row), x, xs, n_tok, n,
                      [](const uint8_t *b) { return Mxfp4Scale(b[0]); }, out);
}

// IQ4_XS (136 bytes / 256): f16 d | u16 scales_h | u8 scales_l[4] | qs[128]; sub-block j of 32 has
// the 6-bit scale (scales_l nibble j | scales_h bits 2j..2j+1 << 4) - 32 and qs[16 j ..]; w = (d *
// scale) * level[q].
void DotIQ4_XSFloat(const Codec &, const void *row, const float *x, int64_t xs, int n_tok, int64_t n, float *out) {
  ExactSuperBlocks<136>(row, n_tok, n, out, [&](auto nt, const uint8_t *b, int64_t s, __m256 (*acc)[2]) {
    constexpr int NT = decltype(nt)::value;
    const float d = LoadHalf(b);
    uint16_t scales_h;
    std::memcpy(&scales_h, b + 2, 2);
    for (int j = 0; j < 8; ++j) {
      const int lo = (b[4 + j / 2] >> (4 * (j % 2))) & 0x0f, hi = (scales_h >> (2 * j)) & 3;
      const __m256 dl = _mm256_set1_ps(d * static_cast<float>((lo | (hi << 4)) - 32));
      ExactLoop<NT>(x + s + 32 * j, xs, 32, [&](int64_t i, __m256 *w0, __m256 *w1) {
        TableWeights16(kIq4Levels, b + 8 + 16 * j, i != 0, dl, w0, w1);
      }, acc);
    }
  });
}

// Q4_1 / Q5_1: w = d * c + m with unsigned codes: acc += (d_w d_x) * dot(c, q) + (m d_x) * sum(q).
template <int NT, typename Codes>
void Q8Unsigned32(const uint8_t *base, int64_t block_bytes, const void *xq, int64_t xqs, int64_t n,
                  Codes &&codes, float *out) {
  __m256 acc[NT];
  float accm[NT];
  const ActBlock32 *a[NT];
  for (int t = 0; t < NT; ++t) {
    acc[t] = _mm256_setzero_ps();
    accm[t] = 0.0f;
    a[t] = Act32<NT>(xq, xqs, t);
  }
  const int64_t nb = n / 32;
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t *p = base + block_bytes * b;
    const __m256i c = codes(p);
    const float dw = LoadHalf(p), mw = LoadHalf(p + 2);
    for (int t = 0; t < NT; ++t) {
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(a[t][b].q));
      const __m256 s = _mm256_cvtepi32_ps(DotU8S8(c, q));
      acc[t] = _mm256_fmadd_ps(s, _mm256_set1_ps(dw * a[t][b].d), acc[t]);
      accm[t] += (mw * a[t][b].d) * static_cast<float>(a[t][b].sum);
    }
  }
  for (int t = 0; t < NT; ++t) out[t] = Reduce8(acc[t]) + accm[t];
}

void DotQ4_1Q8(const Codec &, const void *row, const void *xq, int64_t xqs, int n_tok, int64_t n, float *out) {
  const auto *base = static_cast<const uint8_t *>(row);
  ForTokens(n_tok, [&](auto nt) {
    Q8Unsigned32<decltype(nt)::value>(base, 20, xq, xqs, n, [](const uint8_t *b) { return Q4_1Codes(b); }, out);
  });
}

void DotQ5_1Q8(const Codec &, const void *row, const void *xq, int64_t xqs, int n_tok, int64_t n, float *out) {
  const auto *base = static_cast<const uint8_t *>(row);
  ForTokens(n_tok, [&](auto nt) {
    Q8Unsigned32<decltype(nt)::value>(base, 24, xq, xqs, n, [](const uint8_t *b) { return Q5_1Codes(b); }, out);
  });
}

// Q4_K / Q5_K (256 elements, 8 sub-blocks of 32 with 6-bit scale sc_j and min m_j):
// sum = d d_x * sum_j sc_j dot_j(c, q) - dmin d_x * sum_j m_j sum_j(q). Integer within a block.
// A block's head (prefetched): d, dmin, the 8 scales then 8 mins as bytes, and the mins duplicated
// per 16-element half, (m0, m0, m1, m1, ...) as int16, against the activations' bsums.
struct KHead {
  float d, dmin;
  __m128i sm;
  __m256i mins;
};
template <int kBytes>
inline KHead ReadKHead(const uint8_t *p) {
  for (int l = 0; l < kBytes; l += 64) Prefetch(p + l);
  KHead h;
  h.d = LoadHalf(p);
  h.dmin = LoadHalf(p + 2);
  alignas(16) uint8_t sm[16];
  KScalesMins(p + 4, sm);
  h.sm = _mm_load_si128(reinterpret_cast<const __m128i *>(sm));
  h.mins = _mm256_cvtepu8_epi16(_mm_unpackhi_epi8(h.sm, h.sm));
  return h;
}
// The block's integer sums for one token's activations (8 lanes) into its float accumulators.
inline void AddKBlock(const KHead &h, const ActBlock256 &a, __m256i sumi, __m256 &acc, __m256 &accm) {
  const __m256i summ = _mm256_madd_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(a.bsums)), h.mins);
  acc = _mm256_fmadd_ps(_mm256_set1_ps(h.d * a.d), _mm256_cvtepi32_ps(sumi), acc);
  accm = _mm256_fmadd_ps(_mm256_set1_ps(h.dmin * a.d), _mm256_cvtepi32_ps(summ), accm);
}

template <int NT, int kBytes, bool kFifthBit>
void Q8K4(const uint8_t *base, const void *xq, int64_t xqs, int64_t n, float *out) {
  __m256 acc[NT], accm[NT];
  const ActBlock256 *a[NT];
  for (int t = 0; t < NT; ++t) {
    acc[t] = accm[t] = _mm256_setzero_ps();
    a[t] = Act256<NT>(xq, xqs, t);
  }
  const __m256i m4 = _mm256_set1_epi8(0x0f);
  const int64_t nb = n / 256;
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t *p = base + kBytes * b;
    const KHead h = ReadKHead<kBytes>(p);
    const __m256i scales = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(h.sm));
    const uint8_t *qs = p + (kFifthBit ? 48 : 16);
    __m256i qh = kFifthBit ? _mm256_loadu_si256(reinterpret_cast<const __m256i *>(p + 16)) : _mm256_setzero_si256();
    __m256i sumi[NT];
    for (int t = 0; t < NT; ++t) sumi[t] = _mm256_setzero_si256();
    for (int c = 0; c < 4; ++c) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(qs + 32 * c));
      __m256i lo = _mm256_and_si256(v, m4);
      __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
      if (kFifthBit) {
        const __m256i one = _mm256_set1_epi8(1);
        lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(qh, one), 4));
        hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 1), one), 4));
        qh = _mm256_srli_epi16(qh, 2);
      }
      const __m256i s_lo = _mm256_shuffle_epi8(scales, _mm256_set1_epi16(static_cast<int16_t>(0x0100 * (4 * c + 1) + 4 * c)));
      const __m256i s_hi = _mm256_shuffle_epi8(scales, _mm256_set1_epi16(static_cast<int16_t>(0x0100 * (4 * c + 3) + 4 * c + 2)));
      for (int t = 0; t < NT; ++t) {
        const int8_t *q = a[t][b].q + 64 * c;
        const __m256i p_lo = _mm256_maddubs_epi16(lo, _mm256_loadu_si256(reinterpret_cast<const __m256i *>(q)));
        const __m256i p_hi = _mm256_maddubs_epi16(hi, _mm256_loadu_si256(reinterpret_cast<const __m256i *>(q + 32)));
        sumi[t] = _mm256_add_epi32(sumi[t], _mm256_add_epi32(_mm256_madd_epi16(p_lo, s_lo), _mm256_madd_epi16(p_hi, s_hi)));
      }
    }
    for (int t = 0; t < NT; ++t) AddKBlock(h, a[t][b], sumi[t], acc[t], accm[t]);
  }
  for (int t = 0; t < NT; ++t) out[t] = Reduce8(acc[t]) - Reduce8(accm[t]);
}

// The same with AVX-512 for the integer part: a zmm holds a chunk's low nibbles (the sub-block
// 2c) and its high ones (2c + 1), against the 64 activation bytes they meet, and the two
// sub-blocks' scales. Lane j and j + 8 of the sums then hold what lane j of the AVX2 kernel sums
// for the two halves; they are added (integers: exact) before the same float steps, so the
// results equal Q8K4's bit for bit.
#define STRATA_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))
// GCC 12's AVX-512 intrinsics start from an "undefined" register it then reports as uninitialized.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
template <int NT, int kBytes, bool kFifthBit>
STRATA_AVX512 void Q8K4x512(const uint8_t *base, const void *xq, int64_t xqs, int64_t n, float *out) {
  __m256 acc[NT], accm[NT];
  const ActBlock256 *a[NT];
  for (int t = 0; t < NT; ++t) {
    acc[t] = accm[t] = _mm256_setzero_ps();
    a[t] = Act256<NT>(xq, xqs, t);
  }
  const __m512i m4 = _mm512_set1_epi8(0x0f);
  // Per 16-bit word: no shift for the low 256 bits, one nibble (or one bit of qh) for the high.
  const __m512i nib = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(4), 1);
  const __m512i bit = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(1), 1);
  // vpermw indices: word 2c of the scales in the low 256 bits, 2c + 1 in the high.
  __m512i pick[4];
  for (int c = 0; c < 4; ++c) {
    pick[c] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi16(static_cast<int16_t>(2 * c))),
                                 _mm256_set1_epi16(static_cast<int16_t>(2 * c + 1)), 1);
  }
  const int64_t nb = n / 256;
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t *p = base + kBytes * b;
    const KHead h = ReadKHead<kBytes>(p);
    const __m512i scales = _mm512_castsi128_si512(_mm_cvtepu8_epi16(h.sm));
    const uint8_t *qs = p + (kFifthBit ? 48 : 16);
    __m512i qh = kFifthBit ? _mm512_srlv_epi16(_mm512_broadcast_i64x4(_mm256_loadu_si256(
                                                   reinterpret_cast<const __m256i *>(p + 16))),
                                               bit)
                           : _mm512_setzero_si512();
    __m512i sumi[NT];
    for (int t = 0; t < NT; ++t) sumi[t] = _mm512_setzero_si512();
    for (int c = 0; c < 4; ++c) {
      const __m512i v = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(qs + 32 * c)));
      __m512i codes = _mm512_and_si512(_mm512_srlv_epi16(v, nib), m4);
      if (kFifthBit) {
        codes = _mm512_or_si512(codes, _mm512_slli_epi16(_mm512_and_si512(qh, _mm512_set1_epi8(1)), 4));
        qh = _mm512_srli_epi16(qh, 2);
      }
      const __m512i sc = _mm512_permutexvar_epi16(pick[c], scales);
      for (int t = 0; t < NT; ++t) {
        const __m512i q = _mm512_loadu_si512(a[t][b].q + 64 * c);
        sumi[t] = _mm512_add_epi32(sumi[t], _mm512_madd_epi16(_mm512_maddubs_epi16(codes, q), sc));
      }
    }
    for (int t = 0; t < NT; ++t) {
      const __m256i s8 = _mm256_add_epi32(_mm512_castsi512_si256(sumi[t]), _mm512_extracti64x4_epi64(sumi[t], 1));
      AddKBlock(h, a[t][b], s8, acc[t], accm[t]);
    }
  }
  for (int t = 0; t < NT; ++t) out[t] = Reduce8(acc[t]) - Reduce8(accm[t]);
}

STRATA_AVX512 void DotQ4_KQ8x512(const Codec &, const void *row, const void *xq, int64_t xqs, int n_tok, int64_t n,
                                 float *out) {
  ForTokens(n_tok, [&](auto nt) {
    Q8K4x512<decltype(nt)::value, 144, false>(static_cast<const uint8_t *>(row), xq, xqs, n, out);
  });
}
STRATA_AVX512 void DotQ5_KQ8x512(const Codec &, const void *row, const void *xq, int64_t xqs, int n_tok, int64_t n,
                                 float *out) {
  ForTokens(n_tok, [&](auto nt) {
    Q8K4x512<decltype(nt)::value, 176, true>(static_cast<const uint8_t *>(row), xq, xqs, n, out);
  });
}

// Q6_K (see Q8K6 below) with a zmm for two of a half's four chunks of 32 codes: chunks 2j and
// 2j + 1 (elements 128h + 64j .. + 63) come from the half's 64 low-bit bytes (low nibbles for j = 0,
// high for j = 1) and its 32 high-bit bytes (shifted 4j and 4j + 2), and meet 64 contiguous
// activation bytes; 128-bit lane i takes sub-block scale 8h + 4j + i. The two 256-bit halves then
// hold what the AVX2 kernel adds into the same eight lanes, so their sum, after the same start
// (-32 sum(scale bsum)), is its integer sum exactly, and the float steps are its own.
template <int NT>
STRATA_AVX512 void Q8K6x512(const uint8_t *base, const void *xq, int64_t xqs, int64_t n, float *out) {
  __m256 acc[NT];
  const ActBlock256 *a[NT];
  for (int t = 0; t < NT; ++t) {
    acc[t] = _mm256_setzero_ps();
    a[t] = Act256<NT>(xq, xqs, t);
  }
  const __m512i m4 = _mm512_set1_epi8(0x0f), m2 = _mm512_set1_epi8(0x03);
  __m512i qh_shift[2], pick[2][2];
  for (int j = 0; j < 2; ++j) {
    qh_shift[j] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi16(static_cast<int16_t>(4 * j))),
                                     _mm256_set1_epi16(static_cast<int16_t>(4 * j + 2)), 1);
    for (int h = 0; h < 2; ++h) {
      alignas(64) int16_t idx[32];
      for (int w = 0; w < 32; ++w) idx[w] = static_cast<int16_t>(8 * h + 4 * j + w / 8);
      pick[h][j] = _mm512_load_si512(idx);
    }
  }
  const int64_t nb = n / 256;
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t *p = base + 210 * b;
    for (int l = 0; l < 210; l += 64) Prefetch(p + l);
    const __m128i sc8 = _mm_loadu_si128(reinterpret_cast<const __m128i *>(p + 192));
    const float d = LoadHalf(p + 208);
    const __m512i sc16 = _mm512_castsi256_si512(_mm256_cvtepi8_epi16(sc8));
    __m512i sumi[NT];
    for (int t = 0; t < NT; ++t) sumi[t] = _mm512_setzero_si512();
    for (int h = 0; h < 2; ++h) {
      const __m512i ql = _mm512_loadu_si512(p + 64 * h);
      const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(p + 128 + 32 * h)));
      for (int j = 0; j < 2; ++j) {
        const __m512i lo = _mm512_and_si512(j == 0 ? ql : _mm512_srli_epi16(ql, 4), m4);
        const __m512i hi = _mm512_and_si512(_mm512_srlv_epi16(qh, qh_shift[j]), m2);
        const __m512i codes = _mm512_or_si512(lo, _mm512_slli_epi16(hi, 4));
        const __m512i sc = _mm512_permutexvar_epi16(pick[h][j], sc16);
        for (int t = 0; t < NT; ++t) {
          const __m512i q = _mm512_loadu_si512(a[t][b].q + 128 * h + 64 * j);
          sumi[t] = _mm512_add_epi32(sumi[t], _mm512_madd_epi16(_mm512_maddubs_epi16(codes, q), sc));
        }
      }
    }
    for (int t = 0; t < NT; ++t) {
      const __m256i bs = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(a[t][b].bsums));
      const __m256i start = _mm256_sub_epi32(_mm256_setzero_si256(),
                                             _mm256_slli_epi32(_mm256_madd_epi16(bs, _mm256_cvtepi8_epi16(sc8)), 5));
      const __m256i s8 = _mm256_add_epi32(
          start, _mm256_add_epi32(_mm512_castsi512_si256(sumi[t]), _mm512_extracti64x4_epi64(sumi[t], 1)));
      acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d * a[t][b].d), _mm256_cvtepi32_ps(s8), acc[t]);
    }
  }
  for (int t = 0; t < NT; ++t) out[t] = Reduce8(acc[t]);
}

STRATA_AVX512 void DotQ6_KQ8x512(const Codec &, const void *row, const void *xq, int64_t xqs, int n_tok, int64_t n,
                                 float *out) {
  ForTokens(n_tok, [&](auto nt) { Q8K6x512<decltype(nt)::value>(static_cast<const uint8_t *>(row), xq, xqs, n, out); });
}
#pragma GCC diagnostic pop
#undef STRATA_AVX512

void DotQ4_KQ8(const Codec &, const void *row, const void *xq, int64_t xqs, int n_tok, int64_t n, float *out) {
  ForTokens(n_tok, [&](auto nt) {
    Q8K4<decltype(nt)::value, 144, false>(static_cast<const uint8_t *>(row), xq, xqs, n, out);
  });
}
void DotQ5_KQ8(const Codec &, const void *row, const void *xq, int64_t xqs, int n_tok, int64_t n, float *out) {
  ForTokens(n_tok, [&](auto nt) {
    Q8K4<decltype(nt)::value, 176, true>(static_cast<const uint8_t *>(row), xq, xqs, n, out);
  });
}

// pshufb control picking byte i for lanes 0..7 and byte i + 1 for lanes 8..15 (within 128 bits).
inline __m128i PairShuffle(int i) {
  return _mm_set_epi8(static_cast<char>(i + 1), static_cast<char>(i + 1), static_cast<char>(i + 1),
                      static_cast<char>(i + 1), static_cast<char>(i + 1), static_cast<char>(i + 1),
                      static_cast<char>(i + 1), static_cast<char>(i + 1), static_cast<char>(i),
                      static_cast<char>(i), static_cast<char>(i), static_cast<char>(i),
                      static_cast<char>(i), static_cast<char>(i), static_cast<char>(i),
                      static_cast<char>(i));
}

// sumi[t] += the dot of the 32 codes c of elements 128h + 32k .. + 31 with token t's activation
// codes, each 16 weighted by its sub-block's scale (int8 sc8[8h + 2k], sc8[8h + 2k + 1]).
template <int NT>
inline void AddScaledCodes32(__m256i c, __m128i sc8, int h, int k, const ActBlock256 *const *a, int64_t b,
                             __m256i *sumi) {
  const __m256i s = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc8, PairShuffle(8 * h + 2 * k)));
  for (int t = 0; t < NT; ++t) {
    const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(a[t][b].q + 128 * h + 32 * k));
    sumi[t] = _mm256_add_epi32(sumi[t], _mm256_madd_epi16(_mm256_maddubs_epi16(c, q), s));
  }
}

// Q6_K: sum = d d_x * (sum_s scale_s dot_s(c, q) - 32 sum_s scale_s bsum_s), c in 0..63.
template <int NT>
void Q8K6(const uint8_t *base, const void *xq, int64_t xqs, int64_t n, float *out) {
  __m256 acc[NT];
  const ActBlock256 *a[NT];
  for (int t = 0; t < NT; ++t) {
    acc[t] = _mm256_setzero_ps();
    a[t] = Act256<NT>(xq, xqs, t);
  }
  const int64_t nb = n / 256;
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t *p = base + 210 * b;
    for (int l = 0; l < 210; l += 64) Prefetch(p + l);
    const __m128i sc8 = _mm_loadu_si128(reinterpret_cast<const __m128i *>(p + 192));
    const float d = LoadHalf(p + 208);
    __m256i sumi[NT];
    for (int t = 0; t < NT; ++t) {
      const __m256i bs = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(a[t][b].bsums));
      sumi[t] = _mm256_sub_epi32(_mm256_setzero_si256(),
                                 _mm256_slli_epi32(_mm256_madd_epi16(bs, _mm256_cvtepi8_epi16(sc8)), 5));
    }
    for (int h = 0; h < 2; ++h) {
      for (int k = 0; k < 4; ++k) {
        AddScaledCodes32<NT>(Q6Codes(p + 64 * h, p + 128 + 32 * h, k), sc8, h, k, a, b, sumi);
      }
    }
    for (int t = 0; t < NT; ++t) {
      acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d * a[t][b].d), _mm256_cvtepi32_ps(sumi[t]), acc[t]);
    }
  }
  for (int t = 0; t < NT; ++t) out[t] = Reduce8(acc[t]);
}

void DotQ6_KQ8(const Codec &, const void *row, const void *xq, int64_t xqs, int n_tok, int64_t n, float *out) {
  ForTokens(n_tok, [&](auto nt) { Q8K6<decltype(nt)::value>(static_cast<const uint8_t *>(row), xq, xqs, n, out); });
}

// Q2_K / Q3_K: unsigned codes c of elements 128h + 32k + l (l < 32) against the activation codes,
// weighted per sub-block of 16 by its scale. Q2_K: d sum(sc c q) - dmin sum(m bsum). Q3_K (codes
// q = c - 4, c = low two bits | third bit << 2): d (sum(sc c q) - 4 sum(sc bsum)).
template <int NT, bool kQ3>
void Q8K23(const uint8_t *base, const void *xq, int64_t xqs, int64_t n, float *out) {
  constexpr int kBytes = kQ3 ? 110 : 84;
  __m256 acc[NT], accm[NT];
  const ActBlock256 *a[NT];
  for (int t = 0; t < NT; ++t) {
    acc[t] = accm[t] = _mm256_setzero_ps();
    a[t] = Act256<NT>(xq, xqs, t);
  }
  const __m256i m3 = _mm256_set1_epi8(3), one = _mm256_set1_epi8(1);
  const int64_t nb = n / 256;
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t *p = base + kBytes * b;
    for (int l = 0; l < kBytes; l += 64) Prefetch(p + l);
    alignas(16) int8_t sc[16];
    alignas(16) uint8_t mn[16] = {};
    float d, dmin = 0.f;
    if (kQ3) {
      d = LoadHalf(p + 108);
      const uint8_t *s = p + 96;
      for (int i = 0; i < 16; ++i) {
        const int lo = i < 8 ? (s[i] & 0x0f) : (s[i - 8] >> 4), hi = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
        sc[i] = static_cast<int8_t>((lo | (hi << 4)) - 32);
      }
    } else {
      d = LoadHalf(p + 80);
      dmin = LoadHalf(p + 82);
      for (int i = 0; i < 16; ++i) {
        sc[i] = static_cast<int8_t>(p[i] & 0x0f);
        mn[i] = static_cast<uint8_t>(p[i] >> 4);
      }
    }
    const __m128i sc8 = _mm_load_si128(reinterpret_cast<const __m128i *>(sc));
    const __m256i sc16 = _mm256_cvtepi8_epi16(sc8);
    __m256i sumi[NT];
    for (int t = 0; t < NT; ++t) {
      const __m256i bs = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(a[t][b].bsums));
      sumi[t] = kQ3 ? _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(_mm256_madd_epi16(bs, sc16), 2))
                    : _mm256_setzero_si256();
      if (!kQ3) {
        const __m256i mins = _mm256_cvtepu8_epi16(_mm_load_si128(reinterpret_cast<const __m128i *>(mn)));
        accm[t] = _mm256_fmadd_ps(_mm256_set1_ps(dmin * a[t][b].d), _mm256_cvtepi32_ps(_mm256_madd_epi16(bs, mins)),
                                  accm[t]);
      }
    }
    const __m256i hmask = kQ3 ? _mm256_loadu_si256(reinterpret_cast<const __m256i *>(p)) : _mm256_setzero_si256();
    for (int h = 0; h < 2; ++h) {
      const __m256i qs = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(p + (kQ3 ? 32 : 16) + 32 * h));
      for (int k = 0; k < 4; ++k) {
        __m256i c = _mm256_and_si256(_mm256_srli_epi16(qs, 2 * k), m3);
        if (kQ3) c = _mm256_or_si256(c, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hmask, 4 * h + k), one), 2));
        AddScaledCodes32<NT>(c, sc8, h, k, a, b, sumi);
      }
    }
    for (int t = 0; t < NT; ++t) {
      acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d * a[t][b].d), _mm256_cvtepi32_ps(sumi[t]), acc[t]);
    }
  }
  for (int t = 0; t < NT; ++t) out[t] = Reduce8(acc[t]) - Reduce8(accm[t]);
}

void DotQ2_KQ8(const Codec &, const void *row, const void *xq, int64_t xqs, int n_tok, int64_t n, float *out) {
  ForTokens(n_tok, [&](auto nt) { Q8K23<decltype(nt)::value, false>(static_cast<const uint8_t *>(row), xq, xqs, n, out); });
}
void DotQ3_KQ8(const Codec &, const void *row, const void *xq, int64_t xqs, int n_tok, int64_t n, float *out) {
  ForTokens(n_tok, [&](auto nt) { Q8K23<decltype(nt)::value, true>(static_cast<const uint8_t *>(row), xq, xqs, n, out); });
}

// Any codec in q8 mode: weights through the codec, activations as d * q floats, FMA in 16 lanes.
template <typename Dequant>
void DotQ8Via(const Codec &codec, const void *row, const void *xq, int64_t xqs, int n_tok, int64_t n, float *out,
              Dequant &&dequant) {
  const auto *base = static_cast<const uint8_t *>(row);
  const bool big = codec.block_elems == 256;
  ForTokens(n_tok, [&](auto nt) {
    constexpr int NT = decltype(nt)::value;
    __m256 acc[NT][2];
    for (int t = 0; t < NT; ++t) acc[t][0] = acc[t][1] = _mm256_setzero_ps();
    alignas(32) float w[256];
    for (int64_t s = 0; s < n; s += 256) {
      const int64_t len = std::min<int64_t>(256, n - s);
      dequant(base + (s / codec.block_elems) * codec.block_bytes, w, len);
      for (int64_t i = 0; i < len; i += 32) {
        const int64_t e = s + i;
        for (int t = 0; t < NT; ++t) {
          const auto *xt = static_cast<const uint8_t *>(xq) + t * xqs;
          float dx;
          const int8_t *q;
          if (big) {
            const auto *blk = reinterpret_cast<const ActBlock256 *>(xt) + e / 256;
            dx = blk->d;
            q = blk->q + e % 256;
          } else {
            const auto *blk = reinterpret_cast<const ActBlock32 *>(xt) + e / 32;
            dx = blk->d;
            q = blk->q;
          }
          const __m256 dv = _mm256_set1_ps(dx);
          for (int j = 0; j < 32; j += 16) {
            const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i *>(q + j));
            acc[t][0] = _mm256_fmadd_ps(_mm256_load_ps(w + i + j), _mm256_mul_ps(dv, I8ToPs(v)), acc[t][0]);
            acc[t][1] = _mm256_fmadd_ps(_mm256_load_ps(w + i + j + 8),
                                        _mm256_mul_ps(dv, I8ToPs(_mm_srli_si128(v, 8))), acc[t][1]);
          }
        }
      }
    }
    StoreExact<NT>(acc, out);
  });
}

void DotQ8ViaCodec(const Codec &codec, const void *row, const void *xq, int64_t xqs, int n_tok, int64_t n,
                   float *out) {
  DotQ8Via(codec, row, xq, xqs, n_tok, n, out,
           [&](const uint8_t *src, float *w, int64_t len) { codec.dequantize(src, w, len); });
}

template <void (*Block)(const uint8_t *, float *)>
void DotQ8ViaBlock(const Codec &codec, const void *row, const void *xq, int64_t xqs, int n_tok, int64_t n,
                   float *out) {
  DotQ8Via(codec, row, xq, xqs, n_tok, n, out, [](const uint8_t *src, float *w, int64_t) { Block(src, w); });
}

// The lattice i-quants against 8-bit activations: per 32 elements, the grid levels as unsigned
// bytes u, the signs as +-1 bytes applied to the activation codes, one integer dot (maddubs), then
// (db d_x) per lane. Group(p, g, &u, &signs, &db) decodes group g of block p: db holds each lane's
// weight scale (lane i covers elements 4i .. 4i + 3 of the group).
// Sign byte s as 8 bytes of +-1 (-1 where bit j of s is set), and a 7-bit sign index k as the same
// for its byte IqSigns(k).
struct SignTable {
  alignas(8) int8_t by_byte[256][8];
  alignas(8) int8_t by_index[128][8];
  SignTable() {
    for (int b = 0; b < 256; ++b)
      for (int j = 0; j < 8; ++j) by_byte[b][j] = static_cast<int8_t>((b >> j) & 1 ? -1 : 1);
    for (int k = 0; k < 128; ++k) std::memcpy(by_index[k], by_byte[IqSigns(static_cast<uint32_t>(k))], 8);
  }
};
const SignTable kSigns;
inline const uint8_t *SignRow(const int8_t *row) { return reinterpret_cast<const uint8_t *>(row); }

inline __m256i Rows4(const uint8_t *a, const uint8_t *b, const uint8_t *c, const uint8_t *d) {
  uint64_t x[4];
  std::memcpy(&x[0], a, 8);
  std::memcpy(&x[1], b, 8);
  std::memcpy(&x[2], c, 8);
  std::memcpy(&x[3], d, 8);
  return _mm256_setr_epi64x(static_cast<long long>(x[0]), static_cast<long long>(x[1]), static_cast<long long>(x[2]),
                            static_cast<long long>(x[3]));
}
inline __m256i Rows8x4(const uint8_t *const *r) {  // eight 4-level entries
  uint32_t x[8];
  for (int i = 0; i < 8; ++i) std::memcpy(&x[i], r[i], 4);
  return _mm256_setr_epi32(static_cast<int>(x[0]), static_cast<int>(x[1]), static_cast<int>(x[2]),
                           static_cast<int>(x[3]), static_cast<int>(x[4]), static_cast<int>(x[5]),
                           static_cast<int>(x[6]), static_cast<int>(x[7]));
}

// Per 32 weights, Group(p, g, &u, &signs, &sc) decodes group g of block p: u the levels, signs +-1
// bytes, sc each int16 lane's integer scale (lane i of the maddubs covers elements 2i, 2i + 1). The
// scaled integer sums add up over the block, times Scale(p) (the block's d and the format's
// constant) and d_x once a block.
template <int NT, typename Group, typename Scale>
void Q8Iq(const uint8_t *base, int64_t block_bytes, const void *xq, int64_t xqs, int64_t n, Group &&group,
          Scale &&scale, float *out) {
  __m256 acc[NT];
  const ActBlock256 *a[NT];
  for (int t = 0; t < NT; ++t) {
    acc[t] = _mm256_setzero_ps();
    a[t] = Act256<NT>(xq, xqs, t);
  }
  const int64_t nb = n / 256;
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t *p = base + block_bytes * b;
    for (int l = 0; l < block_bytes; l += 64) Prefetch(p + l);
    __m256i sumi[NT];
    for (int t = 0; t < NT; ++t) sumi[t] = _mm256_setzero_si256();
    for (int g = 0; g < 8; ++g) {
      __m256i u, sg, sc;
      group(p, g, &u, &sg, &sc);
      for (int t = 0; t < NT; ++t) {
        const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(a[t][b].q + 32 * g));
        const __m256i pairs = _mm256_maddubs_epi16(u, _mm256_sign_epi8(q, sg));
        sumi[t] = _mm256_add_epi32(sumi[t], _mm256_madd_epi16(pairs, sc));
      }
    }
    const float ds = scale(p);
    for (int t = 0; t < NT; ++t) {
      acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(ds * a[t][b].d), _mm256_cvtepi32_ps(sumi[t]), acc[t]);
    }
  }
  for (int t = 0; t < NT; ++t) out[t] = Reduce8(acc[t]);
}

template <typename Group, typename Scale>
void DotIqQ8(const void *row, int64_t block_bytes, const void *xq, int64_t xqs, int n_tok, int64_t n, Group &&group,
             Scale &&scale, float *out) {
  ForTokens(n_tok, [&](auto nt) {
    Q8Iq<decltype(nt)::value>(static_cast<const uint8_t *>(row), block_bytes, xq, xqs, n, group, scale, out);
  });
}

inline __m256i OneScale(int s) { return _mm256_set1_epi16(static_cast<int16_t>(s)); }
inline __m256i TwoScales16(int lo, int hi) {  // elements 0..15, then 16..31
  return _mm256_setr_epi16(lo, lo, lo, lo, lo, lo, lo, lo, hi, hi, hi, hi, hi, hi, hi, hi);
}
inline __m256i Signs4(const int8_t (*rows)[8], uint32_t i0, uint32_t i1, uint32_t i2, uint32_t i3) {
  return Rows4(SignRow(rows[i0]), SignRow(rows[i1]), SignRow(rows[i2]), SignRow(rows[i3]));
}

// The formats' scales as integers: (0.5 + s) 0.25 = (2 s + 1) / 8 (IQ2), (0.5 + s) 0.5 = (2 s + 1) / 4
// (IQ3_XXS), 1 + 2 s (IQ3_S), 2 s + 1 with the IQ1 weights' 1/8; the constant goes in Scale.
void DotIQ2_XXSQ8(const Codec &, const void *row, const void *xq, int64_t xqs, int n_tok, int64_t n, float *out) {
  DotIqQ8(row, 66, xq, xqs, n_tok, n, [](const uint8_t *p, int g, __m256i *u, __m256i *sg, __m256i *sc) {
    const uint8_t *q8 = p + 2 + 8 * g;
    uint32_t aux;
    std::memcpy(&aux, q8 + 4, 4);
    *u = Rows4(kIq2xxs.v[q8[0]], kIq2xxs.v[q8[1]], kIq2xxs.v[q8[2]], kIq2xxs.v[q8[3]]);
    *sg = Signs4(kSigns.by_index, aux & 127, (aux >> 7) & 127, (aux >> 14) & 127, (aux >> 21) & 127);
    *sc = OneScale(2 * static_cast<int>(aux >> 28) + 1);
  }, [](const uint8_t *p) { return LoadHalf(p) * 0.125f; }, out);
}

void DotIQ2_XSQ8(const Codec &, const void *row, const void *xq, int64_t xqs, int n_tok, int64_t n, float *out) {
  DotIqQ8(row, 74, xq, xqs, n_tok, n, [](const uint8_t *p, int g, __m256i *u, __m256i *sg, __m256i *sc) {
    uint16_t q2[4];
    std::memcpy(q2, p + 2 + 8 * g, 8);
    *u = Rows4(kIq2xs.v[q2[0] & 511], kIq2xs.v[q2[1] & 511], kIq2xs.v[q2[2] & 511], kIq2xs.v[q2[3] & 511]);
    *sg = Signs4(kSigns.by_index, q2[0] >> 9, q2[1] >> 9, q2[2] >> 9, q2[3] >> 9);
    const uint8_t s = p[66 + g];
    *sc = TwoScales16(2 * (s & 0x0f) + 1, 2 * (s >> 4) + 1);
  }, [](const uint8_t *p) { return LoadHalf(p) * 0.125f; }, out);
}

void DotIQ2_SQ8(const Codec &, const void *row, const void *xq, int64_t xqs, int n_tok, int64_t n, float *out) {
  DotIqQ8(row, 82, xq, xqs, n_tok, n, [](const uint8_t *p, int g, __m256i *u, __m256i *sg, __m256i *sc) {
    const uint8_t *qs = p + 2 + 4 * g, qh = p[66 + g], *sb = p + 34 + 4 * g;
    *u = Rows4(kIq2s.v[qs[0] | ((qh & 3u) << 8)], kIq2s.v[qs[1] | (((qh >> 2) & 3u) << 8)],
               kIq2s.v[qs[2] | (((qh >> 4) & 3u) << 8)], kIq2s.v[qs[3] | (((qh >> 6) & 3u) << 8)]);
    *sg = Signs4(kSigns.by_byte, sb[0], sb[1], sb[2], sb[3]);
    const uint8_t s = p[74 + g];
    *sc = TwoScales16(2 * (s & 0x0f) + 1, 2 * (s >> 4) + 1);
  }, [](const uint8_t *p) { return LoadHalf(p) * 0.125f; }, out);
}

void DotIQ3_XXSQ8(const Codec &, const void *row, const void *xq, int64_t xqs, int n_tok, int64_t n, float *out) {
  DotIqQ8(row, 98, xq, xqs, n_tok, n, [](const uint8_t *p, int g, __m256i *u, __m256i *sg, __m256i *sc) {
    const uint8_t *qs = p + 2 + 8 * g;
    const uint8_t *r[8];
    for (int i = 0; i < 8; ++i) r[i] = kIq3xxs.v[qs[i]];
    *u = Rows8x4(r);
    uint32_t aux;
    std::memcpy(&aux, p + 66 + 4 * g, 4);
    *sg = Signs4(kSigns.by_index, aux & 127, (aux >> 7) & 127, (aux >> 14) & 127, (aux >> 21) & 127);
    *sc = OneScale(2 * static_cast<int>(aux >> 28) + 1);
  }, [](const uint8_t *p) { return LoadHalf(p) * 0.25f; }, out);
}

void DotIQ3_SQ8(const Codec &, const void *row, const void *xq, int64_t xqs, int n_tok, int64_t n, float *out) {
  DotIqQ8(row, 110, xq, xqs, n_tok, n, [](const uint8_t *p, int g, __m256i *u, __m256i *sg, __m256i *sc) {
    const uint8_t *qs = p + 2 + 8 * g, qh = p[66 + g], *sb = p + 74 + 4 * g;
    const uint8_t *r[8];
    for (int i = 0; i < 8; ++i) r[i] = kIq3s.v[qs[i] | (((qh >> i) & 1u) << 8)];
    *u = Rows8x4(r);
    *sg = Signs4(kSigns.by_byte, sb[0], sb[1], sb[2], sb[3]);
    *sc = OneScale(1 + 2 * ((p[106 + g / 2] >> (4 * (g % 2))) & 0x0f));
  }, [](const uint8_t *p) { return LoadHalf(p); }, out);
}

// IQ1: (g + delta) = (8 g +- 1) / 8 with g in {-1, 0, 1}: integer weights of magnitude <= 9, never
// 0, so u = |w| and the signs are w's own; the scale carries the 1/8.
inline __m256i Iq1Weights(const uint8_t *const *r, __m256i delta_sign) {
  __m256i g = Rows4(r[0], r[1], r[2], r[3]);
  g = _mm256_add_epi8(g, g);
  g = _mm256_add_epi8(g, g);
  g = _mm256_add_epi8(g, g);
  return _mm256_add_epi8(g, delta_sign);
}

void DotIQ1_SQ8(const Codec &, const void *row, const void *xq, int64_t xqs, int n_tok, int64_t n, float *out) {
  DotIqQ8(row, 50, xq, xqs, n_tok, n, [](const uint8_t *p, int g, __m256i *u, __m256i *sg, __m256i *sc) {
    uint16_t qh;
    std::memcpy(&qh, p + 34 + 2 * g, 2);
    const uint8_t *qs = p + 2 + 4 * g;
    const uint8_t *r[4];
    for (int l = 0; l < 4; ++l) r[l] = kIq1s.v[qs[l] | (((qh >> (3 * l)) & 7u) << 8)];
    const __m256i w = Iq1Weights(r, _mm256_set1_epi8((qh & 0x8000) == 0 ? 1 : -1));
    *u = _mm256_abs_epi8(w);
    *sg = w;
    *sc = OneScale(2 * ((qh >> 12) & 7) + 1);
  }, [](const uint8_t *p) { return LoadHalf(p) * 0.125f; }, out);
}

void DotIQ1_MQ8(const Codec &, const void *row, const void *xq, int64_t xqs, int n_tok, int64_t n, float *out) {
  DotIqQ8(row, 56, xq, xqs, n_tok, n, [](const uint8_t *p, int g, __m256i *u, __m256i *sg, __m256i *sc) {
    uint16_t scales[4];
    std::memcpy(scales, p + 48, 8);
    const uint8_t *r[4];
    int64_t sign[4];
    for (int c = 0; c < 4; ++c) {
      const int e = 4 * g + c;
      const int nib = (p[32 + e / 2] >> (4 * (e % 2))) & 0x0f;
      r[c] = kIq1s.v[p[e] | (static_cast<uint32_t>(nib & 7) << 8)];
      sign[c] = (nib & 8) == 0 ? 0x0101010101010101ll : -1ll;  // +1 or -1 in each byte
    }
    const __m256i w = Iq1Weights(r, _mm256_setr_epi64x(sign[0], sign[1], sign[2], sign[3]));
    *u = _mm256_abs_epi8(w);
    *sg = w;
    const int k0 = 2 * g, k1 = 2 * g + 1;
    *sc = TwoScales16(2 * ((scales[k0 / 4] >> (3 * (k0 % 4))) & 7) + 1, 2 * ((scales[k1 / 4] >> (3 * (k1 % 4))) & 7) + 1);
  }, [](const uint8_t *p) { return quant::HalfToFloat(quant::IQ1_MScaleBits(p)) * 0.125f; }, out);
}

}  // namespace

bool FindAvx2RowKernels(const Codec &codec, bool avx512, RowKernels *k) {
  k->dot_float = &DotFloatViaCodec;
  k->fused_float = false;
  if (k->act != ActFormat::kNone) {
    k->dot_q8 = &DotQ8ViaCodec;
    k->integer_q8 = false;
  }
  DotFloatFn f = nullptr;   // fused: decodes in registers
  DotFloatFn fb = nullptr;  // through the AVX2 block dequantizer
  DotQ8Fn q = nullptr;      // integer dot products
  DotQ8Fn qb = nullptr;     // q8 through the AVX2 block dequantizer
  switch (codec.id) {
    case TypeId::kF32: f = &DotF32; break;
    case TypeId::kF16: f = &DotF16; break;
    case TypeId::kBF16: f = &DotBF16; break;
    case TypeId::kQ8_0: f = &DotQ8_0Float; q = &DotQ8_0Q8; break;
    case TypeId::kQ4_0: f = &DotQ4_0Float; q = &DotQ4_0Q8; break;
    case TypeId::kQ4_1: f = &DotQ4_1Float; q = &DotQ4_1Q8; break;
    case TypeId::kQ5_0: f = &DotQ5_0Float; q = &DotQ5_0Q8; break;
    case TypeId::kQ5_1: f = &DotQ5_1Float; q = &DotQ5_1Q8; break;
    case TypeId::kQ2_K: fb = &DotFloatViaBlock<&DequantQ2_K>; q = &DotQ2_KQ8; break;
    case TypeId::kQ3_K: fb = &DotFloatViaBlock<&DequantQ3_K>; q = &DotQ3_KQ8; break;
    case TypeId::kQ4_K: f = &DotQ4_KFloat; q = avx512 ? &DotQ4_KQ8x512 : &DotQ4_KQ8; break;
    case TypeId::kQ5_K: fb = &DotFloatViaBlock<&DequantQ5_K>; q = avx512 ? &DotQ5_KQ8x512 : &DotQ5_KQ8; break;
    case TypeId::kQ6_K: f = &DotQ6_KFloat; q = avx512 ? &DotQ6_KQ8x512 : &DotQ6_KQ8; break;
    case TypeId::kIQ4_NL: f = &DotIQ4_NLFloat; q = &DotIQ4_NLQ8; break;
    case TypeId::kIQ4_XS: f = &DotIQ4_XSFloat; q = &DotIQ4_XSQ8; break;
    case TypeId::kMXFP4: f = &DotMXFP4Float; q = &DotMXFP4Q8; break;
    case TypeId::kIQ2_XXS: fb = &DotFloatViaBlock<&DequantIQ2_XXS>; q = &DotIQ2_XXSQ8; break;
    case TypeId::kIQ2_XS: fb = &DotFloatViaBlock<&DequantIQ2_XS>; q = &DotIQ2_XSQ8; break;
    case TypeId::kIQ2_S: fb = &DotFloatViaBlock<&DequantIQ2_S>; q = &DotIQ2_SQ8; break;
    case TypeId::kIQ3_XXS: fb = &DotFloatViaBlock<&DequantIQ3_XXS>; q = &DotIQ3_XXSQ8; break;
    case TypeId::kIQ3_S: fb = &DotFloatViaBlock<&DequantIQ3_S>; q = &DotIQ3_SQ8; break;
    case TypeId::kIQ1_S: fb = &DotFloatViaBlock<&DequantIQ1_S>; q = &DotIQ1_SQ8; break;
    case TypeId::kIQ1_M: fb = &DotFloatViaBlock<&DequantIQ1_M>; q = &DotIQ1_MQ8; break;
    default: break;
  }
  if (f != nullptr) {
    k->dot_float = f;
    k->fused_float = true;
  } else if (fb != nullptr) {
    k->dot_float = fb;
  }
  if (k->act != ActFormat::kNone) {
    if (q != nullptr) {
      k->dot_q8 = q;
      k->integer_q8 = true;
    } else if (qb != nullptr) {
      k->dot_q8 = qb;
    }
  }
  return true;
}

}  // namespace strata::cpu::kernels::internal
