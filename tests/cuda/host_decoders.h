// The CUDA decoders (backends/cuda/codecs*.cuh) run on the host: host_decoders.cu compiles them with
// nvcc, as the kernels are compiled, and without floating-point contraction, so a machine without a
// GPU checks the decoders' arithmetic (tests/cuda/codecs_host_test.cc).
#pragma once

#include <cstdint>

#include "lib/quant/codec.h"

namespace strata::cuda::test {

// Decodes `rows` rows (row_bytes apart) of a `type` matrix of `cols` columns into out (rows, cols)
// with the codec's device decoder, item by item and group by group as the dequantize kernel walks
// them. False, writing nothing, for a type without a device decoder.
bool DecodeOnHost(quant::TypeId type, const uint8_t *w, int64_t rows, int64_t cols, uint64_t row_bytes, float *out);

// The byte alignment the device decoder of `type` needs of a matrix and its rows (its kAlign); 0 for
// a type without one.
int DecoderAlign(quant::TypeId type);

}  // namespace strata::cuda::test
