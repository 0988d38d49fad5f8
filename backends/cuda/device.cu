// CUDA device discovery. Errors (no driver, no device) mean "no GPU", never a failure of the host.
#include "backends/cuda/device.h"

#include <cuda_runtime.h>

#include <atomic>
#include <cstdlib>

#include "lib/util/numa.h"
#include "lib/util/tunables.h"

namespace strata::cuda {

int DeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky error so later calls start clean
    return 0;
  }
  return n;
}

uint64_t DeviceFreeBytes() {
  size_t free = 0, total = 0;
  if (cudaMemGetInfo(&free, &total) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return free;
}

int DeviceNumaNode(int device) {
  char bus_id[32] = {};
  if (cudaDeviceGetPCIBusId(bus_id, sizeof bus_id, device) != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  return numa::PciDeviceNode(bus_id);
}

int SmCount() {
  static std::atomic<int> sm_count[64];  // per device; 0 = not asked yet
  int dev = 0, n_sm = 0;
  if (cudaGetDevice(&dev) == cudaSuccess && dev >= 0 && dev < 64) {
    n_sm = sm_count[dev].load(std::memory_order_relaxed);
    if (n_sm == 0 && cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess && n_sm > 0) {
      sm_count[dev].store(n_sm, std::memory_order_relaxed);
    }
  }
  return n_sm;
}

bool EarlyLaunch() {
  static const bool on = [] {
    if (!tunables::Get().cuda_pdl) return false;
    int dev = 0, major = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    return major >= 9;
  }();
  return on;
}

}  // namespace strata::cuda
