// libFuzzer target for the safetensors parser: any byte string must parse or fail with a format
// status, never crash; a file that parses must tile its data section exactly with its tensors.
#include <cstddef>
#include <cstdint>

#include "lib/format/safetensors.h"

namespace {

void Require(bool ok) {
  if (!ok) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  using namespace strata::format;
  MemorySource src(data, size, "fuzz.safetensors");
  SafetensorsLimits limits;
  limits.max_header_bytes = 1u << 20;
  auto r = ParseSafetensors(src, limits);
  if (!r.ok()) {
    Require(MOE_STATUS_CATEGORY(strata::StatusToMoe(r.status())) == MOE_ERR_FORMAT);
    return 0;
  }
  uint64_t header = 0;
  Require(size >= 8);
  __builtin_memcpy(&header, data, 8);
  uint64_t expect = 8 + header;
  for (const SafetensorsTensor &t : *r) {
    Require(t.offset == expect);  // sorted, contiguous, from the start of the data section
    Require(t.nbytes <= size && t.offset <= size - t.nbytes);
    expect = t.offset + t.nbytes;
  }
  Require(expect == size);
  return 0;
}
