// Quantizer round-trip error bounds (stated per format below) and the reference dot of every codec
// against a float64 dot of the dequantized row. Data are seeded Gaussians with per-block scales.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <limits>
#include <random>
#include <vector>

#include "lib/quant/codec.h"

namespace strata::quant {
namespace {

constexpr TypeId kRunnable[] = {
    TypeId::kF32,  TypeId::kF16,  TypeId::kBF16, TypeId::kQ4_0, TypeId::kQ4_1,   TypeId::kQ5_0,
    TypeId::kQ5_1, TypeId::kQ8_0, TypeId::kQ2_K, TypeId::kQ3_K, TypeId::kQ4_K,   TypeId::kQ5_K,
    TypeId::kQ6_K, TypeId::kIQ4_NL, TypeId::kIQ4_XS, TypeId::kMXFP4, TypeId::kTQ1_0, TypeId::kTQ2_0};
// The lattice i-quants (their round trip and dot are checked elsewhere: codec_ggml_test, codec_test).
constexpr TypeId kLattice[] = {TypeId::kIQ2_XXS, TypeId::kIQ2_XS, TypeId::kIQ2_S, TypeId::kIQ3_XXS,
                               TypeId::kIQ3_S,   TypeId::kIQ1_S,  TypeId::kIQ1_M};

// n Gaussian values; every run of 256 gets its own scale in [0.1, 1000] (f16 scales stay normal),
// and a few runs are special: all zero, constant, all positive, one outlier.
std::vector<float> TestData(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> expo(-1.0f, 3.0f);
  std::vector<float> x(static_cast<size_t>(n));
  for (int64_t b = 0; b < n; b += 256) {
    const float scale = std::pow(10.0f, expo(rng));
    const int kind = static_cast<int>((b / 256) % 8);
    for (int64_t i = b; i < std::min(n, b + 256); ++i) {
      float v = normal(rng) * scale;
      if (kind == 1) v = 0.0f;
      if (kind == 2) v = 0.75f * scale;
      if (kind == 3) v = std::fabs(v) + scale;
      x[static_cast<size_t>(i)] = v;
    }
    if (kind == 4) x[static_cast<size_t>(b)] = 50.0f * scale;
  }
  return x;
}

std::vector<float> RoundTrip(const Codec &c, const std::vector<float> &x) {
  const int64_t n = static_cast<int64_t>(x.size());
  std::vector<uint8_t> q(static_cast<size_t>(n / c.block_elems * c.block_bytes));
  c.quantize(x.data(), q.data(), n);
  std::vector<float> y(x.size());
  c.dequantize(q.data(), y.data(), n);
  return y;
}

struct Span {
  float amax = 0, mn = 0, mx = 0;
};
Span Stats(const float *x, int64_t n) {
  Span s{0.0f, x[0], x[0]};
  for (int64_t i = 0; i < n; ++i) {
    s.amax = std::max(s.amax, std::fabs(x[i]));
    s.mn = std::min(s.mn, x[i]);
    s.mx = std::max(s.mx, x[i]);
  }
  return s;
}

double Rmse(const std::vector<float> &x, const std::vector<float> &y, size_t b, size_t len) {
  double e = 0, r = 0;
  for (size_t i = b; i < b + len; ++i) {
    e += (double{x[i]} - y[i]) * (double{x[i]} - y[i]);
    r += double{x[i]} * x[i];
  }
  return r > 0 ? std::sqrt(e / r) : std::sqrt(e);
}

}  // namespace

TEST_CASE("elementwise quantizers: worst-case error bounds", "[quant]") {
  const std::vector<float> x = TestData(1 << 16, 1);
  SECTION("F32 is exact") {
    const auto y = RoundTrip(*FindCodec(TypeId::kF32), x);
    CHECK(std::memcmp(x.data(), y.data(), x.size() * 4) == 0);
  }
  SECTION("F16: |err| <= 2^-11 |x| + 2^-25 (half a subnormal step)") {
    const auto y = RoundTrip(*FindCodec(TypeId::kF16), x);
    for (size_t i = 0; i < x.size(); ++i) {
      REQUIRE(std::fabs(x[i] - y[i]) <= std::ldexp(std::fabs(x[i]), -11) + std::ldexp(1.0f, -25));
    }
  }
  SECTION("BF16: |err| <= 2^-8 |x|") {
    const auto y = RoundTrip(*FindCodec(TypeId::kBF16), x);
    for (size_t i = 0; i < x.size(); ++i) REQUIRE(std::fabs(x[i] - y[i]) <= std::ldexp(std::fabs(x[i]), -8));
  }
}

// Legacy formats, per 32-element block with amax = max |x|, range = max - min (min <= 0 not needed):
//   Q8_0 |err| <= 0.57 amax/127   (half a step, plus 127 steps of the f16 rounding of d)
//   Q4_0 |err| <= 1.01 amax/8     (the value opposite the extreme lands one step past the top code)
//   Q5_0 |err| <= 1.01 amax/16
//   Q4_1 |err| <= range/30 + (range + |min|) 2^-10
//   Q5_1 |err| <= range/62 + (range + |min|) 2^-10
TEST_CASE("legacy quantizers: worst-case error bounds per block", "[quant]") {
  const std::vector<float> x = TestData(1 << 16, 2);
  struct Case {
    TypeId id;
    double (*bound)(const Span &);
  };
  const Case cases[] = {
      {TypeId::kQ8_0, [](const Span &s) { return 0.57 * s.amax / 127; }},
      {TypeId::kQ4_0, [](const Span &s) { return 1.01 * s.amax / 8; }},
      {TypeId::kQ5_0, [](const Span &s) { return 1.01 * s.amax / 16; }},
      {TypeId::kQ4_1, [](const Span &s) {
         return (double{s.mx} - s.mn) / 30 + (double{s.mx} - s.mn + std::fabs(s.mn)) / 1024;
       }},
      {TypeId::kQ5_1, [](const Span &s) {
         return (double{s.mx} - s.mn) / 62 + (double{s.mx} - s.mn + std::fabs(s.mn)) / 1024;
       }},
  };
  for (const Case &c : cases) {
    const Codec &codec = *FindCodec(c.id);
    INFO(codec.name);
    const auto y = RoundTrip(codec, x);
    for (size_t b = 0; b < x.size(); b += 32) {
      const double bound = c.bound(Stats(&x[b], 32)) * (1 + 1e-6);
      for (size_t i = b; i < b + 32; ++i) {
        INFO("element " << i << " x=" << x[i] << " y=" << y[i] << " bound " << bound);
        REQUIRE(std::fabs(double{x[i]} - y[i]) <= bound);
      }
    }
  }
}

// k-quants (Strata's own least-squares quantizers). Stated bounds, per 256-element super-block:
//   worst case |err| <= f * (sub-block range) + g * (super-block amax), where the first term is the
//   code step (a little more for an imperfect fit) and the second the error of quantizing the
//   sub-block scales to 6 (Q4_K, Q5_K) or 8 (Q6_K) bits against one f16 super-block scale:
//     Q4_K f = 1/15, g = 1/63;  Q5_K f = 1/31, g = 1/63;  Q6_K f = 1/32, g = 1/127
//   RMS error relative to the RMS of the data, per super-block of Gaussian data (equal scales):
//     Q4_K <= 0.085, Q5_K <= 0.042, Q6_K <= 0.021
//   and on the whole set each is no worse than the matching legacy format (Q4_1, Q5_1, Q8_0 / 2).
TEST_CASE("k-quant quantizers: error bounds", "[quant]") {
  const std::vector<float> x = TestData(1 << 16, 3);
  struct Case {
    TypeId id;
    int sub;
    double f, g, rms;
    TypeId legacy;
    double legacy_factor;
  };
  const Case cases[] = {
      {TypeId::kQ4_K, 32, 1.0 / 15, 1.0 / 63, 0.085, TypeId::kQ4_1, 1.0},
      {TypeId::kQ5_K, 32, 1.0 / 31, 1.0 / 63, 0.042, TypeId::kQ5_1, 1.0},
      {TypeId::kQ6_K, 16, 1.0 / 32, 1.0 / 127, 0.021, TypeId::kQ8_0, 4.0},
  };
  for (const Case &c : cases) {
    const Codec &codec = *FindCodec(c.id);
    INFO(codec.name);
    const auto y = RoundTrip(codec, x);
    double worst_rms = 0;
    for (size_t b = 0; b < x.size(); b += 256) {
      const Span blk = Stats(&x[b], 256);
      for (size_t s = b; s < b + 256; s += static_cast<size_t>(c.sub)) {
        const Span sub = Stats(&x[s], c.sub);
        const double bound = c.f * (double{sub.mx} - std::min(sub.mn, 0.0f)) + c.g * blk.amax +
                             1e-6 * blk.amax;
        for (size_t i = s; i < s + static_cast<size_t>(c.sub); ++i) {
          INFO("element " << i << " x=" << x[i] << " y=" << y[i] << " bound " << bound);
          REQUIRE(std::fabs(double{x[i]} - y[i]) <= bound);
        }
      }
      if ((b / 256) % 8 == 0 || (b / 256) % 8 >= 5) worst_rms = std::max(worst_rms, Rmse(x, y, b, 256));
    }
    CHECK(worst_rms <= c.rms);
    const auto yl = RoundTrip(*FindCodec(c.legacy), x);
    double e = 0, el = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      e += (double{x[i]} - y[i]) * (double{x[i]} - y[i]);
      el += (double{x[i]} - yl[i]) * (double{x[i]} - yl[i]);
    }
    INFO("squared error " << e << " vs " << FindCodec(c.legacy)->name << " " << el);
    CHECK(std::sqrt(e) <= c.legacy_factor * std::sqrt(el));
    WARN(codec.name << " worst rms " << worst_rms << " err ratio vs legacy " << std::sqrt(e / el));
  }
}

