// Context and sessions. A Context owns the opened model (file, hyper-parameters, bound and loaded
// weights), the backend and the cache plan; Sessions hold a KV cache, queued input, logits and a
// sampler each. Step runs every session with queued input; a failed step leaves each session as it
// was before the step (input still queued, KV position unchanged), but for a context shift the step
// made (the same shift the next step would make).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "lib/model/backend.h"
#include "lib/model/forward.h"
#include "lib/model/hparams.h"
#include "lib/model/model_file.h"
#include "lib/model/weights.h"
#include "lib/runtime/sampler.h"
#include "lib/store/cache_plan.h"
#include "lib/store/expert_cache.h"
#include "lib/store/expert_table.h"
#include "lib/store/vram_tier.h"
#include "lib/text/tokenizer.h"

namespace strata::runtime {

struct ContextOptions {
  std::string model_path;
  int backend = MOE_BACKEND_AUTO;
  uint64_t vram_budget_bytes = 0;
  uint64_t ram_budget_bytes = 0;
  int n_threads = 0;
  int n_ctx = 0;        // 0 = min(model's, 4096)
  int max_sessions = 1;
  int cache_policy = 2;       // store::PolicyKind: 0 LRU, 1 LFU, 2 route hotness
  int prefetch_distance = 1;  // layers ahead the expert cache predicts; 0 = none
  int n_io_threads = 2;
  std::string hotlist_path;   // seed the expert cache from this hotlist at open (in the background)
  int hotlist_max = 0;        // at most this many experts from it; 0 = as many as the cache holds
  bool direct_io = true;      // O_DIRECT expert reads where the layout allows
  bool cpu_q8_activations = false;  // CPU MatMul mode kQ8Activations instead of kExact
  uint64_t kv_budget_bytes = 0;     // KV blocks all sessions may hold; 0 = the cache plan's KV line
  std::string kv_spill_dir;         // where idle sessions' KV may be evicted; "" = no disk eviction
  int cpu_experts = 0;              // moe_cpu_experts: the CUDA backend's hybrid placement
  bool gpu_q8_activations = false;  // the CUDA backend's decode GEMVs with 8-bit activations
  // Continuous batching: at most this many tokens (of all sessions) per forward pass; 0 = default.
  int max_batch_tokens = 0;
  // Prefill modes by input length (0 = the defaults below; see bench/README.md): a
  // session's input of at most prefill_token_max tokens runs token by token; a pass of at least
  // prefill_layer_min tokens streams whole layers (layer-major); between, selected experts only.
  int prefill_token_max = 0;
  int prefill_layer_min = 0;
  // Progress of the weights' load at open (model::LoadOptions::progress); empty = none.
  std::function<void(uint64_t done, uint64_t total)> load_progress;
  // Asked whether to go on, before and while the weights load (model::LoadOptions::keep_going):
  // false fails the open with MOE_ERR_CANCELLED. Empty = never cancel.
  std::function<bool(uint64_t done, uint64_t total)> load_continue;
  // Choices whose defaults are tunables (lib/util/tunables.h): unset follows the tunable, a set one
  // wins over the environment. Graphs and cold copies go to the CUDA backend
  // (cuda::BackendChoices), huge pages to the weights' load (model::LoadOptions::huge_pages).
  std::optional<bool> cuda_graphs;          // STRATA_CUDA_GRAPHS
  std::optional<int> cuda_cold_copies;      // slots a set, 0 = off; STRATA_CUDA_COLD_COPIES
  std::optional<bool> huge_pages;           // STRATA_HUGEPAGES
  std::optional<bool> cuda_streaming;       // --backend cuda over a streaming context; STRATA_CUDA_STREAMING
  // How every session's KV cache stores keys and values (the CUDA backend takes f32 alone).
  model::KvType kv_type_k = model::KvType::kF32;
  model::KvType kv_type_v = model::KvType::kF32;
};

// The most threads a context starts for compute or for expert I/O (ContextOptions::n_threads,
// n_io_threads; moe_params.n_threads): more only cost memory and start-up, and a typo such as
// 1000000 would ask the host for a million threads.
inline constexpr int kMaxThreads = 1024;

// The most slots a set ContextOptions::cuda_cold_copies asks for (the CUDA backend's most routed
// experts a layer; it clamps to that).
inline constexpr int kMaxColdCopies = 256;

// Measured on the CPU backend (bench/README.md, "prefill modes"): batched selected-expert prefill
// beats token by token from 2 tokens up, so token by token is off by default. Layer-major prefill
// pays once a pass would touch nearly every expert of a layer anyway: DefaultPrefillLayerMin.
inline constexpr int kDefaultMaxBatchTokens = 512;
inline constexpr int kDefaultPrefillTokenMax = 1;
inline constexpr int kNoLayerMajor = 1 << 30;

// The pass size from which prefill streams whole layers: T k >= 4 E tokens (E experts, k a token),
// where a pass routed evenly touches 1 - (1 - k/E)^T >= 98% of a layer's experts, so reading whole
// layers ahead costs hardly more bytes than the selected experts and overlaps them with compute.
// Measured on Qwen3-30B-A3B with spread routing (128 experts, top-8): selected-expert prefill wins
// at 32 tokens, layer-major from 64 (this rule: 64). kNoLayerMajor for a model without experts.
int DefaultPrefillLayerMin(int n_expert, int n_expert_used);

// What the expert tiers did since open (or the last reset).
struct ContextStats {
  bool streaming = false;        // routed experts stream from the file through the RAM cache
  store::CacheStats cache;       // hits are RAM-tier hits; misses were read from the file
  store::VramTierStats vram;     // the VRAM tier over the streamed RAM tier (zeros without one)
  model::DeviceTierStats device; // the device backend's VRAM tier (counters since the last reset)
  int numa_node = -1;            // where the weights and pinned buffers were placed (the GPU's node), or -1
};

struct SessionOptions {
  int n_ctx = 0;        // 0 = the context's default
  uint64_t seed = 0;
  SamplerParams sampler;
  bool logits_all = false;
  // Generation ends at these tokens (and at the model's EOS when stop_at_eos) and at the first
  // occurrence of any stop string in the text (see Session::NextText).
  bool stop_at_eos = true;
  std::vector<int32_t> stop_tokens;
  std::vector<std::string> stop_strings;
  // Attention mask: attend only to the last `window` positions (0 = all); positions holding one
  // of blocked_tokens are never keys for another position's query.
  int window = 0;
  std::vector<int32_t> blocked_tokens;
  // Context shift (llama.cpp's --context-shift / --keep): when the input reaches n_ctx positions
  // and more is queued, a step first drops DiscardFor(n_ctx, n_keep) tokens after the first n_keep
  // (Context::ShiftSession) instead of the input being refused. n_keep in [0, n_ctx).
  bool ctx_shift = false;
  int n_keep = 0;
};

// Tokens a context shift drops from a session holding n_past tokens, n_keep of them kept: half of
// the others, as llama.cpp's main and server (n_discard = (n_past - n_keep) / 2), but at least one,
// so a shift always makes room.
inline int DiscardFor(int n_past, int n_keep) { return std::max(1, (n_past - n_keep) / 2); }

// Why Session::NextText ended the text (values of the C ABI's MOE_STOP_*).
enum class StopReason { kNone = 0, kToken = 1, kString = 2 };

class Context;

// Thread-safety: a session's own calls (Feed, Logits, Sample*, NextText) may run on one host thread
// while another thread steps the context: the fields a step reads or writes are guarded by the
// session's mutex, held only to take the step's chunk of input and to commit its results.
class Session {
 public:
  absl::Status Feed(const int32_t *tokens, size_t n);
  int n_past() const {
    std::lock_guard<std::mutex> lk(mu_);
    return n_past_;
  }
  size_t n_pending() const {
    std::lock_guard<std::mutex> lk(mu_);
    return pending_.size();
  }
  // True when every fed token has been processed and logits are there to sample from.
  bool Ready() const {
    std::lock_guard<std::mutex> lk(mu_);
    return pending_.empty() && n_logit_rows_ > 0;
  }
  // Logits after the last processed token; MOE_ERR_STATE before any.
  absl::StatusOr<const float *> Logits() const;
  // With logits_all: every row of the last step.
  absl::Status LogitsAll(const float **rows, int32_t *n_tokens) const;
  // Samples with the session's sampler; the penalties look at the last penalty_last_n tokens of
  // history() (every token the session has processed, prompt and generated alike).
  absl::StatusOr<int32_t> SampleNext();
  // Samples the next token and turns it into text: *text is what may be shown now (complete UTF-8,
  // nothing that might begin a stop string). A stop token ends the text (*stop = kToken; the token's
  // own text is not shown); reaching a stop string ends it before the string (*stop = kString). Either
  // way the held-back text is settled and the next call starts a new text. MOE_ERR_UNSUPPORTED
  // without a tokenizer. Does not feed the token.
  absl::Status NextText(int32_t *token, std::string *text, StopReason *stop);
  // Ends the current text without a stop: the held-back bytes (an unfinished character as U+FFFD).
  std::string EndText();
  bool IsStopToken(int32_t id) const;
  const std::vector<int32_t> &history() const { return history_; }
  Context &ctx() { return *ctx_; }
  const SessionOptions &options() const { return opts_; }
  // KV bytes the session holds in RAM (0 while evicted to disk), and whether it is evicted.
  uint64_t kv_resident_bytes() const { return kv_.resident_bytes(); }
  bool kv_evicted() const { return kv_.spilled(); }
  // KV blocks shared with a fork (or the session it was forked from).
  int kv_shared_blocks() const { return kv_.shared_blocks(); }

