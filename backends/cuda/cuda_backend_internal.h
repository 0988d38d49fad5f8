// What the files of CudaBackend (cuda_backend.cc, device_weights.cc, device_tables.cc,
// routed_experts.cc, step_graph.cc) share beside the class: small helpers and the process's one
// copier claim. Private to backends/cuda.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "lib/model/weights.h"
#include "lib/util/tunables.h"

namespace strata::cuda {

// One context in the process at a time moves cold experts by the copy engines: two contexts'
// streams can share the driver's hardware queues, and a copy queued behind the other context's
// WaitColdCopies would hold both (cold_copier.h). Later contexts read in place.
extern std::atomic<bool> g_copier_claimed;

inline size_t Align(size_t n) { return (n + 255) & ~size_t{255}; }

// Writes m's device form (its bytes, or float32 rows) to dst (device_weights.cc).
void HostForm(const model::Matrix &m, uint8_t *dst, bool convert);

// STRATA_CUDA_PROMPT_TRACE=1: where a prompt's layers spend their time, the streams drained at each
// mark (a measuring knob).
inline bool PromptTrace() { return tunables::Get().cuda_prompt_trace; }

}  // namespace strata::cuda
