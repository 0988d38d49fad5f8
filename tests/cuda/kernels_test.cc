// GPU kernels against the CPU reference (lib/quant dequantize, CpuBackend) on fresh random inputs,
// outputs poisoned with NaN first. Tolerances (relative L2 unless bit-exact): decoded weights are
// bit-identical by construction; float32 sums differ from the CPU only in order, which for these
// sizes (<= 4096 terms) stays below 1e-5; TF32 GEMMs keep 10 mantissa bits, so 5e-3.
#include <algorithm>
#include <cstdlib>
#include <numeric>

#include "backends/cpu/cpu_backend.h"
#include "backends/cuda/cuda_status.h"
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

const TypeId kCodecs[] = {TypeId::kF32,    TypeId::kF16,    TypeId::kBF16,  TypeId::kQ4_0,    TypeId::kQ4_1,
                          TypeId::kQ5_0,   TypeId::kQ5_1,   TypeId::kQ8_0,  TypeId::kQ2_K,    TypeId::kQ3_K,
                          TypeId::kQ4_K,   TypeId::kQ5_K,   TypeId::kQ6_K,  TypeId::kIQ4_NL,  TypeId::kIQ4_XS,
                          TypeId::kMXFP4,  TypeId::kIQ2_XXS, TypeId::kIQ2_XS, TypeId::kIQ2_S, TypeId::kIQ3_XXS,
                          TypeId::kIQ3_S,  TypeId::kIQ1_S,  TypeId::kIQ1_M, TypeId::kTQ1_0,   TypeId::kTQ2_0};

model::Matrix HostMatrix(TypeId type, const std::vector<uint8_t> &bytes, int64_t rows, int64_t cols, uint64_t rb) {
  model::Matrix m;
  m.codec = quant::FindCodec(type);
  m.rows = rows;
  m.cols = cols;
  m.row_bytes = rb;
  m.data = bytes.data();
  return m;
}

// y (n_tok, rows) of the dequantized rows dotted with x in double: the exact value of what the GEMV
// computes in float32.
std::vector<float> ReferenceMatMul(TypeId type, const std::vector<uint8_t> &w, int64_t rows, int64_t cols, uint64_t rb,
                                   const std::vector<float> &x, int64_t n_tok) {
  const quant::Codec *c = quant::FindCodec(type);
  std::vector<float> row(cols), y(n_tok * rows);
  for (int64_t r = 0; r < rows; ++r) {
    c->dequantize(w.data() + r * rb, row.data(), cols);
    for (int64_t t = 0; t < n_tok; ++t) {
      double s = 0;
      for (int64_t i = 0; i < cols; ++i) s += static_cast<double>(row[i]) * x[t * cols + i];
      y[t * rows + r] = static_cast<float>(s);
    }
  }
  return y;
}

TEST_CASE("CUDA errors map to Strata codes", "[gpu]") {
  CHECK(CudaStatus(cudaSuccess, "x", __FILE__, __LINE__).ok());
  CHECK(StatusToMoe(CudaStatus(cudaErrorMemoryAllocation, "x", __FILE__, __LINE__)) == MOE_ERR_NO_MEMORY);
  CHECK(StatusToMoe(CudaStatus(cudaErrorNoDevice, "x", __FILE__, __LINE__)) == MOE_ERR_UNSUPPORTED_BACKEND);
  CHECK(StatusToMoe(CudaStatus(cudaErrorIllegalAddress, "x", __FILE__, __LINE__)) == MOE_ERR_BACKEND);
  CHECK(StatusToMoe(CudaStatus(CUBLAS_STATUS_ALLOC_FAILED, "x", __FILE__, __LINE__)) == MOE_ERR_NO_MEMORY);
  CHECK(StatusToMoe(CudaStatus(CUBLAS_STATUS_EXECUTION_FAILED, "x", __FILE__, __LINE__)) == MOE_ERR_BACKEND);
  if (!HaveGpu()) return;
  // An impossible allocation is an error the caller gets back, and later calls still work.
  auto huge = DeviceBuffer::Allocate(size_t{1} << 50);
  REQUIRE_FALSE(huge.ok());
  CHECK(StatusToMoe(huge.status()) == MOE_ERR_NO_MEMORY);
  auto small = DeviceBuffer::Allocate(1024);
  CHECK(small.ok());
}

