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
  uint32_t n = std::min(options.n_slots, n_keys);
  uint64_t n_routed = 0;
  for (uint32_t key = 0; key < n_keys; ++key) {
    if (table.entry(table.LayerOf(key), table.ExpertOf(key)).weights != nullptr) ++n_routed;
  }
  const uint64_t below_slots = below->tier_stats().n_slots;
  t->complete_ = uint64_t{n} + below_slots >= n_routed + 1;
  t->tables_ = t->complete_ && device->EnableTables();
  if (t->tables_) {
    // What the tables took comes out of the slots, while the tiers stay complete.
    const uint64_t less = (device->tables_bytes() + table.slot_bytes() - 1) / table.slot_bytes();
    if (less < n && uint64_t{n} - less + below_slots >= n_routed + 1) n -= static_cast<uint32_t>(less);
  }
  STRATA_RETURN_IF_ERROR(device->Allocate(n, table.slot_bytes()));
  t->slots_.resize(n);
  t->free_.reserve(n);
  for (uint32_t s = n; s-- > 0;) t->free_.push_back(static_cast<int>(s));  // slot 0 is taken first
  t->key_slot_.assign(n_keys, -1);
  t->stats_.n_slots = n;
  t->stats_.slot_bytes = table.slot_bytes();
  t->candidate_.assign(n_keys, 0);
  t->moving_up_.assign(n_keys, 0);
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

absl::Status VramTier::OnDecodeToken() {
  pass_layer_major_ = false;
  STRATA_RETURN_IF_ERROR(LandSwaps());
  if (heat_.OnDecodeToken()) floor_ >>= 1;
  // A prompt's re-plan left over goes on at its own pace and z until it is done.
  if (backlog_) return Rebalance(opts_.replan_moves, opts_.replan_z);
  return Rebalance(opts_.swaps_per_step, opts_.promote_z);
}

absl::Status VramTier::OnPromptDone() {
  pass_layer_major_ = false;
  STRATA_RETURN_IF_ERROR(LandSwaps());
  return Rebalance(opts_.replan_moves, opts_.replan_z);
}

VramTier::~VramTier() { (void)Drain(); }

void VramTier::AddCandidate(uint32_t key) {
  if (candidate_[key]) return;
  candidate_[key] = 1;
  candidates_.push_back(key);
}

absl::Status VramTier::PointAt(uint32_t key, const model::ExpertWeights &views) {
  if (!tables_) return absl::OkStatus();
  return device_->Point(table_.LayerOf(key), table_.ExpertOf(key), views);
}

absl::Status VramTier::Rebalance(int max, double z) {
  if (!complete_) return absl::OkStatus();
  STRATA_RETURN_IF_ERROR(Advance(/*wait=*/false));
  if (candidates_.empty()) return absl::OkStatus();
  std::sort(candidates_.begin(), candidates_.end(), [&](uint32_t a, uint32_t b) {
    return heat_[a] != heat_[b] ? heat_[a] > heat_[b] : a < b;
  });
  absl::Status st = absl::OkStatus();
  int started = 0;
  // Stopped by `max`, the moves in flight or a full tier below (not by the rule): the candidates
  // not looked at stay for the next pass.
  size_t cut = candidates_.size();
  bool settled = false;  // the rule stopped the pass: no later candidate would move
  for (size_t i = 0; i < candidates_.size(); ++i) {
    const uint32_t key = candidates_[i];
    if (st.ok() && !settled && (started >= max || moves_.size() >= static_cast<size_t>(opts_.max_moves))) {
      cut = i;
      break;
    }
    if (!st.ok() || settled || Holds(key) || moving_up_[key]) {
      candidate_[key] = 0;
      continue;
    }
    const model::ExpertWeights *ram = below_->ReadyViews(key);
    if (ram == nullptr) {
      candidate_[key] = 0;
      continue;
    }
    // Candidates come hottest first and the victim is the coldest: once one fails, all later do.
    const int v = SlotFor(key, /*may_swap=*/true, z);
    if (v < 0) {
      candidate_[key] = 0;
      settled = true;
      continue;
    }
    const model::ExpertWeights views = *ram;
    absl::StatusOr<bool> began = StartMove(key, views, v);
    if (began.ok() && !*began && !moves_.empty()) {
      // No free RAM slot for the victim: moves whose copies are complete free theirs.
      const size_t before = moves_.size();
      st = FenceQueued();
      if (st.ok()) st = Advance(/*wait=*/false);
      if (st.ok() && moves_.size() < before && !Holds(key) && !moving_up_[key] && below_->ReadyViews(key) != nullptr) {
        const int v2 = SlotFor(key, /*may_swap=*/true, z);
        began = v2 < 0 ? absl::StatusOr<bool>(false) : StartMove(key, *below_->ReadyViews(key), v2);
      }
    }
    if (!began.ok()) {
      st = began.status();
      candidate_[key] = 0;
      continue;
    }
    if (!*began) {  // no free RAM slot for the victim until moves in flight finish
      cut = i;
      break;
    }
    candidate_[key] = 0;
    ++started;
  }
  candidates_.erase(candidates_.begin(), candidates_.begin() + static_cast<std::ptrdiff_t>(cut));
  backlog_ = !candidates_.empty() && st.ok();
  if (started > 0) ++stats_.rebalances;
  STRATA_RETURN_IF_ERROR(FenceQueued());
  STRATA_RETURN_IF_ERROR(st);
  // A device that copies synchronously (or fast) has them complete already.
  return Advance(/*wait=*/false);
}

