// The forward pass of the supported MoE decoder architectures, written once against the Backend
// interface: embeddings, RMSNorm, GQA attention with RoPE (and Qwen3's QK-norm) over a session's KV
// cache, router softmax -> top-k -> optional renormalisation, SwiGLU experts, output head.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "lib/model/backend.h"
#include "lib/model/hparams.h"
#include "lib/model/weights.h"
#include "lib/util/status.h"

namespace strata::model {

// The bytes of KV blocks a context's sessions may hold together (the cache plan's KV budget),
// taken as blocks are allocated and given back as they are freed. Thread-safe.
class KvBudget {
 public:
  explicit KvBudget(uint64_t limit) : limit_(limit) {}
  bool Take(uint64_t bytes);
  void Give(uint64_t bytes) { used_.fetch_sub(bytes); }
  uint64_t used() const { return used_.load(); }
  uint64_t limit() const { return limit_; }

 private:
  const uint64_t limit_;
  std::atomic<uint64_t> used_{0};
};

// One session's KV cache: for each layer, rows of k_width keys and v_width values per position,
// held in blocks of kKvBlockTokens positions that are allocated as the session grows (never more
// than n_ctx positions) and charged to an optional KvBudget. The widths depend on the family:
// kv_dim each for grouped-query attention; for multi-head latent attention the compressed latent
// plus the shared RoPE key in the k rows and no v rows. Keys and values are stored in their own
// KvType (f32, f16 or q8_0: rows encoded as they are written, KvRowBytes each). Also holds the session's attention mask
// (sliding window, blocked token ids) and can spill its blocks to an unlinked file on disk.
// Invariant: masked_ has one byte per position the blocks cover.
class KvCache {
 public:
  struct Widths {
    int k = 0, v = 0;
  };
  static Widths WidthsFor(const HParams &hp);
  KvCache() = default;
  ~KvCache();
  KvCache(const KvCache &) = delete;
  KvCache &operator=(const KvCache &) = delete;
  // Sets the shape; allocates nothing. `budget` (nullable) must outlive the cache. Blocks come from
  // `be` (nullable: host memory), so they live where that backend computes; spill and snapshot
  // copies go through its Download / Upload. k_type / v_type: how key and value rows are stored.
  absl::Status Init(const HParams &hp, int n_ctx, KvBudget *budget = nullptr, Backend *be = nullptr,
                    KvType k_type = KvType::kF32, KvType v_type = KvType::kF32);
  // Attention mask: window > 0 limits every layer to the last `window` positions (combined with a
  // model's own per-layer window by taking the smaller); a position holding one of `blocked` is
  // never a key for another position's query.
  void SetMask(int window, std::vector<int32_t> blocked);
  int window() const { return window_; }
  // The window layer l attends with: the smaller of the model's and the session's (0 = none).
  int WindowFor(const HParams &hp, int l) const;

  // Makes positions [0, n) writable, allocating the blocks that are missing. MOE_ERR_LIMIT_CONTEXT
  // past n_ctx, MOE_ERR_LIMIT_KV when the budget cannot hold them, MOE_ERR_NO_MEMORY, MOE_ERR_STATE
  // while spilled; on failure nothing is allocated.
  absl::Status Reserve(int n);
  // Reserve(pos0 + n) and records the mask of tokens[0, n) at positions pos0...
  absl::Status Prepare(int pos0, const int32_t *tokens, int64_t n);
  // Frees the blocks that hold no position below n (a block shared with another cache stays with it).
  void Trim(int n);
  // Makes this cache (Init'ed with the same shape, holding nothing) a copy of `src`, sharing its
  // blocks copy-on-write: a block held by several caches is copied by the one that writes into it
  // (Prepare), so each sees only its own writes; its budget is given back when its last holder lets
  // it go. MOE_ERR_STATE when src is spilled or this cache is not empty.
  absl::Status ShareFrom(const KvCache &src);
  // Blocks this cache shares with another (tests, stats), and those of them holding a position of
  // [pos0, pos0 + n): the blocks a write there copies first.
  int shared_blocks() const;
  int SharedBlocksIn(int pos0, int64_t n) const;
  // Copies every shared block holding a position of [pos0, pos0 + n) into one of this cache's own
  // (Prepare does it before a write; a step's KV admission does it ahead, against the budget).
  absl::Status Unshare(int pos0, int64_t n);

