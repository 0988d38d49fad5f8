// The expert table: for every routed (layer, expert), where its gate, up and down projections lie
// in the model files, their codecs and shapes, and how to bring all three into one cache slot with
// as few reads as possible (one read when the three are adjacent, as `strata pack` writes them).
// Size classes: the slot size of a layer is its largest expert; the cache uses the model's largest.
// Every part lands in its slot at a multiple of the view alignment, and within the slot's bytes.
#pragma once

#include <cstddef>
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
  // Where the part lands in a slot, a multiple of the table's view alignment. Read as one, the three
  // land at their offsets from the gate's start; part by part, each in a 4 KiB-aligned region of
  // its own, at its file offset's place in a 4 KiB block, or at the region's start when that place
  // would break the view alignment (a safetensors tensor after a header of any length).
  uint64_t slot_offset = 0;
  // slot_offset keeps the file offset's place in a 4 KiB block, so an O_DIRECT read of the aligned
  // blocks around the part (or, read as one, around the three) fills it in place. Otherwise it is
  // read through the page cache. The three parts of a single read agree.
  bool direct_ok = false;
};

struct ExpertEntry {
  ExpertPart part[3];           // gate, up, down
  uint64_t bytes = 0;           // gate + up + down
  uint64_t slot_bytes = 0;      // bytes a slot needs for it: the read span when read as one, else
                                // the parts' regions (each ends past its part and its direct read)
  bool single_read = false;     // the three parts are read with one read of [read_offset, +slot_bytes)
  uint64_t read_offset = 0;
  const model::ExpertWeights *weights = nullptr;  // the bound views: shapes, codecs, names
};

class ExpertTable {
 public:
  // Builds the table over the bound weights (which outlive it). Every part's slot_offset is a
  // multiple of `view_alignment`: a device that reads experts where their slots hold them needs its
  // views aligned (Backend::host_view_alignment). A file whose tensors all start on multiples of it
  // (a GGUF's, for 32) is laid out and read as with no alignment asked. A part that starts elsewhere
  // moves to its region's start and is read through the page cache; three adjacent parts whose
  // offsets from the gate are not multiples of it are read part by part.
  // A power of two up to kDirectBlock (slots start on 4 KiB boundaries); 0 counts as 1, another
  // value is rounded up to a power of two and at most kDirectBlock: view_alignment() says what holds.
  explicit ExpertTable(const model::ModelWeights &w, size_t view_alignment = 1);

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
  // The alignment every part's slot_offset meets.
  uint64_t view_alignment() const { return view_alignment_; }

 private:
  uint64_t view_alignment_ = 1;
  int n_layers_ = 0, n_experts_ = 0;
  std::vector<ExpertEntry> entries_;
  std::vector<uint64_t> layer_slot_bytes_;
  uint64_t slot_bytes_ = 0;
  uint64_t total_bytes_ = 0;
};

}  // namespace strata::store