 private:
  friend class Context;
  Session(Context *ctx, const SessionOptions &o) : ctx_(ctx), opts_(o), rng_(o.seed) {}
  uint64_t last_step_ = 0;  // Context::step_count_ when the session last ran (eviction order)
  absl::StatusOr<const float *> LogitsLocked() const;
  mutable std::mutex mu_;  // guards pending_, n_past_, logits_, n_logit_rows_, rows_open_, history_
  Context *ctx_;
  SessionOptions opts_;
  Rng rng_;
  model::KvCache kv_;
  int n_ctx_ = 0;
  int n_past_ = 0;
  std::vector<int32_t> pending_;
  std::vector<float> logits_;   // (n_rows, n_vocab)
  // The rows of the step in progress, swapped into logits_ when it commits: both buffers keep
  // their room from step to step. Used only by the stepping thread (under the context's lock).
  std::vector<float> step_logits_;
  int32_t n_logit_rows_ = 0;
  bool rows_open_ = false;        // the input of the last step is not all processed: rows accumulate
  std::vector<int32_t> history_;  // processed tokens, in order
  // The text in progress (NextText): detokenizer and stop-string filter, created on first use.
  std::unique_ptr<text::StreamDetokenizer> detok_;
  std::unique_ptr<StopStrings> stop_filter_;
};

class Context {
 public:
  // Opens the model and makes the context ready. See moe_ctx_open for the errors.
  static absl::StatusOr<std::unique_ptr<Context>> Open(const ContextOptions &o);
  // Opens the model file and binds the weights without reading their data (inspect, plan).
  struct Described {
    std::unique_ptr<model::ModelFile> file;
    model::HParams hp;
    model::ModelWeights weights;
  };
  static absl::StatusOr<Described> Describe(const std::string &path);
  static store::PlanInputs PlanInputsFor(const ContextOptions &o, const model::HParams &hp);

