// Expert cache: slot allocation, the I/O threads, prediction and statistics. One mutex guards the
// residency map and slot states; file reads run outside it, into slots that are marked loading (so
// nothing else touches them until they are ready or failed).
#include "lib/util/str_format.h"
#include "lib/store/expert_cache.h"

#include <fcntl.h>
#include <unistd.h>

#ifdef STRATA_HAVE_URING
#include <liburing.h>
#endif

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>

#include "lib/format/file.h"
#include "lib/util/large_alloc.h"
#include "lib/util/numa.h"
#include "lib/util/thread_start.h"

namespace strata::store {

absl::StatusOr<std::unique_ptr<ExpertCache>> ExpertCache::Create(const ExpertTable &table,
                                                                 const model::ModelFile &file,
                                                                 const model::ModelWeights &weights,
                                                                 model::Backend *backend,
                                                                 const CacheOptions &options) {
  const uint32_t n_keys = static_cast<uint32_t>(table.n_layers()) * static_cast<uint32_t>(table.n_experts());
  if (options.n_slots < static_cast<uint32_t>(table.n_experts()) || n_keys == 0) {
    return Errorf(MOE_ERR_INVALID_ARGUMENT, "an expert cache of %u slots cannot hold one layer's %d experts",
                  options.n_slots, table.n_experts());
  }
  if (options.n_io_threads < 1 || options.n_io_threads > 64 || options.prefetch_distance < 0) {
    return Errorf(MOE_ERR_INVALID_ARGUMENT, "bad cache options: %d I/O threads, prefetch distance %d",
                  options.n_io_threads, options.prefetch_distance);
  }
  auto c = std::unique_ptr<ExpertCache>(new ExpertCache(table, file, weights, backend, options));
  const uint32_t n_slots = std::min(options.n_slots, n_keys);
  c->slab_bytes_ = static_cast<uint64_t>(n_slots) * table.slot_bytes();
  c->slab_ = static_cast<uint8_t *>(AllocateLarge(c->slab_bytes_));
  if (c->slab_ == nullptr) {
    return Errorf(MOE_ERR_NO_MEMORY, "cannot allocate an expert cache of %u slots x %u bytes", n_slots,
                  table.slot_bytes());
  }
  // Pages first touched by the lock below, or by the I/O threads' reads, come from the GPU's node.
  if (numa::PreferMemoryNode(c->slab_, c->slab_bytes_, options.numa_node)) c->bound_node_ = options.numa_node;
  c->stats_.numa_node_bound = c->bound_node_;
  if (options.lock_memory) {
    const LockResult lock = LockInPieces(c->slab_, c->slab_bytes_, options.lock_piece_bytes, options.lock_for_testing);
    c->stats_.locked_bytes = lock.locked_bytes;
    c->stats_.memory_locked = lock.locked_bytes == c->slab_bytes_;
    c->stats_.lock_shortfall = lock.shortfall;
  }
  c->slots_.resize(n_slots);
  for (uint32_t s = 0; s < n_slots; ++s) c->slots_[s].data = c->slab_ + static_cast<uint64_t>(s) * table.slot_bytes();
  c->key_slot_.assign(n_keys, -1);
  c->protected_.assign(n_keys, 0);
  c->key_error_.assign(n_keys, absl::OkStatus());
  c->policy_ = MakePolicy(options.policy, n_keys);
  c->gate_ = std::make_unique<PrefetchGate>(options.prefetch_min_precision);
  c->pending_predictions_.resize(table.n_layers());
  if (c->opts_.max_inflight_bytes == 0) c->opts_.max_inflight_bytes = 4 * table.slot_bytes();
  c->stats_.layer_hits.assign(table.n_layers(), 0);
  c->stats_.layer_misses.assign(table.n_layers(), 0);
  c->stats_.n_slots = n_slots;
  c->stats_.slot_bytes = table.slot_bytes();
  c->direct_fds_.assign(file.n_files(), -1);
  if (options.direct_io) {
    for (int i = 0; i < file.n_files(); ++i) {
      // A second descriptor for O_DIRECT reads; where it cannot be had, reads stay buffered.
      format::OpenOptions o;
      o.flags = O_RDONLY | O_DIRECT;
      o.allow_block_device = true;
      absl::StatusOr<format::UniqueFd> fd = format::OpenRegularFile(file.file(i).name(), o);
      if (fd.ok()) c->direct_fds_[i] = fd->Release();
    }
  }
  // A thread the host refuses fails the open: c's destructor stops and joins the ones started.
  c->io_threads_.reserve(static_cast<size_t>(std::max(0, options.n_io_threads)));
  for (int i = 0; i < options.n_io_threads; ++i) {
    STRATA_ASSIGN_OR_RETURN(
        std::thread t, StartThread([p = c.get()] { p->IoLoop(); },
                                   strata::StrFormat("expert I/O thread %d of %d", i + 1, options.n_io_threads)));
    c->io_threads_.push_back(std::move(t));
  }
  return c;
}

ExpertCache::~ExpertCache() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_io_.notify_all();
  for (auto &t : io_threads_) t.join();
  for (int fd : direct_fds_) {
    if (fd >= 0) ::close(fd);
  }
  UnlockPrefix(slab_, stats_.locked_bytes);
  FreeLarge(slab_);
}

