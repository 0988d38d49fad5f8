// The VRAM tier over the RAM tier, on the CPU: its policy against a recorded lower tier (moves up
// into free slots, swaps only for markedly hotter experts, residents moved down rather than
// dropped, distinct experts in the two tiers, the bytes carried intact, failures leaving nothing
// acquired), and whole contexts whose device is host memory (the tests' DeviceSlots): logits at
// several (RAM, VRAM) budget pairs bit-identical to the all-resident run, with every expert use
// counted once by one tier, and the plan's three-tier arithmetic.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "include/strata/moe.h"
#include "lib/runtime/context.h"
#include "lib/store/vram_tier.h"
#include "tests/model/golden_util.h"

namespace {

using strata::store::DeviceSlots;
using strata::store::ExpertTable;
using strata::store::ExpertTier;
using strata::store::SlotBytes;
using strata::store::TierStats;
using strata::store::VramTier;
using strata::store::VramTierOptions;
using strata::testing::kGolden;
using strata::testing::ReadBinary;

// A device whose memory is host memory: what the CPU backend reads views from. Poisoned when
// allocated, so a view into a slot that was never filled reads garbage, not zeros.
class HostSlots final : public DeviceSlots {
 public:
  std::string_view name() const override { return "host"; }
  absl::Status Allocate(uint32_t n, uint64_t slot_bytes) override {
    stride_ = slot_bytes;
    mem_.assign(static_cast<size_t>(n) * slot_bytes, 0xA5);
    n_ = n;
    return absl::OkStatus();
  }
  uint8_t *slot(uint32_t s) const override { return const_cast<uint8_t *>(mem_.data()) + s * stride_; }
  absl::Status CopyIn(uint32_t s, const uint8_t *src, uint64_t bytes) override {
    ++copies_in;
    if (fail_next) {
      fail_next = false;
      return strata::Errorf(MOE_ERR_BACKEND, "injected device copy failure");
    }
    REQUIRE(s < n_);
    REQUIRE(bytes <= stride_);
    std::memcpy(slot(s), src, bytes);
    return absl::OkStatus();
  }
  absl::Status CopyOut(uint32_t s, uint8_t *dst, uint64_t bytes) override {
    ++copies_out;
    REQUIRE(s < n_);
    std::memcpy(dst, slot(s), bytes);
    return absl::OkStatus();
  }
  // Deferred mode: queued copies are only recorded, and made (in order) when a Reached lands them:
  // while `landing` is off a ticket is not reached, so the slots and RAM keep their old bytes and a
  // table pointed too early reads the wrong ones.
  absl::Status QueueCopyIn(uint32_t s, const uint8_t *src, uint64_t bytes) override {
    if (!defer) return CopyIn(s, src, bytes);
    REQUIRE(s < n_);
    REQUIRE(bytes <= stride_);
    ++queued;
    pending_.push_back({slot(s), src, bytes});
    return absl::OkStatus();
  }
  absl::Status QueueCopyOut(uint32_t s, uint8_t *dst, uint64_t bytes) override {
    if (!defer) return CopyOut(s, dst, bytes);
    REQUIRE(s < n_);
    ++queued;
    pending_.push_back({dst, slot(s), bytes});
    return absl::OkStatus();
  }
  absl::Status QueueSwap(uint32_t s, uint8_t *down_dst, uint64_t down_bytes, const uint8_t *up_src,
                         uint64_t up_bytes) override {
    ++swaps;
    if (!defer) return DeviceSlots::QueueSwap(s, down_dst, down_bytes, up_src, up_bytes);
    REQUIRE(s < n_);
    REQUIRE(up_bytes <= stride_);
    queued += 2;
    pending_.push_back({down_dst, slot(s), down_bytes});
    pending_.push_back({slot(s), up_src, up_bytes});
    return absl::OkStatus();
  }
  // A computation after this reads what every queued copy wrote: they are made now (their tickets
  // are still reached only when `landing` says).
  absl::Status ComputeAfterQueued() override {
    ++joins;
    for (size_t i = made_; i < pending_.size(); ++i) std::memcpy(pending_[i].dst, pending_[i].src, pending_[i].bytes);
    made_ = pending_.size();
    return absl::OkStatus();
  }
  absl::StatusOr<uint64_t> Fence() override {
    if (!defer) return uint64_t{0};
    fences_.push_back(pending_.size());
    return fences_.size();
  }
  absl::StatusOr<bool> Reached(uint64_t ticket, bool wait) override {
    if (!defer) return true;
    REQUIRE(ticket >= 1);
    REQUIRE(ticket <= fences_.size());
    if (ticket <= landed_) return true;
    if (!landing && !wait) return false;
    for (size_t i = made_; i < fences_[ticket - 1]; ++i) std::memcpy(pending_[i].dst, pending_[i].src, pending_[i].bytes);
    made_ = std::max(made_, fences_[ticket - 1]);
    landed_ = ticket;
    return true;
  }
  bool defer = false, landing = true;
  int queued = 0, swaps = 0, joins = 0;

  // Device tables: each entry as pointed, checked by the test against the file's bytes.
  bool EnableTables() override { return tables_on; }
  absl::Status Point(int layer, int expert, const strata::model::ExpertWeights &where) override {
    REQUIRE(tables_on);
    entries[{layer, expert}] = where;
    ++points;
    return absl::OkStatus();
  }
  int copies_in = 0, copies_out = 0, points = 0;
  bool fail_next = false;
  static inline bool tables_on = false;
  std::map<std::pair<int, int>, strata::model::ExpertWeights> entries;

