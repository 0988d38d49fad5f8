// Row-dot kernels and CpuBackend::MatMul: every codec, both modes, scalar and AVX2, on fresh random
// rows, against float64 references with stated bounds; batched results equal solo results bit for
// bit, and so do results under 1 and 2 threads.
#include <catch2/catch.hpp>

#include <algorithm>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/kernels/kernels.h"
#include "lib/quant/codec.h"

namespace strata::cpu {
namespace {

using kernels::ActBlock256;
using kernels::ActBlock32;
using kernels::ActFormat;
using kernels::Isa;
using quant::Codec;
using quant::TypeId;

constexpr double kU = 1.0 / (1 << 24);  // float unit roundoff

const TypeId kAllTypes[] = {TypeId::kF32,  TypeId::kF16,  TypeId::kBF16, TypeId::kQ4_0, TypeId::kQ4_1,
                            TypeId::kQ5_0, TypeId::kQ5_1, TypeId::kQ8_0, TypeId::kQ2_K, TypeId::kQ3_K,
                            TypeId::kQ4_K, TypeId::kQ5_K, TypeId::kQ6_K, TypeId::kIQ4_NL,
                            TypeId::kIQ4_XS, TypeId::kMXFP4, TypeId::kIQ2_XXS, TypeId::kIQ2_XS,
                            TypeId::kIQ2_S, TypeId::kIQ3_XXS, TypeId::kIQ3_S, TypeId::kIQ1_S, TypeId::kIQ1_M};

std::vector<Isa> Isas() {
  std::vector<Isa> v = {Isa::kScalar};
  if (kernels::BestIsa() != Isa::kScalar) v.push_back(Isa::kAvx2);
  if (kernels::BestIsa() == Isa::kAvx512) v.push_back(Isa::kAvx512);
  return v;
}

void PutHalf(uint8_t *p, float f) {
  const uint16_t h = quant::FloatToHalf(f);
  std::memcpy(p, &h, 2);
}

// A random row of n elements: random code bytes with sane scale fields (so values stay finite and
// of a realistic spread), or quantized random floats for the float formats.
std::vector<uint8_t> RandomRow(const Codec &c, int64_t n, std::mt19937 &rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> scale(0.001f, 0.05f);
  std::uniform_int_distribution<int> byte(0, 255);
  const int64_t nb = n / c.block_elems;
  std::vector<uint8_t> row(static_cast<size_t>(nb * c.block_bytes));
  if (c.block_elems == 1) {
    std::vector<float> f(static_cast<size_t>(n));
    for (auto &v : f) v = normal(rng);
    c.quantize(f.data(), row.data(), n);
    return row;
  }
  for (auto &b : row) b = static_cast<uint8_t>(byte(rng));
  for (int64_t b = 0; b < nb; ++b) {
    uint8_t *p = row.data() + b * c.block_bytes;
    switch (c.id) {
      case TypeId::kQ4_1:
      case TypeId::kQ5_1:
        PutHalf(p, scale(rng));
        PutHalf(p + 2, -scale(rng) * 8);
        break;
      case TypeId::kQ2_K: PutHalf(p + 80, scale(rng)); PutHalf(p + 82, scale(rng)); break;
      case TypeId::kQ3_K: PutHalf(p + 108, scale(rng)); break;
      case TypeId::kQ4_K:
      case TypeId::kQ5_K: PutHalf(p, scale(rng) * 0.1f); PutHalf(p + 2, scale(rng) * 0.1f); break;
      case TypeId::kQ6_K: PutHalf(p + 208, scale(rng) * 0.1f); break;
      case TypeId::kMXFP4: p[0] = static_cast<uint8_t>(118 + byte(rng) % 12); break;
      case TypeId::kIQ1_M: quant::SetIQ1_MScaleBits(p, quant::FloatToHalf((byte(rng) & 1 ? 1 : -1) * scale(rng))); break;
      default: PutHalf(p, (byte(rng) & 1 ? 1 : -1) * scale(rng)); break;  // Q4_0/Q5_0/Q8_0/IQ4_*
    }
  }
  return row;
}

std::vector<float> RandomActs(int64_t n, std::mt19937 &rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> mag(0.01f, 3.0f);
  std::vector<float> x(static_cast<size_t>(n));
  // Per-32 magnitudes vary, so quantization blocks see different amax.
  float m = 1.0f;
  for (int64_t i = 0; i < n; ++i) {
    if (i % 32 == 0) m = mag(rng);
    x[i] = normal(rng) * m;
  }
  return x;
}

std::vector<int64_t> Sizes(const Codec &c) {
  if (c.block_elems == 1) return {1, 7, 8, 15, 16, 17, 31, 33, 100, 255, 256, 257, 1000, 4096};
  if (c.block_elems == 32) return {32, 64, 96, 160, 256, 544, 4096};
  return {256, 512, 768, 1280, 4096};
}

// The dequantized activations d * q of one token, exactly (in double).
std::vector<double> ActValues(ActFormat f, const void *xq, int64_t n) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    if (f == ActFormat::kQ8Block32) {
      const auto &b = static_cast<const ActBlock32 *>(xq)[i / 32];
      v[i] = static_cast<double>(b.d) * b.q[i % 32];
    } else {
      const auto &b = static_cast<const ActBlock256 *>(xq)[i / 256];
      v[i] = static_cast<double>(b.d) * b.q[i % 256];
    }
  }
  return v;
}

