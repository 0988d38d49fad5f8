// The backend interface: the operations the forward pass needs, implemented once per device
// (backends/cpu, backends/cuda). All tensors are float32 row-major with the shapes in comments;
// weight matrices are codec-encoded Matrix views. Per-element results must not depend on how many
// tokens are in a call, so a session's numbers are the same alone or batched.
//
// Memory: activations, index arrays and KV caches live where the backend computes (host memory for
// the CPU, VRAM for CUDA) in Buffers the backend allocates and the caller owns; the forward pass
// only moves data across with Upload (inputs) and Download (routing selections, logits). Weight
// pointers (Matrix::data, Vec::values) are the host addresses of the loaded model; a device backend
// resolves them to its own copies, made when it adopted the model.
//
// Errors: the operations queue work and return nothing; a backend that can fail (CUDA) keeps the
// first error, skips later work, and hands it out through TakeError, which the forward pass checks
// after every layer and before it returns.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>
#include <tuple>
#include <vector>

#include "lib/model/hparams.h"
#include "lib/model/weights.h"
#include "lib/util/status.h"

namespace strata::store {
class DeviceSlots;  // lib/store/tier.h
}

namespace strata::model {

// Positions per KV block: a session's cache grows by blocks of this many tokens.
inline constexpr int kKvBlockTokens = 128;

// How the KV cache stores a row of `width` floats (llama.cpp's cache types, by their names "f32",
// "f16", "q8_0"): float32; IEEE half (round to nearest even); or ggml's block_q8_0, 32 values to a
// block (an f16 scale d then 32 int8 q, x = q d), quantized as ggml's quantize_row_q8_0_ref does. A
// q8_0 row whose width is not a multiple of 32 ends with one block over the remaining values and
// zeros (tiny models' latent rows); a row of width 32 k is exactly k blocks_q8_0.
enum class KvType : uint8_t { kF32 = 0, kF16 = 1, kQ8_0 = 2 };
inline constexpr int kKvQ8Elems = 32;   // values a q8_0 block holds
inline constexpr int kKvQ8Bytes = 34;   // bytes of a q8_0 block
inline constexpr size_t KvRowBytes(KvType t, int width) {
  return t == KvType::kF16    ? static_cast<size_t>(width) * 2
         : t == KvType::kQ8_0 ? static_cast<size_t>((width + kKvQ8Elems - 1) / kKvQ8Elems) * kKvQ8Bytes
                              : static_cast<size_t>(width) * sizeof(float);
}
// "f32", "f16", "q8_0".
const char *KvTypeName(KvType t);
// The type llama.cpp's name spells (case-insensitive); false for any other name.
bool ParseKvType(std::string_view name, KvType *out);
// dst (KvRowBytes(t, width) bytes) = row src (width floats) in type t.
void EncodeKvRow(KvType t, const float *src, int width, uint8_t *dst);
// out (n floats) = values [c0, c0 + n) of a row (stored in type t); exact for f32 and f16, q d for
// q8_0 (the float product of the code and the block's scale, as ggml dequantizes).
void DecodeKvCols(KvType t, const uint8_t *row, int c0, int n, float *out);

// One layer's slice of a session's KV cache as a block table: position p lives in row
// p % kKvBlockTokens of block p / kKvBlockTokens, a (kKvBlockTokens, row bytes) row-major array of
// rows stored in k_type (keys) or v_type (values). Code reaches rows only through k_row / v_row, so
// where each block lives can change (a device backend may keep the newest blocks, the hot window,
// in its own memory and the rest in host RAM).
// masked (nullable, n_ctx bytes): masked[p] != 0 means position p is never a key for another
// position's query (the session's blocked tokens); a query always attends to its own position.
struct KvView {
  uint8_t *const *k_blocks = nullptr;  // (n_ctx / kKvBlockTokens) blocks of (kKvBlockTokens, k row bytes)
  uint8_t *const *v_blocks = nullptr;  // same for values; unused when v_width is 0
  int n_ctx = 0;                       // positions the blocks cover
  int k_width = 0;                     // floats a row holds
  int v_width = 0;
  const uint8_t *masked = nullptr;
  KvType k_type = KvType::kF32, v_type = KvType::kF32;
  size_t k_row_bytes() const { return KvRowBytes(k_type, k_width); }
  size_t v_row_bytes() const { return KvRowBytes(v_type, v_width); }
  uint8_t *k_row(int pos) const {
    return k_blocks[pos / kKvBlockTokens] + static_cast<size_t>(pos % kKvBlockTokens) * k_row_bytes();
  }
  uint8_t *v_row(int pos) const {
    return v_blocks[pos / kKvBlockTokens] + static_cast<size_t>(pos % kKvBlockTokens) * v_row_bytes();
  }
  // The rows as floats: only for a view whose k (v) type is f32.
  float *k_row_f32(int pos) const { return reinterpret_cast<float *>(k_row(pos)); }
  float *v_row_f32(int pos) const { return reinterpret_cast<float *>(v_row(pos)); }
  bool is_masked(int pos) const { return masked != nullptr && masked[pos] != 0; }
};

// A KvView over contiguous (n_ctx, row bytes) key and value rows, for reference computations and
// tests: its block table points into them every kKvBlockTokens rows. The float constructor is for
// f32 rows.
class ContiguousKv {
 public:
  ContiguousKv(float *k, float *v, int n_ctx, int k_width, int v_width)
      : ContiguousKv(reinterpret_cast<uint8_t *>(k), reinterpret_cast<uint8_t *>(v), n_ctx, k_width, v_width,
                     KvType::kF32, KvType::kF32) {}
  ContiguousKv(uint8_t *k, uint8_t *v, int n_ctx, int k_width, int v_width, KvType k_type, KvType v_type) {
    const size_t kb = KvRowBytes(k_type, k_width), vb = KvRowBytes(v_type, v_width);
    for (int p = 0; p < n_ctx; p += kKvBlockTokens) {
      k_blocks_.push_back(k + static_cast<size_t>(p) * kb);
      v_blocks_.push_back(v != nullptr ? v + static_cast<size_t>(p) * vb : nullptr);
    }
    view_ = KvView{k_blocks_.data(), v_blocks_.data(), n_ctx, k_width, v_width, nullptr, k_type, v_type};
  }
  ContiguousKv(const ContiguousKv &) = delete;
  ContiguousKv &operator=(const ContiguousKv &) = delete;
  const KvView &view() const { return view_; }