int ExpertCache::TakeSlotLocked(uint32_t key) {
  int victim = -1;
  for (size_t s = 0; s < slots_.size(); ++s) {
    if (slots_[s].state == SlotState::kEmpty && slots_[s].pins == 0) {
      victim = static_cast<int>(s);
      break;
    }
  }
  if (victim < 0) {
    std::vector<uint32_t> keys;
    std::vector<int> idx;
    for (size_t s = 0; s < slots_.size(); ++s) {
      const Slot &sl = slots_[s];
      if (sl.state == SlotState::kReady && sl.pins == 0 && !protected_[sl.key]) {
        keys.push_back(sl.key);
        idx.push_back(static_cast<int>(s));
      }
    }
    if (keys.empty()) return -1;
    victim = idx[policy_->Victim(keys)];
    key_slot_[slots_[victim].key] = -1;
    ++stats_.evictions;
    own_evictions_.fetch_add(1, std::memory_order_relaxed);
  }
  Slot &sl = slots_[victim];
  sl.state = SlotState::kLoading;
  sl.key = key;
  sl.prefetched = false;
  key_slot_[key] = victim;
  key_error_[key] = absl::OkStatus();
  return victim;
}

int ExpertCache::StartLoadLocked(uint32_t key, int priority, bool prefetch) {
  const int victim = TakeSlotLocked(key);
  if (victim < 0) return -1;
  slots_[victim].prefetched = prefetch;
  if (prefetch) prefetch_inflight_bytes_ += table_.slot_bytes();
  ++loading_;
  queue_.push(Request{priority, seq_++, victim, prefetch});
  cv_io_.notify_one();
  return victim;
}

model::ExpertWeights ExpertCache::SlotViews(uint32_t key, uint8_t *dst) const {
  const ExpertEntry &en = table_.entry(table_.LayerOf(key), table_.ExpertOf(key));
  model::ExpertWeights v = *en.weights;
  v.gate.data = dst + en.part[0].slot_offset;
  v.up.data = dst + en.part[1].slot_offset;
  v.down.data = dst + en.part[2].slot_offset;
  return v;
}

bool ExpertCache::LayerHeld(int layer) const {
  std::lock_guard<std::mutex> lk(mu_);
  for (int e = 0; e < table_.n_experts(); ++e) {
    const uint32_t key = table_.Key(layer, e);
    if (key_slot_[key] < 0 && !HeldAbove(key)) return false;
  }
  return true;
}

bool ExpertCache::Holds(uint32_t key) const {
  std::lock_guard<std::mutex> lk(mu_);
  return key < key_slot_.size() && key_slot_[key] >= 0;
}

absl::Status ExpertCache::Admit(uint32_t key, const SlotBytes &from) {
  std::unique_lock<std::mutex> lk(mu_);
  if (key >= key_slot_.size()) return Errorf(MOE_ERR_INVALID_ARGUMENT, "expert key %u is out of range", key);
  if (key_slot_[key] >= 0) return absl::OkStatus();  // already here (a load or an earlier admission)
  if (from.bytes > table_.slot_bytes()) {
    return Errorf(MOE_ERR_INTERNAL, "an expert of %u bytes does not fit a %u-byte RAM slot", from.bytes,
                  table_.slot_bytes());
  }
  const int s = TakeSlotLocked(key);
  if (s < 0) return Errorf(MOE_ERR_NO_MEMORY, "no RAM expert slot is free for expert key %u", key);
  uint8_t *dst = slots_[s].data;
  ++loading_;  // a waiter on the key sees it loading until the copy is done
  lk.unlock();
  absl::Status st = absl::OkStatus();
  if (from.device != nullptr) {
    st = from.device->CopyOut(from.device_slot, dst, from.bytes);
  } else if (from.host != nullptr) {
    std::memcpy(dst, from.host, from.bytes);
  } else {
    st = Errorf(MOE_ERR_INTERNAL, "an expert admitted from nowhere");
  }
  lk.lock();
  --loading_;
  Slot &sl = slots_[s];
  if (st.ok()) {
    sl.views = SlotViews(key, dst);
    sl.state = SlotState::kReady;
    ++stats_.admitted;
    stats_.bytes_admitted += from.bytes;
    policy_->OnUse(key, ++tick_);
  } else {
    sl.state = SlotState::kEmpty;
    key_slot_[key] = -1;
  }
  cv_done_.notify_all();
  return st;
}