  ~Context();
  const model::HParams &hparams() const { return hp_; }
  const model::ModelWeights &weights() const { return weights_; }
  const store::CachePlan &plan() const { return plan_; }
  const model::ModelFile &file() const { return *file_; }
  int default_n_ctx() const { return n_ctx_; }
  // The model's tokenizer, or nullptr when the file carries none.
  const text::Tokenizer *tokenizer() const { return tokenizer_.get(); }
  // The model's Jinja chat template (GGUF tokenizer.chat_template, or chat_template of
  // tokenizer_config.json / chat_template.jinja in a checkpoint directory); "" when it has none.
  const std::string &chat_template_source() const { return chat_template_; }

  absl::StatusOr<Session *> OpenSession(const SessionOptions &o);
  void CloseSession(Session *s);
  // A new session that continues exactly as s would: its options, tokens, queued input, logits and
  // generator state, and its KV blocks shared copy-on-write (KvCache::ShareFrom). An evicted s is
  // read back first. The text in progress (NextText) is not copied.
  absl::StatusOr<Session *> ForkSession(Session *s);
  // Forgets the last n processed tokens of s (its KV blocks past the new position are let go, its
  // logits dropped). MOE_ERR_INVALID_ARGUMENT for n < 0 or n > n_past, MOE_ERR_STATE with queued input.
  absl::Status RewindSession(Session *s, int n);
  // Drops the n_discard processed tokens of s after its first n_keep (KvCache::Shift): the later
  // ones move down, their keys rotated to their new positions; the position goes back by n_discard
  // and the history loses those tokens. Queued input and the logits stay (the logits computed
  // before the shift). An evicted s is read back first. MOE_ERR_INVALID_ARGUMENT for a negative
  // count or n_keep + n_discard > n_past (nothing changes); MOE_ERR_LIMIT_KV when blocks shared with
  // a fork cannot be copied (the session unchanged).
  absl::Status ShiftSession(Session *s, int n_keep, int n_discard);
  // One forward pass over the pending input of all sessions (continuous batching, at most
  // max_batch_tokens tokens, shared round-robin so every session with input gets a chunk; a very
  // short input runs token by token, which takes a few passes). A failed step leaves every session
  // as it was. n_pending (nullable): sessions still with input afterwards.
  absl::Status Step(uint32_t *n_pending);
  // Moves the session's KV blocks to an unlinked file in the spill directory, freeing their RAM and
  // budget; the next step that runs the session brings them back unchanged. MOE_ERR_STATE without
  // a spill directory; MOE_ERR_IO_* when the file cannot be written (the session is unchanged).
  absl::Status EvictSession(Session *s);
  // Session snapshots (lib/runtime/snapshot.cc): Save writes `path` atomically (temporary file in
  // the same directory, fsync, rename, directory fsync). Load opens a new session from it, with
  // the saved options or *o (nullable) instead; the snapshot must have been written for this model.
  absl::Status SaveSession(Session *s, const std::string &path);
  // The snapshot's bytes into buf[0, cap): *n_written receives its size; MOE_ERR_LIMIT (nothing
  // written) when buf is null or cap smaller.
  absl::Status SaveSessionBuffer(Session *s, void *buf, size_t cap, size_t *n_written);
  absl::StatusOr<Session *> LoadSession(const std::string &path, const SessionOptions *o);
  // LoadSession from a snapshot's bytes in memory; `name` stands for the path in messages.
  absl::StatusOr<Session *> LoadSessionBytes(const uint8_t *data, uint64_t size, const std::string &name,
                                             const SessionOptions *o);
  // KV bytes all sessions hold in RAM, and the budget they share.
  uint64_t kv_used_bytes() const { return kv_budget_->used(); }
  uint64_t kv_budget_bytes() const { return kv_budget_->limit(); }
  // The model's identity: a hash of the architecture, hyper-parameters and tensor table, and a
  // digest of the weights (WeightsDigest in snapshot.h); a snapshot must match both.
  uint64_t model_id() const { return model_id_; }
  uint64_t weights_digest() const { return weights_digest_; }
  // Steps while there is input and the next pass is expected to end within budget_us of the call;
  // the first pass always runs, sized to the budget from the measured time per token. *n_steps
  // (nullable) receives the passes run.
  absl::Status StepFor(int64_t budget_us, uint32_t *n_pending, uint32_t *n_steps);
  // Asks the step in progress (or, with none, the next one) to stop with MOE_ERR_ABORTED at a layer
  // boundary, undone like any failed step. Thread-safe, lock-free: callable while a step runs.
  void Abort() { abort_.store(true, std::memory_order_release); }
  ContextStats Stats() const;
  // Selections per routed expert (index layer * n_expert + expert) since open or the last reset.
  std::vector<uint64_t> ExpertCounts() const;
  void ResetStats();
  // Shows `o` every weight product's input from the next step on (null: stop); MOE_ERR_UNSUPPORTED_BACKEND
  // where the backend's activations are not in host memory (open the context on the CPU).
  absl::Status ObserveActivations(model::ActivationObserver *o);
  // The RAM expert cache when experts stream; nullptr when all are resident.
  store::ExpertCache *expert_cache() { return cache_.get(); }
  const store::ExpertTable &expert_table() const { return *table_; }

