// Expert parallelism's placement (device_placement.h): owners by load per layer, then replicas.
#include "lib/store/device_placement.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace strata::store {

absl::StatusOr<DevicePlacement> PlaceExperts(const DevicePlacementInputs &in) {
  const int nd = in.n_devices;
  if (nd < 1 || nd > DevicePlacement::kMaxDevices) {
    return Errorf(MOE_ERR_INVALID_ARGUMENT, "expert parallelism over %d devices (1 to %d)", nd,
                  DevicePlacement::kMaxDevices);
  }
  if (in.n_layers <= 0 || in.n_experts <= 0) {
    return Errorf(MOE_ERR_INVALID_ARGUMENT, "a placement of %d layers of %d experts", in.n_layers, in.n_experts);
  }
  const size_t n_keys = static_cast<size_t>(in.n_layers) * static_cast<size_t>(in.n_experts);
  if (in.routed.size() != n_keys) {
    return Errorf(MOE_ERR_INVALID_ARGUMENT, "the placement's routed flags cover %zu experts, not %zu",
                  in.routed.size(), n_keys);
  }
  if (!in.load.empty() && in.load.size() != n_keys) {
    return Errorf(MOE_ERR_INVALID_ARGUMENT, "the placement's loads cover %zu experts, not %zu", in.load.size(),
                  n_keys);
  }
  for (size_t key = 0; key < in.load.size(); ++key) {
    if (!std::isfinite(in.load[key]) || in.load[key] < 0) {
      return Errorf(MOE_ERR_INVALID_ARGUMENT, "expert key %zu has load %g (finite and non-negative wanted)", key,
                    in.load[key]);
    }
  }
  if (in.vram_slots.size() != static_cast<size_t>(nd)) {
    return Errorf(MOE_ERR_INVALID_ARGUMENT, "VRAM slots given for %zu devices, not %d", in.vram_slots.size(), nd);
  }
  auto load = [&](size_t key) { return in.load.empty() ? 1.0 : in.load[key]; };

  DevicePlacement p;
  p.n_devices = nd;
  p.n_layers = in.n_layers;
  p.n_experts = in.n_experts;
  p.owner.assign(n_keys, -1);
  p.holders.assign(n_keys, 0);
  p.owned_load.assign(static_cast<size_t>(in.n_layers) * nd, 0.0);
  p.owned.assign(nd, 0);
  p.replicas.assign(nd, 0);

  std::vector<uint32_t> keys;
  for (int l = 0; l < in.n_layers; ++l) {
    keys.clear();
    for (int x = 0; x < in.n_experts; ++x) {
      const uint32_t key = static_cast<uint32_t>(l) * in.n_experts + x;
      if (in.routed[key]) keys.push_back(key);
    }
    // Hottest first (ties by key), each to the least-loaded device of the layer so far.
    std::stable_sort(keys.begin(), keys.end(), [&](uint32_t a, uint32_t b) { return load(a) > load(b); });
    double *layer_load = &p.owned_load[static_cast<size_t>(l) * nd];
    for (uint32_t key : keys) {
      int best = 0;
      for (int d = 1; d < nd; ++d) {
        if (layer_load[d] < layer_load[best] || (layer_load[d] == layer_load[best] && p.owned[d] < p.owned[best])) {
          best = d;
        }
      }
      p.owner[key] = static_cast<int16_t>(best);
      p.holders[key] = uint64_t{1} << best;
      layer_load[best] += load(key);
      ++p.owned[best];
    }
  }

  if (in.replicate && nd > 1) {
    // Every routed expert hottest first; each device's spare slots take those it does not hold.
    std::vector<uint32_t> all;
    for (uint32_t key = 0; key < n_keys; ++key) {
      if (in.routed[key]) all.push_back(key);
    }
    std::stable_sort(all.begin(), all.end(), [&](uint32_t a, uint32_t b) { return load(a) > load(b); });
    for (int d = 0; d < nd; ++d) {
      uint64_t spare = in.vram_slots[d] > p.owned[d] ? in.vram_slots[d] - p.owned[d] : 0;
      for (size_t i = 0; i < all.size() && spare > 0; ++i) {
        const uint32_t key = all[i];
        if ((p.holders[key] >> d) & 1u) continue;
        p.holders[key] |= uint64_t{1} << d;
        ++p.replicas[d];
        --spare;
      }
    }
  }
  return p;
}

}  // namespace strata::store
