// The VRAM expert tier over a streamed RAM tier: fixed device slots (DeviceSlots, from the
// backend), the route hotness of every expert, and the moves between the tiers. The tiers hold
// distinct experts: an expert a layer takes from RAM moves up into a free slot, or into the slot of
// a markedly colder resident (model::MarkedlyHotter), which moves down into RAM instead of being
// dropped; the RAM tier then gives up its copy. A layer's experts in VRAM are served from their
// slots and never asked of the RAM tier, whose prediction and preloading skip them. Every slot
// holds the bytes of the file, so results are the same at any pair of budgets.
//
// When the two tiers' slots hold every routed expert with one to spare ("complete"), nothing
// streams, and the tier keeps the device's tables (DeviceSlots::EnableTables) pointing at each
// expert where it lies, a VRAM slot or a RAM slot the device reads over the link. Once every
// expert is in place (Settle) the tier reports routes_on_device(): the backend then routes and
// groups decode batches itself, and the forward pass reports each layer's selections after the
// step. Moves then happen between steps only (Rebalance): the experts served from RAM since the
// last one, hottest first, take the slots of markedly colder residents, a few a decode step and
// up to replan_moves after a prompt, the rest of what the heat warrants over the decode steps after
// it; each victim goes down into a free RAM slot. The moves' copies are queued on the device's copy
// engines and overlap the steps: a victim stays in its slot until its bytes are in RAM, an expert
// moving up is read from RAM until its bytes are in the slot, and the tables follow at the step
// after each half, so every step reads every expert's bytes where they are whole.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "lib/store/expert_table.h"
#include "lib/store/heat.h"
#include "lib/store/tier.h"

namespace strata::store {

struct VramTierOptions {
  uint32_t n_slots = 0;
  // A resident's slot goes to an expert hotter by this many standard deviations of their counts
  // (model::MarkedlyHotter), so the tiers do not trade experts over noise.
  double promote_z = 2.0;
  // Slots a layer's call may take from residents (free slots are filled without limit): each such
  // move copies two experts over the link while the step waits.
  int max_swaps_per_call = 2;
  // While the tiers are complete: the swaps a decode step may start between steps, and the z of the
  // re-plan after a prompt (the pairs are then the extremes of thousands of experts, which chance
  // sets two deviations apart).
  int swaps_per_step = 2;
  double replan_z = 3.0;
  // A prompt's re-plan starts at most replan_moves when the prompt ends and as many at each decode
  // step after it, until done; on a device with copy engines the moves overlap the steps (each
  // takes two steps: the victim's bytes down, then the expert's up), at most max_moves in flight.
  int replan_moves = 64;
  int max_moves = 256;
  // A layer-major pass's swaps a layer (BeginPass).
  int pass_moves = 32;
};

struct VramTierStats {
  uint64_t hits = 0;          // expert uses served from a VRAM slot
  uint64_t promotions = 0;    // experts moved up from RAM
  uint64_t demotions = 0;     // residents moved down into RAM to make room
  uint64_t dropped = 0;       // residents given up without a place in RAM (back to the file)
  uint64_t bytes_up = 0, bytes_down = 0;
  uint64_t rebalances = 0;    // Rebalance passes that started a move (complete tiers)
  uint32_t moving = 0;        // moves in flight now
  uint32_t n_slots = 0;
  uint64_t slot_bytes = 0;
};

class VramTier final : public ExpertTier {
 public:
  // `table`, `device` and `below` outlive the tier. Allocates the device's slots (empty until
  // experts move up). MOE_ERR_NO_MEMORY when the device cannot hold them.
  static absl::StatusOr<std::unique_ptr<VramTier>> Create(const ExpertTable &table, DeviceSlots *device,
                                                          ExpertTier *below, const VramTierOptions &options);