uint8_t *ExpertCache::Reserve(uint32_t key) {
  std::lock_guard<std::mutex> lk(mu_);
  if (key >= key_slot_.size() || key_slot_[key] >= 0) return nullptr;
  for (size_t s = 0; s < slots_.size(); ++s) {
    Slot &sl = slots_[s];
    if (sl.state != SlotState::kEmpty || sl.pins != 0) continue;
    sl.state = SlotState::kLoading;
    sl.key = key;
    sl.prefetched = false;
    key_slot_[key] = static_cast<int32_t>(s);
    key_error_[key] = absl::OkStatus();
    ++loading_;  // a waiter on the key sees it loading until Complete
    return sl.data;
  }
  return nullptr;
}

void ExpertCache::Complete(uint32_t key, bool ok) {
  std::lock_guard<std::mutex> lk(mu_);
  if (key >= key_slot_.size() || key_slot_[key] < 0) return;
  Slot &sl = slots_[key_slot_[key]];
  if (sl.state != SlotState::kLoading || sl.key != key) return;
  --loading_;
  if (ok) {
    sl.views = SlotViews(key, sl.data);
    sl.state = SlotState::kReady;
    ++stats_.admitted;
    stats_.bytes_admitted += table_.slot_bytes();
    policy_->OnUse(key, ++tick_);
  } else {
    sl.state = SlotState::kEmpty;
    key_slot_[key] = -1;
  }
  cv_done_.notify_all();
}

const model::ExpertWeights *ExpertCache::ReadyViews(uint32_t key) const {
  std::lock_guard<std::mutex> lk(mu_);
  if (key >= key_slot_.size() || key_slot_[key] < 0) return nullptr;
  const Slot &sl = slots_[key_slot_[key]];
  return sl.state == SlotState::kReady ? &sl.views : nullptr;
}

bool ExpertCache::Evict(uint32_t key) {
  std::lock_guard<std::mutex> lk(mu_);
  if (key >= key_slot_.size() || key_slot_[key] < 0) return false;
  Slot &sl = slots_[key_slot_[key]];
  if (sl.state != SlotState::kReady || sl.pins > 0) return false;
  sl.state = SlotState::kEmpty;
  sl.prefetched = false;
  key_slot_[key] = -1;
  ++stats_.taken_up;
  return true;
}

TierStats ExpertCache::tier_stats() const {
  std::lock_guard<std::mutex> lk(mu_);
  TierStats t;
  t.hits = stats_.hits;
  t.admitted = stats_.admitted;
  t.evicted = stats_.evictions + stats_.taken_up;
  t.bytes_in = stats_.bytes_read + stats_.bytes_admitted;
  t.n_slots = static_cast<uint32_t>(slots_.size());
  t.slot_bytes = table_.slot_bytes();
  return t;
}

absl::Status ExpertCache::ReadDirect(const format::File &f, int fd, uint64_t offset, uint8_t *dst, uint64_t len,
                                     uint64_t need, void *ring) {
  const format::PreadFn hook = format::PreadForTesting();
  uint64_t done = 0;
  while (done < need) {
    ssize_t got;
#ifdef STRATA_HAVE_URING
    if (ring != nullptr && hook == nullptr) {
      auto *r = static_cast<io_uring *>(ring);
      io_uring_sqe *sqe = io_uring_get_sqe(r);
      io_uring_prep_read(sqe, fd, dst + done, static_cast<unsigned>(std::min<uint64_t>(len - done, 1u << 30)),
                         offset + done);
      io_uring_submit(r);
      io_uring_cqe *cqe = nullptr;
      int rc;
      do {
        rc = io_uring_wait_cqe(r, &cqe);
      } while (rc == -EINTR);
      if (rc < 0) {
        errno = -rc;
        got = -1;
      } else {
        got = cqe->res < 0 ? (errno = -cqe->res, -1) : cqe->res;
        io_uring_cqe_seen(r, cqe);
      }
    } else
#endif
    {
      const size_t want = static_cast<size_t>(len - done);
      got = hook != nullptr ? hook(fd, dst + done, want, static_cast<off_t>(offset + done))
                            : ::pread(fd, dst + done, want, static_cast<off_t>(offset + done));
    }
    if (got < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return Errorf(MOE_ERR_IO_READ, "direct read of %u bytes at offset %u: %s", len - done, offset + done,
                    std::strerror(errno));
    }
    if (got == 0) {
      return Errorf(MOE_ERR_IO_CHANGED, "the file ended at offset %u, before the expert's %u bytes", offset + done,
                    need);
    }
    done += static_cast<uint64_t>(got);
    // A direct read moves whole blocks, so a short one normally ends at the end of the file. One that
    // stops elsewhere cannot continue unaligned: the rest goes through the page cache.
    if (done < need && done % kDirectBlock != 0) return f.ReadAt(offset + done, dst + done, need - done);
  }
  return absl::OkStatus();
}