struct Case {
  const Codec *codec;
  int64_t n;
  std::vector<uint8_t> row;
  std::vector<double> w;  // the codec's dequantized weights
  std::vector<float> x;   // kernels::kMaxTokens tokens, n apart
};

Case MakeCase(const Codec &c, int64_t n, std::mt19937 &rng) {
  Case k{&c, n, RandomRow(c, n, rng), {}, {}};
  std::vector<float> w(static_cast<size_t>(n));
  c.dequantize(k.row.data(), w.data(), n);
  k.w.assign(w.begin(), w.end());
  for (int t = 0; t < kernels::kMaxTokens; ++t) {
    const auto xt = RandomActs(n, rng);
    k.x.insert(k.x.end(), xt.begin(), xt.end());
  }
  return k;
}

TEST_CASE("exact-mode kernels match float64 within (n/16 + 4) u sum|w x|, every codec, both ISAs",
          "[cpu][kernels]") {
  std::mt19937 rng(1234);
  for (TypeId id : kAllTypes) {
    const Codec *c = quant::FindCodec(id);
    REQUIRE(c != nullptr);
    for (int64_t n : Sizes(*c)) {
      for (int rep = 0; rep < 3; ++rep) {
        const Case k = MakeCase(*c, n, rng);
        for (Isa isa : Isas()) {
          const kernels::RowKernels rk = kernels::FindRowKernels(*c, isa);
          for (int nt = 1; nt <= kernels::kMaxTokens; ++nt) {
            float out[kernels::kMaxTokens + 1];
            for (float &o : out) o = std::numeric_limits<float>::quiet_NaN();  // poisoned
            rk.dot_float(*c, k.row.data(), k.x.data(), n, nt, n, out);
            CHECK(std::isnan(out[nt]));  // nothing written past n_tok
            for (int t = 0; t < nt; ++t) {
              double ref = 0, mag = 0;
              for (int64_t i = 0; i < n; ++i) {
                ref += k.w[i] * k.x[t * n + i];
                mag += std::fabs(k.w[i] * k.x[t * n + i]);
              }
              const double tol = (static_cast<double>(n) / 16 + 4) * kU * mag * (1 + 1e-6);
              INFO(c->name << " n=" << n << " isa=" << static_cast<int>(isa) << " nt=" << nt << " t=" << t);
              REQUIRE(std::isfinite(out[t]));
              CHECK(std::fabs(out[t] - ref) <= tol);
              // A token's result does not depend on its batch: equal to the 1-token call.
              if (nt == 1) continue;
              float one;
              rk.dot_float(*c, k.row.data(), k.x.data() + t * n, n, 1, n, &one);
              CHECK(std::memcmp(&one, &out[t], sizeof one) == 0);
            }
          }
        }
      }
    }
  }
}