  // ExpertSource: the forward pass's view of the two tiers together.
  void OnRoute(int layer, const float *h, int64_t n_tok, const int32_t *selected, int k) override;
  absl::Status Acquire(int layer, const std::vector<int32_t> &experts,
                       std::vector<const model::ExpertWeights *> *out) override;
  absl::Status AcquireAsync(int layer, const std::vector<int32_t> &experts,
                            std::vector<const model::ExpertWeights *> *out) override;
  absl::StatusOr<const model::ExpertWeights *> Await(int layer, int32_t expert) override;
  void Release(int layer, const std::vector<int32_t> &experts) override;

  // ExpertTier. Admit copies host bytes up into a slot (a resident moving down to make room);
  // Evict moves a resident down into the tier below (or drops it when that has no room).
  bool Holds(uint32_t key) const override { return key < key_slot_.size() && key_slot_[key] >= 0; }
  absl::Status Admit(uint32_t key, const SlotBytes &from) override;
  bool Evict(uint32_t key) override;
  TierStats tier_stats() const override;

  // True while the tiers are complete and the device tables point at every expert: the backend
  // routes on its own, and Acquire (the accounting after the step) neither waits nor fails.
  bool routes_on_device() const override { return routable_; }
  // The two tiers' slots hold every routed expert with one to spare.
  bool complete() const { return complete_; }
  bool tables() const { return tables_; }

  // Before each forward pass. A layer-major pass (a prompt's) acquires its layers in order, each
  // once. While complete, each layer's hottest experts RAM serves (at most pass_moves) then swap
  // with markedly colder residents of the layers the pass has reached (whose heat counts the prompt
  // already, and whose slots no later layer of the pass reads): the victim's bytes go down and the
  // expert's come up into its slot, where the layer computes it. That copy replaces the one the
  // device would make to compute it from RAM, so the link carries nothing more. The tables follow
  // once the copies land, before any step reads them.
  void BeginPass(bool layer_major) { pass_layer_major_ = layer_major; }
  // Between decode steps: the heat's decay, and while complete a Rebalance of swaps_per_step.
  absl::Status OnDecodeToken();
  void OnNewPrompt();
  // After a prompt's passes: while complete, the Rebalance of every markedly hotter expert (replan_z).
  absl::Status OnPromptDone();
  // Before a step: while complete, points the tables at every expert and becomes resident() once
  // each one is in place; an expert neither tier holds is read into RAM, one still loading leaves it
  // for the next step. A RAM tier that gave up an expert on its own makes it check again.
  absl::Status Settle();
  // Moves up to `max` of `keys` (hottest first, e.g. a hotlist) into free slots, each read through
  // the tier below (a layer's run of keys at once); returns how many went up.
  absl::StatusOr<size_t> Seed(const std::vector<uint32_t> &keys, size_t max);
  // The keys a complete tier starts with: `hot` first, then an equal share of every layer's experts,
  // as many as the slots hold.
  std::vector<uint32_t> OpeningKeys(const std::vector<uint32_t> &hot) const;

  // Waits for the moves in flight and finishes them.
  absl::Status Drain();
  ~VramTier() override;

  VramTierStats stats() const;
  void ResetStats();
  uint32_t n_slots() const { return static_cast<uint32_t>(slots_.size()); }
  // Keys in slots now (tests).
  std::vector<uint32_t> ResidentKeys() const;