 private:
  struct Pending {
    uint8_t *dst;
    const uint8_t *src;
    uint64_t bytes;
  };
  std::vector<uint8_t> mem_;
  uint64_t stride_ = 0;
  uint32_t n_ = 0;
  std::vector<Pending> pending_;
  std::vector<size_t> fences_;  // a ticket's end in pending_
  size_t made_ = 0;
  uint64_t landed_ = 0;
};

// Device tables on for the HostSlots made in its lifetime.
struct TablesOn {
  TablesOn() { HostSlots::tables_on = true; }
  ~TablesOn() { HostSlots::tables_on = false; }
};

HostSlots *g_last_slots = nullptr;  // the device of the context opened last
std::unique_ptr<DeviceSlots> MakeHostSlots() {
  auto d = std::make_unique<HostSlots>();
  g_last_slots = d.get();
  return d;
}

struct TestDevice {
  TestDevice() { strata::store::SetDeviceSlotsForTesting(&MakeHostSlots); }
  ~TestDevice() { strata::store::SetDeviceSlotsForTesting(nullptr); }
};

// A RAM tier that starts with every expert (random bytes a key) and records what the tier above
// does with it; the bytes an expert comes back with are checked against its original ones.
class RecordingTier final : public ExpertTier {
 public:
  RecordingTier(const ExpertTable &t, uint32_t seed) : t_(t) {
    std::mt19937 rng(seed);
    const uint32_t n = static_cast<uint32_t>(t.n_layers() * t.n_experts());
    for (uint32_t key = 0; key < n; ++key) {
      if (t.entry(t.LayerOf(key), t.ExpertOf(key)).weights == nullptr) continue;
      std::vector<uint8_t> b(t.slot_bytes());
      for (auto &x : b) x = static_cast<uint8_t>(rng());
      original[key] = b;
      held[key] = b;
    }
  }
  absl::Status Acquire(int layer, const std::vector<int32_t> &experts,
                       std::vector<const strata::model::ExpertWeights *> *out) override {
    ++acquires;
    acquired = experts;
    out->clear();
    for (int32_t x : experts) {
      const uint32_t key = t_.Key(layer, x);
      auto it = held.find(key);
      if (it == held.end()) return strata::Errorf(MOE_ERR_INTERNAL, "key %u is not held below", key);
      ++pins[key];
      views[key] = *t_.entry(layer, x).weights;
      const auto &en = t_.entry(layer, x);
      views[key].gate.data = it->second.data() + en.part[0].slot_offset;
      views[key].up.data = it->second.data() + en.part[1].slot_offset;
      views[key].down.data = it->second.data() + en.part[2].slot_offset;
      out->push_back(&views[key]);
    }
    return absl::OkStatus();
  }
  void Release(int layer, const std::vector<int32_t> &experts) override {
    ++releases;
    for (int32_t x : acquired) --pins[t_.Key(layer, x)];
    acquired.clear();
  }
  bool Holds(uint32_t key) const override { return held.count(key) != 0 || reserved.count(key) != 0; }
  uint8_t *Reserve(uint32_t key) override {
    if (refuse_admit || Holds(key) || held.size() + reserved.size() >= n_slots) return nullptr;
    auto &b = reserved[key];
    b.assign(t_.slot_bytes(), 0x5A);  // poison: read before the copy lands, it is not the expert
    return b.data();
  }
  void Complete(uint32_t key, bool ok) override {
    auto it = reserved.find(key);
    REQUIRE(it != reserved.end());
    if (ok) {
      held[key] = std::move(it->second);
      ++admitted;
    }
    reserved.erase(it);
  }
  absl::Status Admit(uint32_t key, const SlotBytes &from) override {
    if (refuse_admit) return strata::Errorf(MOE_ERR_NO_MEMORY, "no room below");
    std::vector<uint8_t> b(t_.slot_bytes(), 0x5A);
    REQUIRE(from.device != nullptr);
    REQUIRE(from.device->CopyOut(from.device_slot, b.data(), from.bytes).ok());
    held[key] = b;
    ++admitted;
    return absl::OkStatus();
  }
  bool Evict(uint32_t key) override {
    if (pins[key] > 0 || held.erase(key) == 0) return false;
    ++evicted;
    return true;
  }
  TierStats tier_stats() const override {
    TierStats st;
    st.n_slots = n_slots;
    return st;
  }
  const strata::model::ExpertWeights *ReadyViews(uint32_t key) const override {
    auto it = held.find(key);
    if (it == held.end()) return nullptr;
    const auto &en = t_.entry(t_.LayerOf(key), t_.ExpertOf(key));
    strata::model::ExpertWeights &v = ready_views[key];
    v = *en.weights;
    v.gate.data = it->second.data() + en.part[0].slot_offset;
    v.up.data = it->second.data() + en.part[1].slot_offset;
    v.down.data = it->second.data() + en.part[2].slot_offset;
    return &v;
  }

  const ExpertTable &t_;
  uint32_t n_slots = 0;  // what it tells the tier above (the experts it could hold)
  mutable std::map<uint32_t, strata::model::ExpertWeights> ready_views;
  std::map<uint32_t, std::vector<uint8_t>> original, held, reserved;
  std::map<uint32_t, strata::model::ExpertWeights> views;
  std::map<uint32_t, int> pins;
  std::vector<int32_t> acquired;
  int acquires = 0, releases = 0, admitted = 0, evicted = 0;
  bool refuse_admit = false;
};

// The bytes an expert's parts span in its slot.
uint64_t Span(const ExpertTable &t, uint32_t key) {
  uint64_t end = 0;
  for (const auto &p : t.entry(t.LayerOf(key), t.ExpertOf(key)).part) end = std::max(end, p.slot_offset + p.bytes);
  return end;
}

// Whether the view's three parts hold the original bytes of `key`.
bool ViewHolds(const ExpertTable &t, const RecordingTier &below, uint32_t key, const strata::model::ExpertWeights &v) {
  const auto &en = t.entry(t.LayerOf(key), t.ExpertOf(key));
  const auto &orig = below.original.at(key);
  const uint8_t *parts[3] = {v.gate.data, v.up.data, v.down.data};
  for (int p = 0; p < 3; ++p) {
    if (std::memcmp(parts[p], orig.data() + en.part[p].slot_offset, en.part[p].bytes) != 0) return false;
  }
  return true;
}

struct Model {
  strata::runtime::Context::Described d;
  std::unique_ptr<ExpertTable> table;
  explicit Model(const std::string &path) {
    auto r = strata::runtime::Context::Describe(path);
    REQUIRE(r.ok());
    d = std::move(*r);
    table = std::make_unique<ExpertTable>(d.weights);
  }
};

// The plan at the minimum RAM budget: what each tier spends before its slots.
moe_cache_plan PlanAtMinimum(const std::string &model) {
  moe_params p;
  moe_params_init(&p);
  p.model_path = model.c_str();
  p.ram_budget_bytes = 1;
  moe_cache_plan plan;
  moe_cache_plan_init(&plan);
  REQUIRE(moe_plan(&p, &plan) == MOE_OK);
  return plan;
}

// One selection per token of `experts` at `layer`, heat for the tier.
void Route(VramTier &v, int layer, const std::vector<int32_t> &experts) {
  v.OnRoute(layer, nullptr, static_cast<int64_t>(experts.size()), experts.data(), 1);
}

// Up to n experts of layer l the tier does not hold, at random, each selected 200-250 times; their
// keys are added to *hot.
std::vector<int32_t> HeatLayer(VramTier &v, const ExpertTable &t, int l, size_t n, std::mt19937 &rng,
                               std::vector<uint32_t> *hot) {
  std::vector<int32_t> xs;
  for (int x = 0; x < t.n_experts(); ++x) {
    if (!v.Holds(t.Key(l, x))) xs.push_back(x);
  }
  std::shuffle(xs.begin(), xs.end(), rng);
  xs.resize(std::min(xs.size(), n));
  for (int32_t x : xs) {
    Route(v, l, std::vector<int32_t>(200 + rng() % 50, x));
    hot->push_back(t.Key(l, x));
  }
  return xs;
}

// A prompt's routing: per routed layer, up to `per_layer` experts the tier does not hold, each
// selected 200-250 times and acquired once (so RAM serves them); returns their keys.
std::vector<uint32_t> HeatRamExperts(VramTier &v, const ExpertTable &t, size_t per_layer, std::mt19937 &rng) {
  std::vector<const strata::model::ExpertWeights *> out;
  std::vector<uint32_t> hot;
  for (int l = 0; l < t.n_layers(); ++l) {
    if (t.entry(l, 0).weights == nullptr) continue;
    const std::vector<int32_t> xs = HeatLayer(v, t, l, per_layer, rng, &hot);
    REQUIRE(v.Acquire(l, xs, &out).ok());
    v.Release(l, xs);
  }
  return hot;
}

// Complete tiers over the Mixtral golden's table: a RecordingTier below, the host device with its
// tables on, fresh random numbers (the caller logs the seed).
struct CompleteTiers {
  Model m{kGolden + "mixtral_f32/model-f32.gguf"};
  const ExpertTable &t = *m.table;
  const uint32_t seed = std::random_device{}();
  std::mt19937 rng{seed};
  RecordingTier below{t, seed};
  const uint32_t n_keys = static_cast<uint32_t>(t.n_layers() * t.n_experts());
  TablesOn tables;
  HostSlots dev;
  std::unique_ptr<VramTier> tier;
  // The tier of o.n_slots over a tier below that holds ram_slots; complete, not yet settled.
  VramTier &Make(const VramTierOptions &o, uint32_t ram_slots) {
    below.n_slots = ram_slots;
    auto vr = VramTier::Create(t, &dev, &below, o);
    REQUIRE(vr.ok());
    tier = std::move(*vr);
    REQUIRE(tier->complete());
    return *tier;
  }
  // Every table entry reads its expert's own bytes, from a slot exactly when the tier holds it; an
  // expert moving down is held by both tiers until its bytes land below.
  void CheckTables() {
    REQUIRE(dev.entries.size() == below.original.size());
    for (const auto &[id, views] : dev.entries) {
      const uint32_t key = t.Key(id.first, id.second);
      CHECK(ViewHolds(t, below, key, views));
      CHECK((tier->Holds(key) || below.Holds(key)));
      const bool in_slot = views.gate.data >= dev.slot(0) && views.gate.data < dev.slot(tier->n_slots());
      CHECK(in_slot == tier->Holds(key));
    }
  }
};

}  // namespace

