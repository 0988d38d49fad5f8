// 8-bit-activation GEMV (gemv_q8.cu) against the CPU backend's q8 mode: the quantized activations
// byte for byte, and the products within float summation order (relative L2 1e-5), on fresh random
// inputs with outputs poisoned first.
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <utility>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/kernels/kernels.h"
#include "lib/model/routing.h"
#include "tests/cuda/cuda_test_util.h"

namespace strata::cuda {
namespace {

using quant::TypeId;
using test::Download;
using test::HaveGpu;
using test::Poisoned;
using test::RandomFloats;
using test::RandomMatrix;
using test::RelL2;
using test::Upload;

model::Matrix HostMatrixOf(TypeId type, const std::vector<uint8_t> &bytes, int64_t rows, int64_t cols, uint64_t rb) {
  model::Matrix m;
  m.codec = quant::FindCodec(type);
  m.rows = rows;
  m.cols = cols;
  m.row_bytes = rb;
  m.data = bytes.data();
  return m;
}

// n_tok fresh random rows of cols values in [-2, 2) (kept in *x when given), quantized on the device
// as format f.
DeviceBuffer QuantizedInput(std::mt19937 &rng, Q8Act f, int64_t n_tok, int64_t cols, std::vector<float> *x = nullptr) {
  const std::vector<float> v = RandomFloats(rng, n_tok * cols, -2.f, 2.f);
  DeviceBuffer dx = Upload(v);
  if (x != nullptr) *x = v;
  auto dq = DeviceBuffer::Allocate(n_tok * Q8ActRowBytes(f, cols));
  REQUIRE(dq.ok());
  REQUIRE(QuantizeActivationsQ8(f, dx.as<float>(), n_tok, cols, dq->data(), nullptr).ok());
  return std::move(*dq);
}

}  // namespace

TEST_CASE("8-bit activations quantize as the CPU backend's q8 mode, byte for byte", "[gpu][q8]") {
  if (!HaveGpu()) return;
  auto rng = test::Rng();
  const int64_t cols = 1024, n_tok = 5;
  std::vector<float> x = RandomFloats(rng, n_tok * cols, -3.f, 3.f);
  for (int i = 0; i < 256; ++i) x[cols + i] = 0.f;  // an all-zero block (token 1's first 256)
  x[2 * cols + 7] = 40.f;                          // one large value: the rest of its block rounds small
  DeviceBuffer dx = Upload(x);
  for (Q8Act f : {Q8Act::kBlock32, Q8Act::kBlock256}) {
    const bool small = f == Q8Act::kBlock32;
    INFO((small ? "blocks of 32" : "blocks of 256"));
    const int64_t rb = Q8ActRowBytes(f, cols);
    REQUIRE(rb % 16 == 0);
    auto dq = DeviceBuffer::Allocate(n_tok * rb);
    REQUIRE(dq.ok());
    REQUIRE(cudaMemset(dq->data(), 0xa5, n_tok * rb) == cudaSuccess);
    REQUIRE(QuantizeActivationsQ8(f, dx.as<float>(), n_tok, cols, dq->data(), nullptr).ok());
    const std::vector<uint8_t> got = Download<uint8_t>(*dq, n_tok * rb);
    const cpu::kernels::ActFormat cf = small ? cpu::kernels::ActFormat::kQ8Block32 : cpu::kernels::ActFormat::kQ8Block256;
    std::vector<uint8_t> want(cpu::kernels::ActRowBytes(cf, cols));
    for (int64_t t = 0; t < n_tok; ++t) {
      INFO("token " << t);
      cpu::kernels::QuantizeActivations(cf, x.data() + t * cols, cols, want.data());
      const uint8_t *row = got.data() + t * rb;
      const auto *q = reinterpret_cast<const int8_t *>(row);
      const auto *d = reinterpret_cast<const float *>(row + cols);
      if (small) {
        const auto *s = reinterpret_cast<const int32_t *>(row + cols + cols / 32 * 4);
        const auto *b = reinterpret_cast<const cpu::kernels::ActBlock32 *>(want.data());
        for (int64_t k = 0; k < cols / 32; ++k) {
          CHECK(std::memcmp(q + 32 * k, b[k].q, 32) == 0);
          CHECK(std::memcmp(&d[k], &b[k].d, 4) == 0);
          CHECK(s[k] == b[k].sum);
        }
      } else {
        const auto *s = reinterpret_cast<const int16_t *>(row + cols + cols / 256 * 4);
        const auto *b = reinterpret_cast<const cpu::kernels::ActBlock256 *>(want.data());
        for (int64_t k = 0; k < cols / 256; ++k) {
          CHECK(std::memcmp(q + 256 * k, b[k].q, 256) == 0);
          CHECK(std::memcmp(&d[k], &b[k].d, 4) == 0);
          CHECK(std::memcmp(s + 16 * k, b[k].bsums, 32) == 0);
        }
      }
    }
  }
}

TEST_CASE("8-bit rounding gives the values the CPU's generic q8 dot multiplies by, bit for bit", "[gpu][q8]") {
  if (!HaveGpu()) return;
  auto rng = test::Rng();
  const int64_t cols = 768, n_tok = 3;
  std::vector<float> x = RandomFloats(rng, n_tok * cols, -5.f, 5.f);
  for (int i = 0; i < 256; ++i) x[2 * cols + 256 + i] = 0.f;  // an all-zero block
  x[cols + 3] = -60.f;
  DeviceBuffer dx = Upload(x);
  for (int block : {32, 256}) {
    INFO("blocks of " << block);
    const cpu::kernels::ActFormat cf = block == 32 ? cpu::kernels::ActFormat::kQ8Block32 : cpu::kernels::ActFormat::kQ8Block256;
    std::vector<uint8_t> codes(cpu::kernels::ActRowBytes(cf, cols));
    for (bool in_place : {false, true}) {
      INFO((in_place ? "in place" : "to another buffer"));
      DeviceBuffer src = Upload(x);
      DeviceBuffer out = Poisoned(n_tok * cols);
      float *dst = in_place ? src.as<float>() : out.as<float>();
      REQUIRE(RoundActivationsQ8(block, src.as<float>(), n_tok, cols, dst, nullptr).ok());
      const std::vector<float> got = Download<float>(in_place ? src : out, n_tok * cols);
      int64_t mismatches = 0;
      for (int64_t t = 0; t < n_tok; ++t) {
        cpu::kernels::QuantizeActivations(cf, x.data() + t * cols, cols, codes.data());
        for (int64_t e = 0; e < cols; ++e) {
          float want;
          if (block == 32) {
            const auto &b = reinterpret_cast<const cpu::kernels::ActBlock32 *>(codes.data())[e / 32];
            want = b.d * static_cast<float>(b.q[e % 32]);
          } else {
            const auto &b = reinterpret_cast<const cpu::kernels::ActBlock256 *>(codes.data())[e / 256];
            want = b.d * static_cast<float>(b.q[e % 256]);
          }
          mismatches += std::memcmp(&want, &got[t * cols + e], 4) != 0;
        }
      }
      CHECK(mismatches == 0);
    }
  }
  float *none = nullptr;
  CHECK(StatusToMoe(RoundActivationsQ8(64, dx.as<float>(), 1, cols, dx.as<float>(), nullptr)) == MOE_ERR_INVALID_ARGUMENT);
  CHECK(StatusToMoe(RoundActivationsQ8(256, dx.as<float>(), 1, 100, dx.as<float>(), nullptr)) == MOE_ERR_INVALID_ARGUMENT);
  CHECK(StatusToMoe(RoundActivationsQ8(32, dx.as<float>(), 1, cols, none, nullptr)) == MOE_ERR_INVALID_ARGUMENT);
}

TEST_CASE("8-bit-activation GEMV matches the CPU backend's q8 mode", "[gpu][q8]") {
  if (!HaveGpu()) return;
  auto rng = test::Rng();
  const int64_t rows = 301;
  cpu::CpuBackend cpu_be(2, cpu::MatMulMode::kQ8Activations);
  // 2,880 columns (gpt-oss's width): 90 Q8_0 blocks, not a multiple of the 8 column walks; 768
  // (an expert's down projection): 3 Q4_K super-blocks, fewer than the walks, and activation sums
  // at a 4-byte (not 8-byte) offset.
  const std::pair<TypeId, int64_t> shapes[] = {
      {TypeId::kQ8_0, 2048}, {TypeId::kQ4_K, 2048}, {TypeId::kQ8_0, 2880}, {TypeId::kQ4_K, 768}};
  for (const auto &[type, cols] : shapes) {
    INFO(quant::TypeName(static_cast<uint32_t>(type)) << ", " << cols << " columns");
    uint64_t rb = 0;
    std::vector<uint8_t> w = RandomMatrix(rng, type, rows, cols, &rb);
    DeviceBuffer dw = Upload(w);
    const DeviceMatrix m = test::View(type, dw, rows, cols, rb);
    const int64_t max_tok = 40;
    std::vector<float> x;
    const DeviceBuffer dq = QuantizedInput(rng, Q8ActFor(type), max_tok, cols, &x);
    std::vector<float> ref(max_tok * rows);
    const model::Matrix hm = HostMatrixOf(type, w, rows, cols, rb);
    cpu_be.MatMul(hm, x.data(), max_tok, ref.data());
    for (Q8Kernels kern : {Q8Kernels::kGemv, Q8Kernels::kTensor}) {
      INFO("tensor cores " << (kern == Q8Kernels::kTensor));
      std::vector<float> single;
      // Every chunk size (GEMVs: 16, 8, 4, 2, 1; tensor cores: 32, 16, 8 and the 1-4-token dp4a
      // kernel), full and part.
      for (int64_t n_tok : {1, 3, 8, 11, 16, 19, 33, 40}) {
        INFO("n_tok " << n_tok);
        DeviceBuffer dy = Poisoned(n_tok * rows);
        REQUIRE(GemvQ8(m, dq.data(), n_tok, dy.as<float>(), nullptr, kern).ok());
        const std::vector<float> y = Download<float>(dy, n_tok * rows);
        CHECK(RelL2(y, std::vector<float>(ref.begin(), ref.begin() + n_tok * rows)) <= 1e-5);
        if (n_tok == 1) single = y;  // a token's result does not depend on its batch
        CHECK(std::memcmp(y.data(), single.data(), rows * sizeof(float)) == 0);
      }
    }
  }
}

// The attention projections' one launch: three matrices of one codec and width (rows as q, k and v
// of a small model) over one quantized input give GemvQ8's bits on each, at every token chunk.
TEST_CASE("GemvManyQ8 gives each matrix GemvQ8's bits", "[gpu][q8]") {
  if (!HaveGpu()) return;
  auto rng = test::Rng();
  const int64_t cols = 1024, n_rows[3] = {520, 72, 72};
  for (TypeId type : {TypeId::kQ8_0, TypeId::kQ4_K}) {
    INFO(quant::TypeName(static_cast<uint32_t>(type)));
    const DeviceBuffer dq = QuantizedInput(rng, Q8ActFor(type), 35, cols);
    std::vector<DeviceBuffer> dw;
    DeviceMatrix ms[3];
    for (int m = 0; m < 3; ++m) {
      uint64_t rb = 0;
      dw.push_back(Upload(RandomMatrix(rng, type, n_rows[m], cols, &rb)));
      ms[m] = test::View(type, dw.back(), n_rows[m], cols, rb);
    }
    for (int64_t n_tok : {1, 2, 7, 13, 17, 35}) {
      for (Q8Kernels kern : {Q8Kernels::kGemv, Q8Kernels::kTensor}) {
        INFO("n_tok " << n_tok << ", tensor cores " << (kern == Q8Kernels::kTensor));
        std::vector<DeviceBuffer> dy;
        float *ys[3];
        for (int m = 0; m < 3; ++m) {
          dy.push_back(Poisoned(n_tok * n_rows[m]));
          ys[m] = dy.back().as<float>();
        }
        REQUIRE(GemvManyQ8(ms, ys, 3, dq.data(), n_tok, nullptr, kern).ok());
        for (int m = 0; m < 3; ++m) {
          DeviceBuffer one = Poisoned(n_tok * n_rows[m]);
          REQUIRE(GemvQ8(ms[m], dq.data(), n_tok, one.as<float>(), nullptr, kern).ok());
          const auto a = Download<float>(dy[m], n_tok * n_rows[m]), b = Download<float>(one, n_tok * n_rows[m]);
          for (float v : a) REQUIRE(std::isfinite(v));
          CHECK(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
        }
      }
    }
  }
  // Refused: no matrices, too many, mixed codecs, a codec without the path, a null output.
  auto buf = DeviceBuffer::Allocate(1 << 16);
  REQUIRE(buf.ok());
  auto *p = static_cast<uint8_t *>(buf->data());
  float *y[kGemvManyMax + 1] = {};
  for (auto &v : y) v = reinterpret_cast<float *>(p);
  const DeviceMatrix q8{TypeId::kQ8_0, p, 4, 256, 272}, q4{TypeId::kQ4_K, p, 4, 256, 144},
      f32{TypeId::kF32, p, 4, 256, 1024};
  const DeviceMatrix many[kGemvManyMax + 1] = {q8, q8, q8, q8, q8};
  CHECK(StatusToMoe(GemvManyQ8(many, y, 0, p, 1, nullptr)) == MOE_ERR_INVALID_ARGUMENT);
  CHECK(StatusToMoe(GemvManyQ8(many, y, kGemvManyMax + 1, p, 1, nullptr)) == MOE_ERR_INVALID_ARGUMENT);
  const DeviceMatrix mixed[2] = {q8, q4};
  CHECK(StatusToMoe(GemvManyQ8(mixed, y, 2, p, 1, nullptr)) == MOE_ERR_INVALID_ARGUMENT);
  const DeviceMatrix floats[2] = {f32, f32};
  CHECK(StatusToMoe(GemvManyQ8(floats, y, 2, p, 1, nullptr)) == MOE_ERR_UNSUPPORTED_TYPE);
  float *null_y[2] = {y[0], nullptr};
  CHECK(StatusToMoe(GemvManyQ8(many, null_y, 2, p, 1, nullptr)) == MOE_ERR_INVALID_ARGUMENT);
}

// A prompt's expert groups in one launch (PromptMmaQ8): groups of 1 to 70 tokens with gaps between
// them, each group's rows against GemvQ8 on the tensor cores over that expert alone, bit for bit (and
// its SwiGLU against GatedAct over the two products); the gaps keep their poison.
TEST_CASE("Prompt expert groups on the tensor cores give each expert GemvQ8's bits", "[gpu][q8][grouped]") {
  if (!HaveGpu()) return;
  auto rng = test::Rng();
  const std::pair<TypeId, int64_t> shapes[] = {{TypeId::kQ8_0, 512}, {TypeId::kQ4_K, 512}, {TypeId::kQ4_K, 768}};
  const int64_t rows = 72;  // four and a half 16-row blocks
  const int64_t sizes[] = {9, 1, 70, 33, 17, 32};
  const int m = 6;
  for (const auto &[type, cols] : shapes) {
    INFO(quant::TypeName(static_cast<uint32_t>(type)) << ", " << cols << " columns");
    std::vector<DeviceBuffer> dw;
    std::vector<DeviceMatrix> w0, w1;
    for (int g = 0; g < 2 * m; ++g) {
      uint64_t rb = 0;
      dw.push_back(Upload(RandomMatrix(rng, type, rows, cols, &rb)));
      (g < m ? w0 : w1).push_back(test::View(type, dw.back(), rows, cols, rb));
    }
    // Spans in a shuffled order of groups, two rows apart.
    std::vector<int64_t> span;
    int64_t n = 3;
    for (int64_t sz : sizes) {
      span.push_back(n);
      span.push_back(n + sz);
      n += sz + 2;
    }
    const Q8Act f = Q8ActFor(type);
    const int64_t xb = Q8ActRowBytes(f, cols);
    const DeviceBuffer dq = QuantizedInput(rng, f, n, cols);
    std::vector<uint64_t> tab(span.begin(), span.end());
    for (const auto *ws : {&w0, &w1}) {
      for (const DeviceMatrix &w : *ws) tab.push_back(reinterpret_cast<uintptr_t>(w.data));
    }
    const DeviceBuffer dt = Upload(tab);
    PromptGroups p;
    p.span = dt.as<int64_t>();
    p.w0 = reinterpret_cast<const void *const *>(dt.as<uint64_t>() + 2 * m);
    p.m = m;
    for (bool swiglu : {false, true}) {
      INFO("swiglu " << swiglu);
      p.w1 = swiglu ? reinterpret_cast<const void *const *>(dt.as<uint64_t>() + 3 * m) : nullptr;
      DeviceBuffer dy = Poisoned(n * rows);
      REQUIRE(PromptMmaQ8(p, w0[0], dq.data(), dy.as<float>(), nullptr).ok());
      const std::vector<float> y = Download<float>(dy, n * rows);
      std::vector<char> in_span(n, 0);
      for (int g = 0; g < m; ++g) {
        INFO("group " << g << " of " << sizes[g] << " tokens");
        const int64_t t0 = span[2 * g], nt = sizes[g];
        for (int64_t t = t0; t < t0 + nt; ++t) in_span[t] = 1;
        const uint8_t *xg = static_cast<const uint8_t *>(dq.data()) + t0 * xb;
        DeviceBuffer a = Poisoned(nt * rows), b = Poisoned(nt * rows), hh = Poisoned(nt * rows);
        REQUIRE(GemvQ8(w0[g], xg, nt, a.as<float>(), nullptr, Q8Kernels::kTensor).ok());
        const float *ref_dev = a.as<float>();
        if (swiglu) {
          REQUIRE(GemvQ8(w1[g], xg, nt, b.as<float>(), nullptr, Q8Kernels::kTensor).ok());
          REQUIRE(GatedAct(a.as<float>(), b.as<float>(), rows, 1, nt, rows, 0.f, hh.as<float>(), nullptr).ok());
          ref_dev = hh.as<float>();
        }
        std::vector<float> ref(nt * rows);
        REQUIRE(cudaMemcpy(ref.data(), ref_dev, ref.size() * sizeof(float), cudaMemcpyDeviceToHost) == cudaSuccess);
        for (float v : ref) REQUIRE(std::isfinite(v));
        CHECK(std::memcmp(y.data() + t0 * rows, ref.data(), ref.size() * sizeof(float)) == 0);
      }
      int64_t untouched = 0;  // the gaps between spans still hold the poison
      for (int64_t t = 0; t < n; ++t) {
        if (in_span[t]) continue;
        for (int64_t r = 0; r < rows; ++r) untouched += std::isnan(y[t * rows + r]) ? 1 : 0;
      }
      CHECK(untouched == (n - std::accumulate(std::begin(sizes), std::end(sizes), int64_t{0})) * rows);
    }
    // One matrix over a whole prompt (its blocks spread over 32-token chunks): GemvQ8's bits.
    for (int64_t nt : {int64_t{1}, int64_t{40}, n}) {
      INFO("dense, " << nt << " tokens");
      DeviceBuffer a = Poisoned(nt * rows), b = Poisoned(nt * rows);
      REQUIRE(PromptGemvQ8(w0[0], dq.data(), nt, a.as<float>(), nullptr).ok());
      REQUIRE(GemvQ8(w0[0], dq.data(), nt, b.as<float>(), nullptr, Q8Kernels::kTensor).ok());
      const auto ya = Download<float>(a, nt * rows), yb = Download<float>(b, nt * rows);
      for (float v : ya) REQUIRE(std::isfinite(v));
      CHECK(std::memcmp(ya.data(), yb.data(), ya.size() * sizeof(float)) == 0);
    }
  }
  // Refused: a codec without integer dots, null spans, a width off the codec's blocks, unaligned input.
  auto buf = DeviceBuffer::Allocate(1 << 16);
  REQUIRE(buf.ok());
  auto *q = static_cast<uint8_t *>(buf->data());
  PromptGroups p;
  p.span = reinterpret_cast<const int64_t *>(q);
  p.w0 = reinterpret_cast<const void *const *>(q);
  p.m = 1;
  float *y = reinterpret_cast<float *>(q);
  CHECK(StatusToMoe(PromptMmaQ8(p, DeviceMatrix{TypeId::kF32, q, 4, 256, 1024}, q, y, nullptr)) ==
        MOE_ERR_UNSUPPORTED_TYPE);
  CHECK(StatusToMoe(PromptMmaQ8(p, DeviceMatrix{TypeId::kQ4_K, q, 4, 200, 144}, q, y, nullptr)) ==
        MOE_ERR_INVALID_ARGUMENT);
  CHECK(StatusToMoe(PromptMmaQ8(p, DeviceMatrix{TypeId::kQ8_0, q, 4, 256, 272}, q + 4, y, nullptr)) ==
        MOE_ERR_INVALID_ARGUMENT);
  PromptGroups none = p;
  none.span = nullptr;
  CHECK(StatusToMoe(PromptMmaQ8(none, DeviceMatrix{TypeId::kQ8_0, q, 4, 256, 272}, q, y, nullptr)) ==
        MOE_ERR_INVALID_ARGUMENT);
  p.m = -1;
  CHECK(StatusToMoe(PromptMmaQ8(p, DeviceMatrix{TypeId::kQ8_0, q, 4, 256, 272}, q, y, nullptr)) ==
        MOE_ERR_INVALID_ARGUMENT);
}

// The grouped kernels with 8-bit activations, as a decode batch runs a MoE layer: grouping on the
// device, gate/up SwiGLU over the quantized grouped rows, the SwiGLU output quantized again for the
// down projection; each stage against the CPU backend's q8 mode on the same inputs.
TEST_CASE("Grouped 8-bit-activation experts match the CPU backend's q8 mode", "[gpu][q8][grouped]") {
  if (!HaveGpu()) return;
  auto rng = test::Rng();
  const int64_t n_embd = 2048, n_ff = 768, n_tok = 9;
  const int k = 2, n_expert = 8;
  cpu::CpuBackend cpu_be(2, cpu::MatMulMode::kQ8Activations);
  for (TypeId type : {TypeId::kQ4_K, TypeId::kQ8_0}) {
    INFO(quant::TypeName(static_cast<uint32_t>(type)));
    uint64_t rb_in = 0, rb_out = 0;
    std::vector<std::vector<uint8_t>> gate, up, down;
    std::vector<DeviceBuffer> dev;
    std::vector<const void *> tab(3 * n_expert);
    for (int e = 0; e < n_expert; ++e) {
      gate.push_back(RandomMatrix(rng, type, n_ff, n_embd, &rb_in));
      up.push_back(RandomMatrix(rng, type, n_ff, n_embd, &rb_in));
      down.push_back(RandomMatrix(rng, type, n_embd, n_ff, &rb_out));
      for (const auto *m : {&gate.back(), &up.back(), &down.back()}) dev.push_back(Upload(*m));
      tab[e] = dev[dev.size() - 3].data();
      tab[n_expert + e] = dev[dev.size() - 2].data();
      tab[2 * n_expert + e] = dev[dev.size() - 1].data();
    }
    DeviceBuffer dtab = Upload(tab);
    GroupedExperts ge;
    ge.gate = dtab.as<const void *>();
    ge.up = ge.gate + n_expert;
    ge.down = ge.gate + 2 * n_expert;
    ge.gate_shape = {type, nullptr, n_ff, n_embd, rb_in};
    ge.up_shape = ge.gate_shape;
    ge.down_shape = {type, nullptr, n_embd, n_ff, rb_out};
    ge.n_expert = n_expert;
    // Two distinct experts a token.
    std::vector<int32_t> sel;
    for (int64_t t = 0; t < n_tok; ++t) {
      const int a = std::uniform_int_distribution<int>(0, n_expert - 1)(rng);
      sel.push_back(a);
      sel.push_back((a + 1 + std::uniform_int_distribution<int>(0, n_expert - 2)(rng)) % n_expert);
    }
    const int64_t n = n_tok * k;
    const int n_max = static_cast<int>(GroupMaxGroups(n_tok, k, n_expert));
    const model::ExpertGroups groups = model::GroupByExpert(sel.data(), n_tok, k, n_expert);
    std::vector<float> x = RandomFloats(rng, n_tok * n_embd, -2.f, 2.f);
    DeviceBuffer dsel = Upload(sel), dx = Upload(x);
    auto idx = DeviceBuffer::Allocate(2 * n * sizeof(int32_t));
    auto plan = DeviceBuffer::Allocate(GroupPlanInts(n_tok, k, n_expert) * sizeof(int32_t));
    REQUIRE((idx.ok() && plan.ok()));
    REQUIRE(GroupByExpert(dsel.as<int32_t>(), n_tok, k, n_expert, idx->as<int32_t>(), plan->as<int32_t>(), nullptr).ok());
    DeviceBuffer xg = Poisoned(n * n_embd), hg = Poisoned(n * n_ff), yg = Poisoned(n * n_embd);
    REQUIRE(GatherRows(dx.as<float>(), n_embd, idx->as<int32_t>(), n, xg.as<float>(), nullptr).ok());
    const Q8Act f = Q8ActFor(type);
    auto xq = DeviceBuffer::Allocate(n * Q8ActRowBytes(f, n_embd));
    auto hq = DeviceBuffer::Allocate(n * Q8ActRowBytes(f, n_ff));
    REQUIRE((xq.ok() && hq.ok()));
    REQUIRE(QuantizeActivationsQ8(f, xg.as<float>(), n, n_embd, xq->data(), nullptr).ok());
    REQUIRE(GroupedSwiGluQ8(ge, plan->as<int32_t>(), n_max, xq->data(), hg.as<float>(), nullptr, n_tok).ok());
    REQUIRE(QuantizeActivationsQ8(f, hg.as<float>(), n, n_ff, hq->data(), nullptr).ok());
    REQUIRE(GroupedGemvQ8(ge.down, ge.down_shape, plan->as<int32_t>(), n_max, hq->data(), yg.as<float>(), nullptr,
                          n_tok).ok());
    const std::vector<float> xg_h = Download<float>(xg, n * n_embd), hg_h = Download<float>(hg, n * n_ff),
                             yg_h = Download<float>(yg, n * n_embd);
    std::vector<float> want_h(n * n_ff), want_y(n * n_embd), g(n_ff), u(n_ff);
    for (size_t gi = 0; gi < groups.used.size(); ++gi) {
      const int e = groups.used[gi];
      const model::Matrix mg = HostMatrixOf(type, gate[e], n_ff, n_embd, rb_in),
                          mu = HostMatrixOf(type, up[e], n_ff, n_embd, rb_in),
                          md = HostMatrixOf(type, down[e], n_embd, n_ff, rb_out);
      for (int64_t r = groups.first[gi]; r < groups.first[gi + 1]; ++r) {
        cpu_be.MatMul(mg, xg_h.data() + r * n_embd, 1, g.data());
        cpu_be.MatMul(mu, xg_h.data() + r * n_embd, 1, u.data());
        for (int64_t i = 0; i < n_ff; ++i) {
          want_h[r * n_ff + i] = (g[i] / (1.0f + static_cast<float>(std::exp(-static_cast<double>(g[i]))))) * u[i];
        }
        cpu_be.MatMul(md, hg_h.data() + r * n_ff, 1, want_y.data() + r * n_embd);  // the GPU's h as input
      }
    }
    CHECK(RelL2(hg_h, want_h) <= 1e-5);
    CHECK(RelL2(yg_h, want_y) <= 1e-5);
    // The tokens' rows quantized once and read through idx: the same codes, so the same bits as
    // over the gathered rows.
    auto tq = DeviceBuffer::Allocate(n_tok * Q8ActRowBytes(f, n_embd));
    REQUIRE(tq.ok());
    DeviceBuffer hg2 = Poisoned(n * n_ff);
    REQUIRE(QuantizeActivationsQ8(f, dx.as<float>(), n_tok, n_embd, tq->data(), nullptr).ok());
    REQUIRE(GroupedSwiGluQ8(ge, plan->as<int32_t>(), n_max, tq->data(), hg2.as<float>(), nullptr, n_tok, nullptr,
                            idx->as<int32_t>()).ok());
    const std::vector<float> hg2_h = Download<float>(hg2, n * n_ff);
    CHECK(std::memcmp(hg2_h.data(), hg_h.data(), hg_h.size() * sizeof(float)) == 0);
    // Kernels told to take one token at a time (groups of more take more chunks): the same bits.
    DeviceBuffer hg1 = Poisoned(n * n_ff), yg1 = Poisoned(n * n_embd);
    REQUIRE(GroupedSwiGluQ8(ge, plan->as<int32_t>(), n_max, xq->data(), hg1.as<float>(), nullptr, 1).ok());
    REQUIRE(GroupedGemvQ8(ge.down, ge.down_shape, plan->as<int32_t>(), n_max, hq->data(), yg1.as<float>(), nullptr,
                          1).ok());
    const std::vector<float> hg1_h = Download<float>(hg1, n * n_ff), yg1_h = Download<float>(yg1, n * n_embd);
    CHECK(std::memcmp(hg1_h.data(), hg_h.data(), hg_h.size() * sizeof(float)) == 0);
    CHECK(std::memcmp(yg1_h.data(), yg_h.data(), yg_h.size() * sizeof(float)) == 0);
    // A grid narrower than the groups (each block serving several, skipped ones among them): the
    // same bits; a grid wider than n_max is refused.
    const int n_grid = std::max(1, n_max / 3);
    DeviceBuffer hg3 = Poisoned(n * n_ff), yg3 = Poisoned(n * n_embd);
    REQUIRE(GroupedSwiGluQ8(ge, plan->as<int32_t>(), n_max, xq->data(), hg3.as<float>(), nullptr, n_tok, nullptr,
                            nullptr, n_grid).ok());
    REQUIRE(GroupedGemvQ8(ge.down, ge.down_shape, plan->as<int32_t>(), n_max, hq->data(), yg3.as<float>(), nullptr,
                          n_tok, nullptr, n_grid).ok());
    const std::vector<float> hg3_h = Download<float>(hg3, n * n_ff), yg3_h = Download<float>(yg3, n * n_embd);
    CHECK(std::memcmp(hg3_h.data(), hg_h.data(), hg_h.size() * sizeof(float)) == 0);
    CHECK(std::memcmp(yg3_h.data(), yg_h.data(), yg_h.size() * sizeof(float)) == 0);
    CHECK(StatusToMoe(GroupedGemvQ8(ge.down, ge.down_shape, plan->as<int32_t>(), n_max, hq->data(), yg3.as<float>(),
                                    nullptr, n_tok, nullptr, n_max + 1)) == MOE_ERR_INVALID_ARGUMENT);
  }
}

TEST_CASE("8-bit-activation GEMV refuses codecs, shapes and buffers it cannot take", "[gpu][q8]") {
  if (!HaveGpu()) return;
  auto buf = DeviceBuffer::Allocate(1 << 16);
  REQUIRE(buf.ok());
  auto *p = static_cast<uint8_t *>(buf->data());
  const DeviceMatrix f32{TypeId::kF32, p, 4, 256, 1024};
  CHECK(StatusToMoe(GemvQ8(f32, p, 1, reinterpret_cast<float *>(p), nullptr)) == MOE_ERR_UNSUPPORTED_TYPE);
  const DeviceMatrix q8{TypeId::kQ8_0, p, 4, 256, 272};
  CHECK(StatusToMoe(GemvQ8(q8, p + 4, 1, reinterpret_cast<float *>(p), nullptr)) == MOE_ERR_INVALID_ARGUMENT);
  CHECK(StatusToMoe(GemvQ8(q8, p, 1, nullptr, nullptr)) == MOE_ERR_INVALID_ARGUMENT);
  CHECK(StatusToMoe(QuantizeActivationsQ8(Q8Act::kBlock256, reinterpret_cast<float *>(p), 1, 224, p, nullptr)) ==
        MOE_ERR_INVALID_ARGUMENT);
  CHECK(StatusToMoe(QuantizeActivationsQ8(Q8Act::kNone, reinterpret_cast<float *>(p), 1, 256, p, nullptr)) ==
        MOE_ERR_INVALID_ARGUMENT);
}

}  // namespace strata::cuda