absl::Status ExpertCache::ReadExpert(uint32_t key, uint8_t *dst, void *ring, bool *direct, bool buffered) {
  const ExpertEntry &en = table_.entry(table_.LayerOf(key), table_.ExpertOf(key));
  *direct = false;
  const format::File &f0 = file_.file(en.part[0].file_index);
  // One read past the page cache where the table allows it (the three parts' direct_ok agree).
  const int dfd = en.single_read && en.part[0].direct_ok && !buffered ? direct_fds_[en.part[0].file_index] : -1;
  const uint64_t aligned_len = (en.slot_bytes + kDirectBlock - 1) / kDirectBlock * kDirectBlock;
  if (dfd >= 0 && aligned_len <= table_.slot_bytes()) {
    absl::Status st = ReadDirect(f0, dfd, en.read_offset, dst, aligned_len, en.slot_bytes, ring);
    if (!st.ok()) {
      return Annotate(st, absl::StrCat("reading expert tensors '", en.weights->gate.name, "', '", en.weights->up.name,
                                       "', '", en.weights->down.name, "' of '", f0.name(), "'"));
    }
    *direct = true;
    return absl::OkStatus();
  }
  if (en.single_read) {
    absl::Status st = f0.ReadAt(en.read_offset, dst, en.slot_bytes);
    if (!st.ok()) {
      return Annotate(st, absl::StrCat("reading expert tensors '", en.weights->gate.name, "', '",
                                       en.weights->up.name, "', '", en.weights->down.name, "'"));
    }
    return absl::OkStatus();
  }
  // Part by part (each expert's slice of the stacked gate, up and down tensors): a part the table
  // allows past the page cache, in a file that allows it, by a read of the 4 KiB blocks around it
  // into its region; the others (moved to meet the view alignment) through the page cache.
  const model::Matrix *m[3] = {&en.weights->gate, &en.weights->up, &en.weights->down};
  bool all_direct = true;
  for (int p = 0; p < 3; ++p) {
    const ExpertPart &part = en.part[p];
    const format::File &f = file_.file(part.file_index);
    const bool part_direct = part.direct_ok && !buffered && direct_fds_[part.file_index] >= 0;
    all_direct = all_direct && part_direct;
    absl::Status st;
    if (part_direct) {
      const uint64_t head = part.file_offset % kDirectBlock, need = head + part.bytes;
      st = ReadDirect(f, direct_fds_[part.file_index], part.file_offset - head, dst + part.slot_offset - head,
                      (need + kDirectBlock - 1) / kDirectBlock * kDirectBlock, need, ring);
    } else {
      st = f.ReadAt(part.file_offset, dst + part.slot_offset, part.bytes);
    }
    if (!st.ok()) return Annotate(st, absl::StrCat("reading expert tensor '", m[p]->name, "' of '", f.name(), "'"));
  }
  *direct = all_direct;
  return absl::OkStatus();
}

void ExpertCache::IoLoop() {
  // The thread's CPUs and its ring's memory on the slab's node; nothing where the slab is unbound.
  numa::ScopedNodeBinding bind(bound_node_);
  void *ring = nullptr;
#ifdef STRATA_HAVE_URING
  io_uring uring;
  bool have_ring = false;
  for (int fd : direct_fds_) have_ring = have_ring || fd >= 0;
  if (have_ring && io_uring_queue_init(4, &uring, 0) == 0) ring = &uring;
#endif
  IoLoopWith(ring);
#ifdef STRATA_HAVE_URING
  if (ring != nullptr) io_uring_queue_exit(&uring);
#endif
}

void ExpertCache::IoLoopWith(void *ring) {
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    cv_io_.wait(lk, [this] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping with nothing left to do
    const Request r = queue_.top();
    queue_.pop();
    Slot &sl = slots_[r.slot];
    const uint32_t key = sl.key;
    uint8_t *dst = sl.data;
    lk.unlock();
    bool direct = false;
    absl::Status st = ReadExpert(key, dst, ring, &direct);
    lk.lock();
    if (st.ok() && direct) ++stats_.direct_reads;
    if (r.prefetch) prefetch_inflight_bytes_ -= table_.slot_bytes();
    --loading_;
    if (st.ok()) {
      sl.views = SlotViews(key, dst);
      sl.state = SlotState::kReady;
      stats_.bytes_read += table_.entry(table_.LayerOf(key), table_.ExpertOf(key)).slot_bytes;
    } else {
      sl.state = SlotState::kEmpty;
      sl.prefetched = false;
      key_slot_[key] = -1;
      key_error_[key] = st;
      ++stats_.load_errors;
    }
    cv_done_.notify_all();
  }
}

