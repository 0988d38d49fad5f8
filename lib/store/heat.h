// Route hotness, the one rule by which every expert tier (and the RAM cache's hotness policy) ranks
// experts: selections counted per key, halved every kDecayTokens decode tokens, reset at a new prompt.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

namespace strata::store {

// The counts; the tiers themselves stay warm across prompts.
class RouteHeat {
 public:
  static constexpr uint64_t kDecayTokens = 16;
  explicit RouteHeat(uint32_t n_keys) : heat_(n_keys, 0) {}
  void OnSelect(uint32_t key) {
    if (heat_[key] < UINT32_MAX) ++heat_[key];
  }
  // n selections of one key at once (a prompt's tokens of an expert), saturating as OnSelect.
  void Add(uint32_t key, uint32_t n) {
    heat_[key] = static_cast<uint32_t>(std::min<uint64_t>(uint64_t{heat_[key]} + n, UINT32_MAX));
  }
  // True when this token halved the counts.
  bool OnDecodeToken() {
    if (++tokens_ % kDecayTokens != 0) return false;
    for (uint32_t &h : heat_) h >>= 1;
    return true;
  }
  void OnNewPrompt() {
    std::fill(heat_.begin(), heat_.end(), 0);
    tokens_ = 0;
  }
  uint32_t operator[](uint32_t key) const { return heat_[key]; }
  size_t size() const { return heat_.size(); }
  const std::vector<uint32_t> &counts() const { return heat_; }

 private:
  std::vector<uint32_t> heat_;
  uint64_t tokens_ = 0;
};

}  // namespace strata::store
