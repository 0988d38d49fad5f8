// What making a backend needs, in terms every backend understands: the context fills one from its
// options and plan, and the backend registry (backends/registry.h) hands it to the chosen backend.
// It names no backend type, so the code that fills it includes no backend header.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "lib/model/pack.h"
#include "lib/model/weights.h"

namespace strata::model {

struct BackendRequest {
  const ModelWeights *weights = nullptr;
  // The loaded host arena the weights point into (routed experts left out when they stream).
  const uint8_t *arena = nullptr;
  size_t arena_bytes = 0;
  int n_threads = 0;    // CPU threads; 0 = one per core
  bool cpu_q8_activations = false;
  bool gpu_q8_activations = false;
  int cpu_experts = 0;  // moe_cpu_experts: who computes a device backend's cold experts
  // Routed experts the RAM tier holds, of all of them: fewer means the experts stream from the file.
  uint32_t ram_expert_slots = 0;
  uint32_t n_routed_experts = 0;
  // A user's choices for a device backend (unset: the tuning knob's value).
  std::optional<bool> graphs;           // decode steps recorded and replayed
  std::optional<int64_t> cold_copies;   // the copy engines' slots a set; 0 = off
  std::optional<bool> device_streaming; // a device backend over a streaming context

  bool streaming() const { return ram_expert_slots < n_routed_experts; }
};

}  // namespace strata::model
