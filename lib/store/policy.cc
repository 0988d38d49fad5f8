// The three eviction policies; each keeps its scores per key in a flat array.
#include "lib/store/policy.h"

#include <algorithm>

namespace strata::store {
namespace {

class Lru final : public EvictionPolicy {
 public:
  explicit Lru(uint32_t n) : last_(n, 0) {}
  std::string_view name() const override { return "lru"; }
  void OnUse(uint32_t key, uint64_t tick) override { last_[key] = tick; }
  size_t Victim(const std::vector<uint32_t> &keys) const override {
    size_t best = 0;
    for (size_t i = 1; i < keys.size(); ++i) {
      if (last_[keys[i]] < last_[keys[best]]) best = i;
    }
    return best;
  }

 private:
  std::vector<uint64_t> last_;
};

class Lfu final : public EvictionPolicy {
 public:
  explicit Lfu(uint32_t n) : count_(n, 0), last_(n, 0) {}
  std::string_view name() const override { return "lfu"; }
  void OnUse(uint32_t key, uint64_t tick) override {
    ++count_[key];
    last_[key] = tick;
  }
  size_t Victim(const std::vector<uint32_t> &keys) const override {
    size_t best = 0;
    for (size_t i = 1; i < keys.size(); ++i) {
      const uint32_t a = keys[i], b = keys[best];
      if (count_[a] < count_[b] || (count_[a] == count_[b] && last_[a] < last_[b])) best = i;
    }
    return best;
  }

 private:
  std::vector<uint64_t> count_, last_;
};

class Hotness final : public EvictionPolicy {
 public:
  explicit Hotness(uint32_t n) : hot_(n, 0), last_(n, 0) {}
  std::string_view name() const override { return "hot"; }
  void OnSelect(uint32_t key) override { ++hot_[key]; }
  void OnUse(uint32_t key, uint64_t tick) override { last_[key] = tick; }
  void OnDecodeToken() override {
    if (++tokens_ % kDecayEvery == 0) {
      for (auto &h : hot_) h >>= 1;
    }
  }
  void OnNewPrompt() override {
    std::fill(hot_.begin(), hot_.end(), 0);
    tokens_ = 0;
  }
  size_t Victim(const std::vector<uint32_t> &keys) const override {
    size_t best = 0;
    for (size_t i = 1; i < keys.size(); ++i) {
      const uint32_t a = keys[i], b = keys[best];
      if (hot_[a] < hot_[b] || (hot_[a] == hot_[b] && last_[a] < last_[b])) best = i;
    }
    return best;
  }

 private:
  static constexpr uint64_t kDecayEvery = 16;
  std::vector<uint32_t> hot_;
  std::vector<uint64_t> last_;
  uint64_t tokens_ = 0;
};

}  // namespace

std::unique_ptr<EvictionPolicy> MakePolicy(PolicyKind kind, uint32_t n_keys) {
  switch (kind) {
    case PolicyKind::kLru: return std::make_unique<Lru>(n_keys);
    case PolicyKind::kLfu: return std::make_unique<Lfu>(n_keys);
    case PolicyKind::kHotness: return std::make_unique<Hotness>(n_keys);
  }
  return std::make_unique<Lru>(n_keys);
}

std::string_view PolicyName(PolicyKind kind) {
  switch (kind) {
    case PolicyKind::kLru: return "lru";
    case PolicyKind::kLfu: return "lfu";
    case PolicyKind::kHotness: return "hot";
  }
  return "lru";
}

}  // namespace strata::store
