// The host-RAM expert cache: one slab of fixed-size slots (gate|up|down of one expert each), a
// residency map with slot states (empty, loading, ready) and pin counts, an eviction policy, and
// I/O threads that fill slots from the model files — needed-now loads first, then experts
// predicted for the next layers by applying their routers to the current layer's input, within a
// bound on bytes in flight. A pinned or loading slot is never evicted. It serves the forward pass
// as its ExpertSource, or a device tier above it as the RAM tier (lib/store/tier.h): experts the
// tier above holds are not predicted or preloaded here, and the tier above hands its victims down
// (Admit) and takes the experts it promotes (Evict). Bytes and so results are those of the file
// whatever the budget.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <queue>
#include <string>
#include <thread>
#include <vector>

#include "lib/model/backend.h"
#include "lib/model/forward.h"
#include "lib/model/model_file.h"
#include "lib/store/expert_table.h"
#include "lib/store/policy.h"
#include "lib/store/tier.h"
#include "lib/util/memory_lock.h"

namespace strata::store {

struct CacheOptions {
  uint32_t n_slots = 0;              // at least one layer's experts
  PolicyKind policy = PolicyKind::kHotness;
  int prefetch_distance = 1;         // layers ahead to predict; 0 = no prediction
  int n_io_threads = 2;
  uint64_t max_inflight_bytes = 0;   // bound on predicted loads in flight (demand loads are not
                                     // counted); 0 = 4 slots
  // Predicted loads are issued while the measured share of predictions that the routing then
  // used stays at or above this (PrefetchGate); 0 issues every prediction.
  double prefetch_min_precision = 0.5;
  // mlock the slab in pieces of kLockPieceBytes, as much as the host allows; what was not locked,
  // and why, is in CacheStats (LockWarning words it).
  bool lock_memory = true;
  // The NUMA node the slab's pages and the I/O threads belong on (the GPU's, which reads the slots
  // over PCIe); -1, a node the host lacks, or a host of one node: no binding.
  int numa_node = -1;
  // Tests of a partial lock: mlock's stand-in and a smaller piece (nullptr, 0: mlock, kLockPieceBytes).
  LockFn lock_for_testing = nullptr;
  uint64_t lock_piece_bytes = 0;
  // Read experts with O_DIRECT, past the page cache, through io_uring where available, wherever the
  // table allows it (ExpertPart::direct_ok); other parts use buffered pread.
  bool direct_io = true;
};

struct CacheStats {
  uint64_t hits = 0;                 // needed experts found in RAM (or already loading)
  uint64_t misses = 0;               // needed experts read from the file on demand
  uint64_t prefetch_issued = 0;      // predicted loads started
  uint64_t prefetch_useful = 0;      // of those, used before eviction
  uint64_t prefetch_skipped = 0;     // predictions not issued because the gate was closed
  double prefetch_precision = 0;     // the gate's current estimate of prediction precision
  uint64_t evictions = 0;
  uint64_t admitted = 0;             // experts a tier above handed down (its victims)
  uint64_t bytes_admitted = 0;
  uint64_t taken_up = 0;             // experts given up to a tier above (Evict)
  uint64_t bytes_read = 0;           // bytes read from model files into slots
  uint64_t load_errors = 0;
  uint64_t direct_reads = 0;         // expert loads that bypassed the page cache
  double io_wait_s = 0;              // time the forward pass waited for expert loads
  std::vector<uint64_t> layer_hits, layer_misses;
  uint32_t n_slots = 0;
  uint64_t slot_bytes = 0;
  bool memory_locked = false;        // the whole slab is locked
  uint64_t locked_bytes = 0;         // the locked part, from the slab's start
  std::string lock_shortfall;        // why the rest is not locked (LockResult); empty when all is or
                                     // locking was not asked for
  int numa_node_bound = -1;          // the node the slab and I/O threads were bound to, or -1
};

// The context's warning when the slab could not be locked whole: "RAM expert tier: locked 1.2 GiB of
// 6.0 GiB (RLIMIT_MEMLOCK 8.0 MiB); the rest may be paged out". Empty when there is nothing to say.
std::string LockWarning(const CacheStats &s);

class ExpertCache final : public ExpertTier {
 public:
  // `table`, `file`, `weights` and `backend` outlive the cache. The backend computes predictions.
  static absl::StatusOr<std::unique_ptr<ExpertCache>> Create(const ExpertTable &table,
                                                             const model::ModelFile &file,
                                                             const model::ModelWeights &weights,
                                                             model::Backend *backend,
                                                             const CacheOptions &options);
  ~ExpertCache() override;