  KvView layer(int l) {
    return KvView{k_tab_[l].data(), v_tab_[l].data(), capacity(), w_.k, w_.v, masked_.data(), k_type_, v_type_};
  }
  // With a backend, the block tables and the mask also live in its memory, for KvRowRefs (a decode
  // step reads them there, so one call serves every session). SyncDevice brings that copy up to
  // date: the tables when blocks came or went, the mask where it differs from what was sent.
  bool has_device_table() const { return dev_ != nullptr; }
  absl::Status SyncDevice();
  float *const *device_k_table(int l) const { return DevTable() + static_cast<size_t>(2 * l) * max_blocks_; }
  float *const *device_v_table(int l) const { return DevTable() + static_cast<size_t>(2 * l + 1) * max_blocks_; }
  // The mask in backend memory, or null while no position the blocks cover is masked.
  const uint8_t *device_mask() const { return dev_mask_any_ ? DevMask() : nullptr; }
  int n_ctx() const { return n_ctx_; }
  Widths widths() const { return w_; }
  KvType k_type() const { return k_type_; }
  KvType v_type() const { return v_type_; }
  int n_blocks() const { return static_cast<int>(blocks_.size()); }
  int capacity() const { return n_blocks() * kKvBlockTokens; }  // positions the blocks cover
  uint64_t block_bytes() const { return BlockBytesFor(n_layer_, w_, k_type_, v_type_); }
  uint64_t resident_bytes() const { return static_cast<uint64_t>(n_blocks()) * block_bytes(); }

  // Writes the blocks holding positions [0, n) to an unlinked file in `dir` and frees them (and
  // their budget). Unspill reads them back bit for bit (charging the budget again); on failure the
  // cache stays spilled and Unspill may be retried.
  absl::Status Spill(const std::string &dir, int n);
  absl::Status Unspill();
  bool spilled() const { return spill_fd_ >= 0; }
  int spilled_blocks() const { return spill_blocks_; }

  // Snapshots: copies the key (values = false) or value rows of positions [0, n) of layer l to
  // out (n, width) as floats (decoded from the cache's type), from RAM or from the spill file;
  // WriteRows stores rows of reserved positions (encoded in the cache's type: a q8_0 or f16 row read
  // by ReadRows is written back to the same bytes).
  absl::Status ReadRows(int l, bool values, int n, float *out) const;
  void WriteRows(int l, bool values, int n, const float *in);

  // Context shift (kv_shift.cc), llama.cpp's seq_rm of [keep, keep + discard) then seq_add of
  // -discard over [keep + discard, n): of the n positions held, drops the `discard` after the first
  // `keep` and moves the rows of the rest down by `discard` (their mask bytes with them), each key
  // rotated by -discard positions with the model's RoPE (the shared RoPE key of a latent row alone;
  // values and latents move as they are), through `be` (the cache's own backend when it has one), so
  // the rows are those the keys would have had at their new positions, up to rounding; rows stored
  // in f16 or q8_0 are decoded, rotated and encoded again. Blocks shared with a fork are copied
  // first, and the blocks past n - discard are freed. MOE_ERR_INVALID_ARGUMENT for a range outside
  // [0, n); MOE_ERR_STATE while spilled; MOE_ERR_LIMIT_KV when copying a shared block is refused
  // (nothing moved then); a backend's error after rows began to move leaves the cache unusable.
  absl::Status Shift(Backend &be, const HParams &hp, int n, int keep, int discard);

  // Bytes of one position's key and value rows of one layer.
  static uint64_t RowBytesFor(Widths w, KvType k_type, KvType v_type) {
    return KvRowBytes(k_type, w.k) + (w.v > 0 ? KvRowBytes(v_type, w.v) : 0);
  }
  static uint64_t BlockBytesFor(int n_layer, Widths w, KvType k_type = KvType::kF32, KvType v_type = KvType::kF32) {
    return static_cast<uint64_t>(n_layer) * kKvBlockTokens * RowBytesFor(w, k_type, v_type);
  }
  static uint64_t BytesFor(const HParams &hp, int n_ctx, KvType k_type = KvType::kF32, KvType v_type = KvType::kF32) {
    return static_cast<uint64_t>(hp.n_layer) * static_cast<uint64_t>(n_ctx) *
           RowBytesFor(WidthsFor(hp), k_type, v_type);
  }

