// The CUDA backend: the Backend interface (lib/model/backend.h) over the kernel layer
// (backends/cuda/kernels.h). The model's weights are copied to VRAM once at creation (matrices
// whose codec has no device kernel are held dequantized to float32); activations and KV caches are
// device buffers; all work is queued on one compute stream, and only Route (the selections) and
// Download (logits) wait for it. Errors are kept (the first one) and returned by TakeError.
//
// Routed experts the VRAM budget does not hold are lib/store's to place (store::VramTier over
// store::ExpertCache): the backend keeps no slots, heat or plan of its own. It implements the
// device side of those tiers (CudaDeviceSlots, device_slots.h): slots in VRAM, copies between them
// and the RAM tier's page-locked slab, and the layers' device tables of expert addresses
// (EnableExpertTables, PointExpert: a VRAM slot, or a RAM slot mapped for the device), over which
// decode batches route and group on the device (RoutedExperts) with no host wait between layers:
//  - the copy engines (ColdCopier; STRATA_CUDA_COLD_COPIES=N sets the slots, 0 turns it off) move
//    a layer's experts from RAM into staging slots before its products, and while layer l
//    computes they already move layer l + 1's experts as its router predicts them from layer l's
//    input (the prediction's slots are layer l + 1's first choice; what it missed follows);
//  - a prompt's experts from RAM are copied into a ring of staging slots (the copy engines' sets'
//    memory, PromptStage) before their products, the compute stream waiting for each copy.
// The bytes are the same everywhere, so results are bit-identical at any budget.
//
// Hybrid placement (cpu_experts.h): in a decode layer whose experts are mostly read over the link,
// the CPU computes a share of the cold experts from host RAM while the device reads the rest; the
// cost model (lib/model/placement.h) is fed by the link's copy rate measured at creation and the
// CPU's expert rate measured then and on every job. A layer takes this path while the bytes it
// would save (from the layer's cold bytes per call, averaged) outweigh the round trip it adds.
// Results then are those of the CPU backend for those experts (CpuExpertMode::kOff keeps them
// bit-identical at any budget).
#pragma once

#include <chrono>
#include <map>
#include <string>
#include <memory>
#include <optional>
#include <set>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "backends/cuda/cold_copier.h"
#include "backends/cuda/cpu_experts.h"
#include "backends/cuda/kernels.h"
#include "backends/cuda/memory.h"
#include "lib/model/backend.h"
#include "lib/model/pack.h"
#include "lib/model/placement.h"

namespace strata::cuda {

// Choices the host makes (moe_params fields); each unset one follows its tunable
// (lib/util/tunables.h), a set one wins over the environment.
struct BackendChoices {
  std::optional<bool> graphs;          // decode steps recorded and replayed (STRATA_CUDA_GRAPHS)
  std::optional<int64_t> cold_copies;  // the copy engines' slots a set; 0 = off (STRATA_CUDA_COLD_COPIES)
};

class CudaBackend final : public model::Backend {
 public:
  // Copies every resident matrix (those inside the host arena [arena, arena + arena_bytes), where
  // WeightStore keeps them) and every norm / bias vector of `w` to the device. MOE_ERR_NO_MEMORY when
  // VRAM cannot hold them; MOE_ERR_UNSUPPORTED_BACKEND without a device. `w` must outlive the backend
  // (its host addresses are the keys by which the forward pass names weights).
  // Routed experts in the arena are resident; those a VRAM budget does not hold are the runtime's
  // tiers' (not in the arena). cpu: whether and how the CPU computes a share of the experts the tiers serve from RAM.
  // choices: graphs and the copy engines' slots, where the host chose them.
  static absl::StatusOr<std::unique_ptr<CudaBackend>> Create(const model::ModelWeights &w, const uint8_t *arena,
                                                             size_t arena_bytes, const CpuExpertOptions &cpu = {},
                                                             bool q8_activations = false,
                                                             const BackendChoices &choices = {});
  ~CudaBackend() override;
  std::string_view name() const override { return "cuda"; }

  absl::StatusOr<std::unique_ptr<model::Buffer>> Allocate(size_t bytes) override;
  void Upload(void *dst, const void *src, size_t bytes) override;
  void Download(void *dst, const void *src, size_t bytes) override;
  void DownloadParts(const void *src, const DownloadPart *parts, size_t n) override;
  absl::Status TakeError() override;

