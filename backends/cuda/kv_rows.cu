// KV cache rows written and read on the device in the cache's types (f32, f16, q8_0): a decode
// step's rows through their KvRowRefs, and runs of rows for Backend::WriteKvBytes / ReadKvBytes.
// Every row's bytes are EncodeKvRow's (kv_rows.cuh), so a cache written here reads the same on the host.
#include <cuda_runtime.h>

#include <cstdint>

#include "backends/cuda/cuda_status.h"
#include "backends/cuda/kernels.h"
#include "backends/cuda/kv_rows.cuh"
#include "backends/cuda/launch.cuh"

namespace strata::cuda {
namespace {

constexpr int kKvThreads = 128;

// Block (row t, k or v): the row's key (blockIdx.y 0) or value at its position through its tables,
// in the row's type.
__global__ void __launch_bounds__(kKvThreads) WriteKvRowsKernel(const model::KvRowRef *rows, const float *k,
                                                                const float *v, int k_width, int v_width,
                                                                int block_tokens) {
  dev::AwaitPrior();
  const int64_t t = blockIdx.x;
  const model::KvRowRef r = rows[t];
  const bool values = blockIdx.y == 1;
  const int width = values ? v_width : k_width;
  const model::KvType type = values ? r.v_type : r.k_type;
  float *const *tab = values ? r.v_blocks : r.k_blocks;
  uint8_t *dst = reinterpret_cast<uint8_t *>(tab[r.pos / block_tokens]) +
                 static_cast<int64_t>(r.pos % block_tokens) * dev::KvRowBytesDev(type, width);
  dev::EncodeKvRowDev(type, (values ? v : k) + t * width, width, dst);
}

__global__ void __launch_bounds__(kKvThreads) EncodeKvRowsKernel(uint8_t *dst, int64_t dst_stride, const float *src,
                                                                 int64_t src_stride, int width, model::KvType t) {
  dev::AwaitPrior();
  const int64_t r = blockIdx.x;
  dev::EncodeKvRowDev(t, src + r * src_stride, width, dst + r * dst_stride);
}

__global__ void __launch_bounds__(kKvThreads) DecodeKvRowsKernel(float *dst, int64_t dst_stride, const uint8_t *src,
                                                                 int64_t src_stride, int width, model::KvType t) {
  dev::AwaitPrior();
  const int64_t r = blockIdx.x;
  const uint8_t *row = src + r * src_stride;
  for (int i = threadIdx.x; i < width; i += blockDim.x) dst[r * dst_stride + i] = dev::KvLoad(t, row, i);
}

absl::Status CheckRows(int64_t rows, int width, model::KvType t) {
  if (rows < 0 || rows > INT32_MAX || width < 0 ||
      (t != model::KvType::kF32 && t != model::KvType::kF16 && t != model::KvType::kQ8_0)) {
    return Errorf(MOE_ERR_INVALID_ARGUMENT, "KV rows: %d rows of width %d in type %d", rows, width,
                  static_cast<int>(t));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status WriteKvRows(const model::KvRowRef *rows, int64_t n, const float *k, const float *v, int k_width,
                         int v_width, int block_tokens, cudaStream_t stream) {
  if (n < 0 || k_width <= 0 || v_width < 0 || block_tokens <= 0 || n > INT32_MAX) {
    return Errorf(MOE_ERR_INVALID_ARGUMENT, "KV rows: %d rows of widths %d and %d", n, k_width, v_width);
  }
  if (n == 0) return absl::OkStatus();
  const dim3 grid(static_cast<unsigned>(n), v_width > 0 ? 2u : 1u);
  Launch(WriteKvRowsKernel, grid, kKvThreads, 0, stream, rows, k, v, k_width, v_width, block_tokens);
  STRATA_CUDA_RETURN_IF_LAUNCH_FAILED();
  return absl::OkStatus();
}

absl::Status EncodeKvRows(uint8_t *dst, int64_t dst_stride, const float *src, int64_t src_stride, int64_t rows,
                          int width, model::KvType t, cudaStream_t stream) {
  STRATA_RETURN_IF_ERROR(CheckRows(rows, width, t));
  if (rows == 0 || width == 0) return absl::OkStatus();
  Launch(EncodeKvRowsKernel, static_cast<unsigned>(rows), kKvThreads, 0, stream, dst, dst_stride, src, src_stride,
         width, t);
  STRATA_CUDA_RETURN_IF_LAUNCH_FAILED();
  return absl::OkStatus();
}

absl::Status DecodeKvRows(float *dst, int64_t dst_stride, const uint8_t *src, int64_t src_stride, int64_t rows,
                          int width, model::KvType t, cudaStream_t stream) {
  STRATA_RETURN_IF_ERROR(CheckRows(rows, width, t));
  if (rows == 0 || width == 0) return absl::OkStatus();
  Launch(DecodeKvRowsKernel, static_cast<unsigned>(rows), kKvThreads, 0, stream, dst, dst_stride, src, src_stride,
         width, t);
  STRATA_CUDA_RETURN_IF_LAUNCH_FAILED();
  return absl::OkStatus();
}

}  // namespace strata::cuda