TEST_CASE("the VRAM tier moves experts up, swaps only for markedly hotter ones, and moves victims down",
          "[store][vram]") {
  Model m(kGolden + "qwen3moe_f32/model-f32.gguf");
  const ExpertTable &t = *m.table;
  REQUIRE(t.n_experts() >= 4);
  RecordingTier below(t, std::random_device{}());
  HostSlots dev;
  VramTierOptions o;
  o.n_slots = 2;
  auto vr = VramTier::Create(t, &dev, &below, o);
  REQUIRE(vr.ok());
  VramTier &v = **vr;
  const int L = 1;
  std::vector<const strata::model::ExpertWeights *> out;

  // Two free slots: the first two experts a layer takes from RAM move up, and RAM gives them up.
  Route(v, L, {0, 1});
  REQUIRE(v.Acquire(L, {0, 1}, &out).ok());
  REQUIRE(out.size() == 2);
  CHECK(ViewHolds(t, below, t.Key(L, 0), *out[0]));  // this call computes from RAM
  v.Release(L, {0, 1});
  CHECK(v.ResidentKeys() == std::vector<uint32_t>{t.Key(L, 0), t.Key(L, 1)});
  CHECK_FALSE(below.Holds(t.Key(L, 0)));
  CHECK_FALSE(below.Holds(t.Key(L, 1)));
  CHECK(v.stats().promotions == 2);
  CHECK(dev.copies_in == 2);

  // Served from the slots now, with the file's bytes; RAM is asked for nothing.
  REQUIRE(v.Acquire(L, {1, 0}, &out).ok());
  CHECK(below.acquired.empty());
  CHECK(out[0] != nullptr);
  CHECK(ViewHolds(t, below, t.Key(L, 1), *out[0]));
  CHECK(ViewHolds(t, below, t.Key(L, 0), *out[1]));
  CHECK(v.stats().hits == 2);
  v.Release(L, {1, 0});

  // Expert 2, used a little more than the residents, is not markedly hotter: it stays in RAM.
  Route(v, L, {2, 2, 2});
  REQUIRE(v.Acquire(L, {2}, &out).ok());
  v.Release(L, {2});
  CHECK(below.Holds(t.Key(L, 2)));
  CHECK(v.stats().promotions == 2);

  // Markedly hotter: it takes the colder resident's slot (expert 0 or 1 by heat, then age), whose
  // bytes move down into RAM intact.
  Route(v, L, std::vector<int32_t>(40, 2));
  Route(v, L, std::vector<int32_t>(12, 1));
  REQUIRE(v.Acquire(L, {2}, &out).ok());
  v.Release(L, {2});
  CHECK(v.stats().promotions == 3);
  CHECK(v.stats().demotions == 1);
  CHECK(below.admitted == 1);
  CHECK(v.ResidentKeys() == std::vector<uint32_t>{t.Key(L, 1), t.Key(L, 2)});
  REQUIRE(below.Holds(t.Key(L, 0)));
  CHECK(std::memcmp(below.held[t.Key(L, 0)].data(), below.original[t.Key(L, 0)].data(), Span(t, t.Key(L, 0))) == 0);
  CHECK_FALSE(below.Holds(t.Key(L, 2)));

  // A resident in use by the call is no victim: with both residents acquired, nothing swaps.
  Route(v, L, std::vector<int32_t>(200, 3));
  REQUIRE(v.Acquire(L, {1, 2, 3}, &out).ok());
  v.Release(L, {1, 2, 3});
  CHECK(v.stats().promotions == 3);
  CHECK(below.Holds(t.Key(L, 3)));

  // With no room below, a victim is dropped (back to the file) rather than failing.
  below.refuse_admit = true;
  REQUIRE(v.Acquire(L, {3}, &out).ok());
  v.Release(L, {3});
  CHECK(v.stats().dropped == 1);
  CHECK(v.stats().promotions == 4);
  below.refuse_admit = false;
}

