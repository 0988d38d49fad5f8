// Row-dot kernels for the CPU backend: one weight row (any codec) against up to kMaxTokens tokens.
// Invariant: for a fixed (codec, mode, ISA), each token's result is computed by the same operations
// in the same order whatever the token count of the call, so batched results equal solo results.
#pragma once

#include <cstdint>

#include "lib/quant/codec.h"

namespace strata::cpu::kernels {

// Tokens one kernel call handles: each weight block is decoded once and used for all of them.
constexpr int kMaxTokens = 4;

// The instruction set the kernels use; kAvx2 means AVX2 + FMA + F16C; kAvx512 the AVX2 kernels plus
// AVX-512 (F, BW, VL) ones where written, with the same results bit for bit.
enum class Isa { kScalar, kAvx2, kAvx512 };
// What this machine supports (read once with __builtin_cpu_supports), capped by the STRATA_CPU_ISA tunable
// ("scalar", "avx2" or "avx512": the same results bit for bit, so the knob only measures speed).
Isa BestIsa();
// `detected` capped by the value of STRATA_CPU_ISA (null, empty or unknown: no cap).
Isa CapIsa(Isa detected, const char *cap);

// Activation formats of the q8 mode, chosen per codec so that activation blocks line up with weight
// blocks. Each element is x ~= d * q with d = amax(block) / 127 and q = round(x / d) in [-127, 127].
enum class ActFormat {
  kNone,      // the codec has no integer path (float weights): q8 mode uses the exact kernel
  kQ8Block32, // 32-element blocks (legacy, IQ4_NL, MXFP4 weights)
  kQ8Block256 // 256-element blocks with 16-element partial sums (k-quants, IQ4_XS)
};

// One 32-element activation block. sum = sum of q, for codecs with an offset or a min.
struct ActBlock32 {
  float d;
  int32_t sum;
  int8_t q[32];
};
// One 256-element activation block. bsums[i] = sum of q[16i .. 16i + 15].
struct ActBlock256 {
  float d;
  int16_t bsums[16];
  int8_t q[256];
};

// The activation format of the q8 mode for weights of `codec` (by its block size). The CUDA
// backend's 8-bit mode rounds to the same blocks.
ActFormat ActFormatOf(const quant::Codec &codec);

// Bytes of one token's quantized activations of n elements (n a multiple of the block).
int64_t ActRowBytes(ActFormat f, int64_t n);
// Quantizes one token's n activations into dst (ActRowBytes bytes). The same IEEE operations on
// every machine (four at a time with SSE2, one at a time without), so the quantized activations are
// the same everywhere. Non-finite inputs give unspecified codes.
void QuantizeActivations(ActFormat f, const float *x, int64_t n, void *dst);

// Exact mode: out[t] = sum_i w_i * x[t * x_stride + i] for t < n_tok (1..kMaxTokens), where w_i is
// the codec's own dequantized weight (bit-identical to Codec::dequantize) and the products are
// accumulated in float, element i into lane i % 8, lanes reduced by a fixed tree.
// Error vs float64: |out - exact| <= (n / 8 + 3) * 2^-24 * sum_i |w_i x_i| (to first order).
using DotFloatFn = void (*)(const quant::Codec &codec, const void *row, const float *x,
                            int64_t x_stride, int n_tok, int64_t n, float *out);
// Q8 mode: xq holds n_tok token rows of quantized activations xq_stride bytes apart.
// out[t] ~= sum_i w_i * d_b(i) * q_i, integer dot products per block, scaled in float.
using DotQ8Fn = void (*)(const quant::Codec &codec, const void *row, const void *xq,
                         int64_t xq_stride, int n_tok, int64_t n, float *out);

struct RowKernels {
  DotFloatFn dot_float;  // never null
  ActFormat act;         // kNone: dot_q8 is null and q8 mode uses dot_float
  DotQ8Fn dot_q8;
  bool fused_float;      // dot_float decodes in registers (false: via the codec into a stack buffer)
  bool integer_q8;       // dot_q8 uses integer SIMD dot products (false: a float fallback)
};

// The kernels for a codec on an ISA (kAvx2 or kAvx512 only when BestIsa() says so). Never null: codecs without
// dedicated kernels get generic ones that dequantize 256 elements at a time through the codec.
RowKernels FindRowKernels(const quant::Codec &codec, Isa isa);

}  // namespace strata::cpu::kernels
