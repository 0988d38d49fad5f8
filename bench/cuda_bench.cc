// CUDA kernel throughput on the GPU machine: the device-to-device copy bandwidth (the HBM ceiling),
// then the decode GEMV per codec (weight bytes streamed per second, 1 and 8 tokens), one SwiGLU
// expert of Qwen3-30B-A3B's shape at batch 1, and the cuBLASLt GEMM of a 512-token prefill.
// Usage: cuda_bench [weight MiB per matrix, default 1024]. Prints a table; exits 0 without a GPU.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "backends/cuda/device.h"
#include "backends/cuda/kernels.h"
#include "backends/cuda/memory.h"

namespace strata::cuda {
namespace {

#define BENCH_CHECK(expr)                                                      \
  do {                                                                         \
    const absl::Status st_ = (expr);                                           \
    if (!st_.ok()) {                                                           \
      std::fprintf(stderr, "%s: %s\n", #expr, std::string(st_.message()).c_str()); \
      std::exit(1);                                                            \
    }                                                                          \
  } while (0)

template <typename T>
T Must(absl::StatusOr<T> v, const char *what) {
  if (!v.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, std::string(v.status().message()).c_str());
    std::exit(1);
  }
  return std::move(v).value();
}

// Mean milliseconds of `reps` runs of f on stream s, after 3 warm-up runs.
template <class F>
float TimeMs(cudaStream_t s, int reps, F &&f) {
  Event a = Must(Event::Create(true), "event"), b = Must(Event::Create(true), "event");
  for (int i = 0; i < 3; ++i) f();
  BENCH_CHECK(a.Record(s));
  for (int i = 0; i < reps; ++i) f();
  BENCH_CHECK(b.Record(s));
  BENCH_CHECK(b.Synchronize());
  return Must(Event::ElapsedMs(a, b), "elapsed") / reps;
}

int Main(int argc, char **argv) {
  if (DeviceCount() == 0) {
    std::printf("no CUDA device\n");
    return 0;
  }
  const size_t mib = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 1024;
  cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) return 1;
  std::printf("device: %s, %d SMs, L2 %d MiB\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20);
  Stream stream = Must(Stream::Create(), "stream");
  cudaStream_t s = stream.get();

  // HBM ceiling: a device-to-device copy, counting bytes read plus bytes written.
  const size_t copy_bytes = size_t{2} << 30;
  DeviceBuffer src = Must(DeviceBuffer::Allocate(copy_bytes), "alloc"), dst = Must(DeviceBuffer::Allocate(copy_bytes), "alloc");
  if (cudaMemset(src.data(), 1, copy_bytes) != cudaSuccess) return 1;
  const float copy_ms = TimeMs(s, 10, [&] { BENCH_CHECK(CopyAsync(dst.data(), src.data(), copy_bytes, s)); });
  const double hbm = 2.0 * copy_bytes / (copy_ms * 1e-3) / 1e9;
  std::printf("HBM copy (read + write): %.0f GB/s\n\n", hbm);
  src.Reset();
  dst.Reset();

  // Decode GEMV: one matrix of about `mib` MiB (far beyond L2) with 4096 columns.
  const int64_t cols = 4096;
  std::printf("%-7s %9s %10s %10s %8s %10s %10s\n", "codec", "rows", "MiB", "1 tok us", "GB/s", "8 tok us", "GB/s");
  const quant::TypeId types[] = {quant::TypeId::kF32,  quant::TypeId::kF16,  quant::TypeId::kBF16,
                                 quant::TypeId::kQ8_0, quant::TypeId::kQ6_K, quant::TypeId::kQ4_K,
                                 quant::TypeId::kIQ4_XS, quant::TypeId::kMXFP4};
  DeviceBuffer x = Must(DeviceBuffer::Allocate(8 * cols * sizeof(float)), "alloc");
  if (cudaMemset(x.data(), 0, 8 * cols * sizeof(float)) != cudaSuccess) return 1;
  for (quant::TypeId t : types) {
    const quant::Codec *c = quant::FindCodec(t);
    const uint64_t rb = static_cast<uint64_t>(cols / c->block_elems * c->block_bytes);
    const int64_t rows = static_cast<int64_t>((mib << 20) / rb);
    DeviceBuffer w = Must(DeviceBuffer::Allocate(rb * rows), "alloc");
    // 0x3c bytes: finite scales (f16 0x3c3c = 1.06) and arbitrary codes; speed does not depend on them.
    if (cudaMemset(w.data(), 0x3c, rb * rows) != cudaSuccess) return 1;
    DeviceBuffer y = Must(DeviceBuffer::Allocate(8 * rows * sizeof(float)), "alloc");
    const DeviceMatrix m{t, w.data(), rows, cols, rb};
    const float ms1 = TimeMs(s, 20, [&] { BENCH_CHECK(Gemv(m, x.as<float>(), 1, y.as<float>(), s)); });
    const float ms8 = TimeMs(s, 20, [&] { BENCH_CHECK(Gemv(m, x.as<float>(), 8, y.as<float>(), s)); });
    const double bytes = static_cast<double>(rb) * rows;
    std::printf("%-7s %9lld %10.0f %10.1f %8.0f %10.1f %8.0f\n", std::string(c->name).c_str(),
                static_cast<long long>(rows), bytes / (1 << 20), ms1 * 1e3, bytes / (ms1 * 1e-3) / 1e9, ms8 * 1e3,
                bytes / (ms8 * 1e-3) / 1e9);
  }

  // One routed expert of Qwen3-30B-A3B (n_embd 2048, n_ff 768, Q4_K), batch 1, cycling through 256
  // experts so weights come from HBM, not L2.
  {
    const int64_t n_embd = 2048, n_ff = 768, n_exp = 256;
    const quant::Codec *c = quant::FindCodec(quant::TypeId::kQ4_K);
    const uint64_t rb_in = n_embd / 256 * c->block_bytes, rb_out = n_ff / 256 * c->block_bytes;
    const uint64_t per = 2 * rb_in * n_ff + rb_out * n_embd;
    DeviceBuffer w = Must(DeviceBuffer::Allocate(per * n_exp), "alloc");
    if (cudaMemset(w.data(), 0x3c, per * n_exp) != cudaSuccess) return 1;
    Blas blas = Must(Blas::Create(), "blas");
    DeviceBuffer y = Must(DeviceBuffer::Allocate(n_embd * sizeof(float)), "alloc");
    std::vector<DeviceExpert> ex(n_exp);
    for (int64_t e = 0; e < n_exp; ++e) {
      auto *base = w.as<uint8_t>() + e * per;
      ex[e] = {{quant::TypeId::kQ4_K, base, n_ff, n_embd, rb_in},
               {quant::TypeId::kQ4_K, base + rb_in * n_ff, n_ff, n_embd, rb_in},
               {quant::TypeId::kQ4_K, base + 2 * rb_in * n_ff, n_embd, n_ff, rb_out}};
    }
    DeviceBuffer ws = Must(DeviceBuffer::Allocate(ExpertFfnWorkspaceBytes(ex[0], 1)), "alloc");
    const float ms = TimeMs(s, 4, [&] {
      for (int64_t e = 0; e < n_exp; ++e) {
        BENCH_CHECK(ExpertFfn(blas, ex[e], x.as<float>(), 1, y.as<float>(), {ws.data(), ws.size()}, s));
      }
    });
    std::printf("\nQ4_K expert 2048x768 SwiGLU, batch 1: %.2f us/expert, %.0f GB/s\n", ms * 1e3 / n_exp,
                per * n_exp / (ms * 1e-3) / 1e9);
  }

  // Prefill: a 512-token cuBLASLt GEMM against a 4096 x 4096 float matrix.
  {
    const int64_t n = 4096, n_tok = 512;
    DeviceBuffer w = Must(DeviceBuffer::Allocate(n * n * 4), "alloc"), xi = Must(DeviceBuffer::Allocate(n_tok * n * 4), "alloc"),
                 yo = Must(DeviceBuffer::Allocate(n_tok * n * 4), "alloc"),
                 ws = Must(DeviceBuffer::Allocate(Blas::kLtWorkspaceBytes), "alloc");
    if (cudaMemset(w.data(), 0, n * n * 4) != cudaSuccess || cudaMemset(xi.data(), 0, n_tok * n * 4) != cudaSuccess) return 1;
    for (Blas::Compute comp : {Blas::Compute::kF32, Blas::Compute::kTf32}) {
      Blas blas = Must(Blas::Create(comp), "blas");
      const float ms = TimeMs(s, 10, [&] {
        BENCH_CHECK(blas.Sgemm(w.as<float>(), n, n, xi.as<float>(), n_tok, yo.as<float>(), {ws.data(), ws.size()}, s));
      });
      std::printf("GEMM 512 x 4096 x 4096 %s: %.3f ms, %.1f TFLOP/s\n", comp == Blas::Compute::kF32 ? "F32 " : "TF32", ms,
                  2.0 * n * n * n_tok / (ms * 1e-3) / 1e12);
    }
  }
  return 0;
}

}  // namespace
}  // namespace strata::cuda

int main(int argc, char **argv) { return strata::cuda::Main(argc, argv); }