TEST_CASE("a failed device copy leaves nothing acquired, and the tier goes on", "[store][vram]") {
  Model m(kGolden + "qwen3moe_f32/model-f32.gguf");
  const ExpertTable &t = *m.table;
  RecordingTier below(t, 7);
  HostSlots dev;
  VramTierOptions o;
  o.n_slots = 3;
  auto vr = VramTier::Create(t, &dev, &below, o);
  REQUIRE(vr.ok());
  VramTier &v = **vr;
  std::vector<const strata::model::ExpertWeights *> out;
  dev.fail_next = true;
  absl::Status st = v.Acquire(0, {0, 1}, &out);
  CHECK_FALSE(st.ok());
  CHECK(strata::StatusToMoe(st) == MOE_ERR_BACKEND);
  CHECK(below.releases == below.acquires);  // released on the way out
  for (const auto &[key, n] : below.pins) CHECK(n == 0);
  CHECK(v.ResidentKeys().empty());
  REQUIRE(v.Acquire(0, {0, 1}, &out).ok());
  v.Release(0, {0, 1});
  CHECK(v.ResidentKeys().size() == 2);
}

TEST_CASE("random traffic keeps the tiers distinct and every expert's bytes intact", "[store][vram]") {
  Model m(kGolden + "mixtral_f32/model-f32.gguf");
  const ExpertTable &t = *m.table;
  const uint32_t seed = std::random_device{}();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  RecordingTier below(t, seed);
  HostSlots dev;
  VramTierOptions o;
  o.n_slots = 1 + rng() % 5;
  auto vr = VramTier::Create(t, &dev, &below, o);
  REQUIRE(vr.ok());
  VramTier &v = **vr;
  const int n_keys = t.n_layers() * t.n_experts();
  std::vector<const strata::model::ExpertWeights *> out;
  for (int step = 0; step < 300; ++step) {
    const int layer = static_cast<int>(rng() % t.n_layers());
    std::set<int32_t> pick;
    // Skewed: low expert ids come up more often.
    for (int i = 0; i < 3; ++i) {
      pick.insert(static_cast<int32_t>(std::min(rng() % t.n_experts(), rng() % t.n_experts())));
    }
    std::vector<int32_t> experts(pick.begin(), pick.end());
    Route(v, layer, experts);
    REQUIRE(v.Acquire(layer, experts, &out).ok());
    for (size_t i = 0; i < experts.size(); ++i) {
      CHECK(ViewHolds(t, below, t.Key(layer, experts[i]), *out[i]));
    }
    v.Release(layer, experts);
    if (step % 7 == 0) REQUIRE(v.OnDecodeToken().ok());
    for (int key = 0; key < n_keys; ++key) {
      const bool up = v.Holds(key), down = below.Holds(key);
      if (t.entry(t.LayerOf(key), t.ExpertOf(key)).weights == nullptr) continue;
      CHECK(up != down);  // exactly one tier has it
    }
  }
  CHECK(v.stats().promotions >= v.n_slots());
}

TEST_CASE("complete tiers route on the device's tables, swap between steps and keep every entry true",
          "[store][vram]") {
  Model m(kGolden + "mixtral_f32/model-f32.gguf");
  const ExpertTable &t = *m.table;
  const uint32_t seed = std::random_device{}();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  RecordingTier below(t, seed);
  const uint32_t n_keys = static_cast<uint32_t>(t.n_layers() * t.n_experts());
  HostSlots dev;
  TablesOn tables;
  VramTierOptions o;
  o.n_slots = 2 + rng() % 3;
  o.swaps_per_step = 1;
  // Short of one: not complete, no tables.
  below.n_slots = n_keys - o.n_slots;
  {
    auto vr = VramTier::Create(t, &dev, &below, o);
    REQUIRE(vr.ok());
    CHECK_FALSE((*vr)->complete());
    CHECK_FALSE((*vr)->tables());
    REQUIRE((*vr)->Settle().ok());
    CHECK_FALSE((*vr)->routes_on_device());
  }
  below.n_slots = n_keys - o.n_slots + 1;
  HostSlots dev2;
  auto vr = VramTier::Create(t, &dev2, &below, o);
  REQUIRE(vr.ok());
  VramTier &v = **vr;
  REQUIRE(v.complete());
  REQUIRE(v.tables());
  CHECK_FALSE(v.routes_on_device());
  // Every entry holds its expert's original bytes, and each expert lies in one tier.
  auto check = [&] {
    REQUIRE(dev2.entries.size() == below.original.size());
    for (const auto &[id, views] : dev2.entries) {
      const uint32_t key = t.Key(id.first, id.second);
      CHECK(ViewHolds(t, below, key, views));
      CHECK(v.Holds(key) != below.Holds(key));
      // VRAM's experts are read from their slots, the others where RAM holds them.
      const bool in_slot = views.gate.data >= dev2.slot(0) && views.gate.data < dev2.slot(v.n_slots());
      CHECK(in_slot == v.Holds(key));
    }
  };
  REQUIRE(v.Settle().ok());
  CHECK(v.routes_on_device());
  CHECK(v.ResidentKeys().size() == v.n_slots());  // the free slots took RAM's experts
  check();

  // Device-routed steps: the accounting after each one makes no move; a markedly hotter expert
  // takes a resident's slot between steps, a swap a step.
  std::vector<const strata::model::ExpertWeights *> out;
  const std::vector<uint32_t> before = v.ResidentKeys();
  int layer = -1, hot = -1;
  for (int l = 0; l < t.n_layers() && hot < 0; ++l) {
    for (int x = 0; x < t.n_experts() && hot < 0; ++x) {
      if (t.entry(l, x).weights != nullptr && !v.Holds(t.Key(l, x))) layer = l, hot = x;
    }
  }
  REQUIRE(hot >= 0);
  const int copies = dev2.copies_in;
  for (int step = 0; step < 3; ++step) {
    Route(v, layer, std::vector<int32_t>(30, hot));
    REQUIRE(v.Acquire(layer, {hot}, &out).ok());
    v.Release(layer, {hot});
    CHECK(dev2.copies_in == copies + step);  // no move inside the accounting
    REQUIRE(v.OnDecodeToken().ok());
    REQUIRE(v.Settle().ok());
    CHECK(v.routes_on_device());
    check();
    if (v.Holds(t.Key(layer, hot))) break;
  }
  CHECK(v.Holds(t.Key(layer, hot)));
  CHECK(v.stats().demotions == 1);
  CHECK(v.stats().rebalances == 1);
  CHECK(v.ResidentKeys() != before);

  // Random traffic with random moves: the entries stay true after every step.
  for (int step = 0; step < 200; ++step) {
    const int l = static_cast<int>(rng() % t.n_layers());
    if (t.entry(l, 0).weights == nullptr) continue;
    std::set<int32_t> pick;
    for (int i = 0; i < 3; ++i) pick.insert(static_cast<int32_t>(std::min(rng() % t.n_experts(), rng() % t.n_experts())));
    std::vector<int32_t> experts(pick.begin(), pick.end());
    for (int r = 0; r < 1 + static_cast<int>(rng() % 20); ++r) Route(v, l, experts);
    REQUIRE(v.Acquire(l, experts, &out).ok());
    for (size_t i = 0; i < experts.size(); ++i) CHECK(ViewHolds(t, below, t.Key(l, experts[i]), *out[i]));
    v.Release(l, experts);
    REQUIRE((step % 5 == 0 ? v.OnPromptDone() : v.OnDecodeToken()).ok());
    REQUIRE(v.Settle().ok());
    CHECK(v.routes_on_device());
    check();
  }
  CHECK(v.stats().demotions > 1);
  CHECK(v.stats().dropped == 0);
}

