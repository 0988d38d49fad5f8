// CUDA device discovery, callable from C++ translation units that are not compiled by nvcc.
#pragma once

#include <cstdint>

namespace strata::cuda {

// Number of usable CUDA devices; 0 when there is no driver, no device, or an error.
int DeviceCount();

// Multiprocessors of the current device (asked once per device); 0 on an error.
int SmCount();

// Whether kernels are launched to start early (launch.cuh): on a GPU of compute capability 9.0 or
// later unless the environment variable STRATA_CUDA_PDL is 0 (for measuring). Decided once per
// process.
bool EarlyLaunch();

// Bytes of the current device's memory free now (cudaMemGetInfo); 0 on an error.
uint64_t DeviceFreeBytes();

// The host NUMA node the device hangs off (lib/util/numa.h); -1 when unknown.
int DeviceNumaNode(int device = 0);

}  // namespace strata::cuda
