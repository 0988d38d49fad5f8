// CUDA kernel throughput on the GPU machine: the device-to-device copy bandwidth (the HBM ceiling),
// then the decode GEMV per codec (weight bytes streamed per second, 1 and 8 tokens), one SwiGLU
// expert of Qwen3-30B-A3B's shape at batch 1, a MoE layer's routed experts per expert and grouped
// (weights in VRAM and in mapped host memory), and the cuBLASLt GEMM of a 512-token prefill.
// Usage: cuda_bench [weight MiB per matrix, default 1024]. Prints a table; exits 0 without a GPU.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "backends/cuda/device.h"
#include "backends/cuda/kernels.h"
#include "backends/cuda/memory.h"
#include "bench/cuda_bench_util.h"

namespace strata::cuda {
namespace {

using bench::Must;
using bench::TimeMs;

// Fills `bytes` of device memory with random bytes (a fixed 1 MiB pattern, repeated): the lattice
// i-quants' codes then index their grids as a file's codes do, which their GEMV's speed depends on;
// for the other codecs the bytes do not matter (NaN or subnormal scales cost the GPU nothing).
bool FillRandom(void *dev, size_t bytes) {
  std::vector<uint8_t> pattern(size_t{1} << 20);
  std::mt19937 rng(1);
  for (auto &b : pattern) b = static_cast<uint8_t>(rng());
  for (size_t at = 0; at < bytes; at += pattern.size()) {
    const size_t n = std::min(pattern.size(), bytes - at);
    if (cudaMemcpy(static_cast<uint8_t *>(dev) + at, pattern.data(), n, cudaMemcpyHostToDevice) != cudaSuccess) {
      return false;
    }
  }
  return true;
}

// Routed experts of one MoE layer of Qwen3-30B-A3B (128 experts of n_embd 2048, n_ff 768, Q4_K; 8
// per token) for 1 and 16 tokens: the per-expert launches of today's forward pass (GemvSwiGlu + Gemv
// per selected expert; once the launches alone, once with the selection download, host sync and host
// grouping that precede them) against GroupByExpert + GroupedSwiGlu + GroupedGemv; then the grouped
// path with every expert in mapped host memory (zero-copy: the kernels read the link), and staged
// from there into VRAM slots by StageColdExperts before the products. 8 layers'
// weights are cycled so they come from HBM (or the link), not L2. GB/s counts the bytes of the
// distinct experts selected, each read once.
struct ExpertGroup {
  int expert;
  int64_t first, n;
};

// The forward pass's host grouping: groups in ascending expert id, rows in selection order.
std::vector<ExpertGroup> GroupOnHost(const int32_t *sel, int64_t n, int n_expert) {
  std::vector<int64_t> count(n_expert, 0);
  for (int64_t i = 0; i < n; ++i) ++count[sel[i]];
  std::vector<ExpertGroup> groups;
  int64_t row = 0;
  for (int e = 0; e < n_expert; ++e) {
    if (count[e] == 0) continue;
    groups.push_back({e, row, count[e]});
    row += count[e];
  }
  return groups;
}

void GroupedExpertsBench(cudaStream_t s) {
  constexpr int64_t kEmbd = 2048, kFf = 768;
  constexpr int kExperts = 128, kK = 8, kLayers = 8;
  const quant::TypeId q4k = quant::TypeId::kQ4_K;
  const quant::Codec *c = quant::FindCodec(q4k);
  const uint64_t rb_in = kEmbd / 256 * c->block_bytes, rb_out = kFf / 256 * c->block_bytes;
  const uint64_t per = 2 * rb_in * kFf + rb_out * kEmbd;  // one expert: gate | up | down
  const size_t layer_bytes = per * kExperts, all_bytes = layer_bytes * kLayers;
  DeviceBuffer vram = Must(DeviceBuffer::Allocate(all_bytes), "alloc");
  if (cudaMemset(vram.data(), 0x3c, all_bytes) != cudaSuccess) std::exit(1);
  PinnedBuffer host = Must(PinnedBuffer::Allocate(all_bytes, cudaHostAllocMapped), "mapped host alloc");
  std::memset(host.data(), 0x3c, all_bytes);
  void *host_dev = Must(host.device<void>(), "mapped host address");

  // The link's copy bandwidth from page-locked memory: the ceiling for zero-copy reads.
  const size_t link_bytes = size_t{256} << 20;
  DeviceBuffer link_dst = Must(DeviceBuffer::Allocate(link_bytes), "alloc");
  const float link_ms = TimeMs(s, 10, [&] { BENCH_CHECK(CopyAsync(link_dst.data(), host.data(), link_bytes, s)); });
  const double link = link_bytes / (link_ms * 1e-3) / 1e9;
  link_dst.Reset();

  // Address tables: (layer, gate/up/down, expert) -> the expert's matrix, for weights at `base`.
  auto tables = [&](const uint8_t *base) {
    std::vector<const void *> tab(kLayers * 3 * kExperts);
    for (int l = 0; l < kLayers; ++l) {
      for (int e = 0; e < kExperts; ++e) {
        const uint8_t *p = base + l * layer_bytes + e * per;
        tab[(l * 3 + 0) * kExperts + e] = p;
        tab[(l * 3 + 1) * kExperts + e] = p + rb_in * kFf;
        tab[(l * 3 + 2) * kExperts + e] = p + 2 * rb_in * kFf;
      }
    }
    DeviceBuffer d = Must(DeviceBuffer::Allocate(tab.size() * sizeof(void *)), "alloc");
    if (cudaMemcpy(d.data(), tab.data(), tab.size() * sizeof(void *), cudaMemcpyHostToDevice) != cudaSuccess) std::exit(1);
    return d;
  };
  DeviceBuffer vram_tab = tables(vram.as<uint8_t>()), host_tab = tables(static_cast<const uint8_t *>(host_dev));
  auto grouped = [&](const DeviceBuffer &tab, int l) {
    const auto *t = static_cast<const void *const *>(tab.data());
    GroupedExperts ge;
    ge.gate = t + (l * 3 + 0) * kExperts;
    ge.up = t + (l * 3 + 1) * kExperts;
    ge.down = t + (l * 3 + 2) * kExperts;
    ge.gate_shape = ge.up_shape = {q4k, nullptr, kFf, kEmbd, rb_in};
    ge.down_shape = {q4k, nullptr, kEmbd, kFf, rb_out};
    ge.n_expert = kExperts;
    return ge;
  };

  std::mt19937 rng(1234);
  std::printf("\nMoE layer, Qwen3-30B-A3B routed experts (Q4_K 2048x768, 8 of 128 per token); link copy %.1f GB/s\n",
              link);
  std::printf("%-46s %6s %8s %10s %8s\n", "path", "tokens", "experts", "us/layer", "GB/s");
  for (int64_t n_tok : {1, 16}) {
    const int64_t n = n_tok * kK;
    const int n_max = static_cast<int>(GroupMaxGroups(n_tok, kK, kExperts));
    // Random distinct selections per token, per layer.
    std::vector<int32_t> sel(kLayers * n);
    std::vector<std::vector<ExpertGroup>> groups(kLayers);
    double mean_bytes = 0, mean_experts = 0;
    std::vector<int32_t> ids(kExperts);
    for (int e = 0; e < kExperts; ++e) ids[e] = e;
    for (int l = 0; l < kLayers; ++l) {
      for (int64_t t = 0; t < n_tok; ++t) {
        std::shuffle(ids.begin(), ids.end(), rng);
        std::copy(ids.begin(), ids.begin() + kK, sel.begin() + l * n + t * kK);
      }
      groups[l] = GroupOnHost(sel.data() + l * n, n, kExperts);
      mean_experts += static_cast<double>(groups[l].size()) / kLayers;
      mean_bytes += static_cast<double>(groups[l].size()) * per / kLayers;
    }
    DeviceBuffer dsel = Must(DeviceBuffer::Allocate(sel.size() * sizeof(int32_t)), "alloc");
    if (cudaMemcpy(dsel.data(), sel.data(), sel.size() * sizeof(int32_t), cudaMemcpyHostToDevice) != cudaSuccess) std::exit(1);
    PinnedBuffer sel_host = Must(PinnedBuffer::Allocate(n * sizeof(int32_t)), "pinned alloc");
    DeviceBuffer xg = Must(DeviceBuffer::Allocate(n * kEmbd * sizeof(float)), "alloc");
    DeviceBuffer hg = Must(DeviceBuffer::Allocate(n * kFf * sizeof(float)), "alloc");
    DeviceBuffer yg = Must(DeviceBuffer::Allocate(n * kEmbd * sizeof(float)), "alloc");
    DeviceBuffer idx = Must(DeviceBuffer::Allocate(2 * n * sizeof(int32_t)), "alloc");
    DeviceBuffer plan = Must(DeviceBuffer::Allocate(GroupPlanInts(n_tok, kK, kExperts) * sizeof(int32_t)), "alloc");
    if (cudaMemset(xg.data(), 0, n * kEmbd * sizeof(float)) != cudaSuccess) std::exit(1);

    int layer = 0;
    auto launch_per_expert = [&](int l, const std::vector<ExpertGroup> &gs) {
      for (const ExpertGroup &g : gs) {
        const uint8_t *p = vram.as<uint8_t>() + l * layer_bytes + g.expert * per;
        const DeviceMatrix gate{q4k, p, kFf, kEmbd, rb_in}, up{q4k, p + rb_in * kFf, kFf, kEmbd, rb_in},
            down{q4k, p + 2 * rb_in * kFf, kEmbd, kFf, rb_out};
        BENCH_CHECK(GemvSwiGlu(gate, up, xg.as<float>() + g.first * kEmbd, g.n, hg.as<float>() + g.first * kFf, s));
        BENCH_CHECK(Gemv(down, hg.as<float>() + g.first * kFf, g.n, yg.as<float>() + g.first * kEmbd, s));
      }
    };
    // With `stage`, the layer's experts are copied into its slots first (StageColdExperts).
    auto launch_grouped = [&](const DeviceBuffer &tab, int l, const ExpertStage *stage = nullptr) {
      GroupedExperts ge = grouped(tab, l);
      BENCH_CHECK(GroupByExpert(dsel.as<int32_t>() + l * n, n_tok, kK, kExperts, idx.as<int32_t>(), plan.as<int32_t>(), s));
      if (stage != nullptr) {
        BENCH_CHECK(StageColdExperts(ge, *stage, plan.as<int32_t>(), n_max, nullptr, s));
        ge = StagedExperts(ge, *stage);
      }
      BENCH_CHECK(GroupedSwiGlu(ge, plan.as<int32_t>(), n_max, xg.as<float>(), hg.as<float>(), s, n_tok));
      BENCH_CHECK(GroupedGemv(ge.down, ge.down_shape, plan.as<int32_t>(), n_max, hg.as<float>(), yg.as<float>(), s, n_tok));
    };
    const int reps = 4 * kLayers;
    const float ms_launch = TimeMs(s, reps, [&] {
      const int l = layer++ % kLayers;
      launch_per_expert(l, groups[l]);
    });
    const float ms_sync = TimeMs(s, reps, [&] {
      const int l = layer++ % kLayers;
      BENCH_CHECK(CopyAsync(sel_host.data(), dsel.as<int32_t>() + l * n, n * sizeof(int32_t), s));
      if (cudaStreamSynchronize(s) != cudaSuccess) std::exit(1);
      launch_per_expert(l, GroupOnHost(sel_host.as<int32_t>(), n, kExperts));
    });
    const float ms_grouped = TimeMs(s, reps, [&] { launch_grouped(vram_tab, layer++ % kLayers); });
    const float ms_zero_copy = TimeMs(s, kLayers, [&] { launch_grouped(host_tab, layer++ % kLayers); });
    // The same experts copied into VRAM staging slots first (StageColdExperts), then the products.
    ExpertStage stage;
    const GroupedExperts shape = grouped(host_tab, 0);
    stage.slot_bytes = ExpertStageSlotBytes(shape);
    stage.n_slots = n_max;
    DeviceBuffer stage_slots = Must(DeviceBuffer::Allocate(stage.slot_bytes * n_max), "alloc");
    DeviceBuffer stage_tab = Must(DeviceBuffer::Allocate(3 * kExperts * sizeof(void *)), "alloc");
    stage.slots = stage_slots.as<uint8_t>();
    stage.gate = stage_tab.as<const void *>();
    stage.up = stage.gate + kExperts;
    stage.down = stage.up + kExperts;
    stage.host_lo = reinterpret_cast<uintptr_t>(host_dev);
    stage.host_hi = stage.host_lo + all_bytes;
    const float ms_staged = TimeMs(s, kLayers, [&] { launch_grouped(host_tab, layer++ % kLayers, &stage); });
    auto row = [&](const char *path, float ms) {
      const double gbs = mean_bytes / (ms * 1e-3) / 1e9;
      std::printf("%-46s %6lld %8.1f %10.1f %8.0f\n", path, static_cast<long long>(n_tok), mean_experts, ms * 1e3, gbs);
    };
    row("per expert: launches only", ms_launch);
    row("per expert: selection download, sync, launches", ms_sync);
    row("grouped: GroupByExpert + 2 grouped launches", ms_grouped);
    row("grouped, weights in mapped host memory", ms_zero_copy);
    std::printf("%-46s %6s %8s %10s %7.0f%%\n", "  zero-copy GB/s as a share of the link copy", "", "", "",
                100.0 * mean_bytes / (ms_zero_copy * 1e-3) / 1e9 / link);
    row("grouped, staged from mapped host memory first", ms_staged);
    std::printf("%-46s %6s %8s %10s %7.0f%%\n", "  staged GB/s as a share of the link copy", "", "", "",
                100.0 * mean_bytes / (ms_staged * 1e-3) / 1e9 / link);
  }
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
  const quant::TypeId types[] = {
      quant::TypeId::kF32,    quant::TypeId::kF16,     quant::TypeId::kBF16,   quant::TypeId::kQ8_0,
      quant::TypeId::kQ6_K,   quant::TypeId::kQ5_K,    quant::TypeId::kQ4_K,   quant::TypeId::kQ3_K,
      quant::TypeId::kQ2_K,   quant::TypeId::kQ5_1,    quant::TypeId::kQ5_0,   quant::TypeId::kQ4_1,
      quant::TypeId::kQ4_0,   quant::TypeId::kIQ4_NL,  quant::TypeId::kIQ4_XS, quant::TypeId::kMXFP4,
      quant::TypeId::kIQ3_S,  quant::TypeId::kIQ3_XXS, quant::TypeId::kIQ2_S,  quant::TypeId::kIQ2_XS,
      quant::TypeId::kIQ2_XXS, quant::TypeId::kIQ1_M,  quant::TypeId::kIQ1_S,  quant::TypeId::kTQ2_0,
      quant::TypeId::kTQ1_0};
  DeviceBuffer x = Must(DeviceBuffer::Allocate(8 * cols * sizeof(float)), "alloc");
  if (cudaMemset(x.data(), 0, 8 * cols * sizeof(float)) != cudaSuccess) return 1;
  for (quant::TypeId t : types) {
    const quant::Codec *c = quant::FindCodec(t);
    const uint64_t rb = static_cast<uint64_t>(cols / c->block_elems * c->block_bytes);
    const int64_t rows = static_cast<int64_t>((mib << 20) / rb);
    DeviceBuffer w = Must(DeviceBuffer::Allocate(rb * rows), "alloc");
    if (!FillRandom(w.data(), rb * rows)) return 1;
    DeviceBuffer y = Must(DeviceBuffer::Allocate(8 * rows * sizeof(float)), "alloc");
    const DeviceMatrix m{t, w.data(), rows, cols, rb};
    const float ms1 = TimeMs(s, 20, [&] { BENCH_CHECK(Gemv(m, x.as<float>(), 1, y.as<float>(), s)); });
    const float ms8 = TimeMs(s, 20, [&] { BENCH_CHECK(Gemv(m, x.as<float>(), 8, y.as<float>(), s)); });
    const double bytes = static_cast<double>(rb) * rows;
    std::printf("%-7s %9lld %10.0f %10.1f %8.0f %10.1f %8.0f\n", std::string(c->name).c_str(),
                static_cast<long long>(rows), bytes / (1 << 20), ms1 * 1e3, bytes / (ms1 * 1e-3) / 1e9, ms8 * 1e3,
                bytes / (ms8 * 1e-3) / 1e9);
  }

  // 8-bit activations (GemvQ8, integer dot products) against float activations (Gemv), on a matrix
  // of `mib` MiB (HBM-bound) and on one 768 x 2048 expert matrix that stays in L2 across calls (the
  // instruction-bound case of decode); the activations' quantization is timed on its own.
  std::printf("\n%-7s %-14s %10s %10s %10s %10s %12s\n", "codec", "matrix", "float 1 us", "q8 1 us", "float 8 us",
              "q8 8 us", "quantize us");
  for (quant::TypeId t : {quant::TypeId::kQ8_0, quant::TypeId::kQ4_K}) {
    const quant::Codec *c = quant::FindCodec(t);
    for (int big = 1; big >= 0; --big) {
      const int64_t mc = big ? cols : 2048;
      const uint64_t rb = static_cast<uint64_t>(mc / c->block_elems * c->block_bytes);
      const int64_t rows = big ? static_cast<int64_t>((mib << 20) / rb) : 768;
      DeviceBuffer w = Must(DeviceBuffer::Allocate(rb * rows), "alloc");
      if (cudaMemset(w.data(), 0x3c, rb * rows) != cudaSuccess) return 1;
      DeviceBuffer y = Must(DeviceBuffer::Allocate(8 * rows * sizeof(float)), "alloc");
      const Q8Act f = Q8ActFor(t);
      DeviceBuffer xq = Must(DeviceBuffer::Allocate(8 * Q8ActRowBytes(f, mc)), "alloc");
      BENCH_CHECK(QuantizeActivationsQ8(f, x.as<float>(), 8, mc, xq.data(), s));
      const DeviceMatrix m{t, w.data(), rows, mc, rb};
      const float f1 = TimeMs(s, 50, [&] { BENCH_CHECK(Gemv(m, x.as<float>(), 1, y.as<float>(), s)); });
      const float q1 = TimeMs(s, 50, [&] { BENCH_CHECK(GemvQ8(m, xq.data(), 1, y.as<float>(), s)); });
      const float f8 = TimeMs(s, 50, [&] { BENCH_CHECK(Gemv(m, x.as<float>(), 8, y.as<float>(), s)); });
      const float q8 = TimeMs(s, 50, [&] { BENCH_CHECK(GemvQ8(m, xq.data(), 8, y.as<float>(), s)); });
      const float qz = TimeMs(s, 50, [&] { BENCH_CHECK(QuantizeActivationsQ8(f, x.as<float>(), 8, mc, xq.data(), s)); });
      char shape[32];
      std::snprintf(shape, sizeof shape, "%lldx%lld", static_cast<long long>(rows), static_cast<long long>(mc));
      std::printf("%-7s %-14s %10.1f %10.1f %10.1f %10.1f %12.1f\n", std::string(c->name).c_str(), shape, f1 * 1e3,
                  q1 * 1e3, f8 * 1e3, q8 * 1e3, qz * 1e3);
    }
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

  GroupedExpertsBench(s);

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
