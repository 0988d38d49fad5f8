// The CPU backend: row-dot kernels (backends/cpu/kernels) over the codec registry, multi-threaded
// over output rows. For a fixed MatMulMode and ISA every dot product is computed by one code path in
// a fixed order, so results do not depend on the number of tokens in a call or on the thread count.
#pragma once

#include <memory>
#include <vector>

#include "backends/cpu/kernels/kernels.h"
#include "lib/model/backend.h"
#include "lib/util/thread_pool.h"

namespace strata::cpu {

// How MatMul treats activations. kExact: float activations against the codec's exact weights
// (float accumulation; what the golden tests check). kQ8Activations: each token's activations are
// quantized once per call to 8-bit blocks and dotted with integer SIMD; relative to kExact it adds an
// error of at most about 2^-8 * sum_blocks amax|x| * sum|w| (tests/cpu/kernels_test.cc). Float
// weight formats (F32/F16/BF16) always run exact.
enum class MatMulMode { kExact, kQ8Activations };

class CpuBackend final : public model::Backend {
 public:
  // isa: which kernels to run; defaults to the best this machine supports (tests force kScalar).
  // pool_spin: how long idle pool threads spin before sleeping (ThreadPool).
  explicit CpuBackend(int n_threads, MatMulMode mode = MatMulMode::kExact,
                      kernels::Isa isa = kernels::BestIsa(), int pool_spin = ThreadPool::kSpinIterations);
  std::string_view name() const override { return "cpu"; }

  // Memory is host memory: Upload and Download are plain copies.
  absl::StatusOr<std::unique_ptr<model::Buffer>> Allocate(size_t bytes) override;
  void Upload(void *dst, const void *src, size_t bytes) override;
  void Download(void *dst, const void *src, size_t bytes) override;
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
  void MatMulInputMajor(const model::Matrix &w, const float *x, int64_t n_tok, float *y) override;

  void MatMul(const model::Matrix &w, const float *x, int64_t n_tok, float *y) override;
  void MatMulMany(const model::Matrix *const *ws, float *const *ys, int n, const float *x, int64_t n_tok) override;
  void GetRows(const model::Matrix &w, const int32_t *ids, int64_t n, float *out) override;
  void RmsNorm(const float *x, const float *weight, int64_t n_rows, int64_t n, float eps, float *y) override;
  using model::Backend::Attention;
  using model::Backend::Rope;
  void Rope(float *x, int64_t n_tok, int n_heads, int head_dim, const int32_t *pos, float theta,
            model::RopeStyle style, const model::RopeParams &p) override;
  void Attention(const float *q, const model::KvView &kv, int64_t n_tok, int pos0, int n_head, int n_head_kv,
                 int head_dim, int window, float *out, const model::AttentionParams &p) override;
  void ExpertFfn(const model::ExpertWeights &e, const float *x, int64_t n_tok, float *y) override;
  void ExpertsFfn(const model::ExpertWeights *const *ew, int n, const int64_t *first, const float *xg, float *yg,
                  int64_t width) override;
  bool RoutedExperts(const model::RoutedExpertsArgs &a) override;

  // Where ExpertsFfn's time goes (a diagnostic): seconds summed over its calls while set (null: not
  // timed). setup: the operations and the activations' places; gate_up and down: the two parallel
  // loops (with their inputs' quantizing); act: the SwiGLU between them.
  struct ExpertsFfnTimes {
    uint64_t calls = 0;
    double setup_s = 0, gate_up_s = 0, act_s = 0, down_s = 0;
  };
  void set_experts_ffn_times(ExpertsFfnTimes *t) { ffn_times_ = t; }
  bool ObserveActivations(model::ActivationObserver *o) override {
    observer_ = o;
    return true;
  }

  ThreadPool &pool() { return pool_; }
  MatMulMode matmul_mode() const { return mode_; }
  // Not thread-safe against a concurrent MatMul.
  void set_matmul_mode(MatMulMode mode) { mode_ = mode; }
  kernels::Isa isa() const { return isa_; }

 private:
  void MatMulInputMajor(const model::Matrix &w, const float *x, int64_t n_tok, float *y, float *row);

  // One MatMul: y (n_tok, w.rows) = x (n_tok, w.cols) · wᵀ with the kernels and activation mode it
  // runs; xq holds the quantized activations in q8 mode (xq_stride bytes a token).
  struct MatOp {
    const model::Matrix *w = nullptr;
    kernels::RowKernels k{};
    bool q8 = false;
    bool xq_shared = false;  // xq is another operation's (the same input), quantized there
    const float *x = nullptr;
    uint8_t *xq = nullptr;
    int64_t xq_stride = 0, n_tok = 0;
    float *y = nullptr;
  };
  MatOp PrepareMatOp(const model::Matrix &w, const float *x, int64_t n_tok, float *y) const;
  static void QuantizeRows(const MatOp &op, int64_t t0, int64_t t1);
  static void PlaceActivations(const std::vector<MatOp *> &ops, std::vector<uint8_t> *store);
  void RunOps(const std::vector<MatOp *> &ops);
  static void RunRow(const MatOp &op, int64_t r, int64_t t_begin, int64_t t_end);  // row r for tokens [begin, end)
  static void RunRows(const MatOp &op, int64_t r0, int64_t r1);                    // rows [r0, r1), every token
  // Units [i0, i1) of the n_tok x n_ff gate (g) and up (u) outputs into g: see the definition.
  static void GateUpActivation(const model::ExpertWeights &e, float *g, const float *u, int64_t n_ff, int64_t i0,
                               int64_t i1, bool biases_added);
  static void AddDownBias(const model::ExpertWeights &e, float *y, int64_t n_tok, int64_t n_embd);

  ThreadPool pool_;
  MatMulMode mode_;
  kernels::Isa isa_;
  ExpertsFfnTimes *ffn_times_ = nullptr;
  model::ActivationObserver *observer_ = nullptr;
};

}  // namespace strata::cpu