 private:
  static constexpr uint32_t kNone = UINT32_MAX;
  struct Slot {
    uint32_t key = kNone;
    int pins = 0;
    uint64_t last_use = 0;
    model::ExpertWeights views;  // over the device slot
    bool moving = false;         // a move in flight owns it (its key, if any, is the victim)
  };
  // A move between steps (complete tiers): `down` (kNone: the slot was free) goes from slot `slot`
  // into a RAM slot it reserved, then `up` comes from RAM into the slot. Each half's copies are
  // queued on the device's copy engines and finished at a later step, once its ticket is reached.
  struct Move {
    uint32_t up = kNone, down = kNone;
    int slot = -1;
    bool up_half = false;  // the second half (up's bytes) is in flight
    bool swap = false;     // both halves in flight at once (a pass's swap): the slot holds `up`
    bool fenced = false;   // its copies have a ticket (else: queued since the last fence)
    uint64_t ticket = 0;
  };
  VramTier(const ExpertTable &table, DeviceSlots *device, ExpertTier *below, const VramTierOptions &o);
  absl::Status AcquireImpl(int layer, const std::vector<int32_t> &experts,
                           std::vector<const model::ExpertWeights *> *out, bool wait);
  // The bytes of an expert's slot that hold its parts.
  uint64_t SpanBytes(uint32_t key) const;
  // The slot `key` (now in RAM, its views `ram`) should take: a free one, or a markedly colder
  // resident's not in use (of a layer up to max_layer); -1 when it should stay where it is.
  int SlotFor(uint32_t key, bool may_swap, double z, int max_layer = INT32_MAX);
  // A layer-major pass's swaps into the call's slots (BeginPass): entries of `out` at below_at
  // (RAM's views, `got`) become slot views.
  absl::Status PassSwaps(int layer, const std::vector<size_t> &below_at, const std::vector<const model::ExpertWeights *> &got,
                         std::vector<const model::ExpertWeights *> *out);
  // Lands every swap in flight (the tables point at their victims' old slots until then).
  absl::Status LandSwaps();
  // Whether a move in flight involves an expert of `layer`.
  bool Moving(int layer) const;
  // Moves the hottest candidates up into the slots of markedly colder residents (z), at most `max`.
  absl::Status Rebalance(int max, double z);
  // Starts moving `key` (RAM's views `ram`) into slot v; false when the tier below has no free slot
  // for v's resident.
  absl::StatusOr<bool> StartMove(uint32_t key, const model::ExpertWeights &ram, int v);
  // Finishes the halves whose copies are complete (`wait`: all of them, waiting), starting the
  // second halves.
  absl::Status Advance(bool wait);
  // Gives the moves queued since the last fence a ticket.
  absl::Status FenceQueued();
  void AddCandidate(uint32_t key);
  // Points the device table's entry of `key` at `views` (while the tables exist).
  absl::Status PointAt(uint32_t key, const model::ExpertWeights &views);
  // Moves `key` up from its RAM views into slot v (moving the slot's resident down first).
  absl::Status MoveUp(uint32_t key, const model::ExpertWeights &ram, int v);
  // Moves slot v's resident down into the tier below (dropped when it has no room); the slot is
  // then free.
  absl::Status MoveDown(int v);
  absl::Status Promote(uint32_t key, const model::ExpertWeights &ram);
  void Unpin();

  const ExpertTable &table_;
  DeviceSlots *device_;
  ExpertTier *below_;
  VramTierOptions opts_;
  std::vector<Slot> slots_;
  std::vector<int32_t> key_slot_;  // key -> slot or -1
  std::vector<int> free_;          // empty slots
  RouteHeat heat_;
  // A lower bound of the residents' heat (the last scan's coldest, halved with the counts, lowered
  // by each new resident): a candidate not markedly hotter than it needs no scan, since the rule is
  // monotone in the resident's heat.
  uint32_t floor_ = 0;
  bool floor_ok_ = false;
  uint64_t tick_ = 0;
  // The acquisition in progress: its slots here, the experts asked of the tier below, the experts
  // moved up during it (the tier below gives them up at Release), the swaps it made.
  int layer_ = -1;
  std::vector<int> pinned_;
  std::vector<int32_t> below_experts_;
  std::vector<uint32_t> moved_up_;
  int swaps_ = 0;
  // Complete tiers (see above): the tables exist, every expert is in place, the tier below's
  // own_evictions when it last was; experts served from RAM since the last Rebalance.
  bool complete_ = false, tables_ = false, routable_ = false;
  bool backlog_ = false;  // a prompt's re-plan has candidates left (OnPromptDone's cap)
  bool pass_layer_major_ = false;
  uint64_t evictions_seen_ = 0;
  std::vector<uint32_t> candidates_;
  std::vector<char> candidate_;
  std::vector<Move> moves_;       // in flight
  std::vector<char> moving_up_;   // key -> 1 while it is a move's `up`
  uint64_t reached_ = 0;          // tickets up to this one are complete
  VramTierStats stats_;
};

}  // namespace strata::store