  void CopyRows(float *dst, int64_t dst_stride, const float *src, int64_t src_stride, int64_t rows,
                int64_t width) override;
  void Add(float *x, const float *y, int64_t n) override;
  void AddBias(float *x, int64_t n_rows, int64_t n, const float *bias) override;
  void SigmoidScaleRows(float *x, const float *g, int64_t n_rows, int64_t n) override;
  void GatherRows(const float *src, int64_t width, const int32_t *idx, int64_t n, float *dst) override;
  void WeightedRowSum(const float *rows, const int32_t *idx, const float *wts, int64_t n_tok, int k, int64_t width,
                      float *out) override;
  void Route(const model::RouteParams &p, const float *logits, int64_t n_tok, int32_t *sel_host,
             float *wts) override;

  void MatMul(const model::Matrix &w, const float *x, int64_t n_tok, float *y) override;
  void MatMulInputMajor(const model::Matrix &w, const float *x, int64_t n_tok, float *y) override;
  void GetRows(const model::Matrix &w, const int32_t *ids, int64_t n, float *out) override;
  void RmsNorm(const float *x, const float *weight, int64_t n_rows, int64_t n, float eps, float *y) override;
  void AddRmsNorm(float *x, const float *add, const float *weight, int64_t n_rows, int64_t n, float eps,
                  float *y) override;
  void MatMulMany(const model::Matrix *const *ws, float *const *ys, int n, const float *x, int64_t n_tok) override;
  using model::Backend::Attention;
  using model::Backend::Rope;
  void Rope(float *x, int64_t n_tok, int n_heads, int head_dim, const int32_t *pos, float theta,
            model::RopeStyle style, const model::RopeParams &p) override;
  void NormRope(float *q, float *k, int64_t n_tok, int n_head, int n_head_kv, int head_dim, const float *q_norm,
                const float *k_norm, float eps, const int32_t *pos, float theta, model::RopeStyle style,
                const model::RopeParams &p) override;
  void Attention(const float *q, const model::KvView &kv, int64_t n_tok, int pos0, int n_head, int n_head_kv,
                 int head_dim, int window, float *out, const model::AttentionParams &p) override;
  void ExpertFfn(const model::ExpertWeights &e, const float *x, int64_t n_tok, float *y) override;
  // A batch past kDeviceRouteMaxRows rows (a prompt) with 8-bit activations: the experts of a layer
  // in a few launches on the tensor cores (PromptMmaQ8), not a chain of products each.
  void ExpertsFfn(const model::ExpertWeights *const *ew, int n, const int64_t *first, const float *xg, float *yg,
                  int64_t width) override;
  bool RoutedExperts(const model::RoutedExpertsArgs &a) override;
  // KV rows in f16 and q8_0 encoded and decoded on the device (f32: device copies).
  void WriteKvBytes(uint8_t *dst, int64_t dst_stride, const float *src, int64_t src_stride, int64_t rows, int width,
                    model::KvType t) override;
  void ReadKvBytes(float *dst, int64_t dst_stride, const uint8_t *src, int64_t src_stride, int64_t rows, int width,
                   model::KvType t) override;
  void WriteKvRows(const model::KvRowRef *rows, const model::KvRowRef *rows_host, int64_t n, const float *k,
                   const float *v, int k_width, int v_width) override;
  void AttentionRows(const float *q, const model::KvRowRef *rows, const model::KvRowRef *rows_host, int64_t n,
                     int max_keys, int n_head, int n_head_kv, int head_dim, int k_width, int v_width, float *out,
                     const model::AttentionParams &p) override;
  StepMode BeginStep(const model::StepKey &key) override;
  absl::Status EndStep() override;
  model::DeviceTierStats tier_stats() const override;

  // Largest batch (tokens x experts per token) RoutedExperts takes; larger ones (prefill) use the
  // host path: with 8-bit activations its experts and dense products run on the tensor cores a
  // layer's experts in a few launches (ExpertsFfn, PromptGemvQ8), else cuBLASLt GEMMs per product.
  static constexpr int64_t kDeviceRouteMaxRows = 512;
  int64_t routed_rows_max() const override { return kDeviceRouteMaxRows; }

