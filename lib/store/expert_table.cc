// Expert table construction: file extents of each expert's three projections and its read plan,
// every part placed in the slot at a multiple of the view alignment.
#include "lib/store/expert_table.h"

#include <algorithm>

namespace strata::store {
namespace {

uint64_t RoundUp(uint64_t x, uint64_t to) { return (x + to - 1) / to * to; }

// The power of two in [1, kDirectBlock] that a request for `want` is met with.
uint64_t ViewAlignment(size_t want) {
  uint64_t a = 1;
  while (a < want && a < kDirectBlock) a <<= 1;
  return a;
}

}  // namespace

ExpertTable::ExpertTable(const model::ModelWeights &w, size_t view_alignment)
    : view_alignment_(ViewAlignment(view_alignment)) {
  const uint64_t align = view_alignment_;
  n_layers_ = static_cast<int>(w.layers.size());
  // A dense layer (no router, no routed experts: Qwen2-MoE mlp_only_layers, DeepSeek's leading
  // dense layers) has empty entries (weights == nullptr, 0 bytes) that are never acquired.
  n_experts_ = 0;
  for (const auto &L : w.layers) n_experts_ = std::max(n_experts_, static_cast<int>(L.experts.size()));
  entries_.resize(static_cast<size_t>(n_layers_) * n_experts_);
  layer_slot_bytes_.assign(n_layers_, 0);
  for (int l = 0; l < n_layers_; ++l) {
    const int n_layer_experts = static_cast<int>(w.layers[l].experts.size());
    for (int e = 0; e < n_layer_experts; ++e) {
      const model::ExpertWeights &ew = w.layers[l].experts[e];
      ExpertEntry &en = entries_[Key(l, e)];
      en.weights = &ew;
      const model::Matrix *m[3] = {&ew.gate, &ew.up, &ew.down};
      // Read part by part, each part gets a 4 KiB-aligned region of the slot and lands in it at
      // its file offset's place within a 4 KiB block, so an O_DIRECT read of the aligned blocks
      // around it (whatever the file's tensor alignment) fills the region in place. That place is
      // a multiple of the view alignment (which divides 4 KiB) exactly when the file offset is;
      // a part whose file offset is not lands at its region's start and is read through the page
      // cache. Either way the region ends at or past the part's end and its direct read's.
      uint64_t packed = 0;
      for (int p = 0; p < 3; ++p) {
        ExpertPart &part = en.part[p];
        part.file_index = m[p]->tensor->file_index;
        part.file_offset = m[p]->file_offset();
        part.bytes = m[p]->nbytes();
        part.direct_ok = part.file_offset % align == 0;
        const uint64_t head = part.direct_ok ? part.file_offset % kDirectBlock : 0;
        part.slot_offset = packed + head;
        packed += RoundUp(head + part.bytes, kDirectBlock);
      }
      en.bytes = ew.nbytes();
      // One read when the parts are in one file, in order, the gaps between them are small
      // (alignment padding) and up's and down's offsets from the gate's are multiples of the view
      // alignment: the read lands each part at its offset from the gate's start, the gate at 0.
      // It goes past the page cache when it starts on a 4 KiB boundary.
      const ExpertPart &g = en.part[0], &u = en.part[1], &d = en.part[2];
      const bool same_file = g.file_index == u.file_index && u.file_index == d.file_index;
      const bool ordered = g.file_offset + g.bytes <= u.file_offset && u.file_offset + u.bytes <= d.file_offset;
      const uint64_t span = d.file_offset + d.bytes - g.file_offset;
      if (same_file && ordered && span <= en.bytes + 3 * 4096 && (u.file_offset - g.file_offset) % align == 0 &&
          (d.file_offset - g.file_offset) % align == 0) {
        en.single_read = true;
        en.read_offset = g.file_offset;
        const bool direct_ok = g.file_offset % kDirectBlock == 0;
        for (auto &p : en.part) {
          p.slot_offset = p.file_offset - g.file_offset;
          p.direct_ok = direct_ok;
        }
        en.slot_bytes = span;
      } else {
        en.slot_bytes = packed;
      }
      layer_slot_bytes_[l] = std::max(layer_slot_bytes_[l], en.slot_bytes);
      total_bytes_ += en.bytes;
    }
    slot_bytes_ = std::max(slot_bytes_, layer_slot_bytes_[l]);
  }
  slot_bytes_ = RoundUp(slot_bytes_, kDirectBlock);
}

}  // namespace strata::store