TEST_CASE("a prompt's re-plan moves a capped number at its end and the rest over the decode steps",
          "[store][vram]") {
  CompleteTiers f;
  INFO("seed " << f.seed);
  const ExpertTable &t = f.t;
  std::mt19937 &rng = f.rng;
  VramTierOptions o;
  o.n_slots = 4 + rng() % 2;
  o.replan_moves = 1 + static_cast<int>(rng() % 2);
  VramTier &v = f.Make(o, f.n_keys - o.n_slots + 1);
  REQUIRE(v.Settle().ok());
  // A prompt makes many experts RAM serves markedly hotter than every resident (which it leaves cold).
  const std::vector<uint32_t> hot = HeatRamExperts(v, t, 4, rng);
  const size_t want = std::min<size_t>(hot.size(), v.n_slots());
  REQUIRE(want > static_cast<size_t>(o.replan_moves));
  const auto held = [&] {
    size_t n = 0;
    for (uint32_t key : hot) n += v.Holds(key) ? 1 : 0;
    return n;
  };
  const uint64_t moves0 = v.stats().promotions;
  REQUIRE(v.OnPromptDone().ok());
  CHECK(v.stats().promotions - moves0 == static_cast<uint64_t>(o.replan_moves));
  CHECK(held() == static_cast<size_t>(o.replan_moves));
  // Each decode step after it moves the backlog's share, until the hot experts hold the slots.
  size_t steps = 0;
  while (held() < want && steps < 1000) {
    const uint64_t before = v.stats().promotions;
    REQUIRE(v.OnDecodeToken().ok());
    REQUIRE(v.Settle().ok());
    CHECK(v.stats().promotions - before <= static_cast<uint64_t>(o.replan_moves));
    CHECK(v.stats().promotions > before);
    ++steps;
  }
  CHECK(held() == want);
  CHECK(steps <= (want - o.replan_moves + o.replan_moves - 1) / o.replan_moves);
  // Then the decode rule again: nothing hotter waits, nothing moves.
  const uint64_t settled = v.stats().promotions;
  REQUIRE(v.OnDecodeToken().ok());
  CHECK(v.stats().promotions == settled);
  CHECK(v.stats().dropped == 0);
}

TEST_CASE("moves overlap the steps: each half lands before a table points at it", "[store][vram]") {
  CompleteTiers f;
  INFO("seed " << f.seed);
  const ExpertTable &t = f.t;
  std::mt19937 &rng = f.rng;
  RecordingTier &below = f.below;
  HostSlots &dev = f.dev;
  VramTierOptions o;
  o.n_slots = 5 + rng() % 2;
  o.replan_moves = 2 + static_cast<int>(rng() % 2);
  o.max_moves = o.replan_moves + 1;
  const uint32_t spare = 1 + rng() % 3;
  VramTier &v = f.Make(o, f.n_keys - o.n_slots + spare);
  REQUIRE(v.Settle().ok());
  v.ResetStats();  // the opening fill's moves
  dev.defer = true;
  auto check = [&] { f.CheckTables(); };
  // A prompt heats experts RAM serves far above every resident.
  std::vector<const strata::model::ExpertWeights *> out;
  const std::vector<uint32_t> hot = HeatRamExperts(v, t, 3, rng);
  const size_t want = std::min<size_t>(hot.size(), v.n_slots());
  const auto held = [&] {
    size_t n = 0;
    for (uint32_t key : hot) n += v.Holds(key) ? 1 : 0;
    return n;
  };
  // Nothing lands: the prompt's end only queues copies, and no table moves.
  dev.landing = false;
  const int points = dev.points;
  REQUIRE(v.OnPromptDone().ok());
  CHECK(v.stats().moving > 0);
  CHECK(v.stats().moving <= static_cast<uint32_t>(o.replan_moves));
  CHECK(dev.queued > 0);
  CHECK(v.stats().promotions == 0);
  CHECK(dev.points == points);
  CHECK(held() == 0);
  check();
  // Steps where copies land or not, at random: the tables stay true after every one.
  size_t steps = 0;
  while ((held() < want || v.stats().moving > 0) && steps < 2000) {
    dev.landing = rng() % 3 != 0;
    REQUIRE(v.OnDecodeToken().ok());
    CHECK(v.stats().moving <= static_cast<uint32_t>(o.max_moves));
    check();
    ++steps;
  }
  CHECK(held() == want);
  CHECK(v.stats().moving == 0);
  CHECK(v.stats().promotions == want);
  CHECK(v.stats().demotions == want);
  CHECK(v.stats().dropped == 0);
  CHECK(below.reserved.empty());

  // A move in flight is finished by Drain, and by Settle.
  int l2 = -1;
  int32_t x2 = -1;
  for (int l = 0; l < t.n_layers() && x2 < 0; ++l) {
    for (int x = 0; x < t.n_experts() && x2 < 0; ++x) {
      if (t.entry(l, x).weights != nullptr && !v.Holds(t.Key(l, x))) l2 = l, x2 = x;
    }
  }
  REQUIRE(x2 >= 0);
  dev.landing = false;
  Route(v, l2, std::vector<int32_t>(100000, x2));
  REQUIRE(v.Acquire(l2, {x2}, &out).ok());
  v.Release(l2, {x2});
  REQUIRE(v.OnDecodeToken().ok());
  CHECK(v.stats().moving == 1);
  check();
  REQUIRE(v.Drain().ok());
  CHECK(v.stats().moving == 0);
  CHECK(v.Holds(t.Key(l2, x2)));
  check();
}

