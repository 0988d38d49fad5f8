// CUDA device slots for the VRAM expert tier.
#include "backends/cuda/device_slots.h"

#include "backends/cuda/cuda_backend.h"

namespace strata::cuda {

CudaDeviceSlots::~CudaDeviceSlots() {
  if (buf_.data() != nullptr) be_->ForgetDeviceRegion(buf_.as<uint8_t>());
}

absl::Status CudaDeviceSlots::Allocate(uint32_t n, uint64_t slot_bytes) {
  if (buf_.data() != nullptr) return Errorf(MOE_ERR_INTERNAL, "the device slots are allocated once");
  if (n == 0 || slot_bytes == 0) return Errorf(MOE_ERR_INVALID_ARGUMENT, "%u device slots of %u bytes", n, slot_bytes);
  // Each slot starts 256-byte aligned, as the kernels' vector loads and every device copy expect.
  stride_ = (slot_bytes + 255) / 256 * 256;
  STRATA_ASSIGN_OR_RETURN(after_compute_, Event::Create());
  absl::StatusOr<DeviceBuffer> b = DeviceBuffer::Allocate(static_cast<size_t>(stride_) * n);
  if (!b.ok()) {
    return Errorf(MOE_ERR_NO_MEMORY, "the GPU cannot hold %u expert slots of %u bytes (%.2f GiB): %s", n, stride_,
                  static_cast<double>(stride_) * n / (1ull << 30), std::string(b.status().message()));
  }
  buf_ = std::move(*b);
  n_ = n;
  be_->AddDeviceRegion(buf_.as<uint8_t>(), buf_.size());
  return absl::OkStatus();
}

absl::Status CudaDeviceSlots::Copy(void *dst, const void *src, uint64_t bytes, cudaMemcpyKind kind) {
  STRATA_RETURN_IF_ERROR(be_->TakeError());
  STRATA_RETURN_IF_ERROR(after_compute_.Record(be_->compute_stream()));
  const Stream &copy = be_->copy_stream();
  STRATA_RETURN_IF_ERROR(copy.Wait(after_compute_.get()));
  if (cudaError_t e = cudaMemcpyAsync(dst, src, bytes, kind, copy.get()); e != cudaSuccess) {
    (void)cudaGetLastError();
    return Errorf(MOE_ERR_BACKEND, "copying an expert of %u bytes %s VRAM: %s", bytes,
                  kind == cudaMemcpyHostToDevice ? "into" : "out of", cudaGetErrorString(e));
  }
  return copy.Synchronize();
}

absl::Status CudaDeviceSlots::CopyIn(uint32_t s, const uint8_t *src, uint64_t bytes) {
  if (s >= n_ || bytes > stride_) return Errorf(MOE_ERR_INTERNAL, "copy of %u bytes into slot %u of %u", bytes, s, n_);
  return Copy(slot(s), src, bytes, cudaMemcpyHostToDevice);
}

absl::Status CudaDeviceSlots::CopyOut(uint32_t s, uint8_t *dst, uint64_t bytes) {
  if (s >= n_ || bytes > stride_) return Errorf(MOE_ERR_INTERNAL, "copy of %u bytes out of slot %u of %u", bytes, s, n_);
  return Copy(dst, slot(s), bytes, cudaMemcpyDeviceToHost);
}

}  // namespace strata::cuda
