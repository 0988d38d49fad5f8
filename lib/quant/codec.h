// The codec registry: one entry per GGUF tensor type (ids are GGUF's ggml_type values, fixed by the
// file format). A codec knows its block layout and turns blocks into floats; quantizers and dot
// products are optional. Row sizes are always a whole number of blocks.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include "lib/util/status.h"

namespace strata::quant {

enum class TypeId : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ8_1 = 9,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kQ8_K = 15,
  kIQ2_XXS = 16,
  kIQ2_XS = 17,
  kIQ3_XXS = 18,
  kIQ1_S = 19,
  kIQ4_NL = 20,
  kIQ3_S = 21,
  kIQ2_S = 22,
  kIQ4_XS = 23,
  kI8 = 24,
  kI16 = 25,
  kI32 = 26,
  kI64 = 27,
  kF64 = 28,
  kIQ1_M = 29,
  kBF16 = 30,
  kTQ1_0 = 34,
  kTQ2_0 = 35,
  kMXFP4 = 39,
};

struct Codec {
  TypeId id;
  std::string_view name;   // GGUF's name: "F32", "Q8_0", "Q4_K", ...
  int64_t block_elems;     // elements per block (1 for F32/F16/BF16)
  int64_t block_bytes;     // bytes per block
  // Dequantizes n elements (a multiple of block_elems) from src to dst. Never null for a
  // registered codec that can run.
  void (*dequantize)(const void *src, float *dst, int64_t n);
  // Quantizes n elements (multiple of block_elems) without importance weights; null when Strata
  // has no quantizer for the type, or when the type needs importance weights (IQ2_XXS, IQ2_XS and
  // IQ1_S, which ggml refuses to make without them: see RequiresImportance). Byte-identical to
  // ggml's ggml_quantize_chunk with imatrix NULL (tests/quant/fixtures/ggml_*.bin): F16, BF16,
  // Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 (also equal to gguf.quants.quantize), Q2_K, Q3_K, Q4_K, Q5_K,
  // Q6_K, IQ4_NL, IQ4_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_M, MXFP4, TQ1_0 and TQ2_0.
  void (*quantize)(const float *src, void *dst, int64_t n);
  // Reference dot product of one quantized row (n elements) with float activations x. Products and
  // their sum are formed in double and rounded to float once, so the result is within about one
  // float ulp of the exact dot of the dequantized row with x (optimized kernels are checked against
  // it). Never null for a registered codec.
  float (*dot)(const void *row, const float *x, int64_t n);
  // Quantizes ONE ROW of n elements (multiple of block_elems) under importance weights: weights[i]
  // (finite, >= 0) is the importance of column i, as an imatrix gives it (mean squared activation
  // entering that column). Byte-identical to ggml_quantize_chunk with that imatrix, which for the
  // legacy types depends on the whole row (a mean square over the row), so callers pass rows one
  // at a time. Null when the type has no weighted search: then ggml ignores the weights (Q8_0,
  // MXFP4, TQ1_0, TQ2_0, F16, BF16) or Strata has no quantizer; QuantizeRow picks the entry.
  void (*quantize_weighted)(const float *src, void *dst, int64_t n, const float *weights);
};

// Whether Strata can quantize to c at all (with weights, at least).
inline bool CanQuantize(const Codec &c) { return c.quantize != nullptr || c.quantize_weighted != nullptr; }

// Whether c can only be quantized under importance weights: a quantizer exists, but no unweighted
// one (IQ2_XXS, IQ2_XS and IQ1_S, as ggml_quantize_requires_imatrix says).
inline bool RequiresImportance(const Codec &c) { return c.quantize == nullptr && c.quantize_weighted != nullptr; }

// Quantizes one row of n elements with c: under weights (one per column, may be null) when the
// codec has a weighted search, else without them, exactly as ggml_quantize_chunk does for one row.
// c.quantize must not be null unless weights are given and c.quantize_weighted is not null.
inline void QuantizeRow(const Codec &c, const float *src, void *dst, int64_t n, const float *weights) {
  if (weights != nullptr && c.quantize_weighted != nullptr) {
    c.quantize_weighted(src, dst, n, weights);
  } else {
    c.quantize(src, dst, n);
  }
}

// The codec for a GGUF type id, or nullptr when the id is unknown or Strata cannot decode it.
const Codec *FindCodec(uint32_t type_id);
inline const Codec *FindCodec(TypeId id) { return FindCodec(static_cast<uint32_t>(id)); }

// Block geometry of a type id Strata knows by layout even if it cannot decode it (so a parser can
// validate sizes of every GGUF type). nullopt for an unknown id.
struct BlockGeometry {
  int64_t block_elems;
  int64_t block_bytes;
};
std::optional<BlockGeometry> GeometryOf(uint32_t type_id);

// The GGUF name of a type id ("Q4_K"), or "type<id>". The view is static, except "type<id>" for ids
// >= 256, which lives in a per-thread buffer until the next such call on the same thread.
std::string_view TypeName(uint32_t type_id);

// Bytes of a row of n elements: MOE_ERR_FORMAT_TENSOR if n is not a multiple of the block size,
// MOE_ERR_UNSUPPORTED_TYPE for an unknown id.
absl::StatusOr<uint64_t> RowBytes(uint32_t type_id, int64_t n);

// IEEE half and bfloat16 conversions shared by codecs and formats.
float HalfToFloat(uint16_t h);
uint16_t FloatToHalf(float f);  // round to nearest even, as numpy's float16 cast
float Bf16ToFloat(uint16_t b);
// IQ1_M keeps its block's f16 scale d in the top nibbles of the four u16 scales at byte 48 (the
// first scale's lowest): read from and written into a 56-byte block.
uint16_t IQ1_MScaleBits(const uint8_t *block);
void SetIQ1_MScaleBits(uint8_t *block, uint16_t h);
uint16_t FloatToBf16(float f);  // round to nearest even

}  // namespace strata::quant