TEST_CASE("RAII stream, event and pinned buffer round trip", "[gpu]") {
  if (!HaveGpu()) return;
  auto rng = test::Rng();
  auto s = Stream::Create();
  REQUIRE(s.ok());
  auto start = Event::Create(true), end = Event::Create(true);
  REQUIRE((start.ok() && end.ok()));
  const size_t n = 1 << 20;
  auto host = PinnedBuffer::Allocate(n * sizeof(float));
  auto back = PinnedBuffer::Allocate(n * sizeof(float));
  auto dev = DeviceBuffer::Allocate(n * sizeof(float));
  REQUIRE((host.ok() && back.ok() && dev.ok()));
  std::vector<float> v = RandomFloats(rng, n);
  std::copy(v.begin(), v.end(), host->as<float>());
  std::fill(back->as<float>(), back->as<float>() + n, NAN);
  REQUIRE(start->Record(s->get()).ok());
  REQUIRE(CopyAsync(dev->data(), host->data(), n * sizeof(float), s->get()).ok());
  REQUIRE(CopyAsync(back->data(), dev->data(), n * sizeof(float), s->get()).ok());
  REQUIRE(end->Record(s->get()).ok());
  REQUIRE(s->Synchronize().ok());
  CHECK(std::memcmp(back->data(), v.data(), n * sizeof(float)) == 0);
  auto ms = Event::ElapsedMs(*start, *end);
  REQUIRE(ms.ok());
  CHECK(*ms >= 0.f);
}

TEST_CASE("Dequantize and GetRows are bit-identical to lib/quant", "[gpu]") {
  if (!HaveGpu()) return;
  auto rng = test::Rng();
  const int64_t rows = 37, cols = 1024;
  for (TypeId type : kCodecs) {
    INFO(quant::TypeName(static_cast<uint32_t>(type)));
    uint64_t rb = 0;
    std::vector<uint8_t> w = RandomMatrix(rng, type, rows, cols, &rb);
    DeviceBuffer dw = Upload(w);
    const DeviceMatrix m = test::View(type, dw, rows, cols, rb);
    std::vector<float> ref(rows * cols);
    for (int64_t r = 0; r < rows; ++r) quant::FindCodec(type)->dequantize(w.data() + r * rb, ref.data() + r * cols, cols);

    DeviceBuffer out = Poisoned(rows * cols);
    REQUIRE(Dequantize(m, out.as<float>(), nullptr).ok());
    std::vector<float> got = Download<float>(out, rows * cols);
    CHECK(std::memcmp(got.data(), ref.data(), got.size() * sizeof(float)) == 0);

    std::uniform_int_distribution<int32_t> pick(0, rows - 1);
    std::vector<int32_t> ids(9);
    for (auto &id : ids) id = pick(rng);
    ids[3] = ids[1];  // a repeated token
    DeviceBuffer did = Upload(ids);
    DeviceBuffer rows_out = Poisoned(ids.size() * cols);
    REQUIRE(GetRows(m, did.as<int32_t>(), static_cast<int64_t>(ids.size()), rows_out.as<float>(), nullptr).ok());
    std::vector<float> got_rows = Download<float>(rows_out, ids.size() * cols);
    for (size_t i = 0; i < ids.size(); ++i) {
      CHECK(std::memcmp(got_rows.data() + i * cols, ref.data() + ids[i] * cols, cols * sizeof(float)) == 0);
    }
  }
}

