// The cache plan: from memory budgets and the model, how many bytes go where. Non-routed weights,
// KV for the configured sessions and context, and workspace come first (KV and workspace from the
// budget of the memory they live in: the device's for a device backend); whole routed experts fill
// what is left of each tier. Auto budgets take 80% of the usable memory for the model, leaving 20%
// for KV and buffers; a budget below the minimum that can run is raised to it, with a warning.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "lib/model/backend.h"
#include "lib/model/hparams.h"
#include "lib/model/weights.h"
#include "lib/util/status.h"

namespace strata::store {

struct PlanInputs {
  uint64_t ram_budget_bytes = 0;   // 0 = auto
  uint64_t vram_budget_bytes = 0;  // 0 = auto (no GPU tier without a GPU)
  int n_ctx = 4096;
  int max_sessions = 1;
  int max_batch_tokens = 512;
  uint64_t kv_budget_bytes = 0;    // KV blocks all sessions may hold; 0 = max_sessions x n_ctx
  model::KvType kv_type_k = model::KvType::kF32;  // how the KV cache stores keys and values
  model::KvType kv_type_v = model::KvType::kF32;
  // The backend computes in device memory of its own (CUDA, also when planning on a machine without
  // a GPU): the plan then has a VRAM tier from vram_budget_bytes.
  bool have_gpu = false;
  // The KV cache and the forward pass's workspace live in that device's memory (the CUDA backend):
  // the RAM budget then pays for the host copy of the non-routed weights alone.
  bool device_activations = false;
  uint64_t usable_ram_bytes = 0;   // 0 = read from /proc/meminfo
};

struct CachePlan {
  uint64_t ram_budget_bytes = 0;
  uint64_t vram_budget_bytes = 0;
  uint64_t requested_ram_budget_bytes = 0;  // 0 = auto
  uint64_t usable_ram_bytes = 0;
  uint64_t non_routed_bytes = 0;
  uint64_t routed_expert_bytes = 0;
  // KV: sessions allocate blocks of kKvBlockTokens positions on demand; kv_bytes is the budget all
  // sessions share: max_sessions x ceil(n_ctx / block) blocks, or the requested kv_budget_bytes.
  uint64_t kv_bytes = 0;
  uint64_t kv_bytes_per_token = 0;  // one session, all layers, in the KV types below
  model::KvType kv_type_k = model::KvType::kF32, kv_type_v = model::KvType::kF32;
  uint64_t kv_block_bytes = 0;      // one block: kKvBlockTokens positions, all layers
  uint32_t kv_blocks_per_session = 0;  // blocks a session of n_ctx positions may grow to
  uint32_t kv_max_blocks = 0;       // blocks the budget holds: floor(kv_bytes / kv_block_bytes)
  bool kv_budget_requested = false;
  uint64_t workspace_bytes = 0;
  uint64_t expert_slot_bytes = 0;
  uint64_t min_ram_bytes = 0;        // the least budget that can run
  uint32_t n_layers = 0;
  uint32_t n_experts_per_layer = 0;
  uint32_t n_routed_experts = 0;
  uint32_t min_expert_slots = 0;
  uint32_t ram_expert_slots = 0;
  uint32_t vram_expert_slots = 0;
  // What each budget spends before expert slots: a budget of fixed + k slots gives k slots.
  uint64_t ram_fixed_bytes = 0;     // non-routed weights, and KV and workspace where they are in host memory
  uint64_t vram_fixed_bytes = 0;    // non-routed weights, KV and workspace on the device (0 without a device tier)
  // Routed experts neither tier holds: read from the file as they are needed. The tiers hold
  // distinct experts while experts stream, so this is routed - VRAM - RAM (at least 0).
  uint32_t streamed_experts = 0;
  bool clamped = false;
  int n_ctx = 0;
  int max_sessions = 0;
  int max_batch_tokens = 0;
  std::vector<std::string> warnings;
};

// Routed experts neither tier of `p` holds: routed - VRAM - RAM, at least 0.
uint32_t StreamedExperts(const CachePlan &p);

absl::StatusOr<CachePlan> MakePlan(const model::HParams &hp, const model::ModelWeights &w,
                                   const PlanInputs &in);

// MemAvailable from /proc/meminfo (bytes), or 0 when it cannot be read.
uint64_t UsableRamBytes();

// The plan as a ledger a person can check by hand: one line per item with the formula behind it.
std::string FormatLedger(const CachePlan &p);

}  // namespace strata::store
