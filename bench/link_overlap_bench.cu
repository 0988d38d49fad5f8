// Does the link's traffic hide behind a layer's compute? Times, over 48 "layers" like one decode
// token: copying each layer's cold experts (5 experts of Qwen3-30B-A3B's 2.53 MiB, picked at random
// in 4 GiB of mapped page-locked memory) into VRAM by a kernel that reads the link as Strata's
// StageColdExperts does; a chain of small VRAM-bound kernels standing for the layer's compute; the
// two in one stream; and the copy for layer l + 1 on a second stream beside layer l's compute (what
// a prefetch of the next layer's experts does), at three grid sizes; then the same by the copy
// engines (cudaMemcpyAsync), which use no multiprocessor; and the copy engines alone reading an
// mmap'd region registered with cudaHostRegister (as Strata page-locks a model file's experts in
// place), an expert in one copy or in three (its gate, up and down lie apart in a GGUF file).
// Usage: link_overlap_bench [kernels a layer, default 12] [MiB each reads, default 16]. Prints a
// table; exits 0 without a GPU.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include <sys/mman.h>

#include "bench/probe_check.cuh"

namespace {

constexpr int kLayers = 48, kColdExperts = 5, kCopyThreads = 512, kInFlight = 4;
constexpr size_t kExpertBytes = 2666496;  // gate | up | down of one Qwen3-30B-A3B Q4_K expert
constexpr size_t kHostBytes = size_t{4} << 30;

struct Cold {
  const int4 *src[kColdExperts];
};

// Copies the layer's cold experts into dst, 16 bytes a load, kInFlight loads in flight a thread.
__global__ void __launch_bounds__(kCopyThreads) CopyColdKernel(Cold c, int4 *dst, size_t units) {
  const size_t stride = size_t{gridDim.x} * kCopyThreads, total = units * kColdExperts;
  for (size_t u0 = size_t{blockIdx.x} * kCopyThreads + threadIdx.x; u0 < total; u0 += kInFlight * stride) {
    int4 v[kInFlight];
#pragma unroll
    for (int i = 0; i < kInFlight; ++i) {
      const size_t u = u0 + i * stride;
      if (u < total) v[i] = c.src[u / units][u % units];
    }
#pragma unroll
    for (int i = 0; i < kInFlight; ++i) {
      const size_t u = u0 + i * stride;
      if (u < total) dst[u] = v[i];
    }
  }
}

// A VRAM-bound stand-in for one of a layer's kernels: sums n float4s.
__global__ void ComputeKernel(const float4 *a, size_t n, float *out) {
  float s = 0;
  for (size_t i = size_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x) {
    const float4 x = a[i];
    s += x.x + x.y + x.z + x.w;
  }
  if (s == 1234.5f) *out = s;  // keeps the loads
}

}  // namespace

