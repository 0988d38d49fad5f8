// Expert parallelism's exchange for one MoE layer (expert_exchange.h).
#include "lib/model/expert_exchange.h"

#include <algorithm>
#include <cstring>
#include <numeric>

namespace strata::model {

LocalTransport::LocalTransport(int n_ranks) : n_(std::max(1, n_ranks)) {
  box_.assign(n_, std::vector<std::vector<float>>(n_));
}

absl::Status LocalTransport::AllToAll(int rank, const std::vector<std::vector<float>> &send,
                                      std::vector<std::vector<float>> *recv) {
  if (rank < 0 || rank >= n_ || send.size() != static_cast<size_t>(n_)) {
    return Errorf(MOE_ERR_INVALID_ARGUMENT, "rank %d of %d sending to %zu ranks", rank, n_, send.size());
  }
  std::unique_lock<std::mutex> lk(mu_);
  // A rank of the next round waits until every rank has taken this round's rows.
  cv_.wait(lk, [&] { return taken_ == 0 || posted_ < n_; });
  const uint64_t round = round_;
  for (int d = 0; d < n_; ++d) box_[rank][d] = send[d];
  if (++posted_ == n_) cv_.notify_all();
  cv_.wait(lk, [&] { return posted_ == n_ && round_ == round; });
  recv->assign(n_, {});
  for (int s = 0; s < n_; ++s) (*recv)[s] = std::move(box_[s][rank]);
  if (++taken_ == n_) {
    posted_ = 0;
    taken_ = 0;
    ++round_;
  }
  cv_.notify_all();
  return absl::OkStatus();
}

std::vector<std::vector<int32_t>> PlanSends(const store::DevicePlacement &pl, int layer, int rank, int64_t n_tok,
                                            int k, const int32_t *selected) {
  std::vector<std::vector<int32_t>> to(pl.n_devices);
  for (int64_t i = 0; i < n_tok * k; ++i) {
    const uint32_t key = static_cast<uint32_t>(layer) * pl.n_experts + static_cast<uint32_t>(selected[i]);
    to[pl.ComputeDevice(key, rank)].push_back(static_cast<int32_t>(i));
  }
  return to;
}

absl::Status ExchangeExperts(ExpertTransport &t, const store::DevicePlacement &pl, int layer, int rank,
                             const float *x, int64_t n_tok, int64_t width, int k, const int32_t *selected,
                             const float *weights, const ExpertRowsFn &fn, float *out, ExchangeStats *stats) {
  const int nr = t.n_ranks();
  if (nr != pl.n_devices || rank < 0 || rank >= nr || layer < 0 || layer >= pl.n_layers || width <= 0 || k <= 0 ||
      n_tok < 0) {
    return Errorf(MOE_ERR_INVALID_ARGUMENT, "an exchange at rank %d of %d (placement of %d devices), layer %d, %lld x %d rows of %lld",
                  rank, nr, pl.n_devices, layer, static_cast<long long>(n_tok), k, static_cast<long long>(width));
  }
  // A rank that fails here still takes part in both exchanges (sending nothing), so its peers never
  // wait for it; they find its results missing and fail too.
  absl::Status local = absl::OkStatus();
  for (int64_t i = 0; i < n_tok * k && local.ok(); ++i) {
    const int32_t e = selected[i];
    if (e < 0 || e >= pl.n_experts || pl.owner[static_cast<size_t>(layer) * pl.n_experts + e] < 0) {
      local = Errorf(MOE_ERR_INVALID_ARGUMENT, "selection %lld of layer %d names expert %d, which is not routed",
                     static_cast<long long>(i), layer, e);
    }
  }
  if (!local.ok()) {
    std::vector<std::vector<float>> none(nr), recv;
    STRATA_RETURN_IF_ERROR(t.AllToAll(rank, none, &recv));
    STRATA_RETURN_IF_ERROR(t.AllToAll(rank, none, &recv));
    return local;
  }
  // Rows out: each (token, k) pair as its expert (a float holds it exactly) and the token's input.
  const int64_t row = width + 1;
  const std::vector<std::vector<int32_t>> to = PlanSends(pl, layer, rank, n_tok, k, selected);
  std::vector<std::vector<float>> send(nr), recv;
  for (int d = 0; d < nr; ++d) {
    send[d].resize(to[d].size() * row);
    for (size_t r = 0; r < to[d].size(); ++r) {
      const int32_t i = to[d][r];
      float *dst = send[d].data() + r * row;
      dst[0] = static_cast<float>(selected[i]);
      std::memcpy(dst + 1, x + (i / k) * width, width * sizeof(float));
    }
  }
  STRATA_RETURN_IF_ERROR(t.AllToAll(rank, send, &recv));

  // The rows received, an expert at a time (by expert, then by source and order: a fixed order).
  struct Ref {
    int32_t expert;
    int src;
    int64_t r;
  };
  std::vector<Ref> refs;
  for (int s = 0; s < nr; ++s) {
    if (recv[s].size() % row != 0) {
      return Errorf(MOE_ERR_INTERNAL, "rank %d received a partial row from rank %d", rank, s);
    }
    for (int64_t r = 0; r < static_cast<int64_t>(recv[s].size() / row); ++r) {
      refs.push_back({static_cast<int32_t>(recv[s][r * row]), s, r});
    }
  }
  std::stable_sort(refs.begin(), refs.end(), [](const Ref &a, const Ref &b) { return a.expert < b.expert; });
  std::vector<std::vector<float>> back(nr);
  for (int s = 0; s < nr; ++s) back[s].resize(recv[s].size() / row * width);
  std::vector<float> xin, yout;
  for (size_t a = 0; a < refs.size();) {
    size_t b = a;
    while (b < refs.size() && refs[b].expert == refs[a].expert) ++b;
    const int64_t n = static_cast<int64_t>(b - a);
    xin.resize(n * width);
    yout.assign(n * width, 0.f);
    for (size_t j = a; j < b; ++j) {
      std::memcpy(xin.data() + (j - a) * width, recv[refs[j].src].data() + refs[j].r * row + 1, width * sizeof(float));
    }
    local = fn(refs[a].expert, xin.data(), n, yout.data());
    if (!local.ok()) break;
    for (size_t j = a; j < b; ++j) {
      std::memcpy(back[refs[j].src].data() + refs[j].r * width, yout.data() + (j - a) * width, width * sizeof(float));
    }
    a = b;
  }
  if (stats != nullptr) {
    stats->rows_computed += static_cast<int64_t>(refs.size());
    stats->rows_local += static_cast<int64_t>(to[rank].size());
    stats->rows_sent += n_tok * k - static_cast<int64_t>(to[rank].size());
  }
  if (!local.ok()) back.assign(nr, {});
  STRATA_RETURN_IF_ERROR(t.AllToAll(rank, back, &recv));
  STRATA_RETURN_IF_ERROR(local);

  // Each pair's result, where its rows came back; then the weighted sums in k order.
  std::vector<const float *> y(static_cast<size_t>(n_tok * k), nullptr);
  for (int d = 0; d < nr; ++d) {
    if (recv[d].size() != to[d].size() * width) {
      return Errorf(MOE_ERR_BACKEND, "rank %d got %zu result floats from rank %d, not %zu (its experts failed)", rank,
                    recv[d].size(), d, to[d].size() * width);
    }
    for (size_t r = 0; r < to[d].size(); ++r) y[to[d][r]] = recv[d].data() + r * width;
  }
  for (int64_t tok = 0; tok < n_tok; ++tok) {
    float *o = out + tok * width;
    std::fill(o, o + width, 0.f);
    for (int j = 0; j < k; ++j) {
      const float w = weights[tok * k + j];
      const float *yy = y[tok * k + j];
      for (int64_t c = 0; c < width; ++c) o[c] += w * yy[c];
    }
  }
  return absl::OkStatus();
}

}  // namespace strata::model
