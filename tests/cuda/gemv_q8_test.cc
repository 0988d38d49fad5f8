// 8-bit-activation GEMV (gemv_q8.cu) against the CPU backend's q8 mode: the quantized activations
// byte for byte, and the products within float summation order (relative L2 1e-5), on fresh random
// inputs with outputs poisoned first.
#include <cstring>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/kernels/kernels.h"
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

TEST_CASE("8-bit-activation GEMV matches the CPU backend's q8 mode", "[gpu][q8]") {
  if (!HaveGpu()) return;
  auto rng = test::Rng();
  const int64_t rows = 301, cols = 2048;
  cpu::CpuBackend cpu_be(2, cpu::MatMulMode::kQ8Activations);
  for (TypeId type : {TypeId::kQ8_0, TypeId::kQ4_K}) {
    INFO(quant::TypeName(static_cast<uint32_t>(type)));
    uint64_t rb = 0;
    std::vector<uint8_t> w = RandomMatrix(rng, type, rows, cols, &rb);
    DeviceBuffer dw = Upload(w);
    const DeviceMatrix m = test::View(type, dw, rows, cols, rb);
    const Q8Act f = Q8ActFor(type);
    const int64_t max_tok = 11, xrb = Q8ActRowBytes(f, cols);
    std::vector<float> x = RandomFloats(rng, max_tok * cols, -2.f, 2.f);
    DeviceBuffer dx = Upload(x);
    auto dq = DeviceBuffer::Allocate(max_tok * xrb);
    REQUIRE(dq.ok());
    REQUIRE(QuantizeActivationsQ8(f, dx.as<float>(), max_tok, cols, dq->data(), nullptr).ok());
    std::vector<float> ref(max_tok * rows);
    const model::Matrix hm = HostMatrixOf(type, w, rows, cols, rb);
    cpu_be.MatMul(hm, x.data(), max_tok, ref.data());
    std::vector<float> single;
    for (int64_t n_tok : {1, 3, 8, 11}) {
      INFO("n_tok " << n_tok);
      DeviceBuffer dy = Poisoned(n_tok * rows);
      REQUIRE(GemvQ8(m, dq->data(), n_tok, dy.as<float>(), nullptr).ok());
      const std::vector<float> y = Download<float>(dy, n_tok * rows);
      CHECK(RelL2(y, std::vector<float>(ref.begin(), ref.begin() + n_tok * rows)) <= 1e-5);
      if (n_tok == 1) single = y;  // a token's result does not depend on its batch
      CHECK(std::memcmp(y.data(), single.data(), rows * sizeof(float)) == 0);
    }
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
