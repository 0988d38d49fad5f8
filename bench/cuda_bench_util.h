// What the CUDA micro-benchmarks share: failures end the run with the call and its message, and
// CUDA-event timing of a call repeated on a stream.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>

#include "backends/cuda/device.h"
#include "lib/util/status.h"

namespace strata::cuda::bench {

#define BENCH_CHECK(expr)                                                          \
  do {                                                                             \
    const absl::Status st_ = (expr);                                               \
    if (!st_.ok()) {                                                               \
      std::fprintf(stderr, "%s: %s\n", #expr, std::string(st_.message()).c_str()); \
      std::exit(1);                                                                \
    }                                                                              \
  } while (0)

template <typename T>
T Must(absl::StatusOr<T> v, const char *what) {
  if (!v.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, std::string(v.status().message()).c_str());
    std::exit(1);
  }
  return std::move(v).value();
}

// Mean milliseconds of `reps` runs of f on stream s, after 3 warm-up runs.
template <class F>
float TimeMs(cudaStream_t s, int reps, F &&f) {
  Event a = Must(Event::Create(true), "event"), b = Must(Event::Create(true), "event");
  for (int i = 0; i < 3; ++i) f();
  BENCH_CHECK(a.Record(s));
  for (int i = 0; i < reps; ++i) f();
  BENCH_CHECK(b.Record(s));
  BENCH_CHECK(b.Synchronize());
  return Must(Event::ElapsedMs(a, b), "elapsed") / reps;
}

}  // namespace strata::cuda::bench
