// CUDA runtime and cuBLASLt errors as absl::Status carrying a moe_status code. Every fallible CUDA
// call in Strata goes through STRATA_CUDA_RETURN_IF_ERROR, so a failure is returned to the caller
// (and from there to the host as MOE_ERR_*), never turned into exit() or abort().
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include "lib/util/status.h"

namespace strata::cuda {

// The Status for a failed call `expr` at file:line. Codes: cudaErrorMemoryAllocation and
// CUBLAS_STATUS_ALLOC_FAILED -> MOE_ERR_NO_MEMORY; no device / no or too old a driver ->
// MOE_ERR_UNSUPPORTED_BACKEND; CUBLAS_STATUS_NOT_SUPPORTED -> MOE_ERR_UNSUPPORTED; anything else
// (launch failures, illegal addresses, cuBLASLt execution errors) -> MOE_ERR_BACKEND. OkStatus for
// success.
absl::Status CudaStatus(cudaError_t err, const char *expr, const char *file, int line);
absl::Status CudaStatus(cublasStatus_t err, const char *expr, const char *file, int line);

}  // namespace strata::cuda

// Evaluates a cudaError_t or cublasStatus_t expression and returns its Status from the enclosing
// function when it failed. Both enums use 0 for success.
#define STRATA_CUDA_RETURN_IF_ERROR(expr)                                                         \
  do {                                                                                            \
    const auto strata_cuda_err_ = (expr);                                                         \
    if (strata_cuda_err_ != decltype(strata_cuda_err_){}) {                                       \
      return ::strata::cuda::CudaStatus(strata_cuda_err_, #expr, __FILE__, __LINE__);             \
    }                                                                                             \
  } while (0)

// After a kernel launch: launch-configuration errors are reported by cudaGetLastError (which also
// clears them, so they are not blamed on a later unrelated call).
#define STRATA_CUDA_RETURN_IF_LAUNCH_FAILED() STRATA_CUDA_RETURN_IF_ERROR(cudaGetLastError())