 private:
  std::vector<uint8_t *> k_blocks_, v_blocks_;
  KvView view_;
};

// One query row of a decode step at one layer, as the backend reads it from its own memory: the
// row's position, where its session's K/V rows of that layer are (block tables in backend memory,
// laid out as KvView's, rows in k_type / v_type), the session's mask (nullable) and the layer's
// window. A forward pass over several sessions hands one per row to WriteKvRows and AttentionRows,
// so every session of a step is served by one call, and a device backend can replay the step's work
// with new rows. The tables hold block addresses: float pointers, which address floats only for
// f32 rows (the rows are in k_type / v_type; a device backend reads them by those).
struct KvRowRef {
  float *const *k_blocks = nullptr;
  float *const *v_blocks = nullptr;  // unused when v_width is 0
  const uint8_t *masked = nullptr;
  int32_t pos = 0;
  int32_t window = 0;                // 0 = unlimited
  KvType k_type = KvType::kF32, v_type = KvType::kF32;
  // The view of this row's cache for a host-memory backend (rows_host): positions up to pos.
  KvView HostView(int k_width, int v_width) const {
    return KvView{reinterpret_cast<uint8_t *const *>(k_blocks), reinterpret_cast<uint8_t *const *>(v_blocks),
                  pos + 1, k_width, v_width, masked, k_type, v_type};
  }
};

// Frequencies of a RoPE call. inv_freq (head_dim / 2 values) replaces theta^(-2i / head_dim) when set
// (YaRN); cos and sin are multiplied by mscale (YaRN's attention factor).
struct RopeParams {
  const float *inv_freq = nullptr;
  float mscale = 1.f;
};

// Family options of an attention call (defaults: grouped-query attention as Qwen3 / Mixtral).
struct AttentionParams {
  float scale = 0.f;             // score scale; 0 = 1 / sqrt(head_dim)
  const float *sinks = nullptr;  // (n_head) learned sink logits joining each softmax (gpt-oss)
  // Multi-head latent attention: the values are the first v_dim floats of the k rows (the latent),
  // so out is (n_tok, n_head, v_dim). With latent false, values come from the v rows (head_dim).
  bool latent = false;
  int v_dim = 0;
};

// Router options of a Route call (see lib/model/routing.h for the arithmetic).
struct RouteParams {
  Gating gating = Gating::kSoftmax;
  int n_expert = 0;
  int k = 0;                            // experts per token
  int n_group = 1;
  int topk_group = 1;
  bool norm_topk_prob = false;
  float routed_scale = 1.f;
  const float *select_bias = nullptr;   // (n_expert) weight pointer, sigmoid gating only; optional
};

// Memory a backend hands out: host memory for the CPU, device memory for CUDA. Zero-filled.
class Buffer {
 public:
  virtual ~Buffer() = default;
  void *data() const { return data_; }
  size_t bytes() const { return bytes_; }