absl::StatusOr<bool> VramTier::StartMove(uint32_t key, const model::ExpertWeights &ram, int v) {
  Slot &sl = slots_[v];
  Move m;
  m.up = key;
  m.slot = v;
  if (sl.key == kNone) {
    const ExpertEntry &en = table_.entry(table_.LayerOf(key), table_.ExpertOf(key));
    STRATA_RETURN_IF_ERROR(device_->QueueCopyIn(static_cast<uint32_t>(v), ram.gate.data - en.part[0].slot_offset,
                                                SpanBytes(key)));
    free_.erase(std::find(free_.begin(), free_.end(), v));
    m.up_half = true;
  } else {
    // The victim's bytes go down first, into a RAM slot reserved for it; it is read from this slot
    // until they are there.
    uint8_t *dst = below_->Reserve(sl.key);
    if (dst == nullptr) return false;
    if (absl::Status st = device_->QueueCopyOut(static_cast<uint32_t>(v), dst, SpanBytes(sl.key)); !st.ok()) {
      below_->Complete(sl.key, /*ok=*/false);
      return st;
    }
    m.down = sl.key;
  }
  sl.moving = true;
  moving_up_[key] = 1;
  moves_.push_back(m);
  stats_.moving = static_cast<uint32_t>(moves_.size());
  return true;
}

absl::Status VramTier::FenceQueued() {
  bool queued = false;
  for (const Move &m : moves_) queued = queued || !m.fenced;
  if (!queued) return absl::OkStatus();
  STRATA_ASSIGN_OR_RETURN(const uint64_t t, device_->Fence());
  for (Move &m : moves_) {
    if (m.fenced) continue;
    m.ticket = t;
    m.fenced = true;
  }
  return absl::OkStatus();
}