  // Bytes of VRAM the weights took at creation.
  size_t weight_bytes() const { return weight_bytes_; }
  // Page-locks and maps p (a streamed expert cache's slab): its experts are read in place over the
  // link, and each expert call waits for its reads before it returns. Refused (nothing mapped)
  // where a routed expert's codec or shape cannot be read in place.
  absl::Status MapHostMemory(const uint8_t *p, size_t bytes) override;
  // Whether every routed expert of `w` can be read in place (MapHostMemory accepts it): OK, or
  // MOE_ERR_UNSUPPORTED_BACKEND naming the first matrix that cannot.
  static absl::Status CheckReadsInPlace(const model::ModelWeights &w);
  static bool ReadsExpertsInPlace(const model::ModelWeights &w) { return CheckReadsInPlace(w).ok(); }
  void UnmapHostMemory(const uint8_t *p) override;
  // The VRAM tier's slots (CudaDeviceSlots): device memory whose addresses the views of the experts
  // it holds carry, resolved to themselves (AddDeviceRegion) until the slots go.
  std::unique_ptr<store::DeviceSlots> MakeDeviceSlots() override;
  void AddDeviceRegion(uint8_t *dev, size_t bytes);
  // Device tables kept by a tier outside the backend (store::DeviceSlots::EnableTables): every layer
  // whose experts the grouped kernels take gets a table, each entry unset until PointExpert sets it;
  // RoutedExperts then reads them as it reads its own. False where there are none (resident experts
  // have theirs, or no layer qualifies).
  bool EnableExpertTables();
  // Sets expert x of layer l's entry to where `e`'s views lie (a device slot, or mapped host memory),
  // uploaded before the next step or routed layer reads it.
  absl::Status PointExpert(int l, int x, const model::ExpertWeights &e);
  // Device memory the tiers' tables took, with the copy engines' staging slots beside them.
  uint64_t tables_bytes() const { return tables_bytes_; }
  void ForgetDeviceRegion(uint8_t *dev);
  cudaStream_t compute_stream() const { return stream_.get(); }
  const Stream &copy_stream() const { return copy_stream_; }
  // The kernels' vector loads read a mapped view where it lies.
  size_t host_view_alignment() const override { return 32; }