TEST_CASE("quantizers write every output byte", "[quant]") {
  std::vector<float> x = TestData(1024, 4);
  // Non-finite inputs give unspecified codes, but every byte is still written, the same way twice
  // (and the sanitizer builds see no undefined behaviour).
  x[300] = std::numeric_limits<float>::infinity();
  x[600] = std::numeric_limits<float>::quiet_NaN();
  x[900] = -std::numeric_limits<float>::infinity();
  std::vector<TypeId> ids(std::begin(kRunnable), std::end(kRunnable));
  ids.insert(ids.end(), std::begin(kLattice), std::end(kLattice));
  for (TypeId id : ids) {
    const Codec &c = *FindCodec(id);
    if (!CanQuantize(c)) continue;
    INFO(c.name);
    const size_t bytes = static_cast<size_t>(1024 / c.block_elems * c.block_bytes);
    std::vector<uint8_t> a(bytes + 16, 0x00), b(bytes + 16, 0xff);
    const std::vector<float> w(1024, 0.5f);
    for (const float *weights : {static_cast<const float *>(nullptr), w.data()}) {
      if (weights == nullptr && RequiresImportance(c)) continue;
      std::fill(a.begin(), a.end(), uint8_t{0x00});
      std::fill(b.begin(), b.end(), uint8_t{0xff});
      QuantizeRow(c, x.data(), a.data(), 1024, weights);
      QuantizeRow(c, x.data(), b.data(), 1024, weights);
      CHECK(std::memcmp(a.data(), b.data(), bytes) == 0);
      for (size_t i = bytes; i < bytes + 16; ++i) {
        REQUIRE(a[i] == 0x00);
        REQUIRE(b[i] == 0xff);
      }
    }
  }
}

