// Expert parallelism's exchange for one MoE layer (store/device_placement.h). Each rank (a device)
// holds its own tokens' inputs and the router's selections for them; each (token, k) pair is computed
// on the rank the placement names (ComputeDevice: the token's own rank where it holds the expert, else
// the owner). One all-to-all takes the rows there (each with its expert), the receiving rank computes
// them an expert at a time, a second all-to-all brings the results back in the order they were sent,
// and each token's output is the sum over its k selections in k order of weight x result — the sum,
// in the same order, that one device forms (Backend::WeightedRowSum), so where an expert's product of a
// row does not depend on the other rows it is computed with, the logits are those of one device.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <vector>

#include "lib/store/device_placement.h"
#include "lib/util/status.h"

namespace strata::model {

// All-to-all of float rows among the ranks of one group: on GPUs NCCL's grouped sends and receives;
// in one process, LocalTransport.
class ExpertTransport {
 public:
  virtual ~ExpertTransport() = default;
  virtual int n_ranks() const = 0;
  // Rank `rank`'s part of one exchange, which every rank calls: send[d] goes to rank d (itself
  // included) and recv[s] receives what rank s sent it.
  virtual absl::Status AllToAll(int rank, const std::vector<std::vector<float>> &send,
                                std::vector<std::vector<float>> *recv) = 0;
};

// The ranks of one process, each called from a thread of its own: a call returns once every rank has
// posted its sends and taken what it receives.
class LocalTransport final : public ExpertTransport {
 public:
  explicit LocalTransport(int n_ranks);
  int n_ranks() const override { return n_; }
  absl::Status AllToAll(int rank, const std::vector<std::vector<float>> &send,
                        std::vector<std::vector<float>> *recv) override;

 private:
  int n_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::vector<std::vector<float>>> box_;  // [from][to]
  int posted_ = 0, taken_ = 0;
  uint64_t round_ = 0;
};

// Which rank computes each of a rank's (token, k) pairs: to[d] lists the pairs (token * k + j) rank d
// computes, in ascending order.
std::vector<std::vector<int32_t>> PlanSends(const store::DevicePlacement &pl, int layer, int rank, int64_t n_tok,
                                            int k, const int32_t *selected);

// An expert's products for `rows` rows of `width` floats at x into y (the same width).
using ExpertRowsFn = std::function<absl::Status(int expert, const float *x, int64_t rows, float *y)>;

struct ExchangeStats {
  int64_t rows_sent = 0;      // pairs computed on another rank
  int64_t rows_local = 0;     // pairs computed here, of this rank's tokens
  int64_t rows_computed = 0;  // pairs computed here, of every rank's tokens
};

// One rank's MoE layer: x (n_tok x width) its tokens' inputs, selected and weights (n_tok x k) their
// selections; out (n_tok x width) receives the weighted sums. MOE_ERR_INVALID_ARGUMENT for an
// expert outside the layer or one the placement does not route; the transport's or fn's error else.
absl::Status ExchangeExperts(ExpertTransport &t, const store::DevicePlacement &pl, int layer, int rank,
                             const float *x, int64_t n_tok, int64_t width, int k, const int32_t *selected,
                             const float *weights, const ExpertRowsFn &fn, float *out, ExchangeStats *stats = nullptr);

}  // namespace strata::model
