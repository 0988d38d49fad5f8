// Registry, geometry, names, RowBytes errors and the half/bfloat16 conversions (checked exhaustively
// against independent arithmetic in double), plus quantizer round-trip bounds and the reference dot.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "lib/quant/codec.h"
#include "lib/util/status.h"

namespace strata::quant {
namespace {

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// The value of a finite half, computed from its definition in double.
double HalfValue(uint16_t h) {
  const int exp = (h >> 10) & 0x1f;
  const int mant = h & 0x3ff;
  const double mag = exp == 0 ? std::ldexp(mant, -24) : std::ldexp(1024 + mant, exp - 25);
  return (h & 0x8000) ? -mag : mag;
}

// Nearest half to a finite float by bisection over the ordered positive half patterns, ties to
// even; values past the half range go to inf when they are at least the 65520 midpoint.
uint16_t NearestHalf(float f) {
  const double a = std::fabs(static_cast<double>(f));
  const uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  if (a >= 65520.0) return sign | 0x7c00;
  uint16_t lo = 0, hi = 0x7bff;  // largest pattern with value <= a
  while (lo < hi) {
    const uint16_t mid = static_cast<uint16_t>((lo + hi + 1) / 2);
    if (HalfValue(mid) <= a) lo = mid; else hi = static_cast<uint16_t>(mid - 1);
  }
  if (lo == 0x7bff) return sign | lo;  // a in [65504, 65520)
  const double dlo = a - HalfValue(lo), dhi = HalfValue(static_cast<uint16_t>(lo + 1)) - a;
  uint16_t r = lo;
  if (dhi < dlo || (dhi == dlo && (lo & 1))) r = static_cast<uint16_t>(lo + 1);
  return sign | r;
}

// Nearest bfloat16 to a finite float, ties to even, from the two bracketing truncations.
uint16_t NearestBf16(float f) {
  const uint32_t u = Bits(f);
  const uint16_t lo = static_cast<uint16_t>(u >> 16);
  const double a = std::fabs(static_cast<double>(f));
  const double vlo = std::fabs(static_cast<double>(FromBits(uint32_t{lo} << 16)));
  const uint32_t up = (uint32_t{lo} + 1) << 16;  // magnitude one bf16 step further from zero
  const double vhi = (up & 0x7f800000u) == 0x7f800000u ? std::ldexp(1.0, 128)
                                                        : std::fabs(static_cast<double>(FromBits(up)));
  const double dlo = a - vlo, dhi = vhi - a;
  if (dhi < dlo || (dhi == dlo && (lo & 1))) return static_cast<uint16_t>(lo + 1);
  return lo;
}

moe_status CodeOf(const absl::StatusOr<uint64_t> &r) { return StatusToMoe(r.status()); }

}  // namespace

TEST_CASE("GeometryOf knows every GGUF type id, sized as ggml sizes them", "[quant]") {
  struct Row {
    uint32_t id;
    const char *name;
    int64_t elems, bytes;
  };
  const Row rows[] = {
      {0, "F32", 1, 4},          {1, "F16", 1, 2},         {2, "Q4_0", 32, 18},
      {3, "Q4_1", 32, 20},       {6, "Q5_0", 32, 22},      {7, "Q5_1", 32, 24},
      {8, "Q8_0", 32, 34},       {9, "Q8_1", 32, 40},      {10, "Q2_K", 256, 84},
      {11, "Q3_K", 256, 110},    {12, "Q4_K", 256, 144},   {13, "Q5_K", 256, 176},
      {14, "Q6_K", 256, 210},    {15, "Q8_K", 256, 292},   {16, "IQ2_XXS", 256, 66},
      {17, "IQ2_XS", 256, 74},   {18, "IQ3_XXS", 256, 98}, {19, "IQ1_S", 256, 50},
      {20, "IQ4_NL", 32, 18},    {21, "IQ3_S", 256, 110},  {22, "IQ2_S", 256, 82},
      {23, "IQ4_XS", 256, 136},  {24, "I8", 1, 1},         {25, "I16", 1, 2},
      {26, "I32", 1, 4},         {27, "I64", 1, 8},        {28, "F64", 1, 8},
      {29, "IQ1_M", 256, 56},    {30, "BF16", 1, 2},       {34, "TQ1_0", 256, 54},
      {35, "TQ2_0", 256, 66},    {39, "MXFP4", 32, 17},
  };
  for (const Row &r : rows) {
    INFO("type id " << r.id);
    const auto g = GeometryOf(r.id);
    REQUIRE(g.has_value());
    CHECK(g->block_elems == r.elems);
    CHECK(g->block_bytes == r.bytes);
    CHECK(TypeName(r.id) == r.name);
    if (const Codec *c = FindCodec(r.id)) {
      CHECK(static_cast<uint32_t>(c->id) == r.id);
      CHECK(c->name == r.name);
      CHECK(c->block_elems == r.elems);
      CHECK(c->block_bytes == r.bytes);
      CHECK(c->dequantize != nullptr);
      CHECK(c->dot != nullptr);
    }
  }
  for (uint32_t id : {4u, 5u, 31u, 32u, 33u, 36u, 37u, 38u, 40u, 41u, 1000u, 0xffffffffu}) {
    INFO("type id " << id);
    CHECK_FALSE(GeometryOf(id).has_value());
    CHECK(FindCodec(id) == nullptr);
  }
  CHECK(TypeName(4) == "type4");
  CHECK(TypeName(255) == "type255");
  CHECK(TypeName(123456) == "type123456");
  // Known by layout but not runnable.
  CHECK(FindCodec(TypeId::kQ8_K) == nullptr);
  CHECK(FindCodec(TypeId::kI32) == nullptr);
}

TEST_CASE("FindCodec covers the formats Strata decodes", "[quant]") {
  for (TypeId id : {TypeId::kF32, TypeId::kF16, TypeId::kBF16, TypeId::kQ4_0, TypeId::kQ4_1,
                    TypeId::kQ5_0, TypeId::kQ5_1, TypeId::kQ8_0, TypeId::kQ2_K, TypeId::kQ3_K,
                    TypeId::kQ4_K, TypeId::kQ5_K, TypeId::kQ6_K, TypeId::kIQ4_NL, TypeId::kIQ4_XS,
                    TypeId::kMXFP4, TypeId::kIQ2_XXS, TypeId::kIQ2_XS, TypeId::kIQ2_S, TypeId::kIQ3_XXS,
                    TypeId::kIQ3_S, TypeId::kIQ1_S, TypeId::kIQ1_M, TypeId::kTQ1_0, TypeId::kTQ2_0}) {
    INFO(TypeName(static_cast<uint32_t>(id)));
    CHECK(FindCodec(id) != nullptr);
  }
}

TEST_CASE("RowBytes sizes whole-block rows and rejects the rest", "[quant]") {
  CHECK(RowBytes(0, 7).value() == 28);
  CHECK(RowBytes(0, 0).value() == 0);
  CHECK(RowBytes(8, 4096).value() == 4096 / 32 * 34);
  CHECK(RowBytes(12, 2048).value() == 8 * 144);
  CHECK(RowBytes(16, 256).value() == 66);  // sized although not decodable
  CHECK(CodeOf(RowBytes(8, 33)) == MOE_ERR_FORMAT_TENSOR);
  CHECK(CodeOf(RowBytes(12, 128)) == MOE_ERR_FORMAT_TENSOR);
  CHECK(CodeOf(RowBytes(0, -1)) == MOE_ERR_FORMAT_TENSOR);
  CHECK(CodeOf(RowBytes(27, std::numeric_limits<int64_t>::max())) == MOE_ERR_FORMAT_TENSOR);
  CHECK(CodeOf(RowBytes(4, 32)) == MOE_ERR_UNSUPPORTED_TYPE);
  CHECK(CodeOf(RowBytes(1000, 32)) == MOE_ERR_UNSUPPORTED_TYPE);
}

TEST_CASE("HalfToFloat is exact for all 65536 halves", "[quant]") {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const uint16_t hh = static_cast<uint16_t>(h);
    const float f = HalfToFloat(hh);
    const int exp = (h >> 10) & 0x1f;
    const uint32_t mant = h & 0x3ff;
    INFO("half 0x" << std::hex << h);
    REQUIRE(std::signbit(f) == ((h & 0x8000) != 0));
    if (exp == 0x1f && mant == 0) {
      REQUIRE(std::isinf(f));
    } else if (exp == 0x1f) {
      REQUIRE(std::isnan(f));
      REQUIRE(((Bits(f) >> 13) & 0x3ff) == mant);  // payload carried over, as numpy does
    } else {
      REQUIRE(static_cast<double>(f) == HalfValue(hh));
    }
    // Every half survives a round trip, NaN payloads included.
    REQUIRE(FloatToHalf(f) == hh);
  }
}

