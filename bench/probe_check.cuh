// The hardware probes' (link_overlap_bench, host_share_bench) check of a CUDA call: on failure,
// prints the call and the runtime's message and exits 1. They are measurements, not Strata code:
// nothing is left to clean up.
#pragma once

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#define PROBE_CHECK(expr)                                                                     \
  do {                                                                                        \
    const cudaError_t err_ = (expr);                                                          \
    if (err_ != cudaSuccess) {                                                                \
      std::fprintf(stderr, "%s: %s\n", #expr, cudaGetErrorString(err_));                      \
      std::exit(1);                                                                           \
    }                                                                                         \
  } while (0)
