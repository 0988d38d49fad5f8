// The codec registry: block geometry and names for every GGUF type id (so the parser can size any
// tensor), and the runnable codecs by id. All tables are constant-initialized: lookups are safe
// from any thread, including during static initialization of other files.
#include "lib/quant/codec.h"

#include <array>
#include <cstdio>
#include <limits>
#include <string>

#include "lib/quant/codec_impl.h"

namespace strata::quant {
namespace {

struct TypeInfo {
  uint32_t id;
  std::string_view name;
  int64_t block_elems;
  int64_t block_bytes;
};

// Sizes are ggml's (GGML_QUANT_SIZES in the gguf package); QK_K = 256. Ids 31..33 and 36..38 were
// retired by ggml and stay unknown.
constexpr TypeInfo kTypes[] = {
    {0, "F32", 1, 4},
    {1, "F16", 1, 2},
    {2, "Q4_0", 32, 2 + 16},
    {3, "Q4_1", 32, 2 + 2 + 16},
    {6, "Q5_0", 32, 2 + 4 + 16},
    {7, "Q5_1", 32, 2 + 2 + 4 + 16},
    {8, "Q8_0", 32, 2 + 32},
    {9, "Q8_1", 32, 4 + 4 + 32},
    {10, "Q2_K", 256, 2 + 2 + 256 / 16 + 256 / 4},
    {11, "Q3_K", 256, 2 + 256 / 4 + 256 / 8 + 12},
    {12, "Q4_K", 256, 2 + 2 + 256 / 2 + 12},
    {13, "Q5_K", 256, 2 + 2 + 256 / 2 + 256 / 8 + 12},
    {14, "Q6_K", 256, 2 + 256 / 2 + 256 / 4 + 256 / 16},
    {15, "Q8_K", 256, 4 + 256 + 256 / 8},
    {16, "IQ2_XXS", 256, 2 + 256 / 4},
    {17, "IQ2_XS", 256, 2 + 256 / 4 + 256 / 32},
    {18, "IQ3_XXS", 256, 2 + 256 / 4 + 256 / 8},
    {19, "IQ1_S", 256, 2 + 256 / 8 + 256 / 16},
    {20, "IQ4_NL", 32, 2 + 16},
    {21, "IQ3_S", 256, 2 + 256 / 4 + 256 / 8 + 256 / 32 + 4},
    {22, "IQ2_S", 256, 2 + 256 / 4 + 256 / 16},
    {23, "IQ4_XS", 256, 2 + 2 + 256 / 2 + 256 / 64},
    {24, "I8", 1, 1},
    {25, "I16", 1, 2},
    {26, "I32", 1, 4},
    {27, "I64", 1, 8},
    {28, "F64", 1, 8},
    {29, "IQ1_M", 256, 256 / 8 + 256 / 16 + 256 / 32},
    {30, "BF16", 1, 2},
    {34, "TQ1_0", 256, 2 + 4 * 13},
    {35, "TQ2_0", 256, 2 + 64},
    {39, "MXFP4", 32, 1 + 16},
};

const TypeInfo *FindType(uint32_t id) {
  for (const TypeInfo &t : kTypes) {
    if (t.id == id) return &t;
  }
  return nullptr;
}

// Codecs that can run. An id absent here is still sized by GeometryOf.
constexpr const Codec *kCodecs[] = {
    &internal::kCodecF32,  &internal::kCodecF16,  &internal::kCodecBF16, &internal::kCodecQ4_0,
    &internal::kCodecQ4_1, &internal::kCodecQ5_0, &internal::kCodecQ5_1, &internal::kCodecQ8_0,
    &internal::kCodecQ2_K, &internal::kCodecQ3_K, &internal::kCodecQ4_K, &internal::kCodecQ5_K,
    &internal::kCodecQ6_K, &internal::kCodecIQ4_NL, &internal::kCodecIQ4_XS, &internal::kCodecMXFP4,
    &internal::kCodecIQ2_XXS, &internal::kCodecIQ2_XS, &internal::kCodecIQ2_S, &internal::kCodecIQ3_XXS,
    &internal::kCodecIQ3_S, &internal::kCodecIQ1_S, &internal::kCodecIQ1_M, &internal::kCodecTQ1_0,
    &internal::kCodecTQ2_0,
};

// "type<id>" for unknown ids must outlive the call: ids below 256 get permanent strings (built once,
// thread-safe static init); larger ids use a per-thread buffer valid until the next such call.
constexpr uint32_t kNamedUnknownIds = 256;

}  // namespace

const Codec *FindCodec(uint32_t type_id) {
  for (const Codec *c : kCodecs) {
    if (static_cast<uint32_t>(c->id) == type_id) return c;
  }
  return nullptr;
}

std::optional<BlockGeometry> GeometryOf(uint32_t type_id) {
  const TypeInfo *t = FindType(type_id);
  if (t == nullptr) return std::nullopt;
  return BlockGeometry{t->block_elems, t->block_bytes};
}

std::string_view TypeName(uint32_t type_id) {
  if (const TypeInfo *t = FindType(type_id)) return t->name;
  if (type_id < kNamedUnknownIds) {
    static const auto *names = [] {
      auto *a = new std::array<std::string, kNamedUnknownIds>();
      for (uint32_t i = 0; i < kNamedUnknownIds; ++i) (*a)[i] = "type" + std::to_string(i);
      return a;
    }();
    return (*names)[type_id];
  }
  thread_local char buf[32];
  std::snprintf(buf, sizeof buf, "type%u", static_cast<unsigned>(type_id));
  return buf;
}

absl::StatusOr<uint64_t> RowBytes(uint32_t type_id, int64_t n) {
  const TypeInfo *t = FindType(type_id);
  if (t == nullptr) {
    return Errorf(MOE_ERR_UNSUPPORTED_TYPE, "unknown tensor type id %u", type_id);
  }
  if (n < 0 || n % t->block_elems != 0) {
    return Errorf(MOE_ERR_FORMAT_TENSOR, "row of %d elements is not a whole number of %s blocks (%d)",
                  n, t->name, t->block_elems);
  }
  const uint64_t blocks = static_cast<uint64_t>(n / t->block_elems);
  const uint64_t bytes = static_cast<uint64_t>(t->block_bytes);
  if (blocks > std::numeric_limits<uint64_t>::max() / bytes) {
    return Errorf(MOE_ERR_FORMAT_TENSOR, "row of %d %s elements overflows a byte count", n, t->name);
  }
  return blocks * bytes;
}

namespace internal {

float DotViaDequantize(DequantizeFn dequantize, int64_t block_elems, int64_t block_bytes,
                       const void *row, const float *x, int64_t n) {
  constexpr int64_t kChunk = 256;  // a multiple of every block size (1, 32, 256)
  float buf[kChunk];
  const auto *src = static_cast<const uint8_t *>(row);
  double acc = 0.0;
  for (int64_t i = 0; i < n; i += kChunk) {
    const int64_t len = n - i < kChunk ? n - i : kChunk;
    dequantize(src + (i / block_elems) * block_bytes, buf, len);
    for (int64_t j = 0; j < len; ++j) acc += static_cast<double>(buf[j]) * x[i + j];
  }
  return static_cast<float>(acc);
}

}  // namespace internal
}  // namespace strata::quant
