// Cache plan arithmetic and its ledger.
#include "lib/store/cache_plan.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "lib/model/forward.h"

namespace strata::store {

uint64_t UsableRamBytes() {
  std::ifstream f("/proc/meminfo");
  std::string key;
  uint64_t kb = 0;
  std::string unit;
  while (f >> key >> kb >> unit) {
    if (key == "MemAvailable:") return kb * 1024;
  }
  return 0;
}

uint32_t StreamedExperts(const CachePlan &p) {
  const uint64_t held = std::min<uint64_t>(uint64_t{p.ram_expert_slots} + p.vram_expert_slots, p.n_routed_experts);
  return static_cast<uint32_t>(p.n_routed_experts - held);
}

absl::StatusOr<CachePlan> MakePlan(const model::HParams &hp, const model::ModelWeights &w,
                                   const PlanInputs &in) {
  if (in.n_ctx <= 0 || in.max_sessions <= 0 || in.max_batch_tokens <= 0) {
    return Errorf(MOE_ERR_INVALID_ARGUMENT, "plan needs positive n_ctx, sessions and batch (got %d, %d, %d)",
                  in.n_ctx, in.max_sessions, in.max_batch_tokens);
  }
  CachePlan p;
  p.n_ctx = in.n_ctx;
  p.max_sessions = in.max_sessions;
  p.max_batch_tokens = in.max_batch_tokens;
  p.n_layers = static_cast<uint32_t>(hp.n_layer);
  p.n_experts_per_layer = static_cast<uint32_t>(hp.n_expert);
  // Dense layers (no router) have no routed experts; shared experts and dense MLPs are resident
  // (counted in non_routed_bytes), only routed experts stream.
  p.n_routed_experts = 0;
  for (const auto &L : w.layers) p.n_routed_experts += static_cast<uint32_t>(L.experts.size());
  p.non_routed_bytes = model::NonRoutedBytes(w);
  p.routed_expert_bytes = model::RoutedExpertBytes(w);
  for (const auto &L : w.layers)
    for (const auto &e : L.experts) p.expert_slot_bytes = std::max(p.expert_slot_bytes, e.nbytes());
  p.kv_bytes_per_token = model::KvCache::BytesFor(hp, 1, in.kv_type_k, in.kv_type_v);
  p.kv_type_k = in.kv_type_k;
  p.kv_type_v = in.kv_type_v;
  p.kv_block_bytes = p.kv_bytes_per_token * model::kKvBlockTokens;
  p.kv_blocks_per_session = static_cast<uint32_t>((in.n_ctx + model::kKvBlockTokens - 1) / model::kKvBlockTokens);
  p.kv_budget_requested = in.kv_budget_bytes > 0;
  p.kv_bytes = p.kv_budget_requested
                   ? in.kv_budget_bytes
                   : p.kv_block_bytes * p.kv_blocks_per_session * static_cast<uint64_t>(in.max_sessions);
  p.kv_max_blocks = static_cast<uint32_t>(
      std::min<uint64_t>(UINT32_MAX, p.kv_block_bytes ? p.kv_bytes / p.kv_block_bytes : 0));
  // Workspace: float activations of one batch (residual, norm, q/k/v/attention, router, per-slot
  // expert outputs, expert hidden) plus the logits rows a pass holds at once
  // (model::MaxLogitsRowsHeld: a batch wanting more runs its output head in chunks).
  const uint64_t T = static_cast<uint64_t>(in.max_batch_tokens);
  const uint64_t per_tok = 4ull * (4ull * hp.n_embd + 2ull * hp.q_dim() + 2ull * hp.kv_dim() + hp.n_expert +
                                   (hp.n_expert_used + 2ull) * hp.n_embd + 2ull * hp.n_ff_expert);
  const uint64_t logits_rows = static_cast<uint64_t>(
      model::MaxLogitsRowsHeld(static_cast<int64_t>(T), static_cast<int64_t>(in.max_sessions)));
  p.workspace_bytes = T * per_tok + logits_rows * 4ull * static_cast<uint64_t>(hp.n_vocab);
  // Running a batch can touch every expert of one layer at once.
  p.min_expert_slots = std::min<uint32_t>(p.n_routed_experts, p.n_experts_per_layer);
  const uint64_t device_fixed = p.non_routed_bytes + p.kv_bytes + p.workspace_bytes;
  const uint64_t fixed = in.device_activations ? p.non_routed_bytes : device_fixed;
  p.min_ram_bytes = fixed + p.expert_slot_bytes * p.min_expert_slots;
  p.requested_ram_budget_bytes = in.ram_budget_bytes;
  p.usable_ram_bytes = in.usable_ram_bytes ? in.usable_ram_bytes : UsableRamBytes();
  uint64_t budget = in.ram_budget_bytes;
  if (budget == 0) {
    budget = p.usable_ram_bytes / 10 * 8;
    if (budget == 0) budget = fixed + p.routed_expert_bytes;  // no meminfo: plan for everything
  }
  if (budget < p.min_ram_bytes) {
    p.clamped = true;
    p.warnings.push_back(strata::StrFormat(
        "RAM budget %u bytes is below the minimum that can run (%u bytes); using the minimum", budget,
        p.min_ram_bytes));
    budget = p.min_ram_bytes;
  }
  p.ram_budget_bytes = budget;
  const uint64_t slots = p.expert_slot_bytes ? (budget - fixed) / p.expert_slot_bytes : 0;
  p.ram_expert_slots = static_cast<uint32_t>(std::min<uint64_t>(slots, p.n_routed_experts));
  p.ram_fixed_bytes = fixed;
  p.vram_budget_bytes = in.have_gpu ? in.vram_budget_bytes : 0;
  p.vram_expert_slots = 0;
  if (in.have_gpu) {
    // The device holds its own copies of the non-routed weights, the KV cache and the workspace.
    p.vram_fixed_bytes = device_fixed;
    const bool streaming = p.ram_expert_slots < p.n_routed_experts;
    if (p.vram_budget_bytes == 0) {
      // Auto: with every expert in RAM the device holds them all too (every expert resident in
      // VRAM); while experts stream, a VRAM tier needs a budget to size it.
      if (!streaming) {
        p.vram_expert_slots = p.n_routed_experts;
      } else {
        p.warnings.push_back("no VRAM budget: experts stream from the file without a VRAM tier (give one to stack "
                             "VRAM over RAM)");
      }
    } else if (p.vram_budget_bytes > p.vram_fixed_bytes && p.expert_slot_bytes > 0) {
      p.vram_expert_slots = static_cast<uint32_t>(
          std::min<uint64_t>((p.vram_budget_bytes - p.vram_fixed_bytes) / p.expert_slot_bytes, p.n_routed_experts));
    } else {
      p.warnings.push_back(strata::StrFormat(
          "VRAM budget %u bytes does not cover the device's fixed %u bytes: no VRAM expert tier", p.vram_budget_bytes,
          p.vram_fixed_bytes));
    }
  }
  p.streamed_experts = StreamedExperts(p);
  return p;
}

std::string FormatLedger(const CachePlan &p) {
  auto mib = [](uint64_t b) { return strata::StrFormat("%10.1f MiB", static_cast<double>(b) / (1 << 20)); };
  std::ostringstream o;
  o << strata::StrFormat("%-28s %14s  %s\n", "item", "bytes", "formula");
  o << strata::StrFormat("%-28s %14u  %s  %s\n", "non-routed weights", p.non_routed_bytes, mib(p.non_routed_bytes),
                       "embeddings + attention + norms + routers + shared experts + dense MLPs + output");
  if (p.kv_budget_requested) {
    o << strata::StrFormat("%-28s %14u  %s  requested budget: %u blocks of %u B (%d tokens x %u B/token, K %s, V %s), "
                         "shared by all sessions, allocated on demand\n",
                         "KV cache", p.kv_bytes, mib(p.kv_bytes), p.kv_max_blocks, p.kv_block_bytes,
                         model::kKvBlockTokens, p.kv_bytes_per_token, model::KvTypeName(p.kv_type_k),
                         model::KvTypeName(p.kv_type_v));
  } else {
    o << strata::StrFormat("%-28s %14u  %s  %d sessions x %u blocks (n_ctx %d) x %u B (%d tokens x %u B/token, "
                         "K %s, V %s), allocated on demand\n",
                         "KV cache", p.kv_bytes, mib(p.kv_bytes), p.max_sessions, p.kv_blocks_per_session, p.n_ctx,
                         p.kv_block_bytes, model::kKvBlockTokens, p.kv_bytes_per_token,
                         model::KvTypeName(p.kv_type_k), model::KvTypeName(p.kv_type_v));
  }
  o << strata::StrFormat("%-28s %14u  %s  activations of a %d-token batch\n", "workspace", p.workspace_bytes,
                       mib(p.workspace_bytes), p.max_batch_tokens);
  const uint64_t fixed = p.ram_fixed_bytes;
  if (p.vram_fixed_bytes > 0 && fixed != p.vram_fixed_bytes) {
    o << strata::StrFormat("%-28s %14u  %s  sum of the three lines above, on the device\n", "VRAM fixed",
                         p.vram_fixed_bytes, mib(p.vram_fixed_bytes));
    o << strata::StrFormat("%-28s %14u  %s  the host copy of the non-routed weights (KV and workspace on the "
                         "device)\n", "fixed", fixed, mib(fixed));
  } else {
    o << strata::StrFormat("%-28s %14u  %s  sum of the three lines above\n", "fixed", fixed, mib(fixed));
  }
  o << strata::StrFormat("%-28s %14u  %s  %u experts x %u B (largest expert: gate|up|down)\n",
                       "routed experts (all)", p.routed_expert_bytes, mib(p.routed_expert_bytes),
                       p.n_routed_experts, p.expert_slot_bytes);
  o << strata::StrFormat("%-28s %14u  %s  fixed + %u slots (one layer's experts) x %u B\n", "minimum RAM",
                       p.min_ram_bytes, mib(p.min_ram_bytes), p.min_expert_slots, p.expert_slot_bytes);
  o << strata::StrFormat("%-28s %14u  %s  %s\n", "RAM budget", p.ram_budget_bytes, mib(p.ram_budget_bytes),
                       p.requested_ram_budget_bytes == 0
                           ? strata::StrFormat("auto: 80%% of %u usable bytes", p.usable_ram_bytes)
                           : (p.clamped ? std::string("requested, raised to the minimum") : std::string("requested")));
  const uint64_t ram_experts = static_cast<uint64_t>(p.ram_expert_slots) * p.expert_slot_bytes;
  o << strata::StrFormat("%-28s %14u  %s  min(%u, floor((budget - fixed) / %u)) = %u slots\n", "RAM expert tier",
                       ram_experts, mib(ram_experts), p.n_routed_experts, p.expert_slot_bytes, p.ram_expert_slots);
  const uint64_t vram_experts = static_cast<uint64_t>(p.vram_expert_slots) * p.expert_slot_bytes;
  if (p.vram_fixed_bytes > 0) {
    o << strata::StrFormat("%-28s %14u  %s  %s\n", "VRAM budget", p.vram_budget_bytes, mib(p.vram_budget_bytes),
                         p.vram_budget_bytes == 0 ? "auto" : "requested");
    o << strata::StrFormat("%-28s %14u  %s  min(%u, floor((budget - %s) / %u)) = %u slots\n", "VRAM expert tier",
                         vram_experts, mib(vram_experts), p.n_routed_experts,
                         fixed != p.vram_fixed_bytes ? "VRAM fixed" : "fixed", p.expert_slot_bytes,
                         p.vram_expert_slots);
  } else {
    o << strata::StrFormat("%-28s %14u  %s  %u slots (no device tier)\n", "VRAM expert tier", vram_experts,
                         mib(vram_experts), p.vram_expert_slots);
  }
  const uint64_t held = ram_experts + vram_experts;
  const uint64_t on_disk = p.routed_expert_bytes > held ? p.routed_expert_bytes - held : 0;
  o << strata::StrFormat("%-28s %14u  %s  routed experts - VRAM tier - RAM tier (distinct experts): %u experts\n",
                       "streamed from file", on_disk, mib(on_disk), p.streamed_experts);
  for (const auto &w : p.warnings) o << "warning: " << w << "\n";
  return o.str();
}

}  // namespace strata::store