void ExpertCache::OnRoute(int layer, const float *h, int64_t n_tok, const int32_t *selected, int k) {
  std::vector<int32_t> predicted;
  const int n_exp = table_.n_experts();
  const int n_layers = table_.n_layers();
  std::vector<std::pair<int, std::vector<int32_t>>> ahead;
  if (backend_ != nullptr && opts_.prefetch_distance > 0) {
    // Apply the routers of the next layers to this layer's input: their top-k is the prediction.
    for (int d = 1; d <= opts_.prefetch_distance && layer + d < n_layers; ++d) {
      const model::Matrix &router = weights_.layers[layer + d].router;
      if (router.tensor == nullptr) continue;  // a dense layer: nothing to predict
      if (LayerHeld(layer + d)) {  // every expert in a tier: nothing to fetch, no router product
        ahead.emplace_back(d, std::vector<int32_t>());
        continue;
      }
      // h is in backend memory (a device's, for CUDA): the logits are computed there and read back.
      const size_t floats = static_cast<size_t>(n_tok) * n_exp;
      predict_logits_.resize(floats);
      if (predict_buf_ == nullptr || predict_buf_->bytes() < floats * sizeof(float)) {
        absl::StatusOr<std::unique_ptr<model::Buffer>> b = backend_->Allocate(floats * sizeof(float));
        if (!b.ok()) break;  // no prediction this time: the loads come on demand
        predict_buf_ = std::move(*b);
      }
      float *logits = static_cast<float *>(predict_buf_->data());
      backend_->MatMul(router, h, n_tok, logits);
      backend_->Download(predict_logits_.data(), logits, floats * sizeof(float));
      std::vector<uint8_t> want(n_exp, 0);
      std::vector<int32_t> order(n_exp);
      for (int64_t t = 0; t < n_tok; ++t) {
        const float *row = predict_logits_.data() + t * n_exp;
        for (int e = 0; e < n_exp; ++e) order[e] = e;
        std::partial_sort(order.begin(), order.begin() + k, order.end(),
                          [&](int32_t a, int32_t b) { return row[a] > row[b] || (row[a] == row[b] && a < b); });
        for (int j = 0; j < k; ++j) want[order[j]] = 1;
      }
      std::vector<int32_t> list;
      for (int e = 0; e < n_exp; ++e) {
        if (want[e]) list.push_back(e);
      }
      ahead.emplace_back(d, std::move(list));
    }
  }
  std::lock_guard<std::mutex> lk(mu_);
  for (int64_t i = 0; i < n_tok * k; ++i) {
    const uint32_t key = table_.Key(layer, selected[i]);
    policy_->OnSelect(key);
    protected_[key] = 1;
  }
  // Score what was predicted for this layer: protected_ now marks exactly its selections (and
  // whatever an Acquire of this layer marked, which are selections too).
  std::vector<uint32_t> &scored = pending_predictions_[layer];
  if (!scored.empty()) {
    uint64_t used = 0;
    for (uint32_t key : scored) used += protected_[key];
    gate_->Score(used, scored.size());
    scored.clear();
  }
  // Predicted loads start after this layer's own experts are claimed (in Acquire), so a
  // prediction never takes a slot the current layer needs.
  predicted_ = std::move(ahead);
  predicted_layer_ = layer;
}

void ExpertCache::StartPredictedLocked() {
  const auto ahead = std::move(predicted_);
  predicted_.clear();
  bool issuing = gate_->open();
  for (const auto &[d, list] : ahead) {
    std::vector<uint32_t> &scored = pending_predictions_[predicted_layer_ + d];
    scored.clear();
    for (int32_t e : list) {
      const uint32_t key = table_.Key(predicted_layer_ + d, e);
      if (key_slot_[key] >= 0 || HeldAbove(key)) continue;
      scored.push_back(key);
      if (!issuing) {
        ++stats_.prefetch_skipped;
        continue;
      }
      if (prefetch_inflight_bytes_ + table_.slot_bytes() > opts_.max_inflight_bytes ||
          StartLoadLocked(key, d, /*prefetch=*/true) < 0) {
        issuing = false;  // out of room: the rest are scored but not loaded
        continue;
      }
      ++stats_.prefetch_issued;
    }
  }
}