int main(int argc, char **argv) {
  int n_dev = 0;
  if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) {
    std::printf("no CUDA device\n");
    return 0;
  }
  const int chain = argc > 1 ? std::max(1, std::atoi(argv[1])) : 12;
  const size_t kernel_bytes = (argc > 2 ? std::max<size_t>(1, std::strtoull(argv[2], nullptr, 10)) : 16) << 20;
  int sms = 0;
  PROBE_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));

  uint8_t *host = nullptr, *host_dev = nullptr;
  PROBE_CHECK(cudaHostAlloc(reinterpret_cast<void **>(&host), kHostBytes, cudaHostAllocMapped));
  std::mt19937_64 rng(20261130);
  for (size_t i = 0; i < kHostBytes; i += 4096) host[i] = static_cast<uint8_t>(rng());  // touch every page
  PROBE_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void **>(&host_dev), host, 0));
  int4 *dst = nullptr;
  PROBE_CHECK(cudaMalloc(&dst, kColdExperts * kExpertBytes));
  const size_t pool_bytes = 16 * kernel_bytes, n4 = kernel_bytes / sizeof(float4);
  float4 *pool = nullptr;
  float *sink = nullptr;
  PROBE_CHECK(cudaMalloc(&pool, pool_bytes));
  PROBE_CHECK(cudaMemset(pool, 0x3c, pool_bytes));
  PROBE_CHECK(cudaMalloc(&sink, sizeof(float)));

  std::vector<Cold> cold(kLayers);
  std::uniform_int_distribution<size_t> pick(0, kHostBytes / kExpertBytes - 1);
  for (Cold &c : cold) {
    for (auto &p : c.src) p = reinterpret_cast<const int4 *>(host_dev + pick(rng) * kExpertBytes);
  }
  const size_t units = kExpertBytes / sizeof(int4);

  cudaStream_t main_s, side_s;
  PROBE_CHECK(cudaStreamCreateWithFlags(&main_s, cudaStreamNonBlocking));
  PROBE_CHECK(cudaStreamCreateWithFlags(&side_s, cudaStreamNonBlocking));
  cudaEvent_t fork, join, t0, t1;
  PROBE_CHECK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
  PROBE_CHECK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
  PROBE_CHECK(cudaEventCreate(&t0));
  PROBE_CHECK(cudaEventCreate(&t1));

  auto copy = [&](int l, int blocks, cudaStream_t s) {
    CopyColdKernel<<<blocks, kCopyThreads, 0, s>>>(cold[l], dst, units);
  };
  // The same bytes by the copy engines (what cudaMemcpyAsync of pinned memory does), no SMs.
  auto dma = [&](int l, cudaStream_t s) {
    for (int e = 0; e < kColdExperts; ++e) {
      const uint8_t *src = host + (reinterpret_cast<const uint8_t *>(cold[l].src[e]) - host_dev);
      PROBE_CHECK(cudaMemcpyAsync(reinterpret_cast<uint8_t *>(dst) + e * kExpertBytes, src, kExpertBytes,
                                    cudaMemcpyHostToDevice, s));
    }
  };
  // Three copies an expert (gate, up, down), from `base` (host memory with the same layout as `host`).
  auto dma3 = [&](int l, const uint8_t *base, cudaStream_t s) {
    const size_t part = kExpertBytes / 3;
    for (int e = 0; e < kColdExperts; ++e) {
      const uint8_t *src = base + (reinterpret_cast<const uint8_t *>(cold[l].src[e]) - host_dev);
      for (int m = 0; m < 3; ++m) {
        PROBE_CHECK(cudaMemcpyAsync(reinterpret_cast<uint8_t *>(dst) + e * kExpertBytes + m * part, src + m * part,
                                      part, cudaMemcpyHostToDevice, s));
      }
    }
  };
  auto compute = [&](int l, cudaStream_t s) {
    for (int k = 0; k < chain; ++k) ComputeKernel<<<4 * sms, 256, 0, s>>>(pool + ((l * chain + k) % 16) * n4, n4, sink);
  };
  // Median of 7 runs of a token's 48 layers, in ms.
  auto token_ms = [&](auto &&body) {
    std::vector<float> ms;
    for (int r = 0; r < 8; ++r) {
      PROBE_CHECK(cudaEventRecord(t0, main_s));
      body();
      PROBE_CHECK(cudaEventRecord(t1, main_s));
      PROBE_CHECK(cudaEventSynchronize(t1));
      PROBE_CHECK(cudaGetLastError());
      float m = 0;
      PROBE_CHECK(cudaEventElapsedTime(&m, t0, t1));
      if (r > 0) ms.push_back(m);  // the first is a warm-up
    }
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
  };
  // Layer l + 1's experts moved by `issue(l, stream)` on the side stream while layer l computes, the
  // compute stream joining them before layer l + 1 (layer 0's moved first).
  auto pipelined = [&](auto &&issue) {
    issue(0, main_s);
    for (int l = 0; l < kLayers; ++l) {
      PROBE_CHECK(cudaEventRecord(fork, main_s));
      PROBE_CHECK(cudaStreamWaitEvent(side_s, fork, 0));
      if (l + 1 < kLayers) issue(l + 1, side_s);
      PROBE_CHECK(cudaEventRecord(join, side_s));
      compute(l, main_s);
      PROBE_CHECK(cudaStreamWaitEvent(main_s, join, 0));
    }
  };
  const double token_bytes = static_cast<double>(kLayers) * kColdExperts * kExpertBytes;
  auto row = [&](const char *what, int blocks, float ms) {
    std::printf("%-48s %7d %9.2f %8.1f\n", what, blocks, ms, token_bytes / (ms * 1e-3) / 1e9);
  };

  std::printf("%d SMs; a layer: %d cold experts (%.1f MiB) and %d kernels reading %zu MiB each\n", sms, kColdExperts,
              kColdExperts * kExpertBytes / 1048576.0, chain, kernel_bytes >> 20);
  std::printf("%-48s %7s %9s %8s\n", "48 layers", "blocks", "ms", "link GB/s");
  for (int blocks : {sms / 2, sms, 2 * sms}) {
    row("copies alone", blocks, token_ms([&] {
          for (int l = 0; l < kLayers; ++l) copy(l, blocks, main_s);
        }));
  }
  row("copies by the copy engines alone", 0, token_ms([&] {
        for (int l = 0; l < kLayers; ++l) dma(l, main_s);
      }));
  row("copy engines alone, 3 copies an expert", 0, token_ms([&] {
        for (int l = 0; l < kLayers; ++l) dma3(l, host, main_s);
      }));
  // Experts alternating between two streams (so two copy engines may take them), joined per layer.
  row("copy engines alone, 3 copies, two streams", 0, token_ms([&] {
        const size_t part = kExpertBytes / 3;
        for (int l = 0; l < kLayers; ++l) {
          PROBE_CHECK(cudaEventRecord(fork, main_s));
          PROBE_CHECK(cudaStreamWaitEvent(side_s, fork, 0));
          for (int e = 0; e < kColdExperts; ++e) {
            const uint8_t *src = host + (reinterpret_cast<const uint8_t *>(cold[l].src[e]) - host_dev);
            for (int m = 0; m < 3; ++m) {
              PROBE_CHECK(cudaMemcpyAsync(reinterpret_cast<uint8_t *>(dst) + e * kExpertBytes + m * part,
                                            src + m * part, part, cudaMemcpyHostToDevice, e % 2 ? side_s : main_s));
            }
          }
          PROBE_CHECK(cudaEventRecord(join, side_s));
          PROBE_CHECK(cudaStreamWaitEvent(main_s, join, 0));
        }
      }));
