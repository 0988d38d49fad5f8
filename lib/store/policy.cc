// The three eviction policies; each keeps its scores per key in a flat array.
#include "lib/store/policy.h"

#include <algorithm>

#include "lib/store/heat.h"

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
  explicit Hotness(uint32_t n) : heat_(n), last_(n, 0) {}
  std::string_view name() const override { return "hot"; }
  void OnSelect(uint32_t key) override { heat_.OnSelect(key); }
  void OnUse(uint32_t key, uint64_t tick) override { last_[key] = tick; }
  void OnDecodeToken() override { heat_.OnDecodeToken(); }
  void OnNewPrompt() override { heat_.OnNewPrompt(); }
  size_t Victim(const std::vector<uint32_t> &keys) const override {
    size_t best = 0;
    for (size_t i = 1; i < keys.size(); ++i) {
      const uint32_t a = keys[i], b = keys[best];
      if (heat_[a] < heat_[b] || (heat_[a] == heat_[b] && last_[a] < last_[b])) best = i;
    }
    return best;
  }

 private:
  RouteHeat heat_;
  std::vector<uint64_t> last_;
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