TEST_CASE("STRATA_CPU_ISA caps the instruction set, never raises it", "[cpu][kernels]") {
  const Isa all[] = {Isa::kScalar, Isa::kAvx2, Isa::kAvx512};
  for (Isa detected : all) {
    CHECK(kernels::CapIsa(detected, nullptr) == detected);
    CHECK(kernels::CapIsa(detected, "") == detected);
    CHECK(kernels::CapIsa(detected, "avx512") == detected);
    CHECK(kernels::CapIsa(detected, "fastest") == detected);
    CHECK(kernels::CapIsa(detected, "scalar") == Isa::kScalar);
    CHECK(kernels::CapIsa(detected, "avx2") == (detected == Isa::kScalar ? Isa::kScalar : Isa::kAvx2));
  }
}

TEST_CASE("fused AVX2 exact kernels equal dequantize-then-dot bit for bit", "[cpu][kernels]") {
  if (kernels::BestIsa() == Isa::kScalar) return;
  // Same lanes, same FMA order, bit-identical weights: the fused kernel must equal the float32
  // formats' kernel applied to the codec's dequantized row.
  const Codec *f32 = quant::FindCodec(TypeId::kF32);
  const kernels::RowKernels rf = kernels::FindRowKernels(*f32, Isa::kAvx2);
  std::mt19937 rng(99);
  for (TypeId id : kAllTypes) {
    const Codec *c = quant::FindCodec(id);
    const kernels::RowKernels rk = kernels::FindRowKernels(*c, Isa::kAvx2);
    for (int64_t n : Sizes(*c)) {
      const Case k = MakeCase(*c, n, rng);
      std::vector<float> w(static_cast<size_t>(n));
      c->dequantize(k.row.data(), w.data(), n);
      float a[4], b[4];
      rk.dot_float(*c, k.row.data(), k.x.data(), n, 4, n, a);
      rf.dot_float(*f32, w.data(), k.x.data(), n, 4, n, b);
      INFO(c->name << " n=" << n << " fused=" << rk.fused_float);
      CHECK(std::memcmp(a, b, sizeof a) == 0);
    }
  }
}

TEST_CASE("AVX-512 q8 kernels equal the AVX2 ones bit for bit, every codec", "[cpu][kernels]") {
  if (kernels::BestIsa() != Isa::kAvx512) return;
  std::mt19937 rng(std::random_device{}());
  for (TypeId id : kAllTypes) {
    const Codec *c = quant::FindCodec(id);
    const kernels::RowKernels r2 = kernels::FindRowKernels(*c, Isa::kAvx2);
    const kernels::RowKernels r5 = kernels::FindRowKernels(*c, Isa::kAvx512);
    REQUIRE(r2.act == r5.act);
    if (r2.act == ActFormat::kNone) continue;
    for (int64_t n : Sizes(*c)) {
      for (int rep = 0; rep < 4; ++rep) {
        const Case k = MakeCase(*c, n, rng);
        const int64_t stride = kernels::ActRowBytes(r2.act, n);
        std::vector<uint8_t> xq(static_cast<size_t>(stride * kernels::kMaxTokens));
        for (int t = 0; t < kernels::kMaxTokens; ++t) {
          kernels::QuantizeActivations(r2.act, k.x.data() + t * n, n, xq.data() + t * stride);
        }
        for (int nt = 1; nt <= kernels::kMaxTokens; ++nt) {
          float a[kernels::kMaxTokens + 1], b[kernels::kMaxTokens + 1];
          for (int t = 0; t <= kernels::kMaxTokens; ++t) a[t] = b[t] = std::numeric_limits<float>::quiet_NaN();
          r2.dot_q8(*c, k.row.data(), xq.data(), stride, nt, n, a);
          r5.dot_q8(*c, k.row.data(), xq.data(), stride, nt, n, b);
          INFO(c->name << " n=" << n << " nt=" << nt);
          CHECK(std::isnan(b[nt]));
          CHECK(std::memcmp(a, b, sizeof(float) * nt) == 0);
        }
      }
    }
  }
}