TEST_CASE("GEMV matches the exact dot of the dequantized weights for every codec", "[gpu]") {
  if (!HaveGpu()) return;
  auto rng = test::Rng();
  const int64_t rows = 301, cols = 2048;  // rows not a multiple of a block's 8 warps
  cpu::CpuBackend cpu_be(2, cpu::MatMulMode::kExact, cpu::kernels::Isa::kScalar);
  for (TypeId type : kCodecs) {
    INFO(quant::TypeName(static_cast<uint32_t>(type)));
    uint64_t rb = 0;
    std::vector<uint8_t> w = RandomMatrix(rng, type, rows, cols, &rb);
    DeviceBuffer dw = Upload(w);
    const DeviceMatrix m = test::View(type, dw, rows, cols, rb);
    const int64_t max_tok = 27;
    std::vector<float> x = RandomFloats(rng, max_tok * cols);
    DeviceBuffer dx = Upload(x);
    std::vector<float> ref = ReferenceMatMul(type, w, rows, cols, rb, x, max_tok);
    std::vector<float> single;
    for (int64_t n_tok : {1, 3, 8, 11, 16, 27}) {
      INFO("n_tok " << n_tok);
      DeviceBuffer dy = Poisoned(n_tok * rows);
      REQUIRE(Gemv(m, dx.as<float>(), n_tok, dy.as<float>(), nullptr).ok());
      std::vector<float> y = Download<float>(dy, n_tok * rows);
      std::vector<float> r(ref.begin(), ref.begin() + n_tok * rows);
      CHECK(RelL2(y, r) <= 1e-5);
      // A token's result does not depend on the batch it came in.
      if (n_tok == 1) single = y;
      CHECK(std::memcmp(y.data(), single.data(), rows * sizeof(float)) == 0);
      // Whole chunks of 8 share one launch: each the bits of its own 8-token launch.
      for (int64_t t0 = 8; t0 + 8 <= n_tok; t0 += 8) {
        DeviceBuffer d8 = Poisoned(8 * rows);
        REQUIRE(Gemv(m, dx.as<float>() + t0 * cols, 8, d8.as<float>(), nullptr).ok());
        const std::vector<float> y8 = Download<float>(d8, 8 * rows);
        CHECK(std::memcmp(y.data() + t0 * rows, y8.data(), y8.size() * sizeof(float)) == 0);
      }
      if (n_tok == 3) {  // and agrees with the CPU backend
        std::vector<float> cy(n_tok * rows);
        model::Matrix hm = HostMatrix(type, w, rows, cols, rb);
        cpu_be.MatMul(hm, x.data(), n_tok, cy.data());
        CHECK(RelL2(y, cy) <= 1e-5);
      }
    }
  }
}

// Codecs whose blocks are a multiple of 2 bytes but not of 4: with an odd number of blocks a row,
// every other row starts 2 bytes past a word, and the decoders' word loads must realign.
TEST_CASE("Rows of 2-byte-aligned blocks starting mid-word decode and GEMV as lib/quant", "[gpu]") {
  if (!HaveGpu()) return;
  auto rng = test::Rng();
  const int64_t rows = 37;
  for (TypeId type : {TypeId::kQ4_0, TypeId::kQ5_0, TypeId::kQ8_0, TypeId::kQ3_K, TypeId::kQ6_K, TypeId::kIQ4_NL,
                      TypeId::kIQ2_XXS, TypeId::kIQ2_XS, TypeId::kIQ2_S, TypeId::kIQ3_XXS, TypeId::kIQ3_S,
                      TypeId::kIQ1_S, TypeId::kTQ1_0, TypeId::kTQ2_0}) {
    const int64_t cols = quant::FindCodec(type)->block_elems * 33;
    INFO(quant::TypeName(static_cast<uint32_t>(type)) << ", " << cols << " columns");
    uint64_t rb = 0;
    std::vector<uint8_t> w = RandomMatrix(rng, type, rows, cols, &rb);
    REQUIRE(rb % 4 == 2);
    DeviceBuffer dw = Upload(w);
    const DeviceMatrix m = test::View(type, dw, rows, cols, rb);
    std::vector<float> ref(rows * cols);
    for (int64_t r = 0; r < rows; ++r) quant::FindCodec(type)->dequantize(w.data() + r * rb, ref.data() + r * cols, cols);
    DeviceBuffer out = Poisoned(rows * cols);
    REQUIRE(Dequantize(m, out.as<float>(), nullptr).ok());
    CHECK(std::memcmp(Download<float>(out, rows * cols).data(), ref.data(), ref.size() * sizeof(float)) == 0);
    const int64_t n_tok = 3;
    std::vector<float> x = RandomFloats(rng, n_tok * cols);
    DeviceBuffer dx = Upload(x), dy = Poisoned(n_tok * rows);
    REQUIRE(Gemv(m, dx.as<float>(), n_tok, dy.as<float>(), nullptr).ok());
    CHECK(RelL2(Download<float>(dy, n_tok * rows), ReferenceMatMul(type, w, rows, cols, rb, x, n_tok)) <= 1e-5);
  }
}

