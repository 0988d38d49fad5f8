// The CUDA kernel layer: the operations of the backend interface (lib/model/backend.h) on device
// buffers, each queued on a caller's stream with any scratch memory passed in by the caller, so a
// device-resident forward pass can run them back to back and capture them in a CUDA Graph. All
// tensors are float32 row-major device pointers with shapes in comments; launchers validate their
// arguments and return a Status (MOE_ERR_INVALID_ARGUMENT, MOE_ERR_UNSUPPORTED_TYPE, or a CUDA
// error as MOE_ERR_BACKEND) and never block the host.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "lib/model/backend.h"
#include "lib/model/hparams.h"
#include "lib/quant/codec.h"
#include "lib/util/status.h"

namespace strata::cuda {

// A codec-encoded weight matrix in device memory, laid out as in GGUF: `rows` rows of `cols`
// elements, row r at data + r * row_bytes.
struct DeviceMatrix {
  quant::TypeId type = quant::TypeId::kF32;
  const void *data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  uint64_t row_bytes = 0;
};

// Caller-owned scratch memory (device). Launchers that need one say how large with a *Bytes call.
struct Workspace {
  void *data = nullptr;
  size_t bytes = 0;
};

// Whether the kernels read `type` in its codec: every codec lib/quant decodes (F32, F16, BF16, the
// legacy, K, IQ4, lattice i-quant and ternary codecs, MXFP4; codecs.cuh's STRATA_CUDA_DISPATCH_CODEC).
bool HasDeviceCodec(quant::TypeId type);

// Warps that split each row of a GEMV of this codec and matrix shape (1, 2, 4 or 8): enough that a
// row's loads are in flight at once, with two or more steps of work a lane; none for a matrix of
// kGemvWholeRows rows or more, whose rows alone fill the GPU (an output head: the split would only
// add its reduction). Every GEMV kernel, the grouped ones too, splits a matrix's rows so, which
// keeps a (row, token) result the same bits in all of them. The environment variable
// STRATA_CUDA_GEMV_SPLIT caps it (1: no split; for measuring).
constexpr int64_t kGemvWholeRows = 32768;
int GemvTeamWarps(quant::TypeId type, int64_t cols, int64_t rows);

// Checks that w can be used by the kernels: a device codec, cols a multiple of 32 and of the block,
// row_bytes matching, data and row_bytes aligned as the codec's loads need.
absl::Status CheckMatrix(const DeviceMatrix &w);

// ---- Matrix products -------------------------------------------------------------------------

// Tokens the dequantize-GEMV kernels process per weight read; larger n_tok runs in chunks.
constexpr int64_t kGemvMaxTokens = 8;

// y (n_tok, w.rows) = x (n_tok, w.cols) · wᵀ with the dequantize-GEMV kernels (decode, small
// batches). Each weight is decoded as quant::Codec::dequantize does and the products summed in
// float32 (Q8_0 and Q4_K factor a block's scale out of its sum: d Σ q x, (d sc) Σ q x - (dmin m)
// Σ x); a (row, token) result does not depend on n_tok. No workspace.
absl::Status Gemv(const DeviceMatrix &w, const float *x, int64_t n_tok, float *y, cudaStream_t stream);

// ---- 8-bit activations (gemv_q8.cu) -----------------------------------------------------------------
// x quantized once per call as the CPU backend's q8 mode does (backends/cpu/kernels/kernels.h): per
// block d = amax / 127 and q = nearbyint(x * (127 / amax)) clamped to +-127; blocks of 32 (Q8_0
// weights, with Σ q per block) or of 256 (Q4_K, with Σ q per 16 elements). A token's row holds its
// codes, then its block scales, then its sums, padded to 16 bytes. Then integer dot products per
// weight block (dp4a), scaled in float: the CPU's q8 results up to the order of float sums.
enum class Q8Act { kNone, kBlock32, kBlock256 };
Q8Act Q8ActFor(quant::TypeId type);  // kNone: no 8-bit-activation GEMV for the codec
// Whether w's rows meet the 8-bit path's alignment (Q4_K rows 16-byte aligned; Q8_0 any).
bool Q8RowsAligned(const DeviceMatrix &w);
int64_t Q8ActRowBytes(Q8Act f, int64_t cols);
// xq (n_tok rows of Q8ActRowBytes) from x (n_tok, cols); cols a multiple of the block.
absl::Status QuantizeActivationsQ8(Q8Act f, const float *x, int64_t n_tok, int64_t cols, void *xq,
                                   cudaStream_t stream);
// out (n_tok, cols) = x rounded to the same grid in place of the codes (d q per element; out may be x):
// the activations the CPU's q8 mode gives codecs without an integer dot (its generic q8 dot
// multiplies the float weights by them). block 32 or 256, cols a multiple of it.
absl::Status RoundActivationsQ8(int block, const float *x, int64_t n_tok, int64_t cols, float *out,
                                cudaStream_t stream);
// y (n_tok, rows) = w · x, x as QuantizeActivationsQ8(Q8ActFor(w.type)) made it (16-byte aligned),
// in token chunks of 16, 8, 4, 2 and 1 (each chunk reads the weights once; a token's bits do not
// depend on its chunk); or on the tensor cores (Q8Kernels).
// MOE_ERR_UNSUPPORTED_TYPE for a codec without the path; Q4_K rows must be 16-byte aligned.
//
// Q8Kernels picks the kernels of these products: dp4a GEMVs, or the tensor cores (8-bit mma tiles of
// 16 rows x 8 tokens x 32 columns from 5 tokens, up to 32 tokens a launch; the same operations on
// dp4a for 1-4 tokens).
// Either way a token's bits do not depend on its batch; the two differ in float summation order.
// kDefault: Q4_K on the tensor cores, Q8_0 on the GEMVs (measured: Q4_K's tensor kernels level
// with its GEMVs for one session and faster for batches; Q8_0's faster for batches, slower for one;
// bench/README.md); STRATA_CUDA_Q8_TENSOR=1 or 0 puts both on the tensor cores or the GEMVs.
enum class Q8Kernels { kDefault, kGemv, kTensor };
absl::Status GemvQ8(const DeviceMatrix &w, const void *xq, int64_t n_tok, float *y, cudaStream_t stream,
                    Q8Kernels k = Q8Kernels::kDefault);
// GroupedSwiGlu and GroupedGemv (below) over activations quantized per grouped row (xq: n rows of
// Q8ActRowBytes for the codec of gate / of the table's matrices), same plan, n_tok, skip and n_grid.
// GroupedSwiGluQ8 with tok (GroupByExpert's idx) reads grouped row r from xq row tok[r] instead:
// the tokens' rows quantized once, no gathered copy.
struct GroupedExperts;
absl::Status GroupedSwiGluQ8(const GroupedExperts &e, const int32_t *plan, int n_max, const void *xq, float *hg,
                             cudaStream_t stream, int64_t n_tok = -1, const uint8_t *skip = nullptr,
                             const int32_t *tok = nullptr, int n_grid = 0);
absl::Status GroupedGemvQ8(const void *const *tab, const DeviceMatrix &shape, const int32_t *plan, int n_max,
                           const void *xq, float *y, cudaStream_t stream, int64_t n_tok = -1,
                           const uint8_t *skip = nullptr, int n_grid = 0);

// A prompt's expert groups in one launch: for each group g < m, grouped rows [span[2 g], span[2 g + 1])
// of y (shape.rows wide) = those rows of xq (quantized as QuantizeActivationsQ8(Q8ActFor(shape.type))
// made them, 16-byte aligned) times w0[g]ᵀ; with w1 given, silu(x · w0[g]ᵀ) * (x · w1[g]ᵀ) (an expert's
// gate and up). Every matrix has shape's codec, size and row_bytes (its data unused). Each (row, token)
// result has the bits of GemvQ8 on the tensor cores (Q8Kernels::kTensor) over that matrix alone, and the
// SwiGLU those of GatedAct over the two: a token's bits do not depend on its group or the groups beside
// it. Rows outside every span are not written; spans must not overlap. span, w0, w1 are device arrays.
// MOE_ERR_UNSUPPORTED_TYPE for a codec without 8-bit activations; MOE_ERR_INVALID_ARGUMENT for null or
// unaligned buffers or a bad shape.
struct PromptGroups {
  const int64_t *span = nullptr;
  const void *const *w0 = nullptr;
  const void *const *w1 = nullptr;
  int m = 0;
};
absl::Status PromptMmaQ8(const PromptGroups &p, const DeviceMatrix &shape, const void *xq, float *y,
                         cudaStream_t stream);
// GemvQ8 on the tensor cores (the same bits) for a prompt's n_tok tokens in one launch, its blocks
// spread over chunks of 32 tokens as well as over rows.
absl::Status PromptGemvQ8(const DeviceMatrix &w, const void *xq, int64_t n_tok, float *y, cudaStream_t stream);

// ys[m] (n_tok, ws[m].rows) = x (n_tok, cols) · ws[m]ᵀ for n <= kGemvManyMax matrices of one codec
// and column count (the attention projections of one input) in one launch per token chunk;
// per (row, token) bit-identical to Gemv on each matrix.
constexpr int kGemvManyMax = 4;
absl::Status GemvMany(const DeviceMatrix *ws, float *const *ys, int n, const float *x, int64_t n_tok,
                      cudaStream_t stream);
// GemvQ8 over n <= kGemvManyMax matrices of one codec and column count and one quantized input, in
// one launch per token chunk (a launch a matrix where their row counts split them differently); per
// (row, token) bit-identical to GemvQ8 on each matrix.
absl::Status GemvManyQ8(const DeviceMatrix *ws, float *const *ys, int n, const void *xq, int64_t n_tok,
                        cudaStream_t stream, Q8Kernels k = Q8Kernels::kDefault);

// out (rows, cols) = the dequantized w, bit-identical to quant::Codec::dequantize.
absl::Status Dequantize(const DeviceMatrix &w, float *out, cudaStream_t stream);

// out (n, w.cols) = dequantized rows ids[i] of w (ids is a device array). An id outside
// [0, w.rows) yields a row of NaN (the kernel cannot fail; the caller validates token ids).
absl::Status GetRows(const DeviceMatrix &w, const int32_t *ids, int64_t n, float *out, cudaStream_t stream);

// Dense matrix products through cuBLASLt, for batches (prefill). One handle per device and thread
// that uses it (cuBLASLt handles are not tied to a stream).
class Blas {
 public:
  enum class Path { kAuto, kGemv, kGemm };
  // kF32: IEEE float32 products (within 1e-5 relative of the CPU). kTf32: tensor cores with
  // 10-bit-mantissa inputs, about 1e-3 relative, several times faster at large batches.
  enum class Compute { kF32, kTf32 };

