// Kernel dispatch, activation quantization and the portable (baseline x86-64) kernels: weights are
// dequantized 256 elements at a time by the codec into a stack buffer, then accumulated in the
// order kernels.h states. These are the reference for the AVX2 kernels and the path without AVX2.
#include "backends/cpu/kernels/kernels.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string_view>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "backends/cpu/kernels/kernels_internal.h"
#include "lib/util/tunables.h"
// Last: the quantizer's product and its rounding must each round on their own (no fused multiply-add).
#include "lib/quant/fp_contract_off.h"

namespace strata::cpu::kernels {
namespace {

using quant::Codec;

constexpr int64_t kChunk = 256;  // a multiple of every block size (1, 32, 256)

// ---- exact mode ----

void DotFloatGeneric(const Codec &codec, const void *row, const float *x, int64_t x_stride, int n_tok,
                     int64_t n, float *out) {
  float acc[kMaxTokens][16] = {};
  float w[kChunk];
  const auto *src = static_cast<const uint8_t *>(row);
  for (int64_t i = 0; i < n; i += kChunk) {
    const int64_t len = std::min(kChunk, n - i);
    codec.dequantize(src + (i / codec.block_elems) * codec.block_bytes, w, len);
    for (int t = 0; t < n_tok; ++t) {
      const float *xt = x + t * x_stride + i;
      for (int64_t j = 0; j < len; ++j) acc[t][j & 15] += w[j] * xt[j];
    }
  }
  for (int t = 0; t < n_tok; ++t) out[t] = internal::Reduce16(acc[t]);
}

// ---- q8 mode ----

// The float fallback of q8 mode: the same quantity as the integer kernels (weights times the
// dequantized activations d * q), accumulated in float in 16 lanes.
void DotQ8Generic(const Codec &codec, const void *row, const void *xq, int64_t xq_stride, int n_tok,
                  int64_t n, float *out) {
  float acc[kMaxTokens][16] = {};
  float w[kChunk];
  const auto *src = static_cast<const uint8_t *>(row);
  const bool big = codec.block_elems == 256;
  for (int64_t i = 0; i < n; i += kChunk) {
    const int64_t len = std::min(kChunk, n - i);
    codec.dequantize(src + (i / codec.block_elems) * codec.block_bytes, w, len);
    for (int t = 0; t < n_tok; ++t) {
      const auto *xt = static_cast<const uint8_t *>(xq) + t * xq_stride;
      for (int64_t j = 0; j < len; ++j) {
        const int64_t e = i + j;
        float xv;
        if (big) {
          const auto *b = reinterpret_cast<const ActBlock256 *>(xt) + e / 256;
          xv = b->d * static_cast<float>(b->q[e % 256]);
        } else {
          const auto *b = reinterpret_cast<const ActBlock32 *>(xt) + e / 32;
          xv = b->d * static_cast<float>(b->q[e % 32]);
        }
        acc[t][j & 15] += w[j] * xv;
      }
    }
  }
  for (int t = 0; t < n_tok; ++t) out[t] = internal::Reduce16(acc[t]);
}

// std::nearbyint in the default rounding mode (to nearest, ties to even) for |v| <= 2^22, without
// the library call it compiles to on baseline x86-64 (5 ns an element, ~15 us of a CPU expert job's
// serial part): 1.5 * 2^23 + v has no fraction bits left, so the addition itself rounds v, and
// taking the constant off again is exact.
constexpr float kRoundShift = 12582912.0f;  // 1.5 * 2^23
inline float RoundToNearestEven(float v) { return (v + kRoundShift) - kRoundShift; }

// One block (a multiple of 16 long): d = amax / 127, q = round-to-nearest-even(x * 127 / amax),
// clamped to +-127 (the product can round just past 127). All-zero blocks get d = 0 and q = 0. The
// SSE2 path does the same IEEE operations four at a time, so its codes are the scalar path's.
float QuantizeBlock(const float *__restrict x, int len, int8_t *__restrict q) {
  // Eight running maxima: the same maximum as one, without one chain of dependent max instructions
  // through the block.
  float m[8] = {};
  for (int j = 0; j < len; j += 8) {
    for (int l = 0; l < 8; ++l) m[l] = std::max(m[l], std::fabs(x[j + l]));
  }
  float amax = 0.0f;
  for (float v : m) amax = std::max(amax, v);
  if (!(amax > 0.0f)) {
    std::memset(q, 0, static_cast<size_t>(len));
    return 0.0f;
  }
  const float id = 127.0f / amax;
#if defined(__SSE2__)
  const __m128 vid = _mm_set1_ps(id), shift = _mm_set1_ps(kRoundShift);
  const __m128i lo = _mm_set1_epi16(-127), hi = _mm_set1_epi16(127);
  for (int j = 0; j < len; j += 16) {
    __m128i v[4];
    for (int k = 0; k < 4; ++k) {
      const __m128 p = _mm_mul_ps(_mm_loadu_ps(x + j + 4 * k), vid);
      v[k] = _mm_cvttps_epi32(_mm_sub_ps(_mm_add_ps(p, shift), shift));  // integral already: truncation is exact
    }
    const __m128i a = _mm_min_epi16(_mm_max_epi16(_mm_packs_epi32(v[0], v[1]), lo), hi);
    const __m128i b = _mm_min_epi16(_mm_max_epi16(_mm_packs_epi32(v[2], v[3]), lo), hi);
    _mm_storeu_si128(reinterpret_cast<__m128i *>(q + j), _mm_packs_epi16(a, b));
  }
#else
  for (int j = 0; j < len; ++j) {
    const int i = static_cast<int>(RoundToNearestEven(x[j] * id));  // |x * id| <= 127.5: in range
    q[j] = static_cast<int8_t>(i > 127 ? 127 : (i < -127 ? -127 : i));
  }
#endif
  return amax / 127.0f;
}

}  // namespace

ActFormat ActFormatOf(const Codec &codec) {
  if (codec.block_elems == 32) return ActFormat::kQ8Block32;
  if (codec.block_elems == 256) return ActFormat::kQ8Block256;
  return ActFormat::kNone;  // F32, F16, BF16: float weights gain nothing from 8-bit activations
}

Isa CapIsa(Isa detected, const char *cap) {
  if (cap == nullptr) return detected;
  const std::string_view c(cap);
  Isa limit = detected;
  if (c == "scalar") limit = Isa::kScalar;
  if (c == "avx2") limit = Isa::kAvx2;
  return static_cast<int>(limit) < static_cast<int>(detected) ? limit : detected;
}

Isa BestIsa() {
  static const Isa isa = [] {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    // F16C from CPUID leaf 1 (ECX bit 29): clang's __builtin_cpu_supports does not know "f16c".
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & (1u << 29)) != 0;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c) {
      const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vl");
      return CapIsa(avx512 ? Isa::kAvx512 : Isa::kAvx2, tunables::Get().cpu_isa.c_str());
    }
#endif
    return Isa::kScalar;
  }();
  return isa;
}

