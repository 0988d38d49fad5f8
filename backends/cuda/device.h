// CUDA device discovery, callable from C++ translation units that are not compiled by nvcc.
#pragma once

namespace strata::cuda {

// Number of usable CUDA devices; 0 when there is no driver, no device, or an error.
int DeviceCount();

// The host NUMA node the device hangs off (lib/util/numa.h); -1 when unknown.
int DeviceNumaNode(int device = 0);

}  // namespace strata::cuda