absl::Status VramTier::Advance(bool wait) {
  while (!moves_.empty()) {
    // Tickets are reached in order: the newest one reached finishes every half up to it.
    uint64_t newest = 0;
    for (const Move &m : moves_) newest = std::max(newest, m.fenced ? m.ticket : 0);
    if (newest > reached_) {
      std::vector<uint64_t> tickets;
      for (const Move &m : moves_) {
        if (m.fenced && m.ticket > reached_) tickets.push_back(m.ticket);
      }
      std::sort(tickets.begin(), tickets.end());
      tickets.erase(std::unique(tickets.begin(), tickets.end()), tickets.end());
      if (wait) tickets.erase(tickets.begin(), tickets.end() - 1);  // the newest covers the rest
      for (uint64_t t : tickets) {
        STRATA_ASSIGN_OR_RETURN(const bool done, device_->Reached(t, wait));
        if (!done) break;
        reached_ = t;
      }
    }
    bool finished = false;
    absl::Status st = absl::OkStatus();
    for (size_t i = 0; i < moves_.size() && st.ok();) {
      Move &m = moves_[i];
      if (!m.fenced || m.ticket > reached_) {
        ++i;
        continue;
      }
      finished = true;
      Slot &sl = slots_[m.slot];
      if (m.swap) {
        // Both halves landed: the victim is read from RAM, the expert from its slot (already).
        if (m.down != kNone) {
          below_->Complete(m.down, /*ok=*/true);
          ++stats_.demotions;
          stats_.bytes_down += SpanBytes(m.down);
          const model::ExpertWeights *down_ram = below_->ReadyViews(m.down);
          if (down_ram != nullptr) {
            st = PointAt(m.down, *down_ram);
          } else {
            routable_ = false;
          }
        }
        sl.moving = false;
        ++stats_.promotions;
        stats_.bytes_up += SpanBytes(m.up);
        if (st.ok()) st = PointAt(m.up, sl.views);
        below_->Evict(m.up);  // its RAM slot is free for the next victim (a duplicate if in use)
        moves_.erase(moves_.begin() + static_cast<std::ptrdiff_t>(i));
        continue;
      }
      if (!m.up_half) {
        // The victim's bytes are in RAM: it is read there from the next step on, and the slot takes
        // `up`'s bytes after the steps queued so far, which may still read the victim here.
        below_->Complete(m.down, /*ok=*/true);
        ++stats_.demotions;
        stats_.bytes_down += SpanBytes(m.down);
        key_slot_[m.down] = -1;
        sl.key = kNone;
        const model::ExpertWeights *down_ram = below_->ReadyViews(m.down);
        if (down_ram != nullptr) {
          st = PointAt(m.down, *down_ram);
        } else {
          routable_ = false;
        }
        const model::ExpertWeights *ram = below_->ReadyViews(m.up);
        absl::Status cp = st;
        if (cp.ok() && ram != nullptr) {
          const ExpertEntry &en = table_.entry(table_.LayerOf(m.up), table_.ExpertOf(m.up));
          cp = device_->QueueCopyIn(static_cast<uint32_t>(m.slot), ram->gate.data - en.part[0].slot_offset,
                                    SpanBytes(m.up));
        }
        if (cp.ok() && ram != nullptr) {
          m.up_half = true;
          m.fenced = false;
          ++i;
          continue;
        }
        st = cp;  // `up` left RAM on its own, or the copy failed: the move ends with a free slot
      } else {
        const ExpertEntry &en = table_.entry(table_.LayerOf(m.up), table_.ExpertOf(m.up));
        uint8_t *dst = device_->slot(static_cast<uint32_t>(m.slot));
        const model::ExpertWeights *ram = below_->ReadyViews(m.up);
        if (ram != nullptr) {
          sl.key = m.up;
          sl.last_use = ++tick_;
          sl.views = *ram;
          sl.views.gate.data = dst + en.part[0].slot_offset;
          sl.views.up.data = dst + en.part[1].slot_offset;
          sl.views.down.data = dst + en.part[2].slot_offset;
          sl.moving = false;
          key_slot_[m.up] = m.slot;
          floor_ = std::min(floor_, heat_[m.up]);
          ++stats_.promotions;
          stats_.bytes_up += SpanBytes(m.up);
          moving_up_[m.up] = 0;
          st = PointAt(m.up, sl.views);
          below_->Evict(m.up);  // its RAM slot is free for the next victim
          moves_.erase(moves_.begin() + static_cast<std::ptrdiff_t>(i));
          continue;
        }
      }
      // The move ends with the slot free.
      sl.moving = false;
      sl.key = kNone;
      free_.push_back(m.slot);
      moving_up_[m.up] = 0;
      moves_.erase(moves_.begin() + static_cast<std::ptrdiff_t>(i));
    }
    stats_.moving = static_cast<uint32_t>(moves_.size());
    STRATA_RETURN_IF_ERROR(st);
    STRATA_RETURN_IF_ERROR(FenceQueued());
    if (!finished) {
      if (!wait) break;
      // Waiting: nothing finished means the newest ticket is not reached, which wait rules out.
      return Errorf(MOE_ERR_INTERNAL, "the VRAM tier's copies did not complete");
    }
  }
  return absl::OkStatus();
}

absl::Status VramTier::Drain() { return Advance(/*wait=*/true); }