TEST_CASE("GEMV of a matrix tall enough to go unsplit (an output head) matches the exact dot", "[gpu]") {
  if (!HaveGpu()) return;
  auto rng = test::Rng();
  const int64_t rows = kGemvWholeRows + 37, cols = 4096;  // 4096 columns split below kGemvWholeRows rows
  for (TypeId type : {TypeId::kQ4_K, TypeId::kQ8_0}) {
    INFO(quant::TypeName(static_cast<uint32_t>(type)));
    REQUIRE(GemvTeamWarps(type, cols, 301) > 1);
    REQUIRE(GemvTeamWarps(type, cols, rows) == 1);
    uint64_t rb = 0;
    std::vector<uint8_t> w = RandomMatrix(rng, type, rows, cols, &rb);
    DeviceBuffer dw = Upload(w);
    const int64_t n_tok = 2;
    std::vector<float> x = RandomFloats(rng, n_tok * cols);
    DeviceBuffer dx = Upload(x);
    DeviceBuffer dy = Poisoned(n_tok * rows);
    REQUIRE(Gemv(test::View(type, dw, rows, cols, rb), dx.as<float>(), n_tok, dy.as<float>(), nullptr).ok());
    CHECK(RelL2(Download<float>(dy, n_tok * rows), ReferenceMatMul(type, w, rows, cols, rb, x, n_tok)) <= 1e-5);
  }
}

// Kernels are queued to start early (launch.cuh): each waits for the one before it in-kernel. A
// chain where every launch reads what the previous one wrote must give the same bits queued back
// to back as with the host waiting for each kernel to finish.
TEST_CASE("A chain of kernels started early gives the bits of the chain run one kernel at a time", "[gpu]") {
  if (!HaveGpu()) return;
  auto rng = test::Rng();
  // Where the GPU can start kernels early and nothing turned it off, the chain must run so.
  int major = 0;
  REQUIRE(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0) == cudaSuccess);
  if (major >= 9 && std::getenv("STRATA_CUDA_PDL") == nullptr) REQUIRE(EarlyLaunch());
  const int64_t n = 2048;
  uint64_t rb = 0;
  const std::vector<uint8_t> w = RandomMatrix(rng, TypeId::kQ8_0, n, n, &rb);
  DeviceBuffer dw = Upload(w), dnorm = Upload(RandomFloats(rng, n));
  const DeviceMatrix m = test::View(TypeId::kQ8_0, dw, n, n, rb);
  const std::vector<float> x0 = RandomFloats(rng, n);
  auto stream = Stream::Create();
  REQUIRE(stream.ok());
  auto run = [&](bool wait_each) {
    DeviceBuffer a = Upload(x0), b = Poisoned(n), r = Upload(x0);
    auto step = [&](absl::Status st) {
      REQUIRE(st.ok());
      if (wait_each) REQUIRE(stream->Synchronize().ok());
    };
    for (int i = 0; i < 40; ++i) {  // a = rmsnorm(r += W a): a GEMV of many blocks, then a one-block norm
      step(Gemv(m, a.as<float>(), 1, b.as<float>(), stream->get()));
      step(AddRmsNorm(r.as<float>(), b.as<float>(), dnorm.as<float>(), 1, n, 1e-6f, a.as<float>(), stream->get()));
    }
    REQUIRE(stream->Synchronize().ok());
    return Download<float>(a, n);
  };
  const std::vector<float> queued = run(false), one_by_one = run(true);
  CHECK(std::all_of(queued.begin(), queued.end(), [](float v) { return std::isfinite(v); }));
  CHECK(std::memcmp(queued.data(), one_by_one.data(), n * sizeof(float)) == 0);
}

