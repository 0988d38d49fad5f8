// Expert parallelism's placement: which of n devices computes each routed expert of every layer
// (its owner), chosen by expected load, and which devices also hold a copy of a hot one (a replica).
//
// Every device runs attention for its own share of the batch's tokens (data parallel); a layer's
// selections then go to the devices that compute their experts and come back (expert_exchange.h).
// Per layer, the owners balance the expected selections across the devices: experts hottest first,
// each to the device with the least load so far in that layer (ties: fewer experts owned in all, then
// the lower index), so no device's load exceeds another's by more than one expert's. A device whose
// VRAM slots outnumber the experts it owns takes replicas of the hottest experts it does not own: a
// token it holds then computes such an expert where it is, and only the other devices' tokens travel
// to the owner. Each device's VRAM tier holds the hottest of the experts it owns and replicates; the
// rest stream to it from the shared RAM and file tiers.
#pragma once

#include <cstdint>
#include <vector>

#include "lib/util/status.h"

namespace strata::store {

struct DevicePlacementInputs {
  int n_devices = 1;  // 1 to kMaxDevices
  int n_layers = 0, n_experts = 0;
  // Per key (layer * n_experts + expert, as ExpertTable's): whether the layer has that routed expert.
  std::vector<char> routed;
  // Per key: expected selections (a hotlist's counts, the route hotness); empty: all equal.
  std::vector<double> load;
  // Per device: the expert slots its VRAM tier holds.
  std::vector<uint32_t> vram_slots;
  bool replicate = true;  // spare slots take replicas of the hottest experts
};

struct DevicePlacement {
  static constexpr int kMaxDevices = 64;
  int n_devices = 1;
  int n_layers = 0, n_experts = 0;
  std::vector<int16_t> owner;      // per key: the device that computes it; -1 where not routed
  std::vector<uint64_t> holders;   // per key: bit d set where device d holds it (the owner included)
  // Per layer and device: the expected load the device owns (layer * n_devices + device).
  std::vector<double> owned_load;
  std::vector<uint32_t> owned;     // per device: experts it owns, in all layers
  std::vector<uint32_t> replicas;  // per device: replicas it holds

  // The device that computes `key` for a token device `home` holds: home where it holds the expert,
  // else the owner.
  int ComputeDevice(uint32_t key, int home) const {
    return (holders[key] >> home) & 1u ? home : owner[key];
  }
};

// MOE_ERR_INVALID_ARGUMENT naming the input at fault: a device count outside 1..kMaxDevices, sizes
// that do not match the keys or devices, a negative or non-finite load.
absl::StatusOr<DevicePlacement> PlaceExperts(const DevicePlacementInputs &in);

}  // namespace strata::store
