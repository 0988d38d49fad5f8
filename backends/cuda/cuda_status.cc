// Mapping of cudaError_t / cublasStatus_t to Strata's status codes (see cuda_status.h).
#include "backends/cuda/cuda_status.h"

namespace strata::cuda {
namespace {

const char *BaseName(const char *file) {
  const char *slash = file;
  for (const char *p = file; *p != '\0'; ++p) {
    if (*p == '/') slash = p + 1;
  }
  return slash;
}

}  // namespace

absl::Status CudaStatus(cudaError_t err, const char *expr, const char *file, int line) {
  if (err == cudaSuccess) return absl::OkStatus();
  // The failed call also left err as the thread's last error: it is reported here, so it must not
  // be blamed on a later launch (a sticky error stays regardless).
  (void)cudaGetLastError();
  moe_status code = MOE_ERR_BACKEND;
  switch (err) {
    case cudaErrorMemoryAllocation:
      code = MOE_ERR_NO_MEMORY;
      break;
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInvalidDevice:
    case cudaErrorNoKernelImageForDevice:
      code = MOE_ERR_UNSUPPORTED_BACKEND;
      break;
    default:
      break;
  }
  return Errorf(code, "CUDA error %s (%s) in %s at %s:%d", cudaGetErrorName(err), cudaGetErrorString(err),
                expr, BaseName(file), line);
}

absl::Status CudaStatus(cublasStatus_t err, const char *expr, const char *file, int line) {
  if (err == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  moe_status code = MOE_ERR_BACKEND;
  switch (err) {
    case CUBLAS_STATUS_ALLOC_FAILED:
      code = MOE_ERR_NO_MEMORY;
      break;
    case CUBLAS_STATUS_NOT_SUPPORTED:
    case CUBLAS_STATUS_ARCH_MISMATCH:
      code = MOE_ERR_UNSUPPORTED;
      break;
    case CUBLAS_STATUS_NOT_INITIALIZED:
      code = MOE_ERR_UNSUPPORTED_BACKEND;
      break;
    default:
      break;
  }
  return Errorf(code, "cuBLASLt error %s (%s) in %s at %s:%d", cublasLtGetStatusName(err),
                cublasLtGetStatusString(err), expr, BaseName(file), line);
}

}  // namespace strata::cuda