  void OnRoute(int layer, const float *h, int64_t n_tok, const int32_t *selected, int k) override;
  absl::Status Acquire(int layer, const std::vector<int32_t> &experts,
                       std::vector<const model::ExpertWeights *> *out) override;
  void Release(int layer, const std::vector<int32_t> &experts) override;
  absl::Status AcquireAsync(int layer, const std::vector<int32_t> &experts,
                            std::vector<const model::ExpertWeights *> *out) override;
  absl::StatusOr<const model::ExpertWeights *> Await(int layer, int32_t expert) override;

  // ExpertTier: what a tier above asks of the RAM tier.
  bool Holds(uint32_t key) const override;
  absl::Status Admit(uint32_t key, const SlotBytes &from) override;
  uint8_t *Reserve(uint32_t key) override;
  void Complete(uint32_t key, bool ok) override;
  bool Evict(uint32_t key) override;
  TierStats tier_stats() const override;
  const model::ExpertWeights *ReadyViews(uint32_t key) const override;
  uint64_t own_evictions() const override { return own_evictions_.load(std::memory_order_relaxed); }
  // The tier above this one (null: none). Its experts are not predicted, preloaded or layer-fetched
  // here. Called before the first step; `above` outlives the cache's use of it.
  void SetTierAbove(const ExpertTier *above) { above_ = above; }

  void OnDecodeToken();
  void OnNewPrompt();
  // Starts background loads of `keys` (layer * n_experts + expert, hottest first) into free slots,
  // at most `max` of them; returns how many were queued. Used to seed the cache from a hotlist.
  size_t Preload(const std::vector<uint32_t> &keys, size_t max);
  // Reads `keys` (those neither here nor above, routed) into empty slots now, on n_threads threads
  // through the page cache (a file read again is then a copy, not a disk read), and returns when
  // they are ready: an opening that fills the tier whole, where the I/O threads' one read at a time
  // past the page cache would leave the first steps waiting. Stops at the first key with no empty
  // slot. `progress` / `keep_going` as model::LoadOptions takes them, over this call's bytes plus
  // `bytes_before` (what the caller loaded first) out of `bytes_total` (0: this call's alone);
  // keep_going's false fails with MOE_ERR_CANCELLED, the keys read so far staying.
  struct FillOptions {
    int n_threads = 0;  // 0: one per core, at most model::kMaxLoadThreads
    uint64_t bytes_before = 0, bytes_total = 0;
    std::function<void(uint64_t done, uint64_t total)> progress;
    std::function<bool(uint64_t done, uint64_t total)> keep_going;
  };
  absl::Status Fill(const std::vector<uint32_t> &keys, const FillOptions &options);
  // Layer-major prefill: starts loads of every expert of `layer` not yet in RAM, as predictions, into
  // slots that are neither pinned nor needed by the layer being computed; returns how many started.
  // Not bounded by max_inflight_bytes: a long prefill uses nearly every expert of a layer.
  size_t PrefetchLayer(int layer);
  // Waits until no load is in flight (tests, benchmarks).
  void WaitIdle();
  CacheStats stats() const;
  void ResetStats();
  uint32_t n_slots() const { return static_cast<uint32_t>(slots_.size()); }
  // Keys resident and ready now (tests).
  std::vector<uint32_t> ResidentKeys() const;
  // The memory every slot lies in (a device backend maps it to read experts where they lie).
  const uint8_t *slab() const { return slab_; }
  uint64_t slab_bytes() const { return slab_bytes_; }

 private:
  enum class SlotState { kEmpty, kLoading, kReady };
  struct Slot {
    SlotState state = SlotState::kEmpty;
    uint32_t key = 0;
    int pins = 0;
    bool prefetched = false;  // loaded by prediction and not used yet
    uint8_t *data = nullptr;
    model::ExpertWeights views;
  };
  struct Request {
    int priority;   // 0 = needed now; d = predicted d layers ahead
    uint64_t seq;
    int slot;
    bool prefetch;  // a predicted load: counted in prefetch_inflight_bytes_ until read
    bool operator<(const Request &o) const {
      return priority != o.priority ? priority > o.priority : seq > o.seq;
    }
  };