TEST_CASE("cuBLASLt MatMul (GEMM path) matches the reference", "[gpu]") {
  if (!HaveGpu()) return;
  auto rng = test::Rng();
  const int64_t rows = 260, cols = 1024, n_tok = 40;
  auto blas = Blas::Create();
  auto blas_tf32 = Blas::Create(Blas::Compute::kTf32);
  REQUIRE((blas.ok() && blas_tf32.ok()));
  for (TypeId type : {TypeId::kF32, TypeId::kBF16, TypeId::kF16, TypeId::kQ4_K, TypeId::kQ6_K, TypeId::kQ5_K,
                      TypeId::kQ3_K, TypeId::kQ4_1, TypeId::kIQ4_NL, TypeId::kIQ2_XXS, TypeId::kIQ3_S, TypeId::kIQ1_M,
                      TypeId::kTQ1_0}) {
    INFO(quant::TypeName(static_cast<uint32_t>(type)));
    uint64_t rb = 0;
    std::vector<uint8_t> w = RandomMatrix(rng, type, rows, cols, &rb);
    DeviceBuffer dw = Upload(w);
    const DeviceMatrix m = test::View(type, dw, rows, cols, rb);
    std::vector<float> x = RandomFloats(rng, n_tok * cols);
    DeviceBuffer dx = Upload(x);
    std::vector<float> ref = ReferenceMatMul(type, w, rows, cols, rb, x, n_tok);
    auto ws = DeviceBuffer::Allocate(Blas::MatMulWorkspaceBytes(m, n_tok));
    REQUIRE(ws.ok());
    REQUIRE(Blas::Choose(n_tok, Blas::Path::kAuto) == Blas::Path::kGemm);
    DeviceBuffer dy = Poisoned(n_tok * rows);
    REQUIRE(blas->MatMul(m, dx.as<float>(), n_tok, dy.as<float>(), {ws->data(), ws->size()}, nullptr).ok());
    CHECK(RelL2(Download<float>(dy, n_tok * rows), ref) <= 1e-5);
    DeviceBuffer dt = Poisoned(n_tok * rows);
    REQUIRE(blas_tf32->MatMul(m, dx.as<float>(), n_tok, dt.as<float>(), {ws->data(), ws->size()}, nullptr).ok());
    CHECK(RelL2(Download<float>(dt, n_tok * rows), ref) <= 5e-3);
    // Too small a workspace is refused, not overrun.
    CHECK(StatusToMoe(blas->MatMul(m, dx.as<float>(), n_tok, dy.as<float>(), {ws->data(), 16}, nullptr)) ==
          MOE_ERR_INVALID_ARGUMENT);
  }
}