// Offsets of the f16 scale fields, so random blocks can be given sane scales.
std::vector<int> HalfFields(TypeId id) {
  switch (id) {
    case TypeId::kQ4_0: case TypeId::kQ5_0: case TypeId::kQ8_0: case TypeId::kIQ4_NL:
    case TypeId::kIQ4_XS: return {0};
    case TypeId::kQ4_1: case TypeId::kQ5_1: case TypeId::kQ4_K: case TypeId::kQ5_K: return {0, 2};
    case TypeId::kQ2_K: return {80, 82};
    case TypeId::kQ3_K: return {108};
    case TypeId::kQ6_K: return {208};
    case TypeId::kTQ1_0: return {52};
    case TypeId::kTQ2_0: return {64};
    default: return {};
  }
}

TEST_CASE("reference dot equals the float64 dot of the dequantized row", "[quant]") {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (TypeId id : kRunnable) {
    const Codec &c = *FindCodec(id);
    INFO(c.name);
    for (int64_t n : {c.block_elems, int64_t{256}, int64_t{4096}, int64_t{4096 + 256}}) {
      if (n % c.block_elems != 0) continue;
      const int64_t nb = n / c.block_elems;
      std::vector<uint8_t> row(static_cast<size_t>(nb * c.block_bytes));
      if (c.block_elems == 1) {
        std::vector<float> v(static_cast<size_t>(n));
        for (float &f : v) f = normal(rng);
        c.quantize(v.data(), row.data(), n);
      } else {
        for (uint8_t &byte : row) byte = static_cast<uint8_t>(rng());
        for (int64_t b = 0; b < nb; ++b) {
          uint8_t *blk = row.data() + b * c.block_bytes;
          for (int off : HalfFields(id)) {
            const uint16_t h = FloatToHalf(std::fabs(normal(rng)) * 0.05f + 1e-3f);
            std::memcpy(blk + off, &h, 2);
          }
          if (id == TypeId::kMXFP4) blk[0] = static_cast<uint8_t>(120 + rng() % 15);
        }
      }
      std::vector<float> x(static_cast<size_t>(n)), deq(static_cast<size_t>(n));
      for (float &f : x) f = normal(rng);
      c.dequantize(row.data(), deq.data(), n);
      double ref = 0, mag = 0;
      for (int64_t i = 0; i < n; ++i) {
        ref += double{deq[static_cast<size_t>(i)]} * x[static_cast<size_t>(i)];
        mag += std::fabs(double{deq[static_cast<size_t>(i)]} * x[static_cast<size_t>(i)]);
      }
      const float got = c.dot(row.data(), x.data(), n);
      INFO("n=" << n << " dot " << got << " ref " << ref << " sum|terms| " << mag);
      CHECK(std::fabs(got - ref) <= 1e-5 * std::fabs(ref) + 1e-30);
    }
  }
}