absl::Status ExpertCache::Acquire(int layer, const std::vector<int32_t> &experts,
                                  std::vector<const model::ExpertWeights *> *out) {
  std::unique_lock<std::mutex> lk(mu_);
  return AcquireLocked(lk, layer, experts, out, /*wait=*/true);
}

absl::Status ExpertCache::AcquireAsync(int layer, const std::vector<int32_t> &experts,
                                       std::vector<const model::ExpertWeights *> *out) {
  std::unique_lock<std::mutex> lk(mu_);
  return AcquireLocked(lk, layer, experts, out, /*wait=*/false);
}

absl::StatusOr<const model::ExpertWeights *> ExpertCache::Await(int layer, int32_t expert) {
  std::unique_lock<std::mutex> lk(mu_);
  const uint32_t key = table_.Key(layer, expert);
  auto loading = [&] {
    const int s = key_slot_[key];
    return s >= 0 && slots_[s].state == SlotState::kLoading;
  };
  if (loading()) {
    const auto t0 = std::chrono::steady_clock::now();
    cv_done_.wait(lk, [&] { return !loading(); });
    stats_.io_wait_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  const int s = key_slot_[key];
  if (s < 0 || slots_[s].state != SlotState::kReady || slots_[s].key != key) {
    if (!key_error_[key].ok()) return key_error_[key];
    return Errorf(MOE_ERR_INTERNAL, "expert %d of layer %d was not loaded", expert, layer);
  }
  return &slots_[s].views;
}

absl::Status ExpertCache::AcquireLocked(std::unique_lock<std::mutex> &lk, int layer,
                                        const std::vector<int32_t> &experts,
                                        std::vector<const model::ExpertWeights *> *out, bool wait) {
  std::vector<int> pinned;
  pinned.reserve(experts.size());
  for (int32_t e : experts) protected_[table_.Key(layer, e)] = 1;
  auto unpin_all = [&] {
    for (int s : pinned) --slots_[s].pins;
    for (int32_t e : experts) protected_[table_.Key(layer, e)] = 0;
  };
  for (int32_t e : experts) {
    const uint32_t key = table_.Key(layer, e);
    int s = key_slot_[key];
    if (s >= 0) {
      ++stats_.hits;
      ++stats_.layer_hits[layer];
      if (slots_[s].prefetched) {
        ++stats_.prefetch_useful;
        slots_[s].prefetched = false;
      }
    } else {
      s = StartLoadLocked(key, 0, /*prefetch=*/false);
      // Slots still loading become evictable once ready: wait for them rather than fail.
      while (s < 0 && loading_ > 0) {
        const auto t0 = std::chrono::steady_clock::now();
        const int before = loading_;
        cv_done_.wait(lk, [&] { return loading_ < before; });
        stats_.io_wait_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        s = key_slot_[key] >= 0 ? -2 : StartLoadLocked(key, 0, /*prefetch=*/false);
      }
      if (s == -2) {  // a prediction brought it in while we waited
        s = key_slot_[key];
        ++stats_.hits;
        ++stats_.layer_hits[layer];
        ++slots_[s].pins;
        pinned.push_back(s);
        policy_->OnUse(key, ++tick_);
        continue;
      }
      if (s < 0) {
        unpin_all();
        return Errorf(MOE_ERR_NO_MEMORY, "all %u expert cache slots are in use; layer %d needs %u experts",
                      static_cast<uint32_t>(slots_.size()), layer, static_cast<uint32_t>(experts.size()));
      }
      ++stats_.misses;
      ++stats_.layer_misses[layer];
    }
    ++slots_[s].pins;
    pinned.push_back(s);
    policy_->OnUse(key, ++tick_);
  }
  if (predicted_layer_ == layer) StartPredictedLocked();
  // Wait for the loads still in flight (ours and predicted ones we now need), unless the caller
  // awaits them one by one.
  auto all_done = [&] {
    for (int s : pinned) {
      if (slots_[s].state == SlotState::kLoading) return false;
    }
    return true;
  };
  if (wait && !all_done()) {
    const auto t0 = std::chrono::steady_clock::now();
    cv_done_.wait(lk, all_done);
    stats_.io_wait_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  out->resize(experts.size());
  for (size_t i = 0; i < experts.size(); ++i) {
    const uint32_t key = table_.Key(layer, experts[i]);
    const Slot &sl = slots_[pinned[i]];
    if (!wait && sl.state == SlotState::kLoading && sl.key == key) {
      (*out)[i] = nullptr;  // the caller awaits it
      continue;
    }
    if (sl.state != SlotState::kReady || sl.key != key) {
      absl::Status st = key_error_[key].ok() ? Errorf(MOE_ERR_INTERNAL, "expert %d of layer %d was not loaded",
                                                       experts[i], layer)
                                             : key_error_[key];
      unpin_all();
      return st;
    }
    (*out)[i] = &sl.views;
  }
  acquired_layer_ = layer;
  acquired_slots_ = std::move(pinned);
  return absl::OkStatus();
}

void ExpertCache::Release(int layer, const std::vector<int32_t> &experts) {
  std::lock_guard<std::mutex> lk(mu_);
  // Only what the acquisition of this layer pinned (a failed Acquire unpinned its own and left none).
  if (acquired_layer_ == layer) {
    for (int s : acquired_slots_) {
      if (slots_[s].pins > 0) --slots_[s].pins;
    }
  }
  acquired_layer_ = -1;
  acquired_slots_.clear();
  for (int32_t e : experts) protected_[table_.Key(layer, e)] = 0;
}

void ExpertCache::OnDecodeToken() {
  std::lock_guard<std::mutex> lk(mu_);
  policy_->OnDecodeToken();
  gate_->OnDecodeToken();
}

void ExpertCache::OnNewPrompt() {
  std::lock_guard<std::mutex> lk(mu_);
  policy_->OnNewPrompt();
}

size_t ExpertCache::Preload(const std::vector<uint32_t> &keys, size_t max) {
  std::lock_guard<std::mutex> lk(mu_);
  size_t queued = 0;
  for (uint32_t key : keys) {
    if (queued >= max || queued >= slots_.size()) break;
    if (key >= key_slot_.size() || key_slot_[key] >= 0 || HeldAbove(key)) continue;
    if (table_.entry(table_.LayerOf(key), table_.ExpertOf(key)).weights == nullptr) continue;  // dense layer
    if (StartLoadLocked(key, 1000, /*prefetch=*/true) < 0) break;
    ++queued;
  }
  return queued;
}

absl::Status ExpertCache::Fill(const std::vector<uint32_t> &keys, const FillOptions &options) {
  struct Item {
    uint32_t key;
    int slot;
  };
  std::vector<Item> items;
  // Progress counts the experts' own bytes (their parts), as the caller's total does.
  const auto expert_bytes = [this](uint32_t key) {
    uint64_t b = 0;
    for (const ExpertPart &part : table_.entry(table_.LayerOf(key), table_.ExpertOf(key)).part) b += part.bytes;
    return b;
  };
  uint64_t to_read = 0;
  {
    std::lock_guard<std::mutex> lk(mu_);
    // Empty slots in order, so a fill never evicts what an earlier one read.
    size_t next_empty = 0;
    for (uint32_t key : keys) {
      if (key >= key_slot_.size() || key_slot_[key] >= 0 || HeldAbove(key)) continue;
      const ExpertEntry &en = table_.entry(table_.LayerOf(key), table_.ExpertOf(key));
      if (en.weights == nullptr) continue;  // a dense layer
      while (next_empty < slots_.size() &&
             (slots_[next_empty].state != SlotState::kEmpty || slots_[next_empty].pins != 0)) {
        ++next_empty;
      }
      if (next_empty == slots_.size()) break;
      Slot &sl = slots_[next_empty];
      sl.state = SlotState::kLoading;
      sl.key = key;
      sl.prefetched = false;
      key_slot_[key] = static_cast<int32_t>(next_empty);
      key_error_[key] = absl::OkStatus();
      ++loading_;
      items.push_back({key, static_cast<int>(next_empty)});
      to_read += expert_bytes(key);
    }
  }
  const uint64_t total = options.bytes_total > 0 ? options.bytes_total : options.bytes_before + to_read;
  std::atomic<size_t> next{0};
  std::atomic<uint64_t> done{0};
  std::atomic<bool> stop{false};
  std::vector<absl::Status> status(items.size());
  std::vector<char> ready(items.size(), 0);
  std::mutex fail_mu;
  absl::Status cancelled;
  using Clock = std::chrono::steady_clock;
  Clock::time_point last = Clock::now();
  const auto report = [&](uint64_t d) {
    d = std::min(options.bytes_before + d, total) - options.bytes_before;
    if (options.progress) options.progress(options.bytes_before + d, total);
    if (options.keep_going && !options.keep_going(options.bytes_before + d, total)) {
      std::lock_guard<std::mutex> lk(fail_mu);
      cancelled = Errorf(MOE_ERR_CANCELLED, "the load was cancelled by the host's callback at %u of %u bytes",
                         options.bytes_before + d, total);
      stop.store(true, std::memory_order_relaxed);
    }
  };
  const auto read = [&](bool reporter) {
    numa::ScopedNodeBinding bind(bound_node_);
    for (;;) {
      const size_t i = next.fetch_add(1, std::memory_order_relaxed);
      if (i >= items.size() || stop.load(std::memory_order_relaxed)) return;
      bool direct = false;
      status[i] = ReadExpert(items[i].key, slots_[items[i].slot].data, nullptr, &direct, /*buffered=*/true);
      ready[i] = status[i].ok();
      const uint64_t d = done.fetch_add(expert_bytes(items[i].key), std::memory_order_relaxed);
      if (!status[i].ok()) stop.store(true, std::memory_order_relaxed);
      if (reporter && (options.progress || options.keep_going) &&
          std::chrono::duration<double>(Clock::now() - last).count() >= model::kLoadProgressSeconds) {
        last = Clock::now();
        report(d);
      }
    }
  };
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int n_threads = static_cast<int>(std::min<size_t>(
      static_cast<size_t>(std::min(options.n_threads > 0 ? options.n_threads : cores, model::kMaxLoadThreads)),
      std::max<size_t>(items.size(), 1)));
  std::vector<std::thread> readers;
  for (int r = 1; r < n_threads; ++r) {
    try {
      readers.emplace_back([&] { read(false); });
    } catch (const std::system_error &) {
      break;  // the host gives no more threads: fewer readers
    }
  }
  read(true);
  for (std::thread &t : readers) t.join();
  // Each slot is ready with its bytes, or empty again: what was read stays, what was not is free.
  absl::Status first = absl::OkStatus();
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (size_t i = 0; i < items.size(); ++i) {
      Slot &sl = slots_[items[i].slot];
      --loading_;
      if (ready[i]) {
        sl.views = SlotViews(items[i].key, sl.data);
        sl.state = SlotState::kReady;
        stats_.bytes_read += table_.entry(table_.LayerOf(items[i].key), table_.ExpertOf(items[i].key)).slot_bytes;
      } else {
        sl.state = SlotState::kEmpty;
        key_slot_[items[i].key] = -1;
        if (!status[i].ok()) {
          key_error_[items[i].key] = status[i];
          ++stats_.load_errors;
          if (first.ok()) first = status[i];
        }
      }
    }
  }
  cv_done_.notify_all();
  STRATA_RETURN_IF_ERROR(first);
  if (!cancelled.ok()) return cancelled;
  report(done.load());
  return cancelled;  // keep_going's answer to the last report
}

size_t ExpertCache::PrefetchLayer(int layer) {
  std::lock_guard<std::mutex> lk(mu_);
  if (layer < 0 || layer >= table_.n_layers()) return 0;
  size_t queued = 0;
  for (int e = 0; e < table_.n_experts(); ++e) {
    const uint32_t key = table_.Key(layer, e);
    if (key_slot_[key] >= 0 || HeldAbove(key)) continue;
    if (table_.entry(layer, e).weights == nullptr) return queued;  // dense layer
    if (StartLoadLocked(key, 1, /*prefetch=*/true) < 0) break;
    ++stats_.prefetch_issued;
    ++queued;
  }
  return queued;
}

void ExpertCache::WaitIdle() {
  std::unique_lock<std::mutex> lk(mu_);
  cv_done_.wait(lk, [this] { return loading_ == 0; });
}

CacheStats ExpertCache::stats() const {
  std::lock_guard<std::mutex> lk(mu_);
  CacheStats s = stats_;
  s.prefetch_precision = gate_->precision();
  return s;
}

void ExpertCache::ResetStats() {
  std::lock_guard<std::mutex> lk(mu_);
  const CacheStats keep = stats_;
  stats_ = CacheStats();
  stats_.layer_hits.assign(keep.layer_hits.size(), 0);
  stats_.layer_misses.assign(keep.layer_misses.size(), 0);
  stats_.n_slots = keep.n_slots;
  stats_.slot_bytes = keep.slot_bytes;
  stats_.memory_locked = keep.memory_locked;
  stats_.locked_bytes = keep.locked_bytes;
  stats_.lock_shortfall = keep.lock_shortfall;
  stats_.numa_node_bound = keep.numa_node_bound;
}

std::string LockWarning(const CacheStats &s) {
  if (s.lock_shortfall.empty()) return "";
  return absl::StrCat("RAM expert tier: locked ", FormatBytes(s.locked_bytes), " of ",
                      FormatBytes(static_cast<uint64_t>(s.n_slots) * s.slot_bytes), " (", s.lock_shortfall,
                      "); the rest may be paged out");
}

std::vector<uint32_t> ExpertCache::ResidentKeys() const {
  std::lock_guard<std::mutex> lk(mu_);
  std::vector<uint32_t> keys;
  for (const Slot &s : slots_) {
    if (s.state == SlotState::kReady) keys.push_back(s.key);
  }
  std::sort(keys.begin(), keys.end());
  return keys;
}

}  // namespace strata::store