TEST_CASE("RMSNorm matches the CPU backend", "[gpu]") {
  if (!HaveGpu()) return;
  auto rng = test::Rng();
  cpu::CpuBackend cpu_be(2);
  for (int64_t n : {64, 128, 2048, 5000, 9000}) {  // 9000: past the register path (8 per thread)
    const int64_t n_rows = 7;
    std::vector<float> x = RandomFloats(rng, n_rows * n, -3.f, 3.f), wt = RandomFloats(rng, n, 0.5f, 1.5f);
    std::vector<float> ref(n_rows * n);
    cpu_be.RmsNorm(x.data(), wt.data(), n_rows, n, 1e-6f, ref.data());
    DeviceBuffer dx = Upload(x), dw = Upload(wt), dy = Poisoned(n_rows * n);
    REQUIRE(RmsNorm(dx.as<float>(), dw.as<float>(), n_rows, n, 1e-6f, dy.as<float>(), nullptr).ok());
    CHECK(RelL2(Download<float>(dy, n_rows * n), ref) <= 1e-6);
    // In place, as the forward pass does for q/k norms.
    REQUIRE(RmsNorm(dx.as<float>(), dw.as<float>(), n_rows, n, 1e-6f, dx.as<float>(), nullptr).ok());
    CHECK(RelL2(Download<float>(dx, n_rows * n), ref) <= 1e-6);
  }
}

TEST_CASE("RoPE matches the CPU backend in both styles", "[gpu]") {
  if (!HaveGpu()) return;
  auto rng = test::Rng();
  cpu::CpuBackend cpu_be(1);
  const int64_t n_tok = 9;
  const int n_heads = 4, head_dim = 128;
  std::uniform_int_distribution<int32_t> p(0, 32767);
  for (model::RopeStyle style : {model::RopeStyle::kNormal, model::RopeStyle::kNeox}) {
    for (float theta : {10000.f, 1000000.f}) {
      std::vector<float> x = RandomFloats(rng, n_tok * n_heads * head_dim);
      std::vector<int32_t> pos(n_tok);
      for (auto &v : pos) v = p(rng);
      std::vector<float> ref = x;
      cpu_be.Rope(ref.data(), n_tok, n_heads, head_dim, pos.data(), theta, style);
      DeviceBuffer dx = Upload(x), dp = Upload(pos);
      REQUIRE(Rope(dx.as<float>(), n_tok, n_heads, head_dim, dp.as<int32_t>(), theta, style, nullptr).ok());
      CHECK(RelL2(Download<float>(dx, x.size()), ref) <= 1e-6);
    }
  }
}

// The forward pass's Route (lib/model/forward.cc), restated: softmax, top-k with ties to the lower
// index, optional renormalisation.
void ReferenceRoute(const float *logits, int n_expert, int k, bool renorm, int32_t *sel, float *wts) {
  std::vector<float> p(logits, logits + n_expert);
  const float mx = *std::max_element(p.begin(), p.end());
  float sum = 0.f;
  for (auto &v : p) {
    v = std::exp(v - mx);
    sum += v;
  }
  for (auto &v : p) v /= sum;
  std::vector<int32_t> idx(n_expert);
  std::iota(idx.begin(), idx.end(), 0);
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                    [&](int32_t a, int32_t b) { return p[a] > p[b] || (p[a] == p[b] && a < b); });
  float s = 0.f;
  for (int j = 0; j < k; ++j) {
    sel[j] = idx[j];
    wts[j] = p[idx[j]];
    s += wts[j];
  }
  if (renorm) {
    for (int j = 0; j < k; ++j) wts[j] /= s;
  }
}

