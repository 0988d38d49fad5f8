// The VRAM tier's decisions: which experts hold its slots, and the copies that move experts
// between it and the RAM tier below. Runs on the thread that steps the context (the forward pass
// calls it layer by layer), so its state needs no lock; the RAM tier's I/O threads only ask Holds.
#include "lib/store/vram_tier.h"

#include <algorithm>
#include <atomic>

#include "lib/model/placement.h"

namespace strata::store {
namespace {
std::atomic<DeviceSlotsFactory> g_test_device{nullptr};
}  // namespace

void SetDeviceSlotsForTesting(DeviceSlotsFactory factory) { g_test_device.store(factory); }
DeviceSlotsFactory DeviceSlotsForTesting() { return g_test_device.load(); }

VramTier::VramTier(const ExpertTable &table, DeviceSlots *device, ExpertTier *below, const VramTierOptions &o)
    : table_(table),
      device_(device),
      below_(below),
      opts_(o),
      heat_(static_cast<uint32_t>(table.n_layers()) * static_cast<uint32_t>(table.n_experts())) {}

absl::StatusOr<std::unique_ptr<VramTier>> VramTier::Create(const ExpertTable &table, DeviceSlots *device,
                                                           ExpertTier *below, const VramTierOptions &options) {
  if (device == nullptr || below == nullptr) {
    return Errorf(MOE_ERR_INVALID_ARGUMENT, "a VRAM tier needs a device and a tier below it");
  }
  const uint32_t n_keys = static_cast<uint32_t>(table.n_layers()) * static_cast<uint32_t>(table.n_experts());
  if (options.n_slots == 0 || n_keys == 0) {
    return Errorf(MOE_ERR_INVALID_ARGUMENT, "a VRAM tier of %u slots over %u experts", options.n_slots, n_keys);
  }
  if (!(options.promote_z >= 0) || options.max_swaps_per_call < 0) {
    return Errorf(MOE_ERR_INVALID_ARGUMENT, "bad VRAM tier options: z %g, %d swaps a call", options.promote_z,
                  options.max_swaps_per_call);
  }
  auto t = std::unique_ptr<VramTier>(new VramTier(table, device, below, options));
  const uint32_t n = std::min(options.n_slots, n_keys);
  STRATA_RETURN_IF_ERROR(device->Allocate(n, table.slot_bytes()));
  t->slots_.resize(n);
  t->free_.reserve(n);
  for (uint32_t s = n; s-- > 0;) t->free_.push_back(static_cast<int>(s));  // slot 0 is taken first
  t->key_slot_.assign(n_keys, -1);
  t->stats_.n_slots = n;
  t->stats_.slot_bytes = table.slot_bytes();
  return t;
}

uint64_t VramTier::SpanBytes(uint32_t key) const {
  const ExpertEntry &en = table_.entry(table_.LayerOf(key), table_.ExpertOf(key));
  uint64_t end = 0;
  for (const ExpertPart &p : en.part) end = std::max(end, p.slot_offset + p.bytes);
  return end;
}

void VramTier::OnRoute(int layer, const float *h, int64_t n_tok, const int32_t *selected, int k) {
  for (int64_t i = 0; i < n_tok * k; ++i) heat_.OnSelect(table_.Key(layer, selected[i]));
  below_->OnRoute(layer, h, n_tok, selected, k);
}

void VramTier::OnDecodeToken() {
  if (heat_.OnDecodeToken()) floor_ >>= 1;
}

void VramTier::OnNewPrompt() {
  heat_.OnNewPrompt();
  floor_ = 0;
}

int VramTier::SlotFor(uint32_t key, bool may_swap) {
  if (!free_.empty()) return free_.back();
  if (!may_swap) return -1;
  const uint32_t h = heat_[key];
  if (floor_ok_ && !model::MarkedlyHotter(h, floor_, opts_.promote_z)) return -1;
  // The coldest resident not in use (least recently used among equals); the floor covers every
  // resident, those in use too, so it stays a bound once they are released.
  int v = -1;
  uint32_t v_heat = 0, floor = UINT32_MAX;
  for (size_t s = 0; s < slots_.size(); ++s) {
    const Slot &sl = slots_[s];
    if (sl.key == kNone) continue;
    const uint32_t sh = heat_[sl.key];
    floor = std::min(floor, sh);
    if (sl.pins > 0) continue;
    if (v < 0 || sh < v_heat || (sh == v_heat && sl.last_use < slots_[v].last_use)) {
      v = static_cast<int>(s);
      v_heat = sh;
    }
  }
  floor_ = floor;
  floor_ok_ = true;
  if (v < 0 || !model::MarkedlyHotter(h, v_heat, opts_.promote_z)) return -1;
  return v;
}

absl::Status VramTier::MoveDown(int v) {
  Slot &sl = slots_[v];
  if (sl.key == kNone) return absl::OkStatus();
  const uint32_t key = sl.key;
  const SlotBytes from{nullptr, device_, static_cast<uint32_t>(v), SpanBytes(key)};
  absl::Status st = below_->Admit(key, from);
  if (st.ok()) {
    ++stats_.demotions;
    stats_.bytes_down += from.bytes;
  } else if (StatusToMoe(st) == MOE_ERR_NO_MEMORY) {
    ++stats_.dropped;  // no room below: it goes back to the file
  } else {
    return st;
  }
  key_slot_[key] = -1;
  sl.key = kNone;
  free_.push_back(v);
  return absl::OkStatus();
}

absl::Status VramTier::MoveUp(uint32_t key, const model::ExpertWeights &ram, int v) {
  const bool swap = slots_[v].key != kNone;
  STRATA_RETURN_IF_ERROR(MoveDown(v));
  free_.erase(std::find(free_.begin(), free_.end(), v));
  const ExpertEntry &en = table_.entry(table_.LayerOf(key), table_.ExpertOf(key));
  const uint8_t *src = ram.gate.data - en.part[0].slot_offset;  // the RAM slot's first byte
  const uint64_t bytes = SpanBytes(key);
  if (absl::Status st = device_->CopyIn(static_cast<uint32_t>(v), src, bytes); !st.ok()) {
    free_.push_back(v);
    return st;
  }
  Slot &sl = slots_[v];
  uint8_t *dst = device_->slot(static_cast<uint32_t>(v));
  sl.key = key;
  sl.last_use = ++tick_;
  sl.views = ram;
  sl.views.gate.data = dst + en.part[0].slot_offset;
  sl.views.up.data = dst + en.part[1].slot_offset;
  sl.views.down.data = dst + en.part[2].slot_offset;
  key_slot_[key] = v;
  floor_ = std::min(floor_, heat_[key]);
  ++stats_.promotions;
  stats_.bytes_up += bytes;
  if (swap) ++swaps_;
  return absl::OkStatus();
}

absl::Status VramTier::Promote(uint32_t key, const model::ExpertWeights &ram) {
  if (Holds(key)) return absl::OkStatus();
  const int v = SlotFor(key, swaps_ < opts_.max_swaps_per_call);
  if (v < 0) return absl::OkStatus();
  STRATA_RETURN_IF_ERROR(MoveUp(key, ram, v));
  moved_up_.push_back(key);
  return absl::OkStatus();
}

void VramTier::Unpin() {
  for (int s : pinned_) --slots_[s].pins;
  pinned_.clear();
}

absl::Status VramTier::AcquireImpl(int layer, const std::vector<int32_t> &experts,
                                   std::vector<const model::ExpertWeights *> *out, bool wait) {
  out->assign(experts.size(), nullptr);
  pinned_.clear();
  below_experts_.clear();
  moved_up_.clear();
  swaps_ = 0;
  std::vector<size_t> below_at;
  for (size_t i = 0; i < experts.size(); ++i) {
    const uint32_t key = table_.Key(layer, experts[i]);
    const int s = key_slot_[key];
    if (s >= 0) {
      Slot &sl = slots_[s];
      ++sl.pins;
      sl.last_use = ++tick_;
      pinned_.push_back(s);
      (*out)[i] = &sl.views;
      ++stats_.hits;
    } else {
      below_experts_.push_back(experts[i]);
      below_at.push_back(i);
    }
  }
  // The tier below is asked even for nothing: its predictions for this layer start there.
  std::vector<const model::ExpertWeights *> got;
  absl::Status st =
      wait ? below_->Acquire(layer, below_experts_, &got) : below_->AcquireAsync(layer, below_experts_, &got);
  if (!st.ok()) {
    Unpin();
    return st;
  }
  layer_ = layer;
  for (size_t j = 0; j < below_at.size(); ++j) (*out)[below_at[j]] = got[j];
  for (size_t j = 0; j < below_at.size(); ++j) {
    if (got[j] == nullptr) continue;  // still loading: Await moves it up
    st = Promote(table_.Key(layer, below_experts_[j]), *got[j]);
    if (!st.ok()) {
      Release(layer, experts);
      return st;
    }
  }
  return absl::OkStatus();
}

absl::Status VramTier::Acquire(int layer, const std::vector<int32_t> &experts,
                               std::vector<const model::ExpertWeights *> *out) {
  return AcquireImpl(layer, experts, out, /*wait=*/true);
}

absl::Status VramTier::AcquireAsync(int layer, const std::vector<int32_t> &experts,
                                    std::vector<const model::ExpertWeights *> *out) {
  return AcquireImpl(layer, experts, out, /*wait=*/false);
}

absl::StatusOr<const model::ExpertWeights *> VramTier::Await(int layer, int32_t expert) {
  STRATA_ASSIGN_OR_RETURN(const model::ExpertWeights *w, below_->Await(layer, expert));
  STRATA_RETURN_IF_ERROR(Promote(table_.Key(layer, expert), *w));
  return w;  // this call computes from RAM; the next one from the slot
}

void VramTier::Release(int layer, const std::vector<int32_t> &experts) {
  Unpin();
  // Every expert of the call goes back to the tier below, those served here too: it marked them
  // all as needed by this layer when it routed.
  below_->Release(layer, experts);
  // An expert still in use below keeps its copy there until the RAM tier evicts it.
  for (uint32_t key : moved_up_) below_->Evict(key);
  moved_up_.clear();
  below_experts_.clear();
  layer_ = -1;
}

absl::Status VramTier::Admit(uint32_t key, const SlotBytes &from) {
  if (key >= key_slot_.size()) return Errorf(MOE_ERR_INVALID_ARGUMENT, "expert key %u is out of range", key);
  if (Holds(key)) return absl::OkStatus();
  if (from.host == nullptr) return Errorf(MOE_ERR_INTERNAL, "a VRAM slot is filled from host memory");
  const int v = SlotFor(key, /*may_swap=*/true);
  if (v < 0) return Errorf(MOE_ERR_NO_MEMORY, "no VRAM expert slot is free for expert key %u", key);
  model::ExpertWeights ram = *table_.entry(table_.LayerOf(key), table_.ExpertOf(key)).weights;
  const ExpertEntry &en = table_.entry(table_.LayerOf(key), table_.ExpertOf(key));
  ram.gate.data = from.host + en.part[0].slot_offset;
  ram.up.data = from.host + en.part[1].slot_offset;
  ram.down.data = from.host + en.part[2].slot_offset;
  return MoveUp(key, ram, v);
}

bool VramTier::Evict(uint32_t key) {
  if (!Holds(key) || slots_[key_slot_[key]].pins > 0) return false;
  return MoveDown(key_slot_[key]).ok();
}

absl::StatusOr<size_t> VramTier::Seed(const std::vector<uint32_t> &keys, size_t max) {
  size_t moved = 0;
  for (uint32_t key : keys) {
    if (moved >= max || free_.empty()) break;
    if (key >= key_slot_.size() || Holds(key)) continue;
    const int layer = table_.LayerOf(key);
    const int32_t x = table_.ExpertOf(key);
    if (table_.entry(layer, x).weights == nullptr) continue;  // a dense layer
    std::vector<const model::ExpertWeights *> w;
    STRATA_RETURN_IF_ERROR(below_->Acquire(layer, {x}, &w));
    absl::Status st = MoveUp(key, *w[0], free_.back());
    below_->Release(layer, {x});
    STRATA_RETURN_IF_ERROR(st);
    below_->Evict(key);
    ++moved;
  }
  return moved;
}

TierStats VramTier::tier_stats() const {
  TierStats t;
  t.hits = stats_.hits;
  t.admitted = stats_.promotions;
  t.evicted = stats_.demotions + stats_.dropped;
  t.bytes_in = stats_.bytes_up;
  t.n_slots = stats_.n_slots;
  t.slot_bytes = stats_.slot_bytes;
  return t;
}

VramTierStats VramTier::stats() const { return stats_; }

void VramTier::ResetStats() {
  const VramTierStats keep = stats_;
  stats_ = VramTierStats();
  stats_.n_slots = keep.n_slots;
  stats_.slot_bytes = keep.slot_bytes;
}

std::vector<uint32_t> VramTier::ResidentKeys() const {
  std::vector<uint32_t> keys;
  for (const Slot &sl : slots_) {
    if (sl.key != kNone) keys.push_back(sl.key);
  }
  std::sort(keys.begin(), keys.end());
  return keys;
}

}  // namespace strata::store