// The q8-mode contract. Activations: x_i ~= d_b q_i with d_b = amax_b / 127, and
// |x_i - d_b q_i| <= (amax_b / 254)(1 + 2^-12) (round to nearest of x * 127/amax, plus float
// rounding of 127/amax, of the product and of d_b). Hence against the float64 dot of the codec's
// weights with the original x:
//   |dot_q8 - sum w_i x_i| <= sum_b (amax_b / 254)(1 + 2^-12) sum_{i in b} |w_i|  +  E_acc,
// i.e. about 2^-8 * sum_b amax_b * sum_{i in b} |w_i|. E_acc is the float accumulation of the
// per-block scaled integer sums: E_acc <= 64 (n_blocks + 8) u sum_i |w_i d_b q_i| (integer sums are
// exact; the factor 64 covers the cancellation between scale and min terms of Q4_K-style codecs).
TEST_CASE("q8-mode kernels stay within the stated bound, every codec, both ISAs", "[cpu][kernels]") {
  std::mt19937 rng(4321);
  for (TypeId id : kAllTypes) {
    const Codec *c = quant::FindCodec(id);
    for (int64_t n : Sizes(*c)) {
      for (int rep = 0; rep < 3; ++rep) {
        const Case k = MakeCase(*c, n, rng);
        for (Isa isa : Isas()) {
          const kernels::RowKernels rk = kernels::FindRowKernels(*c, isa);
          if (rk.act == ActFormat::kNone) {
            CHECK(rk.dot_q8 == nullptr);
            continue;
          }
          const int64_t stride = kernels::ActRowBytes(rk.act, n);
          const int64_t ab = rk.act == ActFormat::kQ8Block32 ? 32 : 256;
          std::vector<uint8_t> xq(static_cast<size_t>(stride * kernels::kMaxTokens));
          for (int t = 0; t < kernels::kMaxTokens; ++t) {
            kernels::QuantizeActivations(rk.act, k.x.data() + t * n, n, xq.data() + t * stride);
          }
          for (int nt = 1; nt <= kernels::kMaxTokens; ++nt) {
            float out[kernels::kMaxTokens + 1];
            for (float &o : out) o = std::numeric_limits<float>::quiet_NaN();
            rk.dot_q8(*c, k.row.data(), xq.data(), stride, nt, n, out);
            CHECK(std::isnan(out[nt]));
            for (int t = 0; t < nt; ++t) {
              const std::vector<double> xd = ActValues(rk.act, xq.data() + t * stride, n);
              double ref_q = 0, ref = 0, mag_q = 0, act_bound = 0;
              for (int64_t b = 0; b < n / ab; ++b) {
                double amax = 0, wsum = 0;
                for (int64_t i = b * ab; i < (b + 1) * ab; ++i) {
                  amax = std::max(amax, std::fabs(static_cast<double>(k.x[t * n + i])));
                  wsum += std::fabs(k.w[i]);
                  ref_q += k.w[i] * xd[i];
                  ref += k.w[i] * k.x[t * n + i];
                  mag_q += std::fabs(k.w[i] * xd[i]);
                }
                act_bound += amax / 254 * (1 + 1.0 / 4096) * wsum;
              }
              const double e_acc = 64 * (static_cast<double>(n / ab) + 8) * kU * mag_q;
              INFO(c->name << " n=" << n << " isa=" << static_cast<int>(isa) << " nt=" << nt << " t=" << t
                           << " integer=" << rk.integer_q8);
              REQUIRE(std::isfinite(out[t]));
              // The kernel computes the dot with the quantized activations, up to accumulation.
              CHECK(std::fabs(out[t] - ref_q) <= e_acc);
              // And so is within the stated bound of the float64 dot with the original x.
              CHECK(std::fabs(out[t] - ref) <= act_bound + e_acc);
              if (nt > 1) {
                float one;
                rk.dot_q8(*c, k.row.data(), xq.data() + t * stride, stride, 1, n, &one);
                CHECK(std::memcmp(&one, &out[t], sizeof one) == 0);
              }
            }
          }
        }
      }
    }
  }
}