TEST_CASE("Softmax top-k routing matches the forward pass's Route", "[gpu]") {
  if (!HaveGpu()) return;
  auto rng = test::Rng();
  struct Case { int n_expert, k; };
  for (Case c : {Case{8, 2}, Case{64, 8}, Case{128, 8}, Case{256, 8}, Case{384, 10}}) {
    for (bool renorm : {false, true}) {
      for (bool ties : {false, true}) {
        INFO(c.n_expert << " experts, k " << c.k << ", renorm " << renorm << ", ties " << ties);
        const int64_t n_tok = 13;
        std::vector<float> logits = RandomFloats(rng, n_tok * c.n_expert, -4.f, 4.f);
        if (ties) {  // runs of equal logits, including among the largest
          for (int64_t t = 0; t < n_tok; ++t) {
            float *l = logits.data() + t * c.n_expert;
            const float top = *std::max_element(l, l + c.n_expert);
            for (int e = 1; e < c.n_expert; e += 3) l[e] = top;
          }
        }
        std::vector<int32_t> ref_sel(n_tok * c.k);
        std::vector<float> ref_w(n_tok * c.k);
        for (int64_t t = 0; t < n_tok; ++t) {
          ReferenceRoute(logits.data() + t * c.n_expert, c.n_expert, c.k, renorm, ref_sel.data() + t * c.k,
                         ref_w.data() + t * c.k);
        }
        DeviceBuffer dl = Upload(logits), dw = Poisoned(n_tok * c.k);
        auto ds = DeviceBuffer::Allocate(n_tok * c.k * sizeof(int32_t));
        REQUIRE(ds.ok());
        REQUIRE(cudaMemset(ds->data(), 0xff, n_tok * c.k * sizeof(int32_t)) == cudaSuccess);
        REQUIRE(SoftmaxTopK(dl.as<float>(), n_tok, c.n_expert, c.k, renorm, ds->as<int32_t>(), dw.as<float>(), nullptr)
                    .ok());
        CHECK(Download<int32_t>(*ds, n_tok * c.k) == ref_sel);
        CHECK(RelL2(Download<float>(dw, n_tok * c.k), ref_w) <= 1e-6);
      }
    }
  }
}

TEST_CASE("Expert FFN matches the CPU backend on the GEMV and GEMM paths", "[gpu]") {
  if (!HaveGpu()) return;
  auto rng = test::Rng();
  cpu::CpuBackend cpu_be(2, cpu::MatMulMode::kExact, cpu::kernels::Isa::kScalar);
  auto blas = Blas::Create();
  REQUIRE(blas.ok());
  const int64_t n_embd = 512, n_ff = 768;
  struct Types { TypeId gate, up, down; };
  for (Types ty : {Types{TypeId::kQ4_K, TypeId::kQ4_K, TypeId::kQ6_K}, Types{TypeId::kMXFP4, TypeId::kMXFP4, TypeId::kMXFP4},
                   Types{TypeId::kQ8_0, TypeId::kIQ4_XS, TypeId::kBF16}, Types{TypeId::kQ5_K, TypeId::kQ5_K, TypeId::kQ6_K},
                   Types{TypeId::kQ2_K, TypeId::kQ3_K, TypeId::kQ4_K}, Types{TypeId::kQ4_0, TypeId::kQ5_0, TypeId::kQ5_1},
                   Types{TypeId::kQ4_1, TypeId::kQ4_1, TypeId::kQ4_0},
                   // The mixes of IQ2_XXS, IQ2_S, IQ1_M and IQ4_NL files, and the ternary codecs.
                   Types{TypeId::kIQ2_XXS, TypeId::kIQ2_XXS, TypeId::kIQ3_XXS},
                   Types{TypeId::kIQ2_XS, TypeId::kIQ2_S, TypeId::kIQ3_S}, Types{TypeId::kIQ1_S, TypeId::kIQ1_M, TypeId::kIQ2_S},
                   Types{TypeId::kIQ4_NL, TypeId::kIQ4_NL, TypeId::kQ5_K}, Types{TypeId::kTQ1_0, TypeId::kTQ1_0, TypeId::kTQ2_0}}) {
    INFO(quant::TypeName(static_cast<uint32_t>(ty.gate)) << "/" << quant::TypeName(static_cast<uint32_t>(ty.up)) << "/"
                                                         << quant::TypeName(static_cast<uint32_t>(ty.down)));
    uint64_t rbg, rbu, rbd;
    std::vector<uint8_t> g = RandomMatrix(rng, ty.gate, n_ff, n_embd, &rbg), u = RandomMatrix(rng, ty.up, n_ff, n_embd, &rbu),
                         d = RandomMatrix(rng, ty.down, n_embd, n_ff, &rbd);
    model::ExpertWeights he;
    he.gate = HostMatrix(ty.gate, g, n_ff, n_embd, rbg);
    he.up = HostMatrix(ty.up, u, n_ff, n_embd, rbu);
    he.down = HostMatrix(ty.down, d, n_embd, n_ff, rbd);
    DeviceBuffer dg = Upload(g), du = Upload(u), dd = Upload(d);
    const DeviceExpert de{test::View(ty.gate, dg, n_ff, n_embd, rbg), test::View(ty.up, du, n_ff, n_embd, rbu),
                          test::View(ty.down, dd, n_embd, n_ff, rbd)};
    for (int64_t n_tok : {1, 5, 40}) {
      INFO("n_tok " << n_tok);
      std::vector<float> x = RandomFloats(rng, n_tok * n_embd, -2.f, 2.f), ref(n_tok * n_embd);
      cpu_be.ExpertFfn(he, x.data(), n_tok, ref.data());
      DeviceBuffer dx = Upload(x), dy = Poisoned(n_tok * n_embd);
      auto ws = DeviceBuffer::Allocate(ExpertFfnWorkspaceBytes(de, n_tok));
      REQUIRE(ws.ok());
      REQUIRE(ExpertFfn(*blas, de, dx.as<float>(), n_tok, dy.as<float>(), {ws->data(), ws->size()}, nullptr).ok());
      CHECK(RelL2(Download<float>(dy, n_tok * n_embd), ref) <= 1e-5);
    }
  }
}