absl::Status VramTier::Settle() {
  if (!tables_) return absl::OkStatus();
  STRATA_RETURN_IF_ERROR(LandSwaps());  // a failed pass's
  if (routable_ && below_->own_evictions() == evictions_seen_) return absl::OkStatus();
  // Every move finishes first: its experts are then in one place each.
  STRATA_RETURN_IF_ERROR(Drain());
  routable_ = false;
  evictions_seen_ = below_->own_evictions();
  const uint32_t n_keys = static_cast<uint32_t>(key_slot_.size());
  // Residents first: a RAM copy of one is a duplicate (a promotion whose copy was in use), given up
  // so the RAM tier has room for what it lacks.
  for (uint32_t key = 0; key < n_keys; ++key) {
    const int s = key_slot_[key];
    if (s < 0) continue;
    below_->Evict(key);
    STRATA_RETURN_IF_ERROR(PointAt(key, slots_[s].views));
  }
  bool loading = false;
  std::vector<uint32_t> absent;
  for (uint32_t key = 0; key < n_keys; ++key) {
    if (key_slot_[key] >= 0 || table_.entry(table_.LayerOf(key), table_.ExpertOf(key)).weights == nullptr) continue;
    const model::ExpertWeights *ram = below_->ReadyViews(key);
    if (ram != nullptr) {
      // Free slots take RAM's experts first (nothing to swap), which makes room below.
      if (!free_.empty()) {
        const model::ExpertWeights views = *ram;
        STRATA_RETURN_IF_ERROR(MoveUp(key, views, free_.back()));
        below_->Evict(key);
        continue;
      }
      STRATA_RETURN_IF_ERROR(PointAt(key, *ram));
    } else if (below_->Holds(key)) {
      loading = true;  // on its way in: the next step looks again
    } else {
      absent.push_back(key);
    }
  }
  if (loading) return absl::OkStatus();
  // What neither tier holds is read now, through the tier below, a layer's run at once.
  for (size_t i = 0; i < absent.size();) {
    const int layer = table_.LayerOf(absent[i]);
    std::vector<int32_t> xs;
    for (; i < absent.size() && table_.LayerOf(absent[i]) == layer && xs.size() < 64; ++i) {
      xs.push_back(table_.ExpertOf(absent[i]));
    }
    std::vector<const model::ExpertWeights *> w;
    STRATA_RETURN_IF_ERROR(below_->Acquire(layer, xs, &w));
    absl::Status st = absl::OkStatus();
    for (size_t j = 0; j < xs.size() && st.ok(); ++j) st = PointAt(table_.Key(layer, xs[j]), *w[j]);
    below_->Release(layer, xs);
    STRATA_RETURN_IF_ERROR(st);
  }
  if (below_->own_evictions() != evictions_seen_) return absl::OkStatus();  // something moved: look again
  routable_ = true;
  return absl::OkStatus();
}

std::vector<uint32_t> VramTier::OpeningKeys(const std::vector<uint32_t> &hot) const {
  std::vector<uint32_t> keys;
  std::vector<char> taken(key_slot_.size(), 0);
  for (uint32_t key : hot) {
    if (key < taken.size() && !taken[key] && keys.size() < slots_.size()) {
      taken[key] = 1;
      keys.push_back(key);
    }
  }
  std::vector<int> layers;
  for (int l = 0; l < table_.n_layers(); ++l) {
    if (table_.entry(l, 0).weights != nullptr) layers.push_back(l);
  }
  if (layers.empty()) return keys;
  // An equal share of each layer's experts (the first layers take the remainder), then any.
  const size_t left = slots_.size() - keys.size();
  const size_t share = left / layers.size(), extra = left % layers.size();
  for (size_t j = 0; j < layers.size(); ++j) {
    size_t want = share + (j < extra ? 1 : 0);
    for (int x = 0; x < table_.n_experts() && want > 0; ++x) {
      const uint32_t key = table_.Key(layers[j], x);
      if (taken[key]) continue;
      taken[key] = 1;
      keys.push_back(key);
      --want;
    }
  }
  return keys;
}

void VramTier::OnNewPrompt() {
  heat_.OnNewPrompt();
  floor_ = 0;
}

