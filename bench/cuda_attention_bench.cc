// The CUDA attention kernels over a long KV cache, on their own: a decode step (one token over ctx
// keys: the staged decode kernel, and the split kernel it replaced) against the bytes it must read
// over the HBM's measured bandwidth, and a prompt chunk (512 tokens ending at ctx: the flash kernel;
// f16 rows also in the 3xTF32 kernel the f16 tensor-core one replaced)
// against its multiply-adds. Qwen3-30B-A3B's attention shape by default (32 heads over 4 KV heads of
// 128), one layer, KV blocks of 128 tokens, random keys, values and queries in f32, f16 and q8_0 rows.
// Usage: cuda_attention_bench [ctx ...] (default 4096 8192 32768). Prints a table; exits 0 without a GPU.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "backends/cuda/device.h"
#include "backends/cuda/kernels.h"
#include "backends/cuda/memory.h"
#include "bench/cuda_bench_util.h"
#include "lib/model/backend.h"
#include "lib/util/tunables.h"

namespace strata::cuda {
namespace {

using bench::Must;
using bench::TimeMs;

template <typename T>
DeviceBuffer Upload(const std::vector<T> &v) {
  DeviceBuffer b = Must(DeviceBuffer::Allocate(v.size() * sizeof(T)), "allocate");
  if (cudaMemcpy(b.data(), v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice) != cudaSuccess) std::exit(1);
  return b;
}

// Device-to-device copy of 1 GiB: bytes read plus bytes written a second, the HBM ceiling.
double CopyGbs(cudaStream_t s) {
  const size_t n = size_t{1} << 30;
  DeviceBuffer a = Must(DeviceBuffer::Allocate(n), "allocate"), b = Must(DeviceBuffer::Allocate(n), "allocate");
  const float ms = TimeMs(s, 10, [&] { (void)cudaMemcpyAsync(b.data(), a.data(), n, cudaMemcpyDeviceToDevice, s); });
  return 2.0 * n / (ms * 1e-3) / 1e9;
}

struct Shape {
  int n_head = 32, n_head_kv = 4, head_dim = 128, block = 128;
};

void Run(const Shape &sh, int ctx, model::KvType t, double hbm_gbs, cudaStream_t s) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  const int width = sh.n_head_kv * sh.head_dim;
  const size_t rb = model::KvRowBytes(t, width);
  std::vector<uint8_t> k(ctx * rb), v(ctx * rb);
  std::vector<float> row(width);
  for (int p = 0; p < ctx; ++p) {
    for (float &x : row) x = u(rng);
    model::EncodeKvRow(t, row.data(), width, k.data() + p * rb);
    for (float &x : row) x = u(rng);
    model::EncodeKvRow(t, row.data(), width, v.data() + p * rb);
  }
  const DeviceBuffer dk = Upload(k), dv = Upload(v);
  std::vector<const float *> ktab, vtab;
  for (int b = 0; b < ctx / sh.block; ++b) {
    ktab.push_back(reinterpret_cast<const float *>(dk.as<uint8_t>() + static_cast<size_t>(b) * sh.block * rb));
    vtab.push_back(reinterpret_cast<const float *>(dv.as<uint8_t>() + static_cast<size_t>(b) * sh.block * rb));
  }
  const DeviceBuffer dkt = Upload(ktab), dvt = Upload(vtab);
  const int chunk = 512;
  std::vector<float> q(static_cast<size_t>(chunk) * sh.n_head * sh.head_dim);
  for (float &x : q) x = u(rng);
  const DeviceBuffer dq = Upload(q);
  DeviceBuffer out = Must(DeviceBuffer::Allocate(q.size() * sizeof(float)), "allocate");
  AttentionExtArgs a;
  a.k_blocks = dkt.as<const float *>();
  a.v_blocks = dvt.as<const float *>();
  a.block_tokens = sh.block;
  a.k_stride = a.v_stride = width;
  a.n_head = sh.n_head;
  a.n_head_kv = sh.n_head_kv;
  a.head_dim = a.v_dim = sh.head_dim;
  a.scale = 1.f / std::sqrt(static_cast<float>(sh.head_dim));
  a.k_type = a.v_type = t;