 protected:
  void *data_ = nullptr;
  size_t bytes_ = 0;
};

// The routed-expert block of a MoE layer run entirely in backend memory (Backend::RoutedExperts).
struct RoutedExpertsArgs {
  int layer = 0;
  const LayerWeights *weights = nullptr;  // the layer's experts (their host addresses name them)
  RouteParams route;
  const float *logits = nullptr;  // (n_tok, n_expert) router output
  const float *h = nullptr;       // (n_tok, n_embd) normalised input
  int64_t n_tok = 0;
  // Backend memory the forward pass lends: sel (n_tok, k) receives the selections (read back after
  // the pass for accounting); wts (n_tok, k), xg and yg (n_tok k, n_embd), idx (2 n_tok k) scratch.
  int32_t *sel = nullptr;
  float *wts = nullptr, *xg = nullptr, *yg = nullptr;
  int32_t *idx = nullptr;
  int64_t n_embd = 0;
  float *out = nullptr;           // (n_tok, n_embd)
  // The layer's own weights are not resident (the tiers hold the experts, ExpertSource::
  // routes_on_device): only a backend whose device tables address them may take the call.
  bool tables_only = false;
};

// What a device backend's expert tier has done since it was made (zeros without one).
struct DeviceTierStats {
  uint32_t slots = 0;          // expert slots in device memory (0: every routed expert resident)
  uint32_t table_layers = 0;   // MoE layers whose experts are routed and grouped on the device
  uint64_t fills = 0;          // experts copied into slots
  uint64_t fill_bytes = 0;
  uint64_t zero_copy = 0;      // expert uses read by the kernels from host memory over the link
  uint64_t cpu_experts = 0;    // expert uses computed by the CPU from host memory (hybrid placement)
  uint32_t cpu_layers = 0;     // MoE layers now on the hybrid path
  uint64_t promotions = 0;     // fills started by route hotness
  uint64_t replans = 0;        // times the slots were re-planned from a prompt's hotness
  uint64_t prefetched = 0;     // experts copied ahead of their layer on a prediction
  uint64_t prefetch_used = 0;  // of those, selected by their layer
  uint64_t graph_captures = 0;   // decode steps recorded as graphs
  uint64_t graph_replays = 0;    // decode steps run from a recorded graph
};

// What the launches of a decode step depend on besides the contents of backend memory: two steps
// with equal keys issue the same work with the same arguments (Backend::BeginStep).
struct StepKey {
  int64_t n_tok = 0, n_out = 0;    // rows in, rows of logits out
  const void *workspace = nullptr; // the forward pass's activations
  int max_keys = 0;                // bound of the rows' visible positions
  bool resident = true;            // the backend routes the experts by itself (resident, or tables)
  bool operator<(const StepKey &o) const {
    return std::tie(n_tok, n_out, workspace, max_keys, resident) <
           std::tie(o.n_tok, o.n_out, o.workspace, o.max_keys, o.resident);
  }
};

// Watches the inputs of a backend's weight products: for each product y = x · wᵀ, the n_rows rows
// of x (each w.cols floats, host memory) before it runs. An importance matrix (lib/quant/imatrix.h)
// sums their squares per column. Called on the thread that issues the product.
class ActivationObserver {
 public:
  virtual ~ActivationObserver() = default;
  virtual void OnProduct(const Matrix &w, const float *x, int64_t n_rows) = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string_view name() const = 0;