TEST_CASE("a layer-major pass swaps each layer's hot experts into the slots it computes them in",
          "[store][vram]") {
  CompleteTiers f;
  INFO("seed " << f.seed);
  const ExpertTable &t = f.t;
  std::mt19937 &rng = f.rng;
  RecordingTier &below = f.below;
  HostSlots &dev = f.dev;
  VramTierOptions o;
  o.n_slots = 6 + rng() % 3;
  o.replan_moves = 1 + static_cast<int>(rng() % 3);
  o.pass_moves = 1 + static_cast<int>(rng() % 3);
  VramTier &v = f.Make(o, f.n_keys);  // room below for every victim of the pass, landed or not
  // The slots start with an equal share of every layer, as a context opens them.
  REQUIRE(v.Seed(v.OpeningKeys({}), v.n_slots()).ok());
  REQUIRE(v.Settle().ok());
  v.ResetStats();
  dev.defer = true;
  auto check = [&] { f.CheckTables(); };
  // The pass: each layer in order routes a few experts RAM serves, far hotter than every resident.
  v.BeginPass(true);
  std::vector<const strata::model::ExpertWeights *> out;
  std::vector<uint32_t> hot;
  for (int l = 0; l < t.n_layers(); ++l) {
    if (t.entry(l, 0).weights == nullptr) continue;
    const std::vector<int32_t> xs = HeatLayer(v, t, l, 3, rng, &hot);
    // The layer's residents are routed too, a little: colder than the hot ones, warmer than the
    // residents of layers the pass has not reached (which would look coldest).
    std::vector<int32_t> use = xs;
    for (int x = 0; x < t.n_experts(); ++x) {
      if (!v.Holds(t.Key(l, x))) continue;
      Route(v, l, std::vector<int32_t>(10 + rng() % 10, x));
      use.push_back(x);
    }
    std::vector<uint32_t> later;  // residents of the layers still to come
    for (uint32_t key : v.ResidentKeys()) {
      if (t.LayerOf(key) > l) later.push_back(key);
    }
    dev.landing = rng() % 2 == 0;
    const int swaps = dev.swaps, joins = dev.joins;
    REQUIRE(v.Acquire(l, use, &out).ok());
    // Every expert reads its own bytes, the swapped ones from their new slots (the computation
    // waits for the copies).
    size_t in_slots = 0;
    for (size_t i = 0; i < use.size(); ++i) {
      CHECK(ViewHolds(t, below, t.Key(l, use[i]), *out[i]));
      const bool in_slot = out[i]->gate.data >= dev.slot(0) && out[i]->gate.data < dev.slot(v.n_slots());
      CHECK(in_slot == v.Holds(t.Key(l, use[i])));
      in_slots += i < xs.size() && in_slot ? 1 : 0;
    }
    v.Release(l, use);
    // The hottest swapped in at once (the residents are all markedly colder), at most pass_moves,
    // none of them into a later layer's slot; the first layer's residents are all in use.
    if (!xs.empty() && l > 0) {
      CHECK(in_slots >= 1);
      CHECK(in_slots <= static_cast<size_t>(o.pass_moves));
      CHECK(dev.swaps > swaps);
      CHECK(dev.joins == joins + 1);
    }
    for (uint32_t key : later) CHECK(v.Holds(key));
  }
  // The pass's end finishes what is left; every hot expert that fits ends in a slot.
  dev.landing = true;
  REQUIRE(v.OnPromptDone().ok());
  check();  // the tables are true once the pass ends (nothing reads them during it)
  const auto held = [&] {
    size_t n = 0;
    for (uint32_t key : hot) n += v.Holds(key) ? 1 : 0;
    return n;
  };
  const size_t want = std::min<size_t>(hot.size(), v.n_slots());
  for (int i = 0; i < 100 && (held() < want || v.stats().moving > 0); ++i) REQUIRE(v.OnDecodeToken().ok());
  check();
  CHECK(held() == want);
  CHECK(v.stats().dropped == 0);
  CHECK(below.reserved.empty());
}

namespace {

// The plan of a context opened at these budgets (the tiers as they were made, not as planned).
moe_cache_plan OpenedPlan(const std::string &model, uint64_t ram, uint64_t vram) {
  moe_params p;
  moe_params_init(&p);
  p.model_path = model.c_str();
  p.ram_budget_bytes = ram;
  p.vram_budget_bytes = vram;
  p.n_threads = 2;
  moe_ctx *ctx = nullptr;
  INFO(model << ": " << moe_last_error());
  REQUIRE(moe_ctx_open(&p, &ctx) == MOE_OK);
  moe_cache_plan plan;
  moe_cache_plan_init(&plan);
  REQUIRE(moe_ctx_plan(ctx, &plan) == MOE_OK);
  moe_ctx_close(ctx);
  return plan;
}

}  // namespace

TEST_CASE("logits at (RAM, VRAM) budget pairs are bit-identical to the all-resident run", "[store][vram][golden]") {
  TestDevice device;
  for (const char *m : {"qwen3moe_f32/model-q8_0.gguf", "mixtral_f32/model-f16.gguf", "deepseek3_f32/model-f32.gguf",
                        "gptoss_f32/model-mxfp4.gguf"}) {
    const std::string model = kGolden + m;
    const std::string family = std::string(m).substr(0, std::string(m).find('/'));
    const auto tokens = ReadBinary<int32_t>(kGolden + family + "/tokens.bin");
    moe_stats ref_st;
    const auto ref = strata::testing::TeacherForced(model, tokens, 12, MOE_BACKEND_CPU, 0, nullptr, nullptr, &ref_st);
    CHECK(ref_st.streaming == 0);

    const moe_cache_plan plan = PlanAtMinimum(model);
    const uint32_t routed = plan.n_routed_experts, ram_min = plan.ram_expert_slots;
    REQUIRE(ram_min < routed);
    std::mt19937 rng(std::random_device{}());
    const uint32_t few = 1 + rng() % 3;
    const uint32_t pairs[][2] = {{ram_min, few},
                                 {ram_min, routed - ram_min - 1},
                                 {ram_min + 1 + static_cast<uint32_t>(rng() % 3), routed}};
    for (const auto &pair : pairs) {
      const uint64_t ram = plan.ram_fixed_bytes + uint64_t{pair[0]} * plan.expert_slot_bytes;
      // The tests' device plans as a GPU would: fixed + k slots gives k slots.
      const uint64_t vram = plan.ram_fixed_bytes + uint64_t{pair[1]} * plan.expert_slot_bytes;
      const moe_cache_plan got = OpenedPlan(model, ram, vram);
      INFO(m << ": RAM " << pair[0] << " VRAM " << pair[1] << " of " << routed);
      CHECK(got.ram_expert_slots == pair[0]);
      CHECK(got.vram_fixed_bytes == got.ram_fixed_bytes);
      CHECK(got.vram_expert_slots == std::min(pair[1], routed));
      CHECK(got.streamed_experts == routed - std::min(routed, got.ram_expert_slots + got.vram_expert_slots));
      moe_stats st;
      const auto logits = strata::testing::TeacherForced(model, tokens, 12, MOE_BACKEND_CPU, vram, nullptr, nullptr, &st,
                                                         MOE_CPU_EXPERTS_OFF, false, nullptr, nullptr, ram);
      CHECK(logits.size() == ref.size());
      CHECK(std::memcmp(logits.data(), ref.data(), logits.size() * sizeof(float)) == 0);
      CHECK(st.streaming == 1);
      CHECK(st.vram_expert_slots == got.vram_expert_slots);
      // Tiers that hold every expert with one to spare fill VRAM when they open; others promote.
      const bool complete = uint64_t{pair[0]} + got.vram_expert_slots >= uint64_t{routed} + 1;
      if (!complete) CHECK(st.vram_promotions > 0);
      CHECK(st.vram_hits > 0);
      // Every expert use is served by exactly one tier, or read from the file.
      CHECK(st.vram_hits + st.expert_hits + st.expert_misses == ref_st.expert_hits);
    }
  }
}