TEST_CASE("Launchers refuse bad arguments with a Status", "[gpu]") {
  if (!HaveGpu()) return;
  DeviceBuffer buf = Poisoned(4096);
  DeviceMatrix m{TypeId::kQ4_K, buf.data(), 4, 200, 144};  // 200 columns: not a whole Q4_K block
  CHECK(StatusToMoe(Gemv(m, buf.as<float>(), 1, buf.as<float>(), nullptr)) == MOE_ERR_INVALID_ARGUMENT);
  m = {TypeId::kQ8_K, buf.data(), 4, 256, 292};  // a GGUF type lib/quant does not decode
  CHECK(StatusToMoe(Gemv(m, buf.as<float>(), 1, buf.as<float>(), nullptr)) == MOE_ERR_UNSUPPORTED_TYPE);
  m = {TypeId::kQ5_1, static_cast<uint8_t *>(buf.data()) + 2, 4, 256, 192};  // Q5_1 blocks need 4-byte alignment
  CHECK(StatusToMoe(Gemv(m, buf.as<float>(), 1, buf.as<float>(), nullptr)) == MOE_ERR_INVALID_ARGUMENT);
  m = {TypeId::kIQ1_M, static_cast<uint8_t *>(buf.data()) + 2, 4, 256, 56};  // so do IQ1_M's
  CHECK(StatusToMoe(Gemv(m, buf.as<float>(), 1, buf.as<float>(), nullptr)) == MOE_ERR_INVALID_ARGUMENT);
  m = {TypeId::kQ4_K, static_cast<uint8_t *>(buf.data()) + 4, 4, 256, 144};  // misaligned
  CHECK(StatusToMoe(Gemv(m, buf.as<float>(), 1, buf.as<float>(), nullptr)) == MOE_ERR_INVALID_ARGUMENT);
  CHECK(StatusToMoe(SoftmaxTopK(buf.as<float>(), 1, 8, 9, false, nullptr, nullptr, nullptr)) == MOE_ERR_INVALID_ARGUMENT);
}

}  // namespace
}  // namespace strata::cuda