  // ---- memory and transfers ----
  // A zero-filled buffer of `bytes` in the backend's memory. MOE_ERR_NO_MEMORY when it cannot.
  virtual absl::StatusOr<std::unique_ptr<Buffer>> Allocate(size_t bytes) = 0;
  // dst (backend memory) = src (host), queued in order with the operations.
  virtual void Upload(void *dst, const void *src, size_t bytes) = 0;
  // dst (host) = src (backend memory); complete when the call returns.
  virtual void Download(void *dst, const void *src, size_t bytes) = 0;
  // Consecutive pieces of src (backend memory) to their own host places: part i, parts[i].bytes
  // long, starts where part i - 1 ends. Complete when the call returns. The default downloads each
  // part; a backend with its own memory moves them in one transfer.
  struct DownloadPart {
    void *dst;
    size_t bytes;
  };
  virtual void DownloadParts(const void *src, const DownloadPart *parts, size_t n) {
    const auto *p = static_cast<const uint8_t *>(src);
    for (size_t i = 0; i < n; ++i) {
      Download(parts[i].dst, p, parts[i].bytes);
      p += parts[i].bytes;
    }
  }
  // The first error since the last call (OkStatus when none); later work was skipped.
  virtual absl::Status TakeError() { return absl::OkStatus(); }

  // ---- element-wise and data movement ----
  // rows x width floats: dst row r (at dst + r * dst_stride) = src row r (at src + r * src_stride).
  virtual void CopyRows(float *dst, int64_t dst_stride, const float *src, int64_t src_stride, int64_t rows,
                        int64_t width) = 0;
  // KV rows: rows x width floats of src (rows src_stride floats apart) stored in type t at dst
  // (backend memory, rows dst_stride bytes apart), each as EncodeKvRow makes it. Default: f32
  // through CopyRows, the other types encoded where dst lies (a host-memory backend).
  virtual void WriteKvBytes(uint8_t *dst, int64_t dst_stride, const float *src, int64_t src_stride, int64_t rows,
                            int width, KvType t);
  // KV rows back to floats, WriteKvBytes' inverse: rows x width values of the rows at src (backend
  // memory, rows src_stride bytes apart, stored in type t) into dst (backend memory, rows dst_stride
  // floats apart), each as DecodeKvCols gives them. Default: f32 through CopyRows, the other types
  // decoded where src lies (a host-memory backend).
  virtual void ReadKvBytes(float *dst, int64_t dst_stride, const uint8_t *src, int64_t src_stride, int64_t rows,
                           int width, KvType t);
  // x (n) += y (n)
  virtual void Add(float *x, const float *y, int64_t n) = 0;
  // x (n_rows, n) += bias (n, a weight pointer), per row
  virtual void AddBias(float *x, int64_t n_rows, int64_t n, const float *bias) = 0;
  // x (n_rows, n) row r *= sigmoid(g[r])
  virtual void SigmoidScaleRows(float *x, const float *g, int64_t n_rows, int64_t n) = 0;
  // dst (n, width) row i = src row idx[i] (idx in backend memory)
  virtual void GatherRows(const float *src, int64_t width, const int32_t *idx, int64_t n, float *dst) = 0;
  // out (n_tok, width) row t = sum over j < k, in order from 0, of wts[t k + j] * rows[idx[t k + j]]
  // (idx and wts in backend memory): a token's routed experts summed in slot order.
  virtual void WeightedRowSum(const float *rows, const int32_t *idx, const float *wts, int64_t n_tok, int k,
                              int64_t width, float *out) = 0;
  // Router logits (n_tok, n_expert) -> the k selected experts per token into sel_host (n_tok, k) on
  // the host and their weights into wts (n_tok, k) in backend memory.
  virtual void Route(const RouteParams &p, const float *logits, int64_t n_tok, int32_t *sel_host, float *wts) = 0;

  // ---- compute ----