TEST_CASE("FloatToHalf rounds to nearest even", "[quant]") {
  // Around every half: the exact value, the midpoints to its neighbours and one float either side.
  for (uint32_t h = 0; h < 0x7c00; ++h) {
    const double v = HalfValue(static_cast<uint16_t>(h));
    const double next = h + 1 < 0x7c00 ? HalfValue(static_cast<uint16_t>(h + 1)) : 65536.0;
    const float mid = static_cast<float>((v + next) / 2);  // exact: halves have 11 bits
    for (float f : {static_cast<float>(v), mid, std::nextafter(mid, 0.0f),
                    std::nextafter(mid, 1e30f)}) {
      INFO("float 0x" << std::hex << Bits(f));
      REQUIRE(FloatToHalf(f) == NearestHalf(f));
      REQUIRE(FloatToHalf(-f) == NearestHalf(-f));
    }
  }
  std::mt19937 rng(7);
  for (int i = 0; i < 1000000; ++i) {
    const float f = FromBits(rng());
    if (std::isnan(f)) {
      REQUIRE(std::isnan(HalfToFloat(FloatToHalf(f))));
      continue;
    }
    if (std::isinf(f)) continue;
    INFO("float 0x" << std::hex << Bits(f));
    REQUIRE(FloatToHalf(f) == NearestHalf(f));
  }
  CHECK(FloatToHalf(std::numeric_limits<float>::infinity()) == 0x7c00);
  CHECK(FloatToHalf(-std::numeric_limits<float>::infinity()) == 0xfc00);
  CHECK(FloatToHalf(65519.996f) == 0x7bff);
  CHECK(FloatToHalf(65520.0f) == 0x7c00);
  CHECK(FloatToHalf(std::ldexp(1.0f, -25)) == 0x0000);  // tie between 0 and the smallest subnormal
  CHECK(FloatToHalf(std::nextafter(std::ldexp(1.0f, -25), 1.0f)) == 0x0001);
  CHECK(FloatToHalf(-0.0f) == 0x8000);
  // numpy's NaN narrowing: top payload bits kept, never collapsing to inf.
  CHECK(FloatToHalf(FromBits(0x7f800001)) == 0x7c01);
  CHECK(FloatToHalf(FromBits(0xffc02000)) == 0xfe01);
}