  Blas() = default;
  ~Blas();
  Blas(Blas &&o) noexcept;
  Blas &operator=(Blas &&o) noexcept;
  Blas(const Blas &) = delete;
  Blas &operator=(const Blas &) = delete;

  static absl::StatusOr<Blas> Create(Compute compute = Compute::kF32);

  // Workspace MatMul needs for this matrix and batch on `path`: cuBLASLt's scratch plus, for a
  // non-F32 codec on the GEMM path, the dequantized matrix. 0 on the GEMV path.
  static size_t MatMulWorkspaceBytes(const DeviceMatrix &w, int64_t n_tok, Path path = Path::kAuto);
  // Which path kAuto takes: GEMV up to kGemvBatchTokens tokens (weights read once per
  // kGemvMaxTokens, exact decode: a few sessions' decode step), otherwise dequantize into the
  // workspace and one cuBLASLt GEMM (dequantizing costs about what two GEMV passes do).
  static constexpr int64_t kGemvBatchTokens = 16;
  static Path Choose(int64_t n_tok, Path path) {
    if (path != Path::kAuto) return path;
    return n_tok <= kGemvBatchTokens ? Path::kGemv : Path::kGemm;
  }

  // y (n_tok, w.rows) = x (n_tok, w.cols) · wᵀ. MOE_ERR_INVALID_ARGUMENT when ws is smaller than
  // MatMulWorkspaceBytes.
  absl::Status MatMul(const DeviceMatrix &w, const float *x, int64_t n_tok, float *y, Workspace ws,
                      cudaStream_t stream, Path path = Path::kAuto) const;

