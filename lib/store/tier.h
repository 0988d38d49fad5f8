// The expert tiers as one backend-neutral layer: VRAM slots over pinned-RAM slots over the model
// file. Each tier is an ExpertSource (acquire, release) that can also say what it holds, admit an
// expert whose bytes another tier hands it, and evict one; the tiers hold distinct experts, so
// their budgets add up. A device tier drives its memory through DeviceSlots, which a backend with
// its own memory implements (allocate slots, copy in and out after the computations that read
// them); the policy above it (slots, heat, promotions) lives here and runs the same on any device.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "lib/model/forward.h"
#include "lib/store/heat.h"
#include "lib/util/status.h"

namespace strata::store {

// Fixed slots of a device's memory for routed experts, as a backend provides them. A slot holds
// one expert laid out as a RAM cache slot is (gate, up and down at the table's slot offsets), so
// an expert moves between the tiers in one copy of its slot bytes.
class DeviceSlots {
 public:
  virtual ~DeviceSlots() = default;
  virtual std::string_view name() const = 0;
  // Allocates n slots of slot_bytes each, once, before any other call. MOE_ERR_NO_MEMORY when the
  // device cannot hold them (nothing stays allocated).
  virtual absl::Status Allocate(uint32_t n, uint64_t slot_bytes) = 0;
  // Slot s's first byte, an address the backend's kernels read a view's Matrix::data from (a
  // device backend resolves its slots' addresses to themselves).
  virtual uint8_t *slot(uint32_t s) const = 0;
  // Copies `bytes` of host memory into slot s, or slot s into host memory, after every computation
  // queued so far (so a slot being read is not overwritten, and what it is copied to has the bytes
  // last written); complete when the call returns. An error leaves the slot's contents undefined.
  virtual absl::Status CopyIn(uint32_t s, const uint8_t *src, uint64_t bytes) = 0;
  virtual absl::Status CopyOut(uint32_t s, uint8_t *dst, uint64_t bytes) = 0;
  // The same copies queued, returning at once: each starts after every computation queued so far,
  // on the device's copy engines, so it overlaps the computations queued after it (which must not
  // read what it writes). Fence returns a ticket for every copy queued before it; Reached(t) tells
  // whether they are complete, `wait` blocking until they are. By default the copies are made
  // synchronously and every ticket is reached. An error leaves the copies' destinations undefined.
  virtual absl::Status QueueCopyIn(uint32_t s, const uint8_t *src, uint64_t bytes) { return CopyIn(s, src, bytes); }
  virtual absl::Status QueueCopyOut(uint32_t s, uint8_t *dst, uint64_t bytes) { return CopyOut(s, dst, bytes); }
  // A swap queued as one: slot s's first `down_bytes` go into host memory at down_dst, then
  // `up_bytes` of host memory at up_src come into slot s, the second copy after the first on the
  // device, both after every computation queued so far. By default both are made synchronously.
  virtual absl::Status QueueSwap(uint32_t s, uint8_t *down_dst, uint64_t down_bytes, const uint8_t *up_src,
                                 uint64_t up_bytes) {
    STRATA_RETURN_IF_ERROR(CopyOut(s, down_dst, down_bytes));
    return CopyIn(s, up_src, up_bytes);
  }
  // The computations queued from now on start after every copy queued so far (they read slots those
  // copies fill). Synchronous copies leave nothing to wait for.
  virtual absl::Status ComputeAfterQueued() { return absl::OkStatus(); }
  virtual absl::StatusOr<uint64_t> Fence() { return uint64_t{0}; }
  virtual absl::StatusOr<bool> Reached(uint64_t ticket, bool wait) { return true; }
  // Device tables: per layer, every routed expert's address as the device reads it (one of these
  // slots, or host memory the backend maps: the RAM tier's slab), so the backend routes and groups
  // a decode batch by itself (model::Backend::RoutedExperts) while the tiers together hold every
  // expert. EnableTables makes them, every entry unset; false where the backend cannot (then there
  // are none). The caller points every expert of a layer before the forward pass may route there.
  virtual bool EnableTables() { return false; }
  // Device memory the tables took beside the slots (with what the backend stages through them).
  virtual uint64_t tables_bytes() const { return 0; }
  // Points (layer, expert)'s entry at `where`: views over one of these slots or over mapped host
  // memory. Takes effect before the next computation that reads the tables.
  virtual absl::Status Point(int layer, int expert, const model::ExpertWeights &where) { return absl::OkStatus(); }
};

// Tests run the VRAM tier's policy end to end on a backend without memory of its own: a context
// then takes its device slots from this factory (null: none, the default).
using DeviceSlotsFactory = std::unique_ptr<DeviceSlots> (*)();
void SetDeviceSlotsForTesting(DeviceSlotsFactory factory);
DeviceSlotsFactory DeviceSlotsForTesting();

// Where an expert's slot bytes lie when one tier hands it to another: host memory, or a device slot.
struct SlotBytes {
  const uint8_t *host = nullptr;
  DeviceSlots *device = nullptr;
  uint32_t device_slot = 0;
  uint64_t bytes = 0;
};

// What one tier has done since its counts were last reset.
struct TierStats {
  uint64_t hits = 0;        // experts a layer needed that this tier held
  uint64_t admitted = 0;    // experts handed to it by another tier (promoted into a device tier,
                            // demoted into RAM)
  uint64_t evicted = 0;     // experts it gave up
  uint64_t bytes_in = 0;    // bytes copied into it from another tier
  uint32_t n_slots = 0;
  uint64_t slot_bytes = 0;
};

class ExpertTier : public model::ExpertSource {
 public:
  // Whether the tier has `key` (layer * n_experts + expert): ready, or on its way in.
  virtual bool Holds(uint32_t key) const = 0;
  // Takes a slot for `key` (which it does not hold) and copies the expert's bytes in from `from`;
  // the slot's previous expert, if any, is dropped. MOE_ERR_NO_MEMORY when every slot is in use.
  virtual absl::Status Admit(uint32_t key, const SlotBytes &from) = 0;
  // Admission in two halves, for a copy the tier above makes asynchronously: Reserve takes a free
  // slot for `key` (which it does not hold; nothing is given up for it) and returns where its bytes
  // go, null when no slot is free (or the tier cannot); `key` is then held but not ready until
  // Complete(key, ok) (not ok: the slot is empty again).
  virtual uint8_t *Reserve(uint32_t key) { return nullptr; }
  virtual void Complete(uint32_t key, bool ok) {}
  // Gives up `key` when nothing uses it now; false when it is in use or not held.
  virtual bool Evict(uint32_t key) = 0;
  virtual TierStats tier_stats() const = 0;
  // The views of `key` where this tier holds it ready (valid until it moves or leaves), else null:
  // what a device table points at.
  virtual const model::ExpertWeights *ReadyViews(uint32_t key) const { return nullptr; }
  // How many experts this tier has given up on its own to make room (not through Evict), ever: views
  // it handed out stay where they are while the count does not change.
  virtual uint64_t own_evictions() const { return 0; }
};

}  // namespace strata::store