 private:
  Context() = default;
  // One step (see Step) of at most `cap` tokens; *ran = false when no session had input. Locked.
  absl::Status StepLocked(int cap, bool *ran);
  uint32_t CountPendingLocked() const;
  // A snapshot of s (snapshot.h) streamed to sink, begin(total bytes) first. Holds mu_ and s->mu_.
  absl::Status WriteSnapshotLocked(Session *s, const std::function<absl::Status(uint64_t)> &begin,
                                   const std::function<absl::Status(const char *, size_t)> &sink);
  std::unique_ptr<model::ModelFile> file_;
  model::HParams hp_;
  model::ModelWeights weights_;
  model::WeightStore store_;
  std::unique_ptr<model::Backend> backend_;
  model::DeviceTierStats device_base_;  // the backend's counters at the last reset
  int numa_node_ = -1;                  // ContextStats::numa_node
  std::unique_ptr<model::Buffer> workspace_;  // the forward pass's activations, grown on demand
  store::CachePlan plan_;
  std::unique_ptr<text::Tokenizer> tokenizer_;
  std::string chat_template_;
  std::unique_ptr<store::ExpertTable> table_;
  std::unique_ptr<store::ExpertCache> cache_;  // after backend_: destroyed first
  // The VRAM tier over cache_ and its device slots (the backend's): destroyed before both.
  std::unique_ptr<store::DeviceSlots> device_slots_;
  std::unique_ptr<store::VramTier> vram_;
  bool ram_tables_ = false;  // no VRAM tier: the device's tables point at a RAM tier of every expert
  uint64_t resident_hits_ = 0;                  // expert uses when nothing streams
  std::vector<uint64_t> expert_counts_;         // selections per (layer, expert)
  std::vector<uint64_t> resident_layer_hits_;
  int n_ctx_ = 0;
  uint64_t model_id_ = 0;
  uint64_t weights_digest_ = 0;
  std::unique_ptr<model::KvBudget> kv_budget_;
  std::string kv_spill_dir_;
  model::KvType kv_type_k_ = model::KvType::kF32, kv_type_v_ = model::KvType::kF32;
  uint64_t step_count_ = 0;
  // Runs fn (which may take KV budget for s) outside a step; while it fails with MOE_ERR_LIMIT_KV
  // and a spill directory is set, evicts another session (idle ones first, then the least recently
  // run) and tries again. Holds mu_.
  absl::Status WithKvRoom(Session *s, const std::function<absl::Status()> &fn);
  // The shift of ShiftSession on a resident s whose arguments are checked: the KV rows, then the
  // position and history (under s->mu_). Evicts nothing: blocks shared with a fork are copied
  // within the budget or the shift fails unchanged. Holds mu_.
  absl::Status ShiftLocked(Session *s, int n_keep, int n_discard);
  // The step's KV admission (StepLocked): in round-robin `order`, each session with take[idx] > 0
  // gets the blocks for all its queued input (want[idx] tokens) or is left out of the step
  // (take[idx] = 0); with a spill directory, idle sessions (least recently run first) and then the
  // sessions later in the order (last first, leaving the step) are evicted to make room. Fails
  // (nothing taken) when a session needs more than the whole budget, or when no session fits.
  // *first_left_out: the first session in the order left out (n_sess when none). shift[idx] > 0:
  // the session is full and shifts (ShiftLocked) by that many tokens once resident, before its input
  // gets blocks (a shift stays done when the step fails later: the next step would make it anyway).
  // Holds mu_.
  absl::Status AdmitKv(const std::vector<size_t> &order, const std::vector<size_t> &want,
                       const std::vector<int> &shift, std::vector<size_t> *take, size_t *first_left_out);
  int max_batch_tokens_ = kDefaultMaxBatchTokens;
  int prefill_token_max_ = kDefaultPrefillTokenMax;
  int prefill_layer_min_ = kNoLayerMajor;
  size_t rr_next_ = 0;          // round-robin: the session index served first by the next step
  double us_per_token_ = 0;     // measured cost of a token in a pass (moving average), for StepFor
  // Abort's request: read by the passes, spent (cleared) by the step call it stops.
  std::atomic<bool> abort_{false};
  // StepLocked's result, with an abort request spent when it stopped the step.
  absl::Status SpendAbort(absl::Status st);
  std::mutex mu_;  // guards sessions_ and serialises Step
  std::vector<std::unique_ptr<Session>> sessions_;
};

}  // namespace strata::runtime