 private:
  CudaBackend() = default;
  // A host matrix's device copy: in its codec, or (converted) rows of cols float32.
  struct Region {
    uint64_t bytes = 0;           // host bytes covered
    uint64_t host_row_bytes = 0;
    int64_t cols = 0;
    bool converted = false;
    uint8_t *dev = nullptr;
  };
  // A staging slot of a prompt's expert from RAM (PromptStage).
  struct Slot {
    const uint8_t *key = nullptr;   // the host gate bytes of the expert it holds
    int layer = -1, expert = -1;
    std::vector<const uint8_t *> parts;
    Event used;                     // recorded after each computation that reads the slot
    Event fill;                     // the last fill's copies are done
  };
  // A layer's routed experts as device tables (gate, up and down addresses of every expert).
  struct LayerTable {
    bool ok = false;
    GroupedExperts ge;
    size_t tab_off = 0;             // index of its first entry in tab_dev_
    int64_t hist_rows = 0;          // selections of the last call in hist_ (0: none pending)
    Event hist_done;                // when they are there (an eager call's; a step's is step_hist_done_)
    bool hist_step = false;         // they came from a step bracket: step_hist_done_ says when
    double cpu_saving = 0;          // seconds a call would save with the CPU's share (moving average)
    bool hybrid = false;            // the CPU computes a share of the cold experts (CpuExperts)
    bool stage = false;             // its cold experts are staged (StageColdExperts) before the products
    double cold_avg = 1;            // cold experts a decode call (moving average; the copier's until seen)
    bool copies = true;             // its cold experts go by the copy engines (copier_), and are predicted
  };
  struct DeviceVec {
    int64_t n = 0;
    const float *dev = nullptr;
  };
  absl::Status Adopt(const model::ModelWeights &w, const uint8_t *arena, size_t arena_bytes);
  // Device bytes of m as held (its codec, or float32 when converted).
  static bool NeedsConversion(const model::Matrix &m);
  static uint64_t DeviceBytes(const model::Matrix &m);
  // e's matrices (gate | up | down, each aligned) by DMA from the mapped slab into `dev` on the copy
  // stream, entered in in_slots_ and sl->parts; returns the bytes taken.
  absl::StatusOr<uint64_t> CopyParts(const model::ExpertWeights &e, uint8_t *dev, Slot *sl);
  // Builds the per-layer device tables of resident experts after adoption.
  absl::Status BuildTables(const model::ModelWeights &w);
  // Measures the link and creates the CPU experts (hybrid placement) with their device flags, over
  // the mapped host range [host, host + bytes) at `dev` (the arena, or the RAM tier's slab); `calib`
  // as CpuExperts::Create takes it.
  absl::Status StartCpuExperts(const model::ModelWeights &w, const CpuExpertOptions &cpu, int n_expert_max,
                               const uint8_t *host, const uint8_t *dev, size_t bytes,
                               std::vector<model::ExpertWeights> calib = {});
  // The link's rate: a copy of `bytes` from page-locked host memory into device memory, timed (bytes/s).
  absl::StatusOr<double> MeasureLink(void *to, const uint8_t *from, size_t bytes);
  // One expert's copy (`bytes`) beyond its bytes at the link's rate.
  absl::StatusOr<double> MeasureCopyLatency(double link_bytes_s, void *to, const uint8_t *from, size_t bytes);
  CpuExpertOptions cpu_opts_;  // Create's, for the tiers' tables (EnableExpertTables)
  // Between steps (the next has n_tok tokens): which layers take the hybrid path, and which have
  // their cold experts copied by the copy engines. Paths not recorded before run the next two
  // steps eagerly and record again, which costs more than a step, where a layer near a threshold
  // saves microseconds a step by its change. So the layers' own
  // changes to paths without a graph wait until what they are expected to save over kPathHorizon
  // steps outweighs the measured cost of re-recording (TimeStep); so does entering the CPU's share
  // with the cost model's layers (its leaving, and a forced share, are taken at once).
  void UpdatePaths(int64_t n_tok);
  static constexpr double kPathHorizon = 32;
  // A layer's copy-engine path on or off, for the rule above: about what the copier's prediction
  // and wait for a layer cost a step (measured with concentrated routing, copying every layer;
  // bench/README.md), and about what it saves a layer with a cold expert a call.
  static constexpr double kCopiesFlipGainS = 28e-6;
  // STRATA_CUDA_PATHS_ALTERNATE=N (a testing knob): every layer takes the copy engines for N
  // steps, then for N steps none does and every layer takes the CPU's share (when allowed), and so
  // on, the changes forced at once, so that the paths come back to sets recorded before.
  int64_t paths_alternate_ = 0;
  bool allowed_ = false;  // the last call's regime allowed the CPU's share
  // Step times between BeginStep calls of equal token counts with no prompt between: a replayed
  // step's (moving average), the last eager one's, and what re-recording costs over two replayed
  // steps (an eager step and the recording one after it; 0 until measured).
  void TimeStep(const model::StepKey &key);
  StepMode BeginStepImpl(const model::StepKey &key);
  std::chrono::steady_clock::time_point last_begin_{};
  StepMode last_mode_ = StepMode::kEager;
  int64_t last_n_tok_ = -1;
  bool host_batch_since_ = false;  // a prompt ran since the last BeginStep
  double replay_s_ = 0, eager_s_ = 0, record_s_ = 0;
  // STRATA_CUDA_HOST_TRACE=1 (a diagnostic): the host's share of replayed steps, printed at the
  // end: from the last download's return to BeginStep (the caller's work), BeginStep up to the
  // graph's launch (the tier's updates), the launch, and the download's wait for the device.
  bool host_trace_ = false;
  std::chrono::steady_clock::time_point down_end_{}, launch_t0_{};
  bool host_step_ = false;  // a replayed step is waiting for its download
  double host_s_[6] = {}, host_part_s_[2] = {};
  uint64_t host_n_ = 0;
  // A prompt's expert from the RAM tier's slab is copied into a staging slot (the copy engines'
  // sets' memory) for its products, instead of read over the link once per tile. The ring of slots
  // is reused in order, each refill after the last computation that read it.
  absl::StatusOr<Slot *> PromptStage(const model::ExpertWeights &e);
  // Whether e takes PromptStage: it lies in the RAM tier's slab, there is staging memory, and no
  // matrix of it needs conversion.
  bool PromptStages(const model::ExpertWeights &e) const;
  // Drops a staging slot's matrices from in_slots_ (its bytes stay until the slot is refilled).
  void Unstage(Slot &sl);
  std::vector<Slot> prompt_stage_;
  size_t prompt_stage_next_ = 0;
  absl::Status WarmUpBlas();  // cuBLASLt's first product, at open
  absl::StatusOr<DeviceMatrix> Resolve(const model::Matrix &w) const;
  absl::StatusOr<RouteArgs> ToRouteArgs(const model::RouteParams &p) const;
  absl::StatusOr<const float *> Resolve(const float *host_vec) const;
  // host_type: the codec of the matrix in the file (w is float32 when converted), for 8-bit activations.
  absl::Status MatMulDevice(const DeviceMatrix &w, const float *x, int64_t n_tok, float *y, quant::TypeId host_type);
  absl::Status ExpertFfnImpl(const model::ExpertWeights &e, const float *x, int64_t n_tok, float *y);
  // ExpertFfn's work for one expert: staged from RAM in a prompt, the products, the staging slot's use.
  void ExpertFfnOne(const model::ExpertWeights &e, const float *x, int64_t n_tok, float *y);
  // ExpertsFfn's launches (without the wait for streamed experts' reads).
  void ExpertsFfnCall(const model::ExpertWeights *const *ew, int n, const int64_t *first, const float *xg, float *yg,
                      int64_t width);
  // After a host-path computation read staging slot `slot`: its last use; its matrices leave
  // in_slots_ (Unstage).
  absl::Status SlotUsed(Slot *slot);
  // Whether a routed expert of a prompt-sized batch goes through PromptExperts: 8-bit activations,
  // gate and up of one codec with integer dots, no biases, clamp or input-major layout. By codec and
  // layout alone, so every budget and tier sends an expert the same way.
  bool PromptEligible(const model::ExpertWeights &e) const;
  // Experts ew[u] (all eligible and non-null) over grouped rows [first[u], first[u + 1]) of xg (d
  // wide) into yg: those from RAM staged first, in chunks of half the staging ring; then gate and up
  // with SwiGLU in one launch, the rows quantized, and the down products in
  // one launch where its codec has integer dots (else each by MatMulDevice).
  absl::Status PromptExperts(const std::vector<const model::ExpertWeights *> &ew, const std::vector<int64_t> &row0,
                             const std::vector<int64_t> &row1, const float *xg, float *yg);
  // The shape and family options of an attention call over kKvBlockTokens blocks (where the keys are
  // and which positions attend are the caller's to set).
  absl::StatusOr<AttentionExtArgs> AttentionArgs(int n_head, int n_head_kv, int head_dim, int k_width, int v_width,
                                                 const model::AttentionParams &p) const;
  absl::Status AttentionImpl(const float *q, const model::KvView &kv, int64_t n_tok, int pos0, int n_head,
                             int n_head_kv, int head_dim, int window, float *out, const model::AttentionParams &p);
  // A device scratch buffer of at least `bytes`, grown (after the stream drains) when smaller.
  absl::StatusOr<void *> Grow(DeviceBuffer &b, size_t bytes);
  absl::StatusOr<void *> GrowPinned(PinnedBuffer &b, size_t bytes);
  // STRATA_CUDA_PROFILE=1 (a diagnostic, not for production): each outermost operation waits for
  // the device, and its wall time is added to a table printed to stderr when the backend is
  // destroyed — where a step's time goes, launch and execution together. Under STRATA_CUDA_STAMPS
  // the outermost operation also ends in a mark of its name.
  class Profile {
   public:
    Profile(CudaBackend *be, const char *op);
    ~Profile();