TEST_CASE("activation quantization: codes, scales and partial sums", "[cpu][kernels]") {
  std::mt19937 rng(7);
  const auto x = RandomActs(512, rng);
  std::vector<uint8_t> a(static_cast<size_t>(kernels::ActRowBytes(ActFormat::kQ8Block256, 512)));
  kernels::QuantizeActivations(ActFormat::kQ8Block256, x.data(), 512, a.data());
  const auto *b = reinterpret_cast<const ActBlock256 *>(a.data());
  for (int k = 0; k < 2; ++k) {
    for (int s = 0; s < 16; ++s) {
      int sum = 0;
      for (int j = 0; j < 16; ++j) sum += b[k].q[16 * s + j];
      CHECK(sum == b[k].bsums[s]);
    }
  }
  std::vector<float> zeros(32, 0.0f);
  ActBlock32 z;
  kernels::QuantizeActivations(ActFormat::kQ8Block32, zeros.data(), 32, &z);
  CHECK(z.d == 0.0f);
  CHECK(z.sum == 0);
}

TEST_CASE("activation quantization rounds like nearbyint, ties to even, on every block", "[cpu][kernels]") {
  // The reference: the formula of kernels.h with the C library's rounding, element by element.
  auto reference = [](const float *x, int len, int8_t *q) {
    float amax = 0.0f;
    for (int j = 0; j < len; ++j) amax = std::max(amax, std::fabs(x[j]));
    if (amax == 0.0f) {
      std::fill(q, q + len, int8_t{0});
      return 0.0f;
    }
    const float id = 127.0f / amax;
    for (int j = 0; j < len; ++j) {
      const float r = std::nearbyint(x[j] * id);
      q[j] = static_cast<int8_t>(std::clamp(static_cast<int>(r), -127, 127));
    }
    return amax / 127.0f;
  };
  std::mt19937 rng(std::random_device{}());
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> log_scale(-6.0f, 6.0f);
  for (int trial = 0; trial < 400; ++trial) {
    std::vector<float> x(512);
    const float scale = std::exp(log_scale(rng));
    for (auto &v : x) v = normal(rng) * scale;
    if (trial % 4 == 1) {
      // Exact ties: the block's amax is 127, so x * 127 / amax is x itself, and k + 0.5 must go to
      // the even neighbour.
      for (size_t j = 0; j < x.size(); ++j) {
        x[j] = static_cast<float>(static_cast<int>(rng() % 253) - 126) + 0.5f * static_cast<float>(rng() % 2);
      }
      x[0] = 127.0f;
      x[256] = -127.0f;
    }
    if (trial % 4 == 2) std::fill(x.begin() + 256, x.end(), 0.0f);  // an all-zero second block
    if (trial % 4 == 3) {
      std::fill(x.begin(), x.end(), 0.0f);
      x[rng() % 512] = -scale;  // one element, the block's (negative) maximum
    }
    for (ActFormat f : {ActFormat::kQ8Block32, ActFormat::kQ8Block256}) {
      const int block = f == ActFormat::kQ8Block32 ? 32 : 256;
      std::vector<uint8_t> a(static_cast<size_t>(kernels::ActRowBytes(f, 512)), 0xA5);
      kernels::QuantizeActivations(f, x.data(), 512, a.data());
      for (int b = 0; b < 512 / block; ++b) {
        int8_t want[256];
        const float d = reference(x.data() + b * block, block, want);
        const int8_t *got = f == ActFormat::kQ8Block32 ? reinterpret_cast<const ActBlock32 *>(a.data())[b].q
                                                       : reinterpret_cast<const ActBlock256 *>(a.data())[b].q;
        const float got_d = f == ActFormat::kQ8Block32 ? reinterpret_cast<const ActBlock32 *>(a.data())[b].d
                                                       : reinterpret_cast<const ActBlock256 *>(a.data())[b].d;
        INFO("trial " << trial << ", block " << b << " of " << block);
        REQUIRE(got_d == d);
        REQUIRE(std::equal(want, want + block, got));
      }
    }
  }
}