TEST_CASE("plan --json gives each tier's slots from budgets of fixed + k slots", "[store][vram][plan]") {
  const std::string model = kGolden + "qwen3moe_f32/model-q8_0.gguf";
  moe_params p;
  moe_params_init(&p);
  p.model_path = model.c_str();
  p.ram_budget_bytes = 1;
  p.backend = MOE_BACKEND_CUDA;  // planned without a GPU
  moe_cache_plan plan;
  moe_cache_plan_init(&plan);
  REQUIRE(moe_plan(&p, &plan) == MOE_OK);
  CHECK(plan.vram_fixed_bytes > 0);
  CHECK(plan.vram_expert_slots == 0);  // no VRAM budget while experts stream: no VRAM tier
  std::mt19937 rng(std::random_device{}());
  for (int i = 0; i < 4; ++i) {
    const uint32_t kr = plan.ram_expert_slots + rng() % 4, kv = rng() % (plan.n_routed_experts + 2);
    p.ram_budget_bytes = plan.ram_fixed_bytes + uint64_t{kr} * plan.expert_slot_bytes;
    p.vram_budget_bytes =
        plan.vram_fixed_bytes + uint64_t{kv} * plan.expert_slot_bytes + rng() % plan.expert_slot_bytes;
    moe_cache_plan q;
    moe_cache_plan_init(&q);
    REQUIRE(moe_plan(&p, &q) == MOE_OK);
    CHECK(q.ram_expert_slots == std::min(kr, q.n_routed_experts));
    CHECK(q.vram_expert_slots == std::min(kv, q.n_routed_experts));
    const uint32_t held = std::min(q.n_routed_experts, q.ram_expert_slots + q.vram_expert_slots);
    CHECK(q.streamed_experts == q.n_routed_experts - held);
  }
  p.backend = MOE_BACKEND_CPU;
  moe_cache_plan c;
  moe_cache_plan_init(&c);
  REQUIRE(moe_plan(&p, &c) == MOE_OK);
  CHECK(c.vram_fixed_bytes == 0);
  CHECK(c.vram_expert_slots == 0);
}

namespace {

// The bytes of (layer, expert)'s part p, read from the model file.
std::vector<uint8_t> FileBytes(const std::string &path, const ExpertTable &t, int layer, int expert, int p) {
  const strata::store::ExpertPart &part = t.entry(layer, expert).part[p];
  REQUIRE(part.file_index == 0);
  std::vector<uint8_t> b(part.bytes);
  FILE *f = std::fopen(path.c_str(), "rb");
  REQUIRE(f != nullptr);
  REQUIRE(std::fseek(f, static_cast<long>(part.file_offset), SEEK_SET) == 0);
  REQUIRE(std::fread(b.data(), 1, b.size(), f) == b.size());
  std::fclose(f);
  return b;
}

// The device tables of the context opened last: every entry holds its expert's bytes from the
// model file; returns how many entries there are.
size_t CheckEntries(const std::string &model, const ExpertTable &t) {
  const HostSlots *dev = g_last_slots;
  REQUIRE(dev != nullptr);
  for (const auto &[id, views] : dev->entries) {
    const uint8_t *parts[3] = {views.gate.data, views.up.data, views.down.data};
    for (int q = 0; q < 3; ++q) {
      const std::vector<uint8_t> want = FileBytes(model, t, id.first, id.second, q);
      INFO("layer " << id.first << " expert " << id.second << " part " << q);
      REQUIRE(std::memcmp(parts[q], want.data(), want.size()) == 0);
    }
  }
  return dev->entries.size();
}

}  // namespace

TEST_CASE("complete tiers keep the device tables pointing at every expert's bytes", "[store][vram][golden]") {
  TestDevice device;
  TablesOn tables;
  std::mt19937 rng(std::random_device{}());
  for (const char *m : {"qwen3moe_f32/model-q8_0.gguf", "mixtral_f32/model-f16.gguf"}) {
    const std::string model = kGolden + m;
    const std::string family = std::string(m).substr(0, std::string(m).find('/'));
    const auto tokens = ReadBinary<int32_t>(kGolden + family + "/tokens.bin");
    const auto ref = strata::testing::TeacherForced(model, tokens, 12);
    Model md(model);
    const ExpertTable &t = *md.table;
    size_t entries = 0;
    const moe_cache_plan plan = PlanAtMinimum(model);
    const uint32_t routed = plan.n_routed_experts;
    // VRAM a third or so of the experts, RAM the rest and one or a few to spare: complete.
    const uint32_t kv = routed / 3 + rng() % 3, kr = routed - kv + 1 + rng() % 3;
    INFO(m << ": RAM " << kr << " VRAM " << kv << " of " << routed);
    const uint64_t ram = plan.ram_fixed_bytes + uint64_t{kr} * plan.expert_slot_bytes;
    const uint64_t vram = plan.ram_fixed_bytes + uint64_t{kv} * plan.expert_slot_bytes;
    g_last_slots = nullptr;
    // After every step, each entry pointed so far holds its expert's bytes, whatever moved since;
    // every routed expert has an entry once the tiers settle: the steps after route on them.
    const auto check_entries = [&] { entries = CheckEntries(model, t); };
    moe_stats st;
    const auto out = strata::testing::TeacherForced(model, tokens, 12, MOE_BACKEND_CPU, vram, nullptr, nullptr, &st,
                                                    MOE_CPU_EXPERTS_OFF, false, nullptr, nullptr, ram, check_entries);
    CHECK(entries == routed);
    CHECK(std::memcmp(out.data(), ref.data(), out.size() * sizeof(float)) == 0);
    CHECK(st.expert_misses == 0);  // nothing read on demand: every expert was in place before its use
  }
}