  // Decode: the last position over every key.
  a.pos0 = ctx - 1;
  size_t ws_dec = AttentionExtWorkspaceBytes(a, 1);
  {
    tunables::Values knobs = tunables::Get();
    knobs.cuda_flash_decode = false;
    tunables::ScopedValues off(knobs);
    ws_dec = std::max(ws_dec, AttentionExtWorkspaceBytes(a, 1));  // the split kernel's splits
  }
  a.pos0 = ctx - chunk;
  const size_t ws_pre = AttentionExtWorkspaceBytes(a, chunk);
  DeviceBuffer ws = Must(DeviceBuffer::Allocate(std::max<size_t>({ws_dec, ws_pre, 1})), "allocate");
  a.pos0 = ctx - 1;
  const float dec_ms = TimeMs(s, 50, [&] {
    BENCH_CHECK(AttentionExt(dq.as<float>(), a, 1, out.as<float>(), s, Workspace{ws.data(), ws.size()}));
  });
  float split_ms = 0.f;  // the split kernel the staged one replaced, for the same call
  {
    tunables::Values knobs = tunables::Get();
    knobs.cuda_flash_decode = false;
    tunables::ScopedValues off(knobs);
    split_ms = TimeMs(s, 50, [&] {
      BENCH_CHECK(AttentionExt(dq.as<float>(), a, 1, out.as<float>(), s, Workspace{ws.data(), ws.size()}));
    });
  }
  const double dec_bytes = 2.0 * ctx * rb;
  const double dec_gbs = dec_bytes / (dec_ms * 1e-3) / 1e9;
  // A prompt's last chunk: 512 tokens over the keys before them and their own causal triangle.
  a.pos0 = ctx - chunk;
  const float pre_ms = TimeMs(s, 5, [&] {
    BENCH_CHECK(AttentionExt(dq.as<float>(), a, chunk, out.as<float>(), s, Workspace{ws.data(), ws.size()}));
  });
  float tf32_ms = pre_ms;  // f16 rows: the 3xTF32 flash kernel over their values, for the same call
  if (t == model::KvType::kF16) {
    tunables::Values knobs = tunables::Get();
    knobs.cuda_flash_f16 = false;
    tunables::ScopedValues off(knobs);
    tf32_ms = TimeMs(s, 5, [&] {
      BENCH_CHECK(AttentionExt(dq.as<float>(), a, chunk, out.as<float>(), s, Workspace{ws.data(), ws.size()}));
    });
  }
  const double pairs = static_cast<double>(chunk) * (ctx - chunk) + chunk * (chunk + 1) / 2.0;
  const double pre_tflops = 4.0 * pairs * sh.head_dim * sh.n_head / (pre_ms * 1e-3) / 1e12;
  std::printf("| %6d | %-4s | %8.1f | %7.0f | %5.1f%% | %8.2f | %8.1f | %8.0f | %7.1f | %8.0f |\n", ctx,
              model::KvTypeName(t), dec_ms * 1e3, dec_gbs, 100.0 * dec_gbs / hbm_gbs, dec_ms * 48, split_ms * 1e3,
              pre_ms * 1e3, pre_tflops, tf32_ms * 1e3);
}

int Main(int argc, char **argv) {
  int n_dev = 0;
  if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) {
    std::printf("no CUDA device\n");
    return 0;
  }
  std::vector<int> ctxs;
  for (int i = 1; i < argc; ++i) ctxs.push_back(std::atoi(argv[i]));
  if (ctxs.empty()) ctxs = {4096, 8192, 32768};
  cudaStream_t s;
  if (cudaStreamCreate(&s) != cudaSuccess) return 1;
  const double hbm = CopyGbs(s);
  std::printf("HBM copy: %.0f GB/s (read + write)\n\n", hbm);
  std::printf(
      "| ctx | KV | decode us | GB/s | of HBM | x48 ms | split kernel us | prompt chunk us | TFLOP/s | 3xTF32 us |\n");
  std::printf("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  const Shape sh;
  for (int ctx : ctxs) {
    for (model::KvType t : {model::KvType::kF32, model::KvType::kF16, model::KvType::kQ8_0}) Run(sh, ctx, t, hbm, s);
  }
  return 0;
}

}  // namespace
}  // namespace strata::cuda

int main(int argc, char **argv) { return strata::cuda::Main(argc, argv); }