// ---- MatMul ----

model::Matrix MakeMatrix(const Codec &c, int64_t rows, int64_t cols, std::vector<uint8_t> &storage,
                         std::mt19937 &rng) {
  model::Matrix m;
  m.name = "test";
  m.codec = &c;
  m.rows = rows;
  m.cols = cols;
  m.row_bytes = static_cast<uint64_t>(cols / c.block_elems * c.block_bytes);
  storage.clear();
  for (int64_t r = 0; r < rows; ++r) {
    const auto row = RandomRow(c, cols, rng);
    storage.insert(storage.end(), row.begin(), row.end());
  }
  m.data = storage.data();
  return m;
}

TEST_CASE("MatMul: a token's row equals its solo result, in a batch of 8 and under 1 or 2 threads",
          "[cpu][kernels]") {
  std::mt19937 rng(555);
  const int64_t rows = 67, cols = 512, n_tok = 8;
  std::vector<float> x;
  for (int t = 0; t < n_tok; ++t) {
    const auto xt = RandomActs(cols, rng);
    x.insert(x.end(), xt.begin(), xt.end());
  }
  for (TypeId id : kAllTypes) {
    const Codec *c = quant::FindCodec(id);
    std::vector<uint8_t> storage;
    const model::Matrix m = MakeMatrix(*c, rows, cols, storage, rng);
    for (Isa isa : Isas()) {
      for (MatMulMode mode : {MatMulMode::kExact, MatMulMode::kQ8Activations}) {
        CpuBackend one(1, mode, isa), two(2, mode, isa);
        std::vector<float> y1(rows * n_tok, NAN), y2(rows * n_tok, NAN), ys(rows, NAN);
        one.MatMul(m, x.data(), n_tok, y1.data());
        two.MatMul(m, x.data(), n_tok, y2.data());
        INFO(c->name << " isa=" << static_cast<int>(isa) << " mode=" << static_cast<int>(mode));
        for (float v : y1) REQUIRE(std::isfinite(v));
        CHECK(std::memcmp(y1.data(), y2.data(), y1.size() * sizeof(float)) == 0);
        for (int64_t t = 0; t < n_tok; ++t) {
          two.MatMul(m, x.data() + t * cols, 1, ys.data());
          CHECK(std::memcmp(ys.data(), y1.data() + t * rows, rows * sizeof(float)) == 0);
        }
        // Exact mode against float64 of the dequantized weights.
        if (mode == MatMulMode::kExact) {
          std::vector<float> w(cols);
          for (int64_t r = 0; r < rows; r += 11) {
            c->dequantize(m.row(r), w.data(), cols);
            double ref = 0, mag = 0;
            for (int64_t i = 0; i < cols; ++i) {
              ref += static_cast<double>(w[i]) * x[i];
              mag += std::fabs(static_cast<double>(w[i]) * x[i]);
            }
            CHECK(std::fabs(y1[r] - ref) <= (cols / 16.0 + 4) * kU * mag * (1 + 1e-6));
          }
        }
      }
    }
  }
}