namespace {
struct Progress {
  std::vector<std::pair<uint64_t, uint64_t>> calls;
  int64_t cancel_after = -1;  // keep_going answers false from this call on (-1: never)
  int asked = 0;
};
void OnProgress(uint64_t done, uint64_t total, void *user) {
  static_cast<Progress *>(user)->calls.emplace_back(done, total);
}
int32_t KeepGoing(uint64_t done, uint64_t total, void *user) {
  auto *p = static_cast<Progress *>(user);
  return p->cancel_after < 0 || p->asked++ < p->cancel_after ? 1 : 0;
}
}  // namespace

TEST_CASE("complete tiers are filled at open, the load's progress counting their bytes", "[store][vram]") {
  TestDevice device;
  const std::string model = kGolden + "qwen3moe_f32/model-q8_0.gguf";
  const moe_cache_plan plan = PlanAtMinimum(model);
  const uint32_t routed = plan.n_routed_experts;
  std::mt19937 rng(std::random_device{}());
  const uint32_t kv = routed / 4 + rng() % 4, kr = routed - kv + 1 + rng() % 2;
  INFO("RAM " << kr << " VRAM " << kv << " of " << routed);
  moe_params p;
  moe_params_init(&p);
  p.model_path = model.c_str();
  p.ram_budget_bytes = plan.ram_fixed_bytes + uint64_t{kr} * plan.expert_slot_bytes;
  p.vram_budget_bytes = plan.ram_fixed_bytes + uint64_t{kv} * plan.expert_slot_bytes;
  p.n_threads = 2;
  Progress pr;
  p.load_progress = OnProgress;
  p.load_progress_user = &pr;
  moe_ctx *ctx = nullptr;
  REQUIRE(moe_ctx_open(&p, &ctx) == MOE_OK);
  moe_stats st;
  moe_stats_init(&st);
  REQUIRE(moe_ctx_stats(ctx, &st) == MOE_OK);
  moe_ctx_close(ctx);
  // Progress never goes back, keeps one total, and ends at it; the total holds the experts' bytes.
  REQUIRE(!pr.calls.empty());
  const uint64_t total = pr.calls.back().second;
  CHECK(pr.calls.back().first == total);
  for (size_t i = 1; i < pr.calls.size(); ++i) {
    CHECK(pr.calls[i].second == total);
    CHECK(pr.calls[i].first >= pr.calls[i - 1].first);
  }
  CHECK(total > uint64_t{routed} * (plan.expert_slot_bytes / 2));
  // Every expert is in place at open: VRAM's share and RAM's, no read left for the first step.
  CHECK(st.vram_expert_slots == kv);

  // A host that cancels while the experts are read gets MOE_ERR_CANCELLED and no context.
  for (int64_t after : {int64_t{1}, int64_t{2}}) {
    Progress c;
    c.cancel_after = after;
    p.load_progress = nullptr;
    p.load_continue = KeepGoing;
    p.load_progress_user = &c;
    moe_ctx *none = nullptr;
    const moe_status s = moe_ctx_open(&p, &none);
    INFO(moe_last_error());
    CHECK(s == MOE_ERR_CANCELLED);
    CHECK(none == nullptr);
  }
}

// A VRAM budget that leaves the device no expert slot, over a RAM budget that holds every expert:
// one RAM tier of all of them, read whole at open (the load's progress counting its bytes), whose
// slots the device's tables point at, so decode routes on the device with nothing moving under it.
// The logits are the all-resident run's bits and every use is a RAM hit.
TEST_CASE("a VRAM budget with no expert slot leaves one RAM tier of every expert, the tables on it",
          "[store][vram][golden]") {
  TestDevice device;
  TablesOn tables;
  std::mt19937 rng(std::random_device{}());
  for (const char *m : {"qwen3moe_f32/model-q8_0.gguf", "mixtral_f32/model-f16.gguf"}) {
    const std::string model = kGolden + m;
    const std::string family = std::string(m).substr(0, std::string(m).find('/'));
    const auto tokens = ReadBinary<int32_t>(kGolden + family + "/tokens.bin");
    moe_stats ref_st;
    const auto ref = strata::testing::TeacherForced(model, tokens, 12, MOE_BACKEND_CPU, 0, nullptr, nullptr, &ref_st);
    Model md(model);
    const ExpertTable &t = *md.table;
    const moe_cache_plan plan = PlanAtMinimum(model);
    const uint32_t routed = plan.n_routed_experts;
    // The fixed bytes and less than one slot more: no expert slot in VRAM.
    const uint64_t vram = plan.ram_fixed_bytes + rng() % plan.expert_slot_bytes;
    INFO(m << ": VRAM budget " << vram << ", " << routed << " experts");
    const moe_cache_plan got = OpenedPlan(model, 0, vram);
    CHECK(got.vram_expert_slots == 0);
    CHECK(got.ram_expert_slots == routed);
    CHECK(got.streamed_experts == 0);
    // Progress goes on over the experts' bytes, never back, and ends at its total.
    {
      moe_params p;
      moe_params_init(&p);
      p.model_path = model.c_str();
      p.vram_budget_bytes = vram;
      p.n_threads = 2;
      Progress pr;
      p.load_progress = OnProgress;
      p.load_progress_user = &pr;
      moe_ctx *ctx = nullptr;
      REQUIRE(moe_ctx_open(&p, &ctx) == MOE_OK);
      moe_ctx_close(ctx);
      REQUIRE(!pr.calls.empty());
      const uint64_t total = pr.calls.back().second;
      CHECK(pr.calls.back().first == total);
      for (size_t i = 1; i < pr.calls.size(); ++i) CHECK(pr.calls[i].first >= pr.calls[i - 1].first);
      CHECK(total > uint64_t{routed} * (plan.expert_slot_bytes / 2));
    }
    g_last_slots = nullptr;
    size_t entries = 0;
    const auto check_entries = [&] {
      entries = CheckEntries(model, t);
      CHECK(g_last_slots->copies_in == 0);  // no slot, no copy up
    };
    moe_stats st;
    const auto out = strata::testing::TeacherForced(model, tokens, 12, MOE_BACKEND_CPU, vram, nullptr, nullptr, &st,
                                                    MOE_CPU_EXPERTS_OFF, false, nullptr, nullptr, 0, check_entries);
    CHECK(entries == routed);
    CHECK(std::memcmp(out.data(), ref.data(), out.size() * sizeof(float)) == 0);
    CHECK(st.streaming == 1);
    CHECK(st.expert_misses == 0);
    CHECK(st.vram_hits == 0);
    CHECK(st.expert_hits == ref_st.expert_hits);
  }
}