  // y (n_tok, rows) = x (n_tok, cols) · wᵀ for a dense float32 w (rows, cols) in device memory.
  absl::Status Sgemm(const float *w, int64_t rows, int64_t cols, const float *x, int64_t n_tok, float *y,
                     Workspace ws, cudaStream_t stream) const;

  // cuBLASLt scratch passed to every GEMM (part of MatMulWorkspaceBytes).
  static constexpr size_t kLtWorkspaceBytes = size_t{32} << 20;

 private:
  cublasLtHandle_t handle_ = nullptr;
  Compute compute_ = Compute::kF32;
};

// ---- Element-wise and per-row operations ---------------------------------------------------------

// x (n_rows, n) += add, then y = RmsNorm(x): the residual add and the next norm in one launch,
// bit-identical to Add followed by RmsNorm.
absl::Status AddRmsNorm(float *x, const float *add, const float *weight, int64_t n_rows, int64_t n, float eps, float *y,
                        cudaStream_t stream);

// y (n_rows, n) = x / rms(x) * weight per row (weight (n) on the device); y may alias x.
absl::Status RmsNorm(const float *x, const float *weight, int64_t n_rows, int64_t n, float eps, float *y,
                     cudaStream_t stream);

// Rotates x (n_tok, n_heads, head_dim) in place; token t is at position pos[t] (device array).
// Angles are formed as the CPU backend forms them (float inverse frequencies, float angle) with
// sine and cosine evaluated in double.
absl::Status Rope(float *x, int64_t n_tok, int n_heads, int head_dim, const int32_t *pos, float theta,
                  model::RopeStyle style, cudaStream_t stream);

// Softmax routing, as the forward pass's Route: per token, softmax over logits (n_tok, n_expert),
// the k largest probabilities (ties to the lower index) into sel (n_tok, k) in decreasing order and
// their probabilities into wts (n_tok, k), renormalised to sum to one when `renorm`.
absl::Status SoftmaxTopK(const float *logits, int64_t n_tok, int n_expert, int k, bool renorm, int32_t *sel,
                         float *wts, cudaStream_t stream);

// h (n, ) = silu(g) * u, element-wise; h may alias g or u.
absl::Status SwiGlu(const float *g, const float *u, int64_t n, float *h, cudaStream_t stream);

// ---- Attention ------------------------------------------------------------------------------------

// Attention over the KV cache's block tables: AttentionExt and FlashAttention below.

// ---- Expert FFN -----------------------------------------------------------------------------------

// A SwiGLU FFN's matrices on the device: gate, up (n_ff, n_embd), down (n_embd, n_ff).
struct DeviceExpert {
  DeviceMatrix gate, up, down;
};

size_t ExpertFfnWorkspaceBytes(const DeviceExpert &e, int64_t n_tok, Blas::Path path = Blas::Path::kAuto);

// y (n_tok, n_embd) = down(silu(gate x) * up x) for one expert over a group of tokens. On the GEMV
// path gate and up (same codec) are read in one fused kernel that applies SwiGLU.
absl::Status ExpertFfn(const Blas &blas, const DeviceExpert &e, const float *x, int64_t n_tok, float *y,
                       Workspace ws, cudaStream_t stream, Blas::Path path = Blas::Path::kAuto);

// The fused first half of ExpertFfn's GEMV path: h (n_tok, gate.rows) = silu(gate x) * up x.
absl::Status GemvSwiGlu(const DeviceMatrix &gate, const DeviceMatrix &up, const float *x, int64_t n_tok,
                        float *h, cudaStream_t stream);

// ---- Grouped experts (grouped.cu) -----------------------------------------------------------------

// A MoE layer's routed experts in three launches that the host never has to look into: GroupByExpert
// turns the routing selections into a grouping plan on the device, then GroupedSwiGlu and
// GroupedGemv run every group of rows through its expert's matrices. The grouped kernels launch a
// grid of (row blocks, n_max) blocks, n_max the most groups there can be; a block whose group index
// is at or past the plan's group count exits at once, so the host needs neither the selections nor
// the number of distinct experts. Per (row, token) the results are bit-identical to GemvSwiGlu and
// Gemv on that expert alone: the same row dot (gemv.cuh), with a group's tokens taken in chunks of
// 8, 4, 2 and 1. Weights are read once per chunk of 8 tokens of a group.

// n_max: the most groups n_tok tokens of k selections over n_expert experts form, min(n_tok k,
// n_expert); 0 for no tokens.
int64_t GroupMaxGroups(int64_t n_tok, int k, int n_expert);
// int32 entries of a grouping plan: 2 + 2 n_max.
int64_t GroupPlanInts(int64_t n_tok, int k, int n_expert);
// The rows of groups a grouped launch gives blocks to (its n_grid, below): the distinct experts
// n_tok tokens of k different selections each are expected to reach when every expert is equally
// likely, n_expert (1 - (1 - k / n_expert)^n_tok), rounded up with 5% to spare, at most n_max. A
// grid row per possible group (n_max) leaves the rows past the groups formed to blocks that only
// read the plan and leave: 16 tokens of 8 selections over 128 experts form ~82 groups of 128 possible.
// STRATA_CUDA_GROUP_GRID=0 makes it n_max (a measuring knob).
int GroupGridGroups(int64_t n_tok, int k, int n_expert);
// The token chunk (1, 2, 4 or 8) for the 8-bit grouped launches of n_tok tokens (their n_tok
// argument): the groups' expected mean size under the same uniform routing, rounded, taken up to a
// power of two, at most n_tok (16 tokens of 8 over 128 experts: 1.6 a group, chunks of 2). A group of
// more tokens takes several chunks; the bits do not change. The 2-token kernels hold more blocks a
// multiprocessor than the 8-token ones (GroupedQ8MinBlocks, gemv.cuh).
int GroupChunkTokens(int64_t n_tok, int k, int n_expert);
// MOE_ERR_INVALID_ARGUMENT naming `what` unless 0 <= n_grid <= n_max.
absl::Status CheckGroupGrid(int n_max, int n_grid, const char *what);

// The most experts a layer may have on the device paths (routing, grouping, staging).
constexpr int kRouteMaxExperts = 256;

// Groups the selections sel (n_tok, k) (device; sel[t k + j] is the expert of token t's slot j) by
// expert, as the forward pass's FeedForward does on the host: groups in ascending expert id, within
// a group the selections i = t k + j ascending. With n = n_tok k and n_max = GroupMaxGroups(...),
// writes (device arrays):
//   idx (2 n): idx[r] = token of grouped row r (r < n); idx[n + i] = grouped row of selection i.
//   plan (GroupPlanInts): plan[0] = n_groups; plan[1 + g] = expert of group g; plan[1 + n_max + g]
//       = first grouped row of group g for g <= n_groups, so group g is rows [plan[1 + n_max + g],
//       plan[2 + n_max + g]) and plan[1 + n_max + n_groups] = n. Entries past n_groups are unspecified.
// One block, deterministic. A selection outside [0, n_expert) (a routing bug) joins no group: its
// idx[n + i] is -1 and the grouped rows end that many short of n (idx past them unspecified); the
// kernel stays in bounds. 1 <= n_expert <= kRouteMaxExperts, k >= 1, n at most 2^30. No workspace.
absl::Status GroupByExpert(const int32_t *sel, int64_t n_tok, int k, int n_expert, int32_t *idx, int32_t *plan,
                           cudaStream_t stream);

// Every routed expert of a layer, for the grouped kernels: gate[e], up[e], down[e] (device arrays of
// n_expert pointers, e.g. rebuilt when an expert moves) are expert e's matrices, each an address the
// device can read: VRAM, or page-locked host memory mapped for the device (zero-copy, read over the
// link as the kernel runs). Every expert has the codec, shape and row_bytes of the *_shape matrices,
// whose data field is unused; each expert's address must be aligned as CheckMatrix requires of data
// (256-byte aligned always is). gate, up (n_ff, n_embd) of one codec and row_bytes; down (n_embd, n_ff).
struct GroupedExperts {
  const void *const *gate = nullptr;
  const void *const *up = nullptr;
  const void *const *down = nullptr;
  DeviceMatrix gate_shape, up_shape, down_shape;
  int n_expert = 0;
};

// MOE_ERR_UNSUPPORTED_TYPE for a codec without device kernels; MOE_ERR_INVALID_ARGUMENT for null
// tables, n_expert < 1, gate and up not of one codec, shape and row_bytes (not fusable), down not
// (n_embd, n_ff), or a shape CheckMatrix refuses. Reads no device memory.
absl::Status CheckGroupedExperts(const GroupedExperts &e);

// hg (n, n_ff) = for each group g < plan[0], rows [first[g], first[g + 1]) of silu(gate x) * up x
// with expert plan[1 + g]'s gate and up, x = xg (n, n_embd), the grouped input rows. plan and n_max
// as GroupByExpert made them; n_max <= e.n_expert and <= 65535. Rows outside every group are not
// written. n_tok, when known (>= 0), sizes the kernels' token chunks: a group's rows are taken at most
// that many at once. The number of tokens grouped is the largest that helps (a token selects an
// expert once, so no group holds more rows); GroupChunkTokens may choose fewer. The results do not
// depend on it.
// skip (device, n_expert flags, optional): a group whose expert's flag is set is not run (its rows
// are not written): another processor computes it (CopySkippedGroups brings its rows in).
// n_grid (1 .. n_max; 0 for n_max): the rows of groups the grid has; the block of row y serves
// groups y, y + n_grid, ... below plan[0]. The results do not depend on it.
absl::Status GroupedSwiGlu(const GroupedExperts &e, const int32_t *plan, int n_max, const float *xg, float *hg,
                           cudaStream_t stream, int64_t n_tok = -1, const uint8_t *skip = nullptr, int n_grid = 0);

// y (n, shape.rows) = for each group g < plan[0], rows [first[g], first[g + 1]) of x (n, shape.cols)
// · wᵀ with w = tab[plan[1 + g]] (device array of pointers, each matrix of `shape`; data unused):
// the down projection of the grouped experts. n_max <= 65535; n_tok, skip and n_grid as for
// GroupedSwiGlu.
absl::Status GroupedGemv(const void *const *tab, const DeviceMatrix &shape, const int32_t *plan, int n_max,
                         const float *x, float *y, cudaStream_t stream, int64_t n_tok = -1,
                         const uint8_t *skip = nullptr, int n_grid = 0);

// VRAM staging slots for a layer's cold experts (the VRAM tier): StageColdExperts copies the
// experts a plan needs that lie in mapped host memory into these slots, so the grouped kernels read
// them from VRAM. The copy and products run at about the rate of the grouped kernels reading the
// same experts in place, a little faster for batches (cuda_bench, bench/README.md).
// Slot j holds gate | up | down at byte offsets 0, Align256(gate bytes), Align256(gate bytes) +
// Align256(up bytes).
struct ExpertStage {
  uint8_t *slots = nullptr;  // n_slots x slot_bytes of VRAM, 256-byte aligned
  int n_slots = 0;
  uint64_t slot_bytes = 0;
  // The staged tables (device arrays of n_expert pointers each), written by StageColdExperts.
  const void **gate = nullptr, **up = nullptr, **down = nullptr;
  // Device addresses of the mapped host memory: an expert whose three matrices lie in [host_lo,
  // host_hi) is cold.
  uintptr_t host_lo = 0, host_hi = 0;
  // Optional device counters: counts[0] += experts a launch copies, counts[1] += groups whose expert
  // already lies in [hit_lo, hit_hi) (e.g. staged ahead by a prefetch).
  unsigned long long *counts = nullptr;
  uintptr_t hit_lo = 0, hit_hi = 0;
};

// The bytes of a slot for experts of these shapes (gate | up | down, each 256-aligned); 0 for shapes
// StageColdExperts cannot copy.
uint64_t ExpertStageSlotBytes(const GroupedExperts &e);

// StageColdExperts' checks of from and stage (all but the plan's); reads no device memory.
absl::Status CheckExpertStage(const GroupedExperts &from, const ExpertStage &stage);

// Of the groups g < plan[0], in group order, those whose expert is cold (all three matrices in the
// mapped host range, 16-byte aligned) and not skipped (skip: n_expert flags, optional) take slots
// 0, 1, ... of `stage`, at most n_slots of them, and their matrices are copied there by every block
// of the launch. stage's tables receive from's tables with the staged experts' entries pointing at
// their slots (every other entry as in from). Cold experts past n_slots stay where they are (the
// grouped kernels read them over the link). The bytes are the same, so the grouped kernels give the
// same bits through either table. plan and n_max as GroupByExpert made them (n_max <= n_expert).
// MOE_ERR_INVALID_ARGUMENT for bad tables, slots too small or unaligned, or an expert matrix whose
// bytes are not a multiple of 16. Reads no device memory before the launch.
absl::Status StageColdExperts(const GroupedExperts &from, const ExpertStage &stage, const int32_t *plan, int n_max,
                              const uint8_t *skip, cudaStream_t stream);

// from with stage's tables: what the grouped kernels read after StageColdExperts.
GroupedExperts StagedExperts(const GroupedExperts &from, const ExpertStage &stage);

// Cold experts by the copy engines. The copy engines move a layer's cold experts at the
// link's rate while kernels run beside them at full speed, where kernels that read the link
// (StageColdExperts, products reading in place) slow down beside other kernels
// (bench/link_overlap_bench.cu). Copy engines are driven by the host, so: PlanColdCopies picks the
// cold experts and their slots on the device exactly as StageColdExperts does, writes the staged
// tables and posts a request to a mailbox in mapped host memory; a host thread (ColdCopier) issues
// the copies and, after them on its stream, writes the request's number to `done`; WaitColdCopies
// holds a stream until `done` reaches the last urgent request's number.
constexpr int kColdRing = 16;  // requests in flight at most (a layer posts two and waits)
struct ColdRequest {
  uint64_t src[kRouteMaxExperts][3];  // device (mapped) addresses of expert j's gate, up, down
  uint64_t slots = 0;                 // device address of slot 0; expert j goes to slot j
  uint64_t slot_bytes = 0, off[3] = {}, bytes[3] = {};
  int32_t n = 0;                      // experts to copy
  int32_t layer = 0;
  int32_t urgent = 0;                 // 1: the layer's own (its products wait), 0: a prediction's
  uint32_t seq = 0;                   // written last: 1, 2, ... (a request's number)
};
struct ColdMailbox {
  ColdRequest *ring = nullptr;      // device address of kColdRing requests in mapped host memory
  uint32_t *next = nullptr;         // device: the number of the last request posted
  const uint32_t *done = nullptr;   // device: the number of the last request whose copies landed
  uint32_t *want = nullptr;         // device: the request WaitColdCopies waits for
  uint32_t *timed_out = nullptr;    // device address of 3 mapped host words: [0] set by a wait that gave up
  uint64_t timeout_ns = 2000000000;  // how long a wait waits
  unsigned long long *waited_ns = nullptr;  // device: the waits' summed time (kept where set)
};

// StageColdExperts' choice of slots and tables for from, stage, plan, n_max and skip (one block,
// no copy), then a request for the chosen experts posted to mb (`urgent`: also the one the next
// WaitColdCopies waits for). No request when none is cold; an urgent plan then has the next wait
// wait for the requests posted before. stage.counts as in StageColdExperts. Errors as
// StageColdExperts'.
absl::Status PlanColdCopies(const GroupedExperts &from, const ExpertStage &stage, const int32_t *plan, int n_max,
                            const uint8_t *skip, const ColdMailbox &mb, int layer, bool urgent,
                            cudaStream_t stream);

// Where a staging's experts come from and go: from's and the stage's tables, each matrix's size in
// 16-byte units and its offset in a slot.
struct StageTables {
  const void *const *from[3] = {};
  const void **to[3] = {};
  uint64_t units[3] = {};
  uint64_t off[3] = {};
};
// PlanColdCopies' arguments but the plan, checked (MakeColdPlan): the same plan run at the end of
// another launch's grouping (RouteGroupQuantize), one launch fewer a layer.
struct ColdPlan {
  StageTables t;
  int n_expert = 0;
  ExpertStage stage;
  const uint8_t *skip = nullptr;
  ColdMailbox mb;
  int layer = 0;
  bool urgent = false;
};
absl::StatusOr<ColdPlan> MakeColdPlan(const GroupedExperts &from, const ExpertStage &stage, const uint8_t *skip,
                                      const ColdMailbox &mb, int layer, bool urgent);

// Holds `stream` until mb's `done` reaches its `want` (every request posted before the last urgent
// one has landed too: the copier serves them in order). A wait past mb.timeout_ns sets *timed_out
// and lets the stream go on (ColdCopier::status() reports it); once it is set, a wait that would
// wait returns at once.
absl::Status WaitColdCopies(const ColdMailbox &mb, cudaStream_t stream);

// For each group g < plan[0] whose expert's skip flag is set: rows [first[g], first[g + 1]) of dst
// (n, width) = those of src, which may be page-locked host memory mapped for the device (the rows
// the CPU computed). Other rows are left as they are.
absl::Status CopySkippedGroups(const int32_t *plan, int n_max, const uint8_t *skip, const float *src, float *dst,
                               int64_t width, cudaStream_t stream);

// Calls to a host thread through mapped memory (CpuExperts): no host function in the stream. The
// driver runs host functions on a thread of its own; a recorded step holding them saw the copier's
// copies (ColdCopier) stall behind its waits, and each costs a round trip through that thread. Here the device posts the call as the copier's requests are posted, and a kernel polls
// the host thread's answer.
struct CpuCall {
  int32_t layer = 0, k = 0, n_expert = 0, pad = 0;
  int64_t n_tok = 0;
  uint32_t seq = 0;  // written last: 1, 2, ... (the call's number)
};
struct CpuCallBox {
  CpuCall *call = nullptr;             // device address of the call record in mapped host memory
  int32_t *sel = nullptr;              // device addresses of mapped host buffers: the call's selections,
  float *h = nullptr;                  // input rows
  const void **tab = nullptr;          // and tables of gate, up and down addresses (3 n_expert)
  uint32_t *next = nullptr;            // device: the number of the last call posted
  const uint32_t *answer = nullptr;    // device address of 2 mapped words the host writes: [0] the last
                                       // call decided (its skip flags written), [1] the last one done
  uint32_t *timed_out = nullptr;       // device address of 4 mapped words: [0] set by a wait that gave
                                       // up, [1] its stage, [2] the call it waited for, [3] the answer seen
  uint64_t timeout_ns = 10000000000;   // how long a wait waits
  unsigned long long *waited_ns = nullptr;  // device, 2 counters: the waits' summed time per stage (optional)
};

// Writes sel (n_tok * k), h (n_tok * n_embd) and tab (n_expert) of c to b's host buffers (with
// up_tab and down_tab, when given, after it: b.tab[n_expert + x], b.tab[2 n_expert + x]), then the
// call (numbered one past *b.next) to b.call. MOE_ERR_INVALID_ARGUMENT for an incomplete box or
// null inputs.
absl::Status PostCpuCall(const CpuCallBox &b, const CpuCall &c, const int32_t *sel, const float *h, int64_t n_embd,
                         const void *const *tab, cudaStream_t stream, const void *const *up_tab = nullptr,
                         const void *const *down_tab = nullptr);

// Holds `stream` until the host's answer[stage] reaches the last call posted (stage 0: decided,
// 1: done), then, when skip_dev is given, copies n_skip flags from skip_host (a mapped host buffer's
// device address) to skip_dev. A wait past b.timeout_ns sets b.timed_out and lets the stream go on
// with every flag 0; once it is set, a wait that would wait returns at once, so a step fails in one
// timeout (the host reports it and clears the flag).
absl::Status WaitCpuCall(const CpuCallBox &b, int stage, const uint8_t *skip_host, uint8_t *skip_dev, int n_skip,
                         cudaStream_t stream);

// ---- Family options and element-wise glue of the forward pass (forward_ops.cu) -----------------

// *at = the device's global clock (ns) once the stream's earlier kernels are done: a diagnostic
// mark in a step (STRATA_CUDA_STAMPS).
absl::Status Stamp(unsigned long long *at, cudaStream_t stream);
// x (n) += y (n)
absl::Status Add(float *x, const float *y, int64_t n, cudaStream_t stream);
// x (n_rows, n) += bias (n), per row
absl::Status AddBias(float *x, int64_t n_rows, int64_t n, const float *bias, cudaStream_t stream);
// x (n_rows, n) row r *= sigmoid(g[r])
absl::Status SigmoidScaleRows(float *x, const float *g, int64_t n_rows, int64_t n, cudaStream_t stream);
// dst (n, width) row i = src row idx[i]
absl::Status GatherRows(const float *src, int64_t width, const int32_t *idx, int64_t n, float *dst,
                        cudaStream_t stream);
// out (n_tok, width) row t = sum over j < k in order of wts[t k + j] * rows[idx[t k + j]]; where
// sel_back is given, also sel_back[i] = sel[i] for i < n_tok k (a layer's selections sent back in
// the same launch).
absl::Status WeightedRowSum(const float *rows, const int32_t *idx, const float *wts, int64_t n_tok, int k,
                            int64_t width, float *out, cudaStream_t stream, const int32_t *sel = nullptr,
                            int32_t *sel_back = nullptr);
// h (n_tok, n_ff) = act(gate, up) where gate (t, f) is g[t * row + f * step] and up (t, f) is
// u[t * row + f * step]: step 1 for separate gate and up outputs, 2 for interleaved columns. act is
// silu(gate) * up, or with limit > 0 gpt-oss's (clamp(up, ±limit) + 1) * g * sigmoid(1.702 g),
// g = min(gate, limit).
absl::Status GatedAct(const float *g, const float *u, int64_t row, int step, int64_t n_tok, int64_t n_ff,
                      float limit, float *h, cudaStream_t stream);
// y (n_tok, cols) = x (n_tok, rows) · w for a dense float32 input-major w (rows, cols), each output
// accumulated over the rows in order with IEEE products and sums (as the CPU backend).
absl::Status MatMulInputMajorF32(const float *w, int64_t rows, int64_t cols, const float *x, int64_t n_tok, float *y,
                                 cudaStream_t stream);

// RoPE with the inverse frequencies given (a host array of head_dim / 2 values, passed by value to
// the kernel: no copy) and cos / sin scaled by mscale (YaRN). head_dim at most 2 kRopeMaxHalf.
constexpr int kRopeMaxHalf = 256;
absl::Status RopeWithTable(float *x, int64_t n_tok, int n_heads, int head_dim, const int32_t *pos,
                           const float *inv_freq, float mscale, model::RopeStyle style, cudaStream_t stream);

// Qwen3's per-head q/k norm then RoPE in one launch: each head row of q (n_tok, n_head, head_dim) and
// k (n_tok, n_head_kv, head_dim) normalised by q_weight / k_weight (head_dim, device) as RmsNorm
// does, then rotated as RopeWithTable does (token t at pos[t]); bit-identical to those calls.
absl::Status NormRope(float *q, float *k, int64_t n_tok, int n_head, int n_head_kv, int head_dim,
                      const float *q_weight, const float *k_weight, float eps, const int32_t *pos, const float *inv_freq,
                      float mscale, model::RopeStyle style, cudaStream_t stream);

// Attention with every family option over a block table: position p's key row is at
// k_blocks[p / block_tokens] + (p % block_tokens) * k_stride, plus kv_head * head_dim; values the
// same from v_blocks, or with `latent` the first v_dim floats of each key row (one KV head, MLA); an
// optional mask (masked[p] != 0: p is no key for another position's query); an optional sink logit
// per head; a given score scale; window 0 = unlimited. q (n_tok, n_head, head_dim) -> out (n_tok,
// n_head, v_dim). Block tables, mask and sinks are device arrays. Outside the flash path (below), the
// one-pass kernel keeps the scores of one (token, head) in shared memory, so the visible keys are
// bounded by the device's shared memory (MOE_ERR_UNSUPPORTED beyond).
struct AttentionExtArgs {
  const float *const *k_blocks = nullptr;
  const float *const *v_blocks = nullptr;
  int block_tokens = 0;
  int64_t k_stride = 0, v_stride = 0;
  int pos0 = 0, n_head = 0, n_head_kv = 1, head_dim = 0, v_dim = 0, window = 0;
  float scale = 1.f;
  const float *sinks = nullptr;    // (n_head), optional
  const uint8_t *masked = nullptr; // (positions), optional
  bool latent = false;
  // Rows mode: query token t's position, tables, mask and window come from rows[t] (device array);
  // pos0, the tables, mask and window above are unused. Always split, into max_keys / kAttnChunk
  // chunks (rounded up): max_keys must bound every row's visible positions, and ws is required.
  const model::KvRowRef *rows = nullptr;
  int max_keys = 0;
  // How the rows are stored (KvView's types; rows mode: every row's, which must agree). f32 rows are
  // read as floats, as ever; f16 and q8_0 rows are decoded value by value as they are loaded (as
  // DecodeKvCols gives them), k_stride and v_stride still counting values. Latent values are read
  // from the key rows, in k_type. The flash kernel decodes typed tiles into its float tiles.
  model::KvType k_type = model::KvType::kF32, v_type = model::KvType::kF32;
};
// Whether a's keys or values are stored in a type other than f32.
inline bool KvRowsTyped(const AttentionExtArgs &a) {
  return a.k_type != model::KvType::kF32 || (!a.latent && a.v_type != model::KvType::kF32);
}
// With few (token, head) blocks and many keys (decode over a long context), the keys are split into
// chunks of kAttnChunk, each chunk's softmax numerator and denominator computed by its own block
// into `ws`, and a second launch combines the chunks in order (flash-decoding); the split needs
// AttentionExtWorkspaceBytes of ws, and without it the call runs in one pass.
constexpr int kAttnChunk = 64;
// A prompt (FlashAttentionApplies) takes the flash kernel (flash_attention.cu) instead: no
// workspace, no bound on the keys.
size_t AttentionExtWorkspaceBytes(const AttentionExtArgs &a, int64_t n_tok);
absl::Status AttentionExt(const float *q, const AttentionExtArgs &a, int64_t n_tok, float *out, cudaStream_t stream,
                          Workspace ws = {});

// Flash attention for a prompt over the block tables (AttentionExt's path for it): tiles of 64
// (token, head of a GQA group) rows against tiles of keys, online softmax, both products in 3xTF32
// on tensor cores (about float32's accuracy, not its bits). Applies without rows, with at least 16
// tokens or 2 whose (token, head) rows fill half a tile, head_dim 64 or 128, v_dim = head_dim (latent: one KV head, v_dim <= head_dim), at most 64
// heads a KV head and f32 / f16 strides in whole 4-float / 8-half pieces (block starts 16-byte
// aligned; q8_0 rows any stride); FlashAttention fails otherwise.
// When its query tiles are too few to fill the device over many keys (a short prompt after a long
// context), the keys are split into runs combined as the split path's chunks (AttentionCombine);
// that needs FlashAttentionWorkspaceBytes of ws, and without it the call runs unsplit.
// Decode attention (flash_decode.cu), the split path's kernel for GQA heads of 128 (groups of 2 to 8,
// no latent rows, no sink logits): a block per (token, KV head, split) stages its keys' and values'
// rows by cp.async for the whole group, splits sized from each row's own key count (at most 64).
// Applies where AttentionExt would split (rows mode, or a decode step); needs
// FlashDecodeWorkspaceBytes of ws when it splits (never more than the split path's).
bool FlashDecodeApplies(const AttentionExtArgs &a, int64_t n_tok);
int FlashDecodeSplits(const AttentionExtArgs &a, int64_t n_tok);
size_t FlashDecodeWorkspaceBytes(const AttentionExtArgs &a, int64_t n_tok);
absl::Status FlashDecode(const float *q, const AttentionExtArgs &a, int64_t n_tok, float *out, cudaStream_t stream,
                         Workspace ws);
bool FlashAttentionApplies(const AttentionExtArgs &a, int64_t n_tok);
size_t FlashAttentionWorkspaceBytes(const AttentionExtArgs &a, int64_t n_tok);
absl::Status FlashAttention(const float *q, const AttentionExtArgs &a, int64_t n_tok, float *out,
                            cudaStream_t stream, Workspace ws = {});
// The split path's second phase: for each (token, head) its n_split parts (m, l, out...) at
// part[(th * n_split + s) * (v_dim + 2)], with the optional sink logit, into out (n_tok, n_head, v_dim).
absl::Status AttentionCombine(const float *part, const AttentionExtArgs &a, int64_t n_tok, int n_split, float *out,
                              cudaStream_t stream);

// Writes row t of k (n, k_width) and v (n, v_width) at rows[t].pos through rows[t]'s block tables
// (blocks of block_tokens rows; v_width 0: keys only). One launch for every session of a step.
// Each row is stored in its KvRowRef's k_type / v_type, with the bytes EncodeKvRow makes on the host.
absl::Status WriteKvRows(const model::KvRowRef *rows, int64_t n, const float *k, const float *v, int k_width,
                         int v_width, int block_tokens, cudaStream_t stream);
// Backend::WriteKvBytes and ReadKvBytes on the device (kv_rows.cu): rows x width floats of src (rows
// src_stride floats apart) encoded in type t at dst (rows dst_stride bytes apart), byte for byte as
// EncodeKvRow; and back, each value as DecodeKvCols gives it. Device pointers; one block a row.
absl::Status EncodeKvRows(uint8_t *dst, int64_t dst_stride, const float *src, int64_t src_stride, int64_t rows,
                          int width, model::KvType t, cudaStream_t stream);
absl::Status DecodeKvRows(float *dst, int64_t dst_stride, const uint8_t *src, int64_t src_stride, int64_t rows,
                          int width, model::KvType t, cudaStream_t stream);

// Every routing variant of lib/model/routing.h, one thread per token: logits (n_tok, n_expert) ->
// sel (n_tok, k) and wts (n_tok, k). gating: 0 softmax, 1 softmax over the selected, 2 sigmoid.
struct RouteArgs {
  int gating = 0;
  int n_expert = 0, k = 0, n_group = 1, topk_group = 1;
  bool norm_topk_prob = false;
  float routed_scale = 1.f;
  const float *select_bias = nullptr;  // (n_expert) device, optional
};
absl::Status Route(const RouteArgs &p, const float *logits, int64_t n_tok, int32_t *sel, float *wts,
                   cudaStream_t stream);
// MOE_ERR_INVALID_ARGUMENT unless Route can take p.
absl::Status CheckRouteArgs(const RouteArgs &p);

// Route, GroupByExpert and QuantizeActivationsQ8(f, h, n_tok, cols, xq) in one launch, for a decode
// step of 1 .. kRouteGroupMaxTokens tokens: one block routes (a warp a token, two past 8 tokens) and
// groups, the others quantize the tokens' rows of h, where three launches would each wait for the
// one before. The same bits as the three; idx and plan as GroupByExpert writes them (n_max =
// GroupMaxGroups(n_tok, p.k, p.n_expert)). f kNone: no quantizing (h, cols and xq unused). With
// `cold`, the routing block then runs PlanColdCopies over the plan it wrote, as that launch would.
constexpr int kRouteGroupMaxTokens = 16;
absl::Status RouteGroupQuantize(const RouteArgs &p, const float *logits, int64_t n_tok, int32_t *sel, float *wts,
                                int32_t *idx, int32_t *plan, Q8Act f, const float *h, int64_t cols, void *xq,
                                cudaStream_t stream, const ColdPlan *cold = nullptr);

}  // namespace strata::cuda