TEST_CASE("MatMul: a prompt-sized batch, met by rows in tiles of tokens, equals each token's solo result",
          "[cpu][kernels]") {
  // 300 tokens of 512 columns: past one tile of float activations (64 tokens) and of 8-bit codes
  // (about 240), rows in blocks of 32 and a short last block.
  std::mt19937 rng(std::random_device{}());
  const int64_t rows = 71, cols = 512, n_tok = 300;
  std::vector<float> x;
  for (int t = 0; t < n_tok; ++t) {
    const auto xt = RandomActs(cols, rng);
    x.insert(x.end(), xt.begin(), xt.end());
  }
  for (TypeId id : {TypeId::kQ4_K, TypeId::kQ8_0, TypeId::kQ6_K, TypeId::kF16, TypeId::kIQ4_XS}) {
    const Codec *c = quant::FindCodec(id);
    std::vector<uint8_t> storage;
    const model::Matrix m = MakeMatrix(*c, rows, cols, storage, rng);
    for (Isa isa : Isas()) {
      for (MatMulMode mode : {MatMulMode::kExact, MatMulMode::kQ8Activations}) {
        CpuBackend two(2, mode, isa);
        std::vector<float> y(rows * n_tok, NAN), ys(rows, NAN);
        two.MatMul(m, x.data(), n_tok, y.data());
        INFO(c->name << " isa=" << static_cast<int>(isa) << " mode=" << static_cast<int>(mode));
        for (int64_t t = 0; t < n_tok; ++t) {
          std::fill(ys.begin(), ys.end(), NAN);
          two.MatMul(m, x.data() + t * cols, 1, ys.data());
          INFO("token " << t);
          REQUIRE(std::memcmp(ys.data(), y.data() + t * rows, rows * sizeof(float)) == 0);
        }
      }
    }
  }
}

}  // namespace

TEST_CASE("MatMulMany equals MatMul on each matrix bit for bit", "[cpu][kernels]") {
  std::mt19937 rng(777);
  const int64_t cols = 512, n_tok = 3;
  std::vector<float> x;
  for (int t = 0; t < n_tok; ++t) {
    const auto xt = RandomActs(cols, rng);
    x.insert(x.end(), xt.begin(), xt.end());
  }
  // Q8_0 twice (one set of codes shared), then codecs of other activation formats and a float one.
  const TypeId types[] = {TypeId::kQ8_0, TypeId::kQ8_0, TypeId::kQ4_K, TypeId::kQ6_K, TypeId::kF16};
  const int64_t rows[] = {70, 9, 33, 64, 17};
  const int n = 5;
  std::vector<std::vector<uint8_t>> store(n);
  std::vector<model::Matrix> ms;
  for (int i = 0; i < n; ++i) ms.push_back(MakeMatrix(*quant::FindCodec(types[i]), rows[i], cols, store[i], rng));
  for (Isa isa : Isas()) {
    for (MatMulMode mode : {MatMulMode::kExact, MatMulMode::kQ8Activations}) {
      INFO("isa=" << static_cast<int>(isa) << " mode=" << static_cast<int>(mode));
      CpuBackend be(2, mode, isa);
      std::vector<std::vector<float>> got(n), want(n);
      std::vector<const model::Matrix *> ws;
      std::vector<float *> ys;
      for (int i = 0; i < n; ++i) {
        got[i].assign(rows[i] * n_tok, NAN);
        want[i].assign(rows[i] * n_tok, NAN);
        ws.push_back(&ms[i]);
        ys.push_back(got[i].data());
        be.MatMul(ms[i], x.data(), n_tok, want[i].data());
      }
      be.MatMulMany(ws.data(), ys.data(), n, x.data(), n_tok);
      for (int i = 0; i < n; ++i) {
        INFO("matrix " << i);
        for (float v : got[i]) REQUIRE(std::isfinite(v));
        CHECK(std::memcmp(got[i].data(), want[i].data(), got[i].size() * sizeof(float)) == 0);
      }
    }
  }
}

// ---- Experts of a layer together ----