// Importance-weighted quantizers on fresh random rows (a new seed each run). Gaussian rows, weights
// log-normal with one column in eight made 100x heavier. Stated per type: the round trip's RMS
// error relative to the rows' RMS stays under the bound below, every output byte is written, and
// the weights steer the error: summed over the rows, the weighted squared error on the heavy
// columns is below 0.9 times the unweighted quantizer's there (for the types that have one; Q6_K's
// six bits leave the weights less to steer: below 0.95, its ratio over many seeds reaching 0.91).
TEST_CASE("weighted quantizers: fresh rows, bounds and steering", "[quant]") {
  const uint32_t seed = std::random_device{}();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  constexpr int64_t kCols = 1024, kRows = 32;
  struct Case {
    TypeId id;
    double rms;
  };
  const Case cases[] = {{TypeId::kQ4_0, 0.11}, {TypeId::kQ4_1, 0.10}, {TypeId::kQ5_0, 0.055},
                        {TypeId::kQ5_1, 0.05}, {TypeId::kQ2_K, 0.36}, {TypeId::kQ3_K, 0.20},
                        {TypeId::kQ4_K, 0.095}, {TypeId::kQ5_K, 0.047}, {TypeId::kQ6_K, 0.024},
                        {TypeId::kIQ4_NL, 0.10}, {TypeId::kIQ4_XS, 0.10}, {TypeId::kIQ2_XXS, 0.46},
                        {TypeId::kIQ2_XS, 0.40}, {TypeId::kIQ2_S, 0.34}, {TypeId::kIQ3_XXS, 0.25},
                        {TypeId::kIQ3_S, 0.18}, {TypeId::kIQ1_S, 0.62}, {TypeId::kIQ1_M, 0.60}};
  std::vector<float> w(kCols), x(kCols * kRows);
  std::vector<bool> heavy(kCols);
  for (int64_t i = 0; i < kCols; ++i) {
    heavy[i] = rng() % 8 == 0;
    w[i] = std::exp(normal(rng)) * (heavy[i] ? 100.0f : 1.0f);
  }
  const float row_scale = std::pow(10.0f, std::uniform_real_distribution<float>(-3.0f, 2.0f)(rng));
  for (float &v : x) v = normal(rng) * row_scale;
  for (const Case &k : cases) {
    const Codec &c = *FindCodec(k.id);
    INFO(c.name);
    REQUIRE(c.quantize_weighted != nullptr);
    const size_t row_bytes = static_cast<size_t>(kCols / c.block_elems * c.block_bytes);
    std::vector<uint8_t> a(row_bytes + 16, 0x00), b(row_bytes + 16, 0xff), plain(row_bytes);
    std::vector<float> yw(kCols), yp(kCols);
    double err = 0, ref = 0, heavy_w = 0, heavy_p = 0;
    for (int64_t r = 0; r < kRows; ++r) {
      const float *row = x.data() + r * kCols;
      QuantizeRow(c, row, a.data(), kCols, w.data());
      c.quantize_weighted(row, b.data(), kCols, w.data());
      REQUIRE(std::memcmp(a.data(), b.data(), row_bytes) == 0);
      for (size_t i = row_bytes; i < row_bytes + 16; ++i) REQUIRE((a[i] == 0x00 && b[i] == 0xff));
      // (the types ggml makes only under weights have no unweighted result to compare with)
      if (c.quantize != nullptr) c.quantize(row, plain.data(), kCols);
      c.dequantize(a.data(), yw.data(), kCols);
      if (c.quantize != nullptr) c.dequantize(plain.data(), yp.data(), kCols);
      for (int64_t i = 0; i < kCols; ++i) {
        const double ew = double{row[i]} - yw[i], ep = double{row[i]} - yp[i];
        err += ew * ew;
        ref += double{row[i]} * row[i];
        if (heavy[i]) {
          heavy_w += ew * ew;
          heavy_p += ep * ep;
        }
      }
    }
    const double rms = std::sqrt(err / ref);
    INFO("relative rms " << rms << ", heavy columns' squared error " << heavy_w << " weighted vs " << heavy_p);
    CHECK(rms <= k.rms);
    if (c.quantize != nullptr) CHECK(heavy_w < (k.id == TypeId::kQ6_K ? 0.95 : 0.9) * heavy_p);
    WARN(c.name << " weighted: relative rms " << rms << ", heavy columns' error vs unweighted "
                << std::sqrt(heavy_w / heavy_p));
  }
}

}  // namespace strata::quant
