// Eviction policies for the expert cache. A policy sees every routing selection and every slot
// use, and picks a victim among the slots the cache offers (never a pinned or loading slot: the
// cache filters those out first). LRU: least recently used; LFU: fewest uses since the key was
// first seen; route hotness: selections counted per key, halved every 16 decode tokens, reset at a
// new prompt (the cache itself stays warm).
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

namespace strata::store {

enum class PolicyKind { kLru = 0, kLfu = 1, kHotness = 2 };

class EvictionPolicy {
 public:
  virtual ~EvictionPolicy() = default;
  virtual std::string_view name() const = 0;
  // A token selected `key` (counted per selection, duplicates included).
  virtual void OnSelect(uint32_t key) {}
  // `key` was used from the cache (a hit or a completed load) at logical time `tick`.
  virtual void OnUse(uint32_t key, uint64_t tick) = 0;
  virtual void OnDecodeToken() {}
  virtual void OnNewPrompt() {}
  // The index into `keys` of the key to evict (`keys` is non-empty).
  virtual size_t Victim(const std::vector<uint32_t> &keys) const = 0;
};

// Whether predicted loads are worth issuing. Each prediction of an expert that was not resident
// when it was made is scored when its layer routes (a hit if the layer selected it), issued or not,
// so a gate that closed opens again once predictions improve. A useless prefetch costs a read the
// disk could have spent on a needed expert and evicts a cached one, so below `min_precision` the
// cache stops issuing them. The counts halve every 16 decode steps; a prior of a few hits lets
// prediction start enabled.
class PrefetchGate {
 public:
  explicit PrefetchGate(double min_precision) : min_(min_precision) {}
  void Score(uint64_t hits, uint64_t total) {
    hits_ += static_cast<double>(hits);
    total_ += static_cast<double>(total);
  }
  double precision() const { return (hits_ + kPrior) / (total_ + kPrior); }
  bool open() const { return precision() >= min_; }
  void OnDecodeToken() {
    if (++tokens_ % 16 == 0) {
      hits_ *= 0.5;
      total_ *= 0.5;
    }
  }

 private:
  static constexpr double kPrior = 4;
  double min_;
  double hits_ = 0, total_ = 0;
  uint64_t tokens_ = 0;
};

// n_keys: layers x experts.
std::unique_ptr<EvictionPolicy> MakePolicy(PolicyKind kind, uint32_t n_keys);
std::string_view PolicyName(PolicyKind kind);

}  // namespace strata::store
