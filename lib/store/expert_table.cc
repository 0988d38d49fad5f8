// Expert table construction: file extents of each expert's three projections and its read plan.
#include "lib/store/expert_table.h"

#include <algorithm>

namespace strata::store {

ExpertTable::ExpertTable(const model::ModelWeights &w) {
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
      // around it (whatever the file's tensor alignment) fills the region in place.
      uint64_t packed = 0;
      for (int p = 0; p < 3; ++p) {
        en.part[p].file_index = m[p]->tensor->file_index;
        en.part[p].file_offset = m[p]->file_offset();
        en.part[p].bytes = m[p]->nbytes();
        en.part[p].direct_ok = true;
        const uint64_t head = en.part[p].file_offset % kDirectBlock;
        en.part[p].slot_offset = packed + head;
        packed += (head + m[p]->nbytes() + kDirectBlock - 1) / kDirectBlock * kDirectBlock;
      }
      en.bytes = ew.nbytes();
      // One read when the parts are in one file, in order, and the gaps between them are small
      // (alignment padding): the read then lands each part at its offset from the gate's start. It
      // goes past the page cache when it starts on a 4 KiB boundary.
      const ExpertPart &g = en.part[0], &u = en.part[1], &d = en.part[2];
      const bool same_file = g.file_index == u.file_index && u.file_index == d.file_index;
      const bool ordered = g.file_offset + g.bytes <= u.file_offset && u.file_offset + u.bytes <= d.file_offset;
      const uint64_t span = d.file_offset + d.bytes - g.file_offset;
      if (same_file && ordered && span <= en.bytes + 3 * 4096) {
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
  slot_bytes_ = (slot_bytes_ + kDirectBlock - 1) / kDirectBlock * kDirectBlock;
}

}  // namespace strata::store