TEST_CASE("bfloat16 conversions: exact widening, nearest-even narrowing, quiet NaNs", "[quant]") {
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const uint16_t bb = static_cast<uint16_t>(b);
    const float f = Bf16ToFloat(bb);
    REQUIRE(Bits(f) == b << 16);
    if (std::isnan(f)) {
      REQUIRE(FloatToBf16(f) == (bb | 0x40));  // quietened
    } else {
      REQUIRE(FloatToBf16(f) == bb);
      // Midpoint to the next pattern away from zero, and one float either side of it.
      const uint32_t mid = (b << 16) | 0x8000u;
      if (!std::isinf(f) && ((mid >> 23) & 0xff) != 0xff) {
        for (uint32_t u : {mid, mid - 1, mid + 1}) REQUIRE(FloatToBf16(FromBits(u)) == NearestBf16(FromBits(u)));
      }
    }
  }
  std::mt19937 rng(11);
  for (int i = 0; i < 1000000; ++i) {
    const float f = FromBits(rng());
    if (std::isnan(f) || std::isinf(f)) continue;
    INFO("float 0x" << std::hex << Bits(f));
    REQUIRE(FloatToBf16(f) == NearestBf16(f));
  }
  CHECK(FloatToBf16(FromBits(0x7f7fffff)) == 0x7f80);  // largest float rounds up to inf
  CHECK(FloatToBf16(FromBits(0x7f800001)) == 0x7fc0);  // signalling NaN -> quiet NaN
}

}  // namespace strata::quant