   private:
    CudaBackend *be_;
    CudaBackend *stamp_;
    const char *op_;
    std::chrono::steady_clock::time_point t0_;
  };
  // Decode-step graphs. A step is first run under watch (kWatch): when nothing in it needed the
  // host (an upload, a download, a wait; a buffer may grow), its key is marked clean; the next step
  // of that key is recorded (kCapture) and run from the graph, and later ones replay it. A scratch
  // buffer that grows moves, so every graph is dropped when one that a recording took grows (a
  // prompt's own buffers grow without it: graph_bufs_). With the tiers' tables, their moves enter
  // the tables between steps and each layer's selections come back after the step.
  enum class Bracket { kNone, kWatch, kCapture };
  // An operation that needs the host mid-step: a watched step is not clean; inside a recording
  // it is an error, which the caller returns or notes (the recording then fails and the step runs
  // again outside it). A buffer growing (`growth`) leaves a watched step clean: the next step of
  // its key asks the same sizes, so it is recorded at once.
  absl::Status HostRoundTrip(const char *what, bool growth = false);
  // The layers' selections copied during the step: the tier reads them once the step is done
  // (one event for the step's layers, queried once it has landed: an event a layer, recorded and
  // queried, was a large share of the host's time between steps).
  void FinishHist(const std::vector<std::pair<int, int64_t>> &hist);
  Event step_hist_done_;
  bool step_hist_landed_ = false;
  absl::StatusOr<bool> HistLanded(LayerTable &t);
  struct StepGraph {
    Graph exec;
    std::vector<std::pair<int, int64_t>> hist;  // (layer, rows) of the selections it copies back
    std::vector<const char *> stamps;            // the names of its marks (STRATA_CUDA_STAMPS)
    uint64_t used = 0;                           // the step it last ran (the least recent goes first)
  };
  // A step is recorded for its key and for the layers' paths it ran (an index into path_sets_):
  // a change of paths keeps the graphs of the paths before, so paths that come back (the CPU-share
  // probe's return to the link, BeginStep) replay at once, with no watched step and no recording.
  struct GraphKey {
    model::StepKey step;
    uint32_t paths = 0;
    bool operator<(const GraphKey &o) const {
      if (o.step < step) return false;
      return step < o.step || paths < o.paths;
    }
  };
  static constexpr size_t kMaxGraphs = 64;
  static constexpr size_t kMaxPathSets = 64;  // past it, graphs and sets start again
  bool use_graphs_ = true;  // off (BackendChoices::graphs, STRATA_CUDA_GRAPHS=0): every step eager
  std::optional<int64_t> cold_copies_choice_;  // BackendChoices::cold_copies, read by Adopt
  // STRATA_CUDA_GRAPH_TRACE=1 (a diagnostic): each step's way (replayed, recorded, watched), what
  // kept a watched step from being clean, and the path sets, on stderr.
  bool graph_trace_ = false;
  std::chrono::steady_clock::time_point capture_t0_{};
  std::map<GraphKey, StepGraph> graphs_;
  // Scratch buffers a recording took (Grow inside kCapture): one of them growing moves it, and the
  // graphs go. Kept until they do (a superset of what the graphs read).
  std::unordered_set<const DeviceBuffer *> graph_bufs_;
  std::set<GraphKey> clean_, refused_;
  std::vector<std::string> path_sets_;  // a character a layer: bit 0 hybrid, bit 1 copies
  uint32_t paths_ = 0;                  // the tables' paths now
  static std::string PathString(const std::vector<char> &hybrid_on, const std::vector<char> &copies_on);
  uint32_t AddPathSet(const std::string &set);  // a new set's index (past kMaxPathSets, all start again)
  bool Recorded(int64_t n_tok, uint32_t paths) const;  // a graph of n_tok tokens on those paths
  Bracket bracket_ = Bracket::kNone;
  bool step_clean_ = false;
  GraphKey step_key_;
  std::vector<std::pair<int, int64_t>> step_hist_;
  uint64_t graph_captures_ = 0, graph_replays_ = 0;
  bool profile_ = false;
  // STRATA_CUDA_PROFILER_STEP=N (a diagnostic): the profiler API brackets the N-th step (counted
  // from 0 over BeginStep calls), so `ncu --profile-from-start off` sees that step's kernels alone.
  int64_t profiler_step_ = -1, steps_ = 0;
  int profile_depth_ = 0;
  std::map<std::string, std::pair<double, uint64_t>> profile_table_;
  // STRATA_CUDA_STAMPS=1 (a diagnostic): a recorded step marks the device's clock at named points
  // of each MoE layer (Stamp, a one-thread kernel each); after each run of the graph the time from
  // one mark to the next is summed under the later mark's name, printed at close. The marks cost a
  // few microseconds each, so they show where a step's time goes, not its length.
  static constexpr size_t kMaxStamps = 2048;
  DeviceBuffer stamps_;
  std::vector<const char *> stamp_names_;          // of the step being recorded
  const std::vector<const char *> *stamped_ = nullptr;  // of the graph run last
  std::map<std::string, std::pair<double, uint64_t>> stamp_table_;
  uint64_t stamped_steps_ = 0;
  int stamp_depth_ = 0;
  void Stamp(const char *name);
  void ReadStamps();  // the last run's marks into stamp_table_ (waits for the stream)
  bool Note(absl::Status s) {
    if (!s.ok() && err_.ok()) err_ = std::move(s);
    return err_.ok();
  }