#if CUDART_VERSION >= 12080
  // A layer's 15 copies in one call.
  auto batch = [&](int l, cudaStream_t s, unsigned flags) {
    const size_t part = kExpertBytes / 3;
    void *dsts[3 * kColdExperts];
    const void *srcs[3 * kColdExperts];
    size_t sizes[3 * kColdExperts];
    for (int e = 0; e < kColdExperts; ++e) {
      const uint8_t *src = host + (reinterpret_cast<const uint8_t *>(cold[l].src[e]) - host_dev);
      for (int m = 0; m < 3; ++m) {
        dsts[3 * e + m] = reinterpret_cast<uint8_t *>(dst) + e * kExpertBytes + m * part;
        srcs[3 * e + m] = src + m * part;
        sizes[3 * e + m] = part;
      }
    }
    cudaMemcpyAttributes a{};
    a.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    a.flags = flags;
    size_t idx = 0;
    PROBE_CHECK(cudaMemcpyBatchAsync(dsts, srcs, sizes, 3 * kColdExperts, &a, &idx, 1, s));
  };
  row("copy engines alone, 3 copies, batched", 0, token_ms([&] {
        for (int l = 0; l < kLayers; ++l) batch(l, main_s, 0);
      }));
  row("batched copy of l + 1 beside compute of l", 0, token_ms([&] {
        pipelined([&](int l, cudaStream_t s) { batch(l, s, 0); });
      }));
#endif
  row("3-copy copy of l + 1 beside compute of l", 0, token_ms([&] {
        pipelined([&](int l, cudaStream_t s) { dma3(l, host, s); });
      }));
  // The same offsets in anonymous mmap'd memory, page-locked by cudaHostRegister.
  void *reg = mmap(nullptr, kHostBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (reg != MAP_FAILED) {
    auto *r8 = static_cast<uint8_t *>(reg);
    for (size_t i = 0; i < kHostBytes; i += 4096) r8[i] = static_cast<uint8_t>(rng());
    if (cudaHostRegister(reg, kHostBytes, cudaHostRegisterMapped) == cudaSuccess) {
      auto dma_reg = [&](int l, cudaStream_t s) {
        for (int e = 0; e < kColdExperts; ++e) {
          const uint8_t *src = r8 + (reinterpret_cast<const uint8_t *>(cold[l].src[e]) - host_dev);
          PROBE_CHECK(cudaMemcpyAsync(reinterpret_cast<uint8_t *>(dst) + e * kExpertBytes, src, kExpertBytes,
                                        cudaMemcpyHostToDevice, s));
        }
      };
      row("copy engines alone, registered mmap", 0, token_ms([&] {
            for (int l = 0; l < kLayers; ++l) dma_reg(l, main_s);
          }));
      row("copy engines alone, registered, 3 copies", 0, token_ms([&] {
            for (int l = 0; l < kLayers; ++l) dma3(l, r8, main_s);
          }));
      PROBE_CHECK(cudaHostUnregister(reg));
    } else {
      (void)cudaGetLastError();
      std::printf("cudaHostRegister refused %zu GiB: no registered rows\n", kHostBytes >> 30);
    }
    munmap(reg, kHostBytes);
  }
  row("compute alone", 0, token_ms([&] {
        for (int l = 0; l < kLayers; ++l) compute(l, main_s);
      }));
  row("copy then compute, one stream", 2 * sms, token_ms([&] {
        for (int l = 0; l < kLayers; ++l) {
          copy(l, 2 * sms, main_s);
          compute(l, main_s);
        }
      }));
  for (int blocks : {sms / 2, sms, 2 * sms}) {
    row("copy of l + 1 beside compute of l, joined", blocks, token_ms([&] {
          pipelined([&](int l, cudaStream_t s) { copy(l, blocks, s); });
        }));
  }
  row("copy-engine copy of l + 1 beside compute of l", 0, token_ms([&] {
        pipelined(dma);
      }));
  row("all copies beside all compute, no joins", sms / 2, token_ms([&] {
        PROBE_CHECK(cudaEventRecord(fork, main_s));
        PROBE_CHECK(cudaStreamWaitEvent(side_s, fork, 0));
        for (int l = 0; l < kLayers; ++l) copy(l, sms / 2, side_s);
        for (int l = 0; l < kLayers; ++l) compute(l, main_s);
        PROBE_CHECK(cudaEventRecord(join, side_s));
        PROBE_CHECK(cudaStreamWaitEvent(main_s, join, 0));
      }));
  PROBE_CHECK(cudaFree(sink));
  PROBE_CHECK(cudaFree(pool));
  PROBE_CHECK(cudaFree(dst));
  PROBE_CHECK(cudaFreeHost(host));
  return 0;
}
