// CUDA device discovery, callable from C++ translation units that are not compiled by nvcc.
#pragma once

namespace strata::cuda {

// Number of usable CUDA devices; 0 when there is no driver, no device, or an error.
int DeviceCount();

}  // namespace strata::cuda
