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

#include "backends/cpu/kernels/kernels_internal.h"

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

// One block: d = amax / 127, q = round-to-nearest-even(x * 127 / amax), clamped to +-127 (the
// product can round just past 127). All-zero blocks get d = 0 and q = 0.
float QuantizeBlock(const float *x, int len, int8_t *q) {
  float amax = 0.0f;
  for (int j = 0; j < len; ++j) amax = std::max(amax, std::fabs(x[j]));
  if (!(amax > 0.0f)) {
    std::memset(q, 0, static_cast<size_t>(len));
    return 0.0f;
  }
  const float id = 127.0f / amax;
  for (int j = 0; j < len; ++j) {
    const float r = std::nearbyint(x[j] * id);
    q[j] = static_cast<int8_t>(r >= 127.0f ? 127 : (r <= -127.0f ? -127 : static_cast<int>(r)));
  }
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
      return CapIsa(avx512 ? Isa::kAvx512 : Isa::kAvx2, std::getenv("STRATA_CPU_ISA"));
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