int64_t ActRowBytes(ActFormat f, int64_t n) {
  switch (f) {
    case ActFormat::kQ8Block32: return (n / 32) * static_cast<int64_t>(sizeof(ActBlock32));
    case ActFormat::kQ8Block256: return (n / 256) * static_cast<int64_t>(sizeof(ActBlock256));
    case ActFormat::kNone: break;
  }
  return 0;
}

void QuantizeActivations(ActFormat f, const float *x, int64_t n, void *dst) {
  if (f == ActFormat::kQ8Block32) {
    auto *b = static_cast<ActBlock32 *>(dst);
    for (int64_t i = 0; i < n; i += 32, ++b) {
      b->d = QuantizeBlock(x + i, 32, b->q);
      int32_t s = 0;
      for (int j = 0; j < 32; ++j) s += b->q[j];
      b->sum = s;
    }
  } else if (f == ActFormat::kQ8Block256) {
    auto *b = static_cast<ActBlock256 *>(dst);
    for (int64_t i = 0; i < n; i += 256, ++b) {
      b->d = QuantizeBlock(x + i, 256, b->q);
      for (int k = 0; k < 16; ++k) {
        int s = 0;
        for (int j = 0; j < 16; ++j) s += b->q[16 * k + j];
        b->bsums[k] = static_cast<int16_t>(s);
      }
    }
  }
}

RowKernels FindRowKernels(const quant::Codec &codec, Isa isa) {
  RowKernels k;
  k.dot_float = &DotFloatGeneric;
  k.act = ActFormatOf(codec);
  k.dot_q8 = k.act == ActFormat::kNone ? nullptr : &DotQ8Generic;
  k.fused_float = false;
  k.integer_q8 = false;
#if defined(__x86_64__)
  if (isa == Isa::kAvx2 || isa == Isa::kAvx512) {
    RowKernels a = k;
    if (internal::FindAvx2RowKernels(codec, isa == Isa::kAvx512, &a)) k = a;
  }
#endif
  return k;
}

}  // namespace strata::cpu::kernels
