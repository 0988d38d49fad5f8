// The device decoders compiled for the host (host_decoders.h). Built with -ffp-contract=off: each
// product and sum is rounded on its own, as MulRn/AddRn/SubRn are on the device.
#include "tests/cuda/host_decoders.h"

#include "backends/cuda/codecs.cuh"

namespace strata::cuda::test {
namespace {

template <class C>
void Decode(const uint8_t *w, int64_t rows, int64_t cols, uint64_t row_bytes, float *out) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t it = 0; it < cols / dev::kItemElems; ++it) {
      const typename C::Item item = C::Prepare(w + r * row_bytes, it);
      for (int g = 0; g < dev::kGroupsPerItem; ++g) {
        C::Group(item, g, out + r * cols + it * dev::kItemElems + g * dev::kGroupElems);
      }
    }
  }
}

}  // namespace

bool DecodeOnHost(quant::TypeId type, const uint8_t *w, int64_t rows, int64_t cols, uint64_t row_bytes, float *out) {
  return STRATA_CUDA_DISPATCH_CODEC(type, Decode<C>(w, rows, cols, row_bytes, out));
}

int DecoderAlign(quant::TypeId type) {
  int align = 0;
  STRATA_CUDA_DISPATCH_CODEC(type, align = C::kAlign);
  return align;
}

}  // namespace strata::cuda::test