 private:
  // One block of KV memory, charged to the budget until its last holder lets it go.
  struct Block {
    std::unique_ptr<Buffer> buf;
    KvBudget *budget = nullptr;
    uint64_t charged = 0;
    Block() = default;
    Block(const Block &) = delete;
    Block &operator=(const Block &) = delete;
    ~Block() {
      if (budget != nullptr) budget->Give(charged);
    }
  };
  using BlockRef = std::shared_ptr<Block>;
  absl::Status AddBlocks(int n, std::vector<BlockRef> *out);
  void Adopt(std::vector<BlockRef> *blocks);
  // Block memory <-> host, through the backend when there is one.
  void ToHost(void *dst, const void *src, size_t bytes) const;
  void FromHost(void *dst, const void *src, size_t bytes) const;
  static uint8_t *Data(const BlockRef &b) { return static_cast<uint8_t *>(b->buf->data()); }
  // Points the tables of block b at its memory (every layer's k and v rows).
  void SetTables(int b, uint8_t *base);
  size_t k_row_bytes() const { return KvRowBytes(k_type_, w_.k); }
  size_t v_row_bytes() const { return w_.v > 0 ? KvRowBytes(v_type_, w_.v) : 0; }
  void FreeAll();
  // Positions [lo, hi) of masked_ may differ from the backend's copy.
  void MaskChanged(size_t lo, size_t hi);
  void RecountMask();
  float *const *DevTable() const { return static_cast<float *const *>(dev_->data()); }
  uint8_t *DevMask() const {
    return static_cast<uint8_t *>(dev_->data()) + static_cast<size_t>(2) * n_layer_ * max_blocks_ * sizeof(float *);
  }
  int n_ctx_ = 0;
  int n_layer_ = 0;
  Widths w_;
  KvType k_type_ = KvType::kF32, v_type_ = KvType::kF32;
  KvBudget *budget_ = nullptr;
  Backend *be_ = nullptr;
  // blocks_[b]: (n_layer, [k (kKvBlockTokens, k row bytes) | v (kKvBlockTokens, v row bytes)]) bytes;
  // shared with forks (ShareFrom) until one of them writes into it.
  std::vector<BlockRef> blocks_;
  std::vector<std::vector<uint8_t *>> k_tab_, v_tab_;  // per layer, per block
  std::vector<uint8_t> masked_;
  int window_ = 0;
  std::vector<int32_t> blocked_;  // sorted, unique
  // The backend's copy: per layer [k table | v table] of max_blocks_ block addresses, then n_ctx_
  // mask bytes; dev_mask_sent_ what its mask holds, dev_tab_dirty_ when the tables changed since.
  std::unique_ptr<Buffer> dev_;
  int max_blocks_ = 0;
  bool dev_tab_dirty_ = false, dev_mask_any_ = false;
  std::vector<uint8_t> dev_mask_sent_;
  size_t mask_dirty_lo_ = SIZE_MAX, mask_dirty_hi_ = 0;  // MaskChanged's range since the last sync
  int64_t mask_nonzero_ = 0;                               // masked positions in masked_
  int spill_fd_ = -1;
  int spill_blocks_ = 0;
  uint32_t spill_crc_ = 0;
};

// Where the routed experts' bytes come from. For each layer the forward pass reports the routing
// of the whole batch, then acquires the distinct selected experts (ascending ids, each once per
// batch), computes with them, and releases them. An implementation may bring experts in from a slower
// tier inside Acquire and must keep them in place until Release; it may use the routing and the
// layer input to predict what later layers need. Without one, the resident weights are used.
class ExpertSource {
 public:
  virtual ~ExpertSource() = default;
  // `h` (n_tok, n_embd): the normalised input of layer l's experts, in the backend's memory; `selected` (n_tok * k) the
  // expert ids chosen for each token.
  // `h` is null when the selections were made in backend memory and are reported after the pass
  // (only for a resident() source).
  virtual void OnRoute(int layer, const float *h, int64_t n_tok, const int32_t *selected, int k) {}
  // True when Acquire hands out the layer's own resident weights and cannot fail: the forward pass
  // may then run experts before asking and report OnRoute / Acquire / Release after the pass.
  virtual bool resident() const { return false; }
  // True when the backend's device tables address every expert where the tiers hold it
  // (store::DeviceSlots::EnableTables): the forward pass may then let a backend with tables route
  // and group by itself (RoutedExperts with tables_only), and report as for resident(). Acquire
  // then cannot fail either.
  virtual bool routes_on_device() const { return false; }
  // out[i] receives the weights of experts[i], valid until Release(layer, experts). On failure
  // nothing stays acquired and Release is not called.
  virtual absl::Status Acquire(int layer, const std::vector<int32_t> &experts,
                               std::vector<const ExpertWeights *> *out) = 0;
  virtual void Release(int layer, const std::vector<int32_t> &experts) = 0;
  // For sources that load experts: Acquire without waiting for loads in flight — out[i] is null for
  // an expert still loading, and Await(layer, experts[i]) waits for it — so the caller can compute
  // the ready experts while the rest are read. Release follows either way, also after a failed
  // Await. Default: Acquire (everything ready at once).
  virtual absl::Status AcquireAsync(int layer, const std::vector<int32_t> &experts,
                                    std::vector<const ExpertWeights *> *out) {
    return Acquire(layer, experts, out);
  }
  virtual absl::StatusOr<const ExpertWeights *> Await(int layer, int32_t expert) {
    return Errorf(MOE_ERR_INTERNAL, "expert %d of layer %d is not being loaded", expert, layer);
  }
};

// RoPE frequencies of a head of `dim` rotated dimensions: theta^(-2i/dim), or with YaRN the blend of
// interpolated (/ factor) and original frequencies over the correction range, as transformers'
// yarn initialisation computes them. Empty when plain RoPE applies. The forward pass rotates
// queries and keys with them, and a context shift rotates cached keys back by the same ones.
std::vector<float> RopeFrequencies(const HParams &hp, int dim);

// One sequence of a batch: its KV cache and the new tokens at positions pos0..pos0+n_tok-1.
struct SequenceArgs {
  KvCache *kv = nullptr;
  const int32_t *tokens = nullptr;
  int64_t n_tok = 0;
  int pos0 = 0;                      // position of tokens[0]; the cache holds positions < pos0
  bool all_logits = false;           // logits for every token, else only the last
  // When set, the sequence's logits rows go here (room for (all_logits ? n_tok : 1) x n_vocab
  // floats) and its entry of Forward's logits stays empty: a caller keeping its own buffers from
  // step to step has them written once, with no allocation.
  float *logits_dst = nullptr;
};

// A forward pass over several sequences at once (continuous batching): embeddings, norms, routing
// and experts run over the concatenated tokens, so an expert is acquired once per batch for every
// token of every sequence that routes to it; attention runs per sequence over its own cache. Each
// token's numbers do not depend on the other tokens of the batch.
struct ForwardArgs {
  std::vector<SequenceArgs> seqs;
  ExpertSource *experts = nullptr;   // nullptr: the resident weights in `w`
  // Caller-owned activation workspace in the backend's memory, replaced by a larger one when it
  // holds fewer than ForwardWorkspaceBytes; nullptr: one for this call only.
  std::unique_ptr<Buffer> *workspace = nullptr;
  // Set by another thread to stop the pass at its next layer boundary with MOE_ERR_ABORTED (checked
  // before the first layer too); the caches are then as after any failure below. nullptr: never.
  const std::atomic<bool> *abort = nullptr;
};

// Tests only: fn(layer, user) runs on the stepping thread at every layer boundary of every forward
// pass, before the abort flag is read (so a test can abort at a chosen layer). nullptr: none.
void SetLayerHookForTesting(void (*fn)(int layer, void *user), void *user);

// The logits rows a forward pass holds in backend memory at once, beyond one a sequence. A batch
// that wants more (a prompt whose every position's logits are asked) runs its output head in chunks
// of this many rows, each downloaded before the next, so the workspace (and the cache plan's share
// of a memory budget) does not grow with n_vocab floats per batch token: Qwen3's 151,936 would take
// 297 MiB a 512-token batch. Such a pass runs eagerly (a recorded step holds no download); a decode
// step (one row a sequence) is never chunked.
inline constexpr int64_t kLogitsChunkRows = 64;

// Rows of logits held at once for n_out rows over n_seq sequences (n_out when they fit).
inline int64_t LogitsRowsHeld(int64_t n_out, int64_t n_seq) {
  return n_out <= (n_seq > kLogitsChunkRows ? n_seq : kLogitsChunkRows) ? n_out : kLogitsChunkRows;
}
// The most LogitsRowsHeld gives a pass of at most max_tok tokens over at most max_seq sequences
// (what a workspace sized for any such pass sets aside): a row a token up to kLogitsChunkRows, or a
// row a sequence where that is more.
inline int64_t MaxLogitsRowsHeld(int64_t max_tok, int64_t max_seq) {
  const int64_t rows = max_seq > kLogitsChunkRows ? max_seq : kLogitsChunkRows;
  return max_tok < rows ? max_tok : rows;
}

// Bytes of backend memory a forward pass over n_tok tokens of n_seq sequences with n_out rows of
// logits needs.
size_t ForwardWorkspaceBytes(const HParams &hp, int64_t n_tok, int64_t n_out, int64_t n_seq);

// Runs the sequences through the model, writing their K/V into their caches and the logits of
// sequence i to its logits_dst, else into (*logits)[i] ((all_logits ? n_tok : 1) x n_vocab; logits
// may be null when every sequence has a logits_dst). Requires pos0 + n_tok <= kv->n_ctx() for each, and distinct caches. Arguments are checked before any cache is written; then
// each cache gets the blocks its new positions need (MOE_ERR_LIMIT_KV when the budget refuses them)
// and their mask. On a later failure (an expert load) the caches may hold rows at positions >= pos0,
// which are not yet part of any sequence, so the sequences stay as they were; blocks taken for them
// may remain (KvCache::Trim frees them).
absl::Status Forward(const HParams &hp, const ModelWeights &w, Backend &be, const ForwardArgs &args,
                     std::vector<std::vector<float>> *logits);

// One sequence: the same as a batch of one.
absl::Status Forward(const HParams &hp, const ModelWeights &w, Backend &be, KvCache &kv, const int32_t *tokens,
                     int64_t n_tok, int pos0, bool all_logits, ExpertSource *experts, std::vector<float> *logits);

}  // namespace strata::model