  ExpertCache(const ExpertTable &table, const model::ModelFile &file, const model::ModelWeights &weights,
              model::Backend *backend, const CacheOptions &options)
      : table_(table), file_(file), weights_(weights), backend_(backend), opts_(options) {}
  // Picks a slot for `key` (an empty one, else the policy's victim among unpinned ready slots that
  // are not protected), marks it loading and queues it. -1 when every slot is in use. Locked.
  int StartLoadLocked(uint32_t key, int priority, bool prefetch);
  // The slot StartLoadLocked would take for `key` (an empty one, else the policy's victim), marked
  // loading and mapped to the key, nothing queued; -1 when every slot is in use. Locked.
  int TakeSlotLocked(uint32_t key);
  // Whether the tier above holds `key` (then it is not fetched here ahead of need).
  bool HeldAbove(uint32_t key) const { return above_ != nullptr && above_->Holds(key); }
  // Whether every expert of `layer` is here or in the tier above (a prediction would fetch nothing).
  bool LayerHeld(int layer) const;
  // The views of `key`'s expert in slot bytes at `dst`.
  model::ExpertWeights SlotViews(uint32_t key, uint8_t *dst) const;
  void StartPredictedLocked();
  void IoLoop();
  void IoLoopWith(void *ring);
  // Reads one expert into its slot; `ring` is the calling I/O thread's io_uring (or nullptr).
  // `buffered`: through the page cache even where the file allows direct reads.
  absl::Status ReadExpert(uint32_t key, uint8_t *dst, void *ring, bool *direct, bool buffered = false);
  // Acquire's body; with wait false, experts still loading are left null in out.
  absl::Status AcquireLocked(std::unique_lock<std::mutex> &lk, int layer, const std::vector<int32_t> &experts,
                             std::vector<const model::ExpertWeights *> *out, bool wait);
  absl::Status ReadDirect(const format::File &f, int fd, uint64_t offset, uint8_t *dst, uint64_t len, uint64_t need,
                          void *ring);

  const ExpertTable &table_;
  const model::ModelFile &file_;
  const model::ModelWeights &weights_;
  model::Backend *backend_;
  CacheOptions opts_;
  std::unique_ptr<EvictionPolicy> policy_;
  const ExpertTier *above_ = nullptr;

  uint8_t *slab_ = nullptr;
  uint64_t slab_bytes_ = 0;
  int bound_node_ = -1;                  // the slab's NUMA node, where the I/O threads run; set before they start
  std::vector<Slot> slots_;
  std::vector<int32_t> key_slot_;        // key -> slot or -1
  std::vector<uint8_t> protected_;       // keys the current layer needs: not evicted by prediction
  std::vector<absl::Status> key_error_;  // last load failure per key, reported to the waiter
  std::priority_queue<Request> queue_;
  uint64_t seq_ = 0, tick_ = 0;
  uint64_t prefetch_inflight_bytes_ = 0;  // predicted loads queued or being read
  int loading_ = 0;
  bool stop_ = false;
  CacheStats stats_;
  std::atomic<uint64_t> own_evictions_{0};  // never reset (ExpertTier::own_evictions)
  mutable std::mutex mu_;
  std::condition_variable cv_io_, cv_done_;
  std::vector<std::thread> io_threads_;
  std::vector<int> direct_fds_;          // O_DIRECT descriptor per model file, -1 where unavailable
  std::vector<float> predict_logits_;
  std::unique_ptr<model::Buffer> predict_buf_;  // the routers' output in backend memory, then predict_logits_
  std::vector<std::pair<int, std::vector<int32_t>>> predicted_;  // (distance, experts) from OnRoute
  int predicted_layer_ = -1;
  // The slots pinned by the acquisition in progress (layer, slots), unpinned by Release by index: a
  // slot whose load failed no longer maps its key.
  int acquired_layer_ = -1;
  std::vector<int> acquired_slots_;
  // Per layer: keys predicted for it that were not resident when predicted, scored at its routing.
  std::vector<std::vector<uint32_t>> pending_predictions_;
  std::unique_ptr<PrefetchGate> gate_;
};

}  // namespace strata::store
