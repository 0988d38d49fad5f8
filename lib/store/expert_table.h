// The expert table: for every routed (layer, expert), where its gate, up and down projections lie
// in the model files, their codecs and shapes, and how to bring all three into one cache slot with
// as few reads as possible (one read when the three are adjacent, as `strata pack` writes them).
// Size classes: the slot size of a layer is its largest expert; the cache uses the model's largest.
#pragma once

#include <cstdint>
#include <vector>

#include "lib/model/weights.h"

namespace strata::store {

// The block O_DIRECT reads are aligned to (offset, length and memory).
constexpr uint64_t kDirectBlock = 4096;

struct ExpertPart {
  int file_index = 0;
  uint64_t file_offset = 0;
  uint64_t bytes = 0;
  uint64_t slot_offset = 0;  // where the part lands in a slot (its file offset's place in a 4 KiB block,
                             // unless the three are read as one)
  // slot_offset keeps the file offset's place in a 4 KiB block, so an O_DIRECT read of the aligned
  // blocks around the part (or, read as one, around the three) fills it in place. Otherwise it is
  // read through the page cache. The three parts of a single read agree.
  bool direct_ok = false;
};

struct ExpertEntry {
  ExpertPart part[3];           // gate, up, down
  uint64_t bytes = 0;           // gate + up + down
  uint64_t slot_bytes = 0;      // bytes a slot needs for it (the read span when read as one)
  bool single_read = false;     // the three parts are read with one read of [read_offset, +slot_bytes)
  uint64_t read_offset = 0;
  const model::ExpertWeights *weights = nullptr;  // the bound views: shapes, codecs, names
};

class ExpertTable {
 public:
  // Builds the table over the bound weights (which outlive it).
  explicit ExpertTable(const model::ModelWeights &w);

  int n_layers() const { return n_layers_; }
  int n_experts() const { return n_experts_; }
  const ExpertEntry &entry(int layer, int expert) const { return entries_[Key(layer, expert)]; }
  uint32_t Key(int layer, int expert) const { return static_cast<uint32_t>(layer * n_experts_ + expert); }
  int LayerOf(uint32_t key) const { return static_cast<int>(key / n_experts_); }
  int ExpertOf(uint32_t key) const { return static_cast<int>(key % n_experts_); }
  // Largest slot_bytes over the model (rounded up to 4 KiB), and per layer.
  uint64_t slot_bytes() const { return slot_bytes_; }
  uint64_t layer_slot_bytes(int layer) const { return layer_slot_bytes_[layer]; }
  uint64_t total_bytes() const { return total_bytes_; }

 private:
  int n_layers_ = 0, n_experts_ = 0;
  std::vector<ExpertEntry> entries_;
  std::vector<uint64_t> layer_slot_bytes_;
  uint64_t slot_bytes_ = 0;
  uint64_t total_bytes_ = 0;
};

}  // namespace strata::store