  Stream stream_;
  Blas blas_;
  DeviceBuffer weight_buf_, vec_buf_;
  std::map<const uint8_t *, Region> regions_;        // resident matrices, keyed by host start
  std::unordered_map<const uint8_t *, Region> in_slots_;  // matrices of experts now in staging slots
  std::unordered_map<const uint8_t *, std::pair<int, int>> expert_id_;  // host gate bytes -> (layer, expert)
  uint64_t slot_bytes_ = 0, fills_ = 0, fill_bytes_ = 0;  // a staging slot's bytes; the prompt's copies
  // Pinned bounce buffers for the forward pass's small transfers (inputs, expert groups, routing
  // selections, logits): pageable copies would be staged by the driver on every call. `up_done_`
  // marks when the last upload has left up_io_.
  PinnedBuffer up_io_, down_io_;
  Event up_done_;
  Stream copy_stream_;
  std::vector<const uint8_t *> mapped_;  // MapHostMemory's ranges (regions_ holds their mappings)
  bool InMappedHost(const uint8_t *p) const;  // p lies in one of them
  // Device copies of the vectors by the tensor rows they hold (sub_offset), for the copies of a
  // streamed expert's bias vectors its views carry.
  std::map<std::pair<const model::TensorRef *, uint64_t>, float *> vec_refs_;
  absl::StatusOr<const float *> Resolve(const model::Vec &v) const;
  // x (n_rows, n) += the bias vector, wherever its host copy lies.
  absl::Status AddBiasOf(float *x, int64_t n_rows, int64_t n, const model::Vec &bias);
  std::map<const float *, DeviceVec> vecs_;         // keyed by host values.data()
  // Device tables for RoutedExperts: per layer [gate x n_expert | up x n_expert | down x n_expert].
  const model::ModelWeights *w_ = nullptr;
  std::vector<LayerTable> tables_;
  int first_table_layer_ = -1;                       // the first layer with a device table
  DeviceBuffer tab_dev_, plan_buf_, grouped_ws_, attn_ws_;
  std::vector<const void *> tab_host_;  // what tab_dev_ holds (or will, once a deferred flush ran)
  std::vector<char> table_dirty_;       // per layer: its entries changed since the last FlushTables
  void FlushTables();                   // one upload of each marked layer's table
  int PlaceTables();                    // each table's arrays within tab_dev_; the most experts a layer
  bool external_tables_ = false;        // the tables are a tier's outside the backend (EnableExpertTables)
  bool tables_dirty_ = false;           // PointExpert changed an entry since the last FlushTables
  // With the tiers' tables the copy engines stage RAM's experts into VRAM staging slots, copying
  // from the mapped range at tier_copies_ (the RAM tier's slab; null: no copies).
  absl::Status EnableTierCopies(int n_expert_max);
  // With the tiers' tables: the CPU's share of the experts RAM serves (CpuExperts over the slab),
  // the selections coming back for each layer's count of them (UpdateTierLayer). Best effort.
  absl::Status EnableTierCpuShare(int n_expert_max);
  // Before a step with the tiers' tables: layer l's last selections update its average of experts
  // served from RAM and of the CPU's saving on them, which UpdatePaths weighs.
  absl::Status UpdateTierLayer(int l);
  // Layer l's last selections once they are in host memory (hist_): their count, 0 while there are
  // none or they have not landed (the next call looks again); *sel points at them.
  absl::StatusOr<int64_t> TakeSelections(int l, const int32_t **sel);
  // A call's count of experts served from host memory: the layer's averages UpdatePaths weighs.
  void NoteColdExperts(LayerTable &t, int cold, uint64_t expert_bytes);
  const uint8_t *tier_copies_ = nullptr;
  uint64_t tables_bytes_ = 0;
  absl::Status SetUpColdCopies(int n_expert_max, const uint8_t *host, const uint8_t *dev, size_t bytes);
  PinnedBuffer hist_;                                // (n_layer, kDeviceRouteMaxRows) last selections
  int32_t *hist_dev_ = nullptr;                      // hist_ mapped for the device
  uint64_t zero_copy_uses_ = 0;                      // uses of experts the tables point at in RAM
  std::unique_ptr<CpuExperts> cpu_experts_;          // hybrid placement (null: off)
  std::unique_ptr<model::RegimeProbe> regime_;       // auto beside the copier: CPU share or copies, timed
  DeviceBuffer skip_dev_;                            // the experts of a layer the CPU computes
  // Staging slots for a decode layer's experts from RAM (StageColdExperts): copied in before the
  // grouped kernels instead of read in place. stage_.n_slots 0: off (no copy engines).
  DeviceBuffer stage_buf_, stage_tab_;
  ExpertStage stage_;
  // Cold experts by the copy engines (null: off, or no tiers' tables): stage_ holds a layer's
  // urgent copies, pf_stage_[pf_set_] the predicted ones of layer pf_layer_ (the sets alternate,
  // so a prediction never lands in the set the current layer reads), N slots each.
  std::unique_ptr<ColdCopier> copier_;
  bool cold_copies_ = false;  // also: this context holds the process's one copier
  ExpertStage pf_stage_[2];
  DeviceBuffer pf_tab_, pf_logits_, pf_sel_, pf_wts_, pf_idx_, pf_plan_;
  // Device counters: [0] experts copied on a prediction, [1] unused, [2] experts copied for their
  // own layer after a prediction, [3] of a layer's groups, those its prediction had copied.
  DeviceBuffer pf_counts_;
  int pf_layer_ = -1;  // the layer whose predicted experts pf_stage_[pf_set_] holds (-1: none)
  int pf_set_ = 0;
  // Queues on s layer nl's routing of h (n_tok rows, an earlier layer's input) and a request for the
  // predicted cold experts (at most n_slots, in group order) into the other set. No prediction where
  // the router is not on the device.
  absl::Status PredictColdExperts(int nl, const float *h, int64_t n_tok, const model::RouteParams &route,
                                  int n_slots, cudaStream_t s);
  // The predictions' own stream in a recorded step, forked from the compute stream after a layer's
  // own plan and joined before the layer ends (RoutedExperts).
  Stream predict_stream_;
  Event pf_fork_, pf_join_;
  // Orders the next copy into sl after the last computation that read it.
  absl::Status AfterLastUse(const Slot &sl);
  // Upload ring: pinned segments reused once the copies from their previous lap are done.
  static constexpr size_t kRingSegment = size_t{256} << 10;
  static constexpr int kRingSegments = 16;
  PinnedBuffer ring_;
  Event ring_done_[kRingSegments];
  int ring_seg_ = 0;
  size_t ring_off_ = 0;
  DeviceBuffer mm_ws_, ffn_ws_, deq_ws_, sel_dev_, kv_tab_;
  // 8-bit activations (gemv_q8.cu), as the CPU backend's q8 mode: decode products over Q8_0 / Q4_K
  // weights dot integer codes (the quantized input of a product, and of the grouped down
  // projection); every other product over a block codec multiplies the float weights by its input
  // rounded to the same grid (q8_r_), as the CPU's generic q8 dot does.
  bool q8_ = false;
  DeviceBuffer q8_x_, q8_h_, q8_r_;
  // The rows of the host path's batch in the layer now computing (set by ExpertsFfn, cleared by
  // WeightedRowSum): experts that arrive after ExpertsFfn take the same products.
  int64_t host_batch_rows_ = 0;
  DeviceBuffer prompt_xq_, prompt_h_, prompt_hq_, prompt_tab_;
  // y = w · x through GemvQ8 when the product takes the GEMV path and w's codec has one; false when
  // it does not apply (the caller runs the float product).
  absl::StatusOr<bool> MatMulQ8(const DeviceMatrix &w, const float *x, int64_t n_tok, float *y);
  // The block (32 or 256) of the grid 8-bit activations round to for products over `type`; 0 when
  // the option is off or the codec has no blocks (float weights).
  int Q8Grid(quant::TypeId type) const;
  // x, or x rounded to the q8 grid of `type` in q8_r_ (n_tok rows of cols).
  absl::StatusOr<const float *> GridInput(quant::TypeId type, const float *x, int64_t n_tok, int64_t cols);
  // A routed-expert layer's grouped gate/up SwiGLU and down projection (8-bit activations where the
  // option and the codecs allow), over `rows` grouped rows of n_tok tokens.
  // xg: the grouped input rows; or, with tok (GroupByExpert's idx; 8-bit gate/up codecs only), the
  // tokens' rows, grouped row r reading row tok[r]. xq_ready (8-bit gate/up only, with tok): those
  // rows already quantized (RouteGroupQuantize), or null to quantize xg here.
  absl::Status GroupedProducts(const GroupedExperts &ge, const int32_t *plan, int n_max, const float *xg,
                               const int32_t *tok, float *h, float *yg, int64_t rows, int64_t n_tok,
                               const uint8_t *skip, const void *xq_ready = nullptr);
  size_t weight_bytes_ = 0;
  absl::Status err_;
};

}  // namespace strata::cuda