TEST_CASE("ExpertsFfn equals ExpertFfn on each group bit for bit, and writes no other row", "[cpu][kernels]") {
  std::mt19937 rng(4242);
  const int64_t d = 512, ff = 256;
  const std::vector<int64_t> first = {0, 3, 4, 4, 9, 11, 13};  // group 2 empty
  const int n = static_cast<int>(first.size()) - 1;
  std::vector<std::vector<uint8_t>> store(3 * n);
  std::vector<model::ExpertWeights> experts(n);
  model::TensorRef present;  // biases count as present when they name a tensor
  auto random_vec = [&](int64_t len) {
    model::Vec v;
    v.tensor = &present;
    v.n = len;
    v.values = RandomActs(len, rng);
    return v;
  };
  const TypeId gate_up[] = {TypeId::kQ4_K, TypeId::kQ8_0, TypeId::kQ4_K, TypeId::kQ6_K, TypeId::kIQ4_XS, TypeId::kF32};
  const TypeId down[] = {TypeId::kQ4_K, TypeId::kQ6_K, TypeId::kQ8_0, TypeId::kQ6_K, TypeId::kQ4_K, TypeId::kF32};
  for (int u = 0; u < n; ++u) {
    model::ExpertWeights &e = experts[u];
    const Codec &cg = *quant::FindCodec(gate_up[u]), &cd = *quant::FindCodec(down[u]);
    if (u == 5) {  // gpt-oss's input-major layout: gate holds gate/up interleaved, (d, 2 ff); down (ff, d)
      e.input_major = true;
      e.gate = MakeMatrix(cg, d, 2 * ff, store[3 * u], rng);
      e.down = MakeMatrix(cd, ff, d, store[3 * u + 2], rng);
      e.gate_bias = random_vec(2 * ff);
      e.swiglu_limit = 7.f;
      continue;
    }
    e.gate = MakeMatrix(cg, ff, d, store[3 * u], rng);
    e.up = MakeMatrix(cg, ff, d, store[3 * u + 1], rng);
    e.down = MakeMatrix(cd, d, ff, store[3 * u + 2], rng);
    if (u == 4) {  // biases and the clamped SwiGLU on the row-major path
      e.gate_bias = random_vec(ff);
      e.up_bias = random_vec(ff);
      e.down_bias = random_vec(d);
      e.swiglu_limit = 7.f;
    }
  }
  std::vector<float> xg;
  for (int64_t r = 0; r < first.back(); ++r) {
    const auto xr = RandomActs(d, rng);
    xg.insert(xg.end(), xr.begin(), xr.end());
  }
  std::vector<const model::ExpertWeights *> ew(n);
  for (int u = 0; u < n; ++u) ew[u] = &experts[u];
  ew[1] = nullptr;  // still loading: skipped
  for (Isa isa : Isas()) {
    for (MatMulMode mode : {MatMulMode::kExact, MatMulMode::kQ8Activations}) {
      INFO("isa=" << static_cast<int>(isa) << " mode=" << static_cast<int>(mode));
      CpuBackend be(2, mode, isa);
      std::vector<float> got(first.back() * d, NAN), want(first.back() * d, NAN);
      // Timed (the CPU experts' trace): the same bits, one call counted, its parts within its time.
      CpuBackend::ExpertsFfnTimes times;
      be.set_experts_ffn_times(&times);
      const auto t0 = std::chrono::steady_clock::now();
      be.ExpertsFfn(ew.data(), n, first.data(), xg.data(), got.data(), d);
      const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      be.set_experts_ffn_times(nullptr);
      CHECK(times.calls == 1);
      CHECK(times.gate_up_s > 0);
      CHECK(times.down_s > 0);
      CHECK(times.setup_s + times.gate_up_s + times.act_s + times.down_s <= wall);
      for (int u = 0; u < n; ++u) {
        if (ew[u] == nullptr) continue;
        be.ExpertFfn(*ew[u], xg.data() + first[u] * d, first[u + 1] - first[u], want.data() + first[u] * d);
      }
      for (int u = 0; u < n; ++u) {
        INFO("expert " << u);
        const size_t at = first[u] * d, len = (first[u + 1] - first[u]) * d;
        if (ew[u] == nullptr) {
          for (size_t i = 0; i < len; ++i) REQUIRE(std::isnan(got[at + i]));  // not written
          continue;
        }
        for (size_t i = 0; i < len; ++i) REQUIRE(std::isfinite(got[at + i]));
        CHECK(std::memcmp(got.data() + at, want.data() + at, len * sizeof(float)) == 0);
      }
    }
  }
}

}  // namespace strata::cpu
