// The CPU backend: scalar reference kernels over the codec registry, multi-threaded over output rows.
// Every dot product is computed by one code path in a fixed order, so results do not depend on the
// number of tokens in a call or on the thread count.
#pragma once

#include <memory>

#include "lib/model/backend.h"
#include "lib/util/thread_pool.h"

namespace strata::cpu {

class CpuBackend final : public model::Backend {
 public:
  explicit CpuBackend(int n_threads);
  std::string_view name() const override { return "cpu"; }

  void MatMul(const model::Matrix &w, const float *x, int64_t n_tok, float *y) override;
  void GetRows(const model::Matrix &w, const int32_t *ids, int64_t n, float *out) override;
  void RmsNorm(const float *x, const float *weight, int64_t n_rows, int64_t n, float eps, float *y) override;
  void Rope(float *x, int64_t n_tok, int n_heads, int head_dim, const int32_t *pos, float theta,
            model::RopeStyle style) override;
  void Attention(const float *q, const model::KvView &kv, int64_t n_tok, int pos0, int n_head,
                 int n_head_kv, int head_dim, int window, float *out) override;
  void ExpertFfn(const model::ExpertWeights &e, const float *x, int64_t n_tok, float *y) override;

  ThreadPool &pool() { return pool_; }

 private:
  ThreadPool pool_;
};

}  // namespace strata::cpu