int VramTier::SlotFor(uint32_t key, bool may_swap, double z, int max_layer) {
  if (!free_.empty()) return free_.back();
  if (!may_swap) return -1;
  const uint32_t h = heat_[key];
  if (floor_ok_ && !model::MarkedlyHotter(h, floor_, z)) return -1;
  // The coldest resident not in use (least recently used among equals); the floor covers every
  // resident, those in use too, so it stays a bound once they are released.
  int v = -1;
  uint32_t v_heat = 0, floor = UINT32_MAX;
  for (size_t s = 0; s < slots_.size(); ++s) {
    const Slot &sl = slots_[s];
    if (sl.key == kNone || sl.moving) continue;
    const uint32_t sh = heat_[sl.key];
    floor = std::min(floor, sh);
    if (sl.pins > 0 || table_.LayerOf(sl.key) > max_layer) continue;
    if (v < 0 || sh < v_heat || (sh == v_heat && sl.last_use < slots_[v].last_use)) {
      v = static_cast<int>(s);
      v_heat = sh;
    }
  }
  floor_ = floor;
  floor_ok_ = true;
  if (v < 0 || !model::MarkedlyHotter(h, v_heat, z)) return -1;
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
    if (tables_) {
      const model::ExpertWeights *ram = below_->ReadyViews(key);
      if (ram != nullptr) {
        STRATA_RETURN_IF_ERROR(PointAt(key, *ram));
      } else {
        routable_ = false;
      }
    }
  } else if (StatusToMoe(st) == MOE_ERR_NO_MEMORY) {
    ++stats_.dropped;  // no room below: it goes back to the file
    routable_ = false;
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
  return PointAt(key, sl.views);
}

absl::Status VramTier::Promote(uint32_t key, const model::ExpertWeights &ram) {
  if (Holds(key) || moving_up_[key]) return absl::OkStatus();
  // Complete tiers swap between steps only (Rebalance): here just into a free slot.
  const int v = SlotFor(key, !complete_ && swaps_ < opts_.max_swaps_per_call, opts_.promote_z);
  if (v < 0) {
    if (complete_) AddCandidate(key);
    return absl::OkStatus();
  }
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
  if (pass_layer_major_ && !moves_.empty()) {
    // The pass's earlier moves progress; one of this layer's (a previous pass's) lands first.
    STRATA_RETURN_IF_ERROR(Moving(layer) ? Drain() : Advance(/*wait=*/false));
  }
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
  if (pass_layer_major_ && complete_ && !below_at.empty()) {
    st = PassSwaps(layer, below_at, got, out);
    if (!st.ok()) {
      Release(layer, experts);
      return st;
    }
  }
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

bool VramTier::Moving(int layer) const {
  for (const Move &m : moves_) {
    if (table_.LayerOf(m.up) == layer || (m.down != kNone && table_.LayerOf(m.down) == layer)) return true;
  }
  return false;
}

absl::Status VramTier::PassSwaps(int layer, const std::vector<size_t> &below_at,
                                 const std::vector<const model::ExpertWeights *> &got,
                                 std::vector<const model::ExpertWeights *> *out) {
  std::vector<size_t> order;  // into below_at, hottest first
  for (size_t j = 0; j < below_at.size(); ++j) {
    if (got[j] != nullptr) order.push_back(j);
  }
  auto key_of = [&](size_t j) { return table_.Key(layer, below_experts_[j]); };
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const uint32_t ka = key_of(a), kb = key_of(b);
    return heat_[ka] != heat_[kb] ? heat_[ka] > heat_[kb] : ka < kb;
  });
  int started = 0;
  absl::Status st = absl::OkStatus();
  for (size_t j : order) {
    if (started >= opts_.pass_moves || moves_.size() >= static_cast<size_t>(opts_.max_moves)) break;
    const uint32_t key = key_of(j);
    if (Holds(key) || moving_up_[key]) continue;
    // Hottest first against the coldest resident: once one stays, so do the rest.
    const int v = SlotFor(key, /*may_swap=*/true, opts_.replan_z, layer);
    if (v < 0) break;
    Slot &sl = slots_[v];
    const ExpertEntry &en = table_.entry(layer, below_experts_[j]);
    const uint8_t *src = got[j]->gate.data - en.part[0].slot_offset;  // its RAM slot's first byte
    Move m;
    m.up = key;
    m.slot = v;
    m.up_half = true;
    m.swap = true;
    if (sl.key == kNone) {
      st = device_->QueueCopyIn(static_cast<uint32_t>(v), src, SpanBytes(key));
      if (!st.ok()) break;
      free_.erase(std::find(free_.begin(), free_.end(), v));
    } else {
      uint8_t *dst = below_->Reserve(sl.key);
      if (dst == nullptr) break;  // no free RAM slot for the victim until moves in flight land
      m.down = sl.key;
      key_slot_[m.down] = -1;
      st = device_->QueueSwap(static_cast<uint32_t>(v), dst, SpanBytes(m.down), src, SpanBytes(key));
      if (!st.ok()) {
        // Neither copy can be trusted: the victim is in neither tier (Settle reads it again).
        below_->Complete(m.down, /*ok=*/false);
        sl.key = kNone;
        free_.push_back(v);
        routable_ = false;
        break;
      }
    }
    // The slot is the expert's from these copies on: this call computes it there.
    uint8_t *d = device_->slot(static_cast<uint32_t>(v));
    sl.key = key;
    sl.moving = true;
    sl.last_use = ++tick_;
    sl.views = *got[j];
    sl.views.gate.data = d + en.part[0].slot_offset;
    sl.views.up.data = d + en.part[1].slot_offset;
    sl.views.down.data = d + en.part[2].slot_offset;
    ++sl.pins;
    pinned_.push_back(v);
    key_slot_[key] = v;
    floor_ = std::min(floor_, heat_[key]);
    (*out)[below_at[j]] = &sl.views;
    moves_.push_back(m);
    ++started;
  }
  stats_.moving = static_cast<uint32_t>(moves_.size());
  if (started == 0) return st;
  ++stats_.rebalances;
  STRATA_RETURN_IF_ERROR(FenceQueued());
  STRATA_RETURN_IF_ERROR(device_->ComputeAfterQueued());
  return st;
}

