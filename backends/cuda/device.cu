// CUDA device discovery. Errors (no driver, no device) mean "no GPU", never a failure of the host.
#include "backends/cuda/device.h"

#include <cuda_runtime.h>

namespace strata::cuda {

int DeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky error so later calls start clean
    return 0;
  }
  return n;
}

}  // namespace strata::cuda