  // y (n_tok, w.rows) = x (n_tok, w.cols) · wᵀ
  virtual void MatMul(const Matrix &w, const float *x, int64_t n_tok, float *y) = 0;
  // y (n_tok, w.cols) = x (n_tok, w.rows) · w for an input-major matrix (a transposed product):
  // each row of w decoded once and accumulated into every token's output in row order.
  virtual void MatMulInputMajor(const Matrix &w, const float *x, int64_t n_tok, float *y) = 0;
  // out (n, w.cols) = rows ids[i] of w (ids in backend memory)
  virtual void GetRows(const Matrix &w, const int32_t *ids, int64_t n, float *out) = 0;
  // y (n_rows, n) = x / rms(x) * weight, per row; y may alias x
  virtual void RmsNorm(const float *x, const float *weight, int64_t n_rows, int64_t n, float eps,
                       float *y) = 0;
  // x (n_rows, n) += add, then y = RmsNorm(x): a residual add and the next norm (one launch on a
  // device), with the numbers of Add then RmsNorm.
  virtual void AddRmsNorm(float *x, const float *add, const float *weight, int64_t n_rows, int64_t n, float eps,
                          float *y) {
    Add(x, add, n_rows * n);
    RmsNorm(x, weight, n_rows, n, eps, y);
  }
  // ys[i] (n_tok, ws[i]->rows) = x · ws[i]ᵀ for n matrices over one input (attention projections;
  // one launch on a device), with the numbers of MatMul on each.
  virtual void MatMulMany(const Matrix *const *ws, float *const *ys, int n, const float *x, int64_t n_tok) {
    for (int i = 0; i < n; ++i) MatMul(*ws[i], x, n_tok, ys[i]);
  }
  // Rotates x (n_tok, n_heads, head_dim) in place; token t is at position pos[t] (backend memory).
  virtual void Rope(float *x, int64_t n_tok, int n_heads, int head_dim, const int32_t *pos, float theta,
                    RopeStyle style, const RopeParams &p) = 0;
  void Rope(float *x, int64_t n_tok, int n_heads, int head_dim, const int32_t *pos, float theta, RopeStyle style) {
    Rope(x, n_tok, n_heads, head_dim, pos, theta, style, RopeParams{});
  }
  // Per-head q/k norm then RoPE (Qwen3): q (n_tok, n_head, head_dim) and k (n_tok, n_head_kv,
  // head_dim) head rows normalised by q_norm / k_norm (head_dim, weight pointers), then rotated;
  // one launch on a device, with the numbers of RmsNorm on each then Rope on each.
  virtual void NormRope(float *q, float *k, int64_t n_tok, int n_head, int n_head_kv, int head_dim, const float *q_norm,
                        const float *k_norm, float eps, const int32_t *pos, float theta, RopeStyle style,
                        const RopeParams &p) {
    RmsNorm(q, q_norm, n_tok * n_head, head_dim, eps, q);
    RmsNorm(k, k_norm, n_tok * n_head_kv, head_dim, eps, k);
    Rope(q, n_tok, n_head, head_dim, pos, theta, style, p);
    Rope(k, n_tok, n_head_kv, head_dim, pos, theta, style, p);
  }
  // Causal attention for n_tok new tokens at positions pos0..pos0+n_tok-1, whose K/V rows are already
  // in kv. q (n_tok, n_head, head_dim) -> out (n_tok, n_head, head_dim, or v_dim when p.latent).
  // window 0 = unlimited, else position p attends to p - window + 1 .. p; positions kv.is_masked()
  // are skipped (except p itself).
  virtual void Attention(const float *q, const KvView &kv, int64_t n_tok, int pos0, int n_head,
                         int n_head_kv, int head_dim, int window, float *out, const AttentionParams &p) = 0;
  void Attention(const float *q, const KvView &kv, int64_t n_tok, int pos0, int n_head, int n_head_kv,
                 int head_dim, int window, float *out) {
    Attention(q, kv, n_tok, pos0, n_head, n_head_kv, head_dim, window, out, AttentionParams{});
  }
  // Rows given as KvRowRefs (rows in backend memory; rows_host the same descriptors in host memory,
  // whose block tables a host-memory backend reads): writes row t's key k (n, k_width) and value v
  // (n, v_width) at its position, then attends each query row of q (n, n_head, head_dim) over its
  // session's positions up to its own -> out (n, n_head, head_dim or v_dim), with the numbers of
  // Attention on that row alone. max_keys bounds the visible positions of every row (a device
  // backend sizes its launch by it, not by the rows' contents). Defaults: the per-row host loop.
  virtual void WriteKvRows(const KvRowRef *rows, const KvRowRef *rows_host, int64_t n, const float *k,
                           const float *v, int k_width, int v_width);
  virtual void AttentionRows(const float *q, const KvRowRef *rows, const KvRowRef *rows_host, int64_t n, int max_keys,
                             int n_head, int n_head_kv, int head_dim, int k_width, int v_width, float *out,
                             const AttentionParams &p);
  // y (n_tok, n_embd) = down(act(gate x + gate_bias, up x + up_bias)) + down_bias for one expert over a
  // group of tokens; act is silu(g) * u, or gpt-oss's clamped form when e.swiglu_limit > 0; an
  // input-major expert (e.input_major) is computed from its fused gate/up block.
  virtual void ExpertFfn(const ExpertWeights &e, const float *x, int64_t n_tok, float *y) = 0;
  // Experts ew[0..n) over their groups of gathered rows: expert u on rows [first[u], first[u + 1])
  // of xg into the same rows of yg (rows `width` floats), as ExpertFfn on each group; a null ew[u]
  // is skipped. The groups are disjoint, so a backend may run them together. Default: ExpertFfn on
  // each in turn.
  virtual void ExpertsFfn(const ExpertWeights *const *ew, int n, const int64_t *first, const float *xg, float *yg,
                          int64_t width);