absl::Status VramTier::LandSwaps() {
  for (const Move &m : moves_) {
    if (m.swap) return Drain();
  }
  return absl::OkStatus();
}

absl::Status VramTier::Admit(uint32_t key, const SlotBytes &from) {
  if (key >= key_slot_.size()) return Errorf(MOE_ERR_INVALID_ARGUMENT, "expert key %u is out of range", key);
  if (Holds(key)) return absl::OkStatus();
  if (from.host == nullptr) return Errorf(MOE_ERR_INTERNAL, "a VRAM slot is filled from host memory");
  const int v = SlotFor(key, /*may_swap=*/true, opts_.promote_z);
  if (v < 0) return Errorf(MOE_ERR_NO_MEMORY, "no VRAM expert slot is free for expert key %u", key);
  model::ExpertWeights ram = *table_.entry(table_.LayerOf(key), table_.ExpertOf(key)).weights;
  const ExpertEntry &en = table_.entry(table_.LayerOf(key), table_.ExpertOf(key));
  ram.gate.data = from.host + en.part[0].slot_offset;
  ram.up.data = from.host + en.part[1].slot_offset;
  ram.down.data = from.host + en.part[2].slot_offset;
  return MoveUp(key, ram, v);
}

bool VramTier::Evict(uint32_t key) {
  if (!Holds(key) || slots_[key_slot_[key]].pins > 0 || slots_[key_slot_[key]].moving) return false;
  return MoveDown(key_slot_[key]).ok();
}

absl::StatusOr<size_t> VramTier::Seed(const std::vector<uint32_t> &keys, size_t max) {
  size_t moved = 0;
  for (size_t i = 0; i < keys.size() && moved < max && !free_.empty();) {
    // A run of one layer's keys (at most the free slots left) is read at once by the tier below.
    const int layer = keys[i] < key_slot_.size() ? table_.LayerOf(keys[i]) : -1;
    std::vector<int32_t> xs;
    const size_t room = std::min<size_t>({64, max - moved, free_.size()});
    for (; i < keys.size() && xs.size() < room; ++i) {
      const uint32_t key = keys[i];
      if (key >= key_slot_.size() || table_.LayerOf(key) != layer) break;
      const int32_t x = table_.ExpertOf(key);
      if (Holds(key) || table_.entry(layer, x).weights == nullptr) continue;  // held, or a dense layer
      if (std::find(xs.begin(), xs.end(), x) == xs.end()) xs.push_back(x);
    }
    if (xs.empty()) {
      if (i < keys.size() && keys[i] >= key_slot_.size()) ++i;  // out of range: skipped
      continue;
    }
    std::vector<const model::ExpertWeights *> w;
    STRATA_RETURN_IF_ERROR(below_->Acquire(layer, xs, &w));
    absl::Status st = absl::OkStatus();
    size_t up = 0;
    for (; up < xs.size(); ++up) {
      st = MoveUp(table_.Key(layer, xs[up]), *w[up], free_.back());
      if (!st.ok()) break;
    }
    below_->Release(layer, xs);
    for (size_t j = 0; j < up; ++j) below_->Evict(table_.Key(layer, xs[j]));  // the copies are up
    STRATA_RETURN_IF_ERROR(st);
    moved += xs.size();
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