  // Optional: routes, groups and runs a.layer's routed experts without the host seeing the
  // selections (a device backend avoids one wait per layer), with the numbers of the host path
  // (Route, grouping by expert, ExpertFfn per group, WeightedRowSum); a.sel keeps the selections.
  // Returns false, having queued nothing, when the backend cannot run this layer or batch that way.
  virtual bool RoutedExperts(const RoutedExpertsArgs &a) { return false; }
  // The most rows (tokens x experts per token) a RoutedExperts call takes; 0 where it takes none.
  virtual int64_t routed_rows_max() const { return 0; }

  // Optional: host memory the caller hands the backend views into from now on (a streamed expert
  // cache's slots), to read where it lies; it stays until UnmapHostMemory. What a view names may
  // change once the call it was handed to returns, so the backend has read it by then. Default:
  // nothing to do (a host backend reads host memory).
  virtual absl::Status MapHostMemory(const uint8_t *p, size_t bytes) { return absl::OkStatus(); }
  virtual void UnmapHostMemory(const uint8_t *p) {}
  // The alignment, in bytes, every view into mapped host memory must have (a device's vector loads
  // read it where it lies); the caller checks its views before it maps. Default: 1, any.
  virtual size_t host_view_alignment() const { return 1; }

  virtual DeviceTierStats tier_stats() const { return {}; }
  // Optional: fixed slots of the backend's own memory for the VRAM expert tier over a streamed RAM
  // tier (lib/store/vram_tier.h); null when the backend computes from host memory.
  virtual std::unique_ptr<store::DeviceSlots> MakeDeviceSlots();
  // Optional: a decode step's device work as a replayable graph. The forward pass brackets the work
  // of a step whose inputs are all in backend memory (uploaded before BeginStep, results read
  // after EndStep) with BeginStep(key) / EndStep(); `key` names everything the work's launches
  // depend on besides that memory (StepKey). kEager: run the
  // work as usual (the backend may watch whether it could be captured); kCapture: issue it as usual,
  // the backend records it instead of running it, and EndStep runs it (an EndStep error means
  // nothing ran: the caller runs the work again outside a bracket); kReplay: the work already ran
  // (queued): skip it and call nothing else before reading the results.
  enum class StepMode { kEager, kCapture, kReplay };
  virtual StepMode BeginStep(const StepKey &key) { return StepMode::kEager; }
  virtual absl::Status EndStep() { return absl::OkStatus(); }
  // Optional: every weight product's input from now on goes to `o` first (null: none); false where
  // the backend cannot show them (its activations are not in host memory).
  virtual bool ObserveActivations(ActivationObserver *o) { return false; }

};

}  // namespace strata::model
