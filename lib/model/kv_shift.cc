// Context shift of a session's KV cache (KvCache::Shift): the positions after a kept prefix are
// dropped, the rows after them move down, and their keys are rotated back by the positions they
// moved. Everything runs as backend operations (ReadKvBytes, Rope, CopyRows, WriteKvBytes), so the
// rows never leave the memory they live in and a device backend shifts its own cache.
//
// RoPE composes: a key cached at position p is R(p) k, and R(-d) R(p) k = R(p - d) k, the key a
// fresh pass at position p - d would have written, up to rounding. The rotation uses the forward
// pass's frequencies (theta, NORMAL or NEOX pairs, YaRN's blend) but no YaRN attention factor: the
// cached key carries it once already, and a rotation must not apply it again.
#include <algorithm>
#include <vector>

#include "lib/model/forward.h"

namespace strata::model {

absl::Status KvCache::Shift(Backend &be, const HParams &hp, int n, int keep, int discard) {
  if (be_ != nullptr && be_ != &be) return Errorf(MOE_ERR_INTERNAL, "a KV cache shifted through another backend");
  if (n < 0 || keep < 0 || discard < 0 || keep > n - discard || n > n_ctx_) {
    return Errorf(MOE_ERR_INVALID_ARGUMENT, "cannot drop %d positions after the first %d of a cache holding %d", discard,
                  keep, n);
  }
  if (discard == 0) return absl::OkStatus();
  if (spilled()) return Errorf(MOE_ERR_STATE, "the KV cache is spilled to disk");
  if (n > capacity()) return Errorf(MOE_ERR_INTERNAL, "KV positions %d.. are not allocated", capacity());
  // The rows [keep, n - discard) are written: blocks shared with a fork holding them are copied
  // first (the rows past them are only read, and their blocks let go).
  STRATA_RETURN_IF_ERROR(Unshare(keep, n - discard - keep));
  const int first = keep + discard;  // the first position that moves
  if (first < n) {
    // Where a k row's rotated part lies: all of it in heads of head_dim (grouped-query attention),
    // or the shared RoPE key after the latent (multi-head latent attention).
    const int rope_dim = hp.rope_dim();
    const int rope_heads = hp.mla ? 1 : hp.n_head_kv;
    const int rope_off = hp.mla ? hp.kv_lora_rank : 0;
    if (rope_off + rope_heads * rope_dim != w_.k) {
      return Errorf(MOE_ERR_INTERNAL, "a KV key row of %d floats does not hold %d RoPE heads of %d after %d", w_.k,
                    rope_heads, rope_dim, rope_off);
    }
    const std::vector<float> inv_freq = RopeFrequencies(hp, rope_dim);
    RopeParams rp;
    rp.inv_freq = inv_freq.empty() ? nullptr : inv_freq.data();
    rp.mscale = 1.f;
    // Scratch in backend memory, 256-byte aligned pieces: rows (kKvBlockTokens, widest row) floats,
    // part (kKvBlockTokens, rope_dim) the rotated parts of latent rows, delta (kKvBlockTokens) the
    // position offset of every row, -discard.
    const int width = std::max(w_.k, w_.v);
    auto align = [](size_t b) { return (b + 255) & ~size_t{255}; };
    const size_t rows_bytes = align(static_cast<size_t>(kKvBlockTokens) * width * sizeof(float));
    const size_t part_bytes = hp.mla ? align(static_cast<size_t>(kKvBlockTokens) * rope_dim * sizeof(float)) : 0;
    const size_t delta_bytes = static_cast<size_t>(kKvBlockTokens) * sizeof(int32_t);
    STRATA_ASSIGN_OR_RETURN(std::unique_ptr<Buffer> scratch, be.Allocate(rows_bytes + part_bytes + delta_bytes));
    auto *base = static_cast<uint8_t *>(scratch->data());
    float *rows = reinterpret_cast<float *>(base);
    float *part = reinterpret_cast<float *>(base + rows_bytes);
    int32_t *delta = reinterpret_cast<int32_t *>(base + rows_bytes + part_bytes);
    const std::vector<int32_t> deltas(kKvBlockTokens, -discard);
    be.Upload(delta, deltas.data(), delta_bytes);
    const int64_t kb = static_cast<int64_t>(k_row_bytes()), vb = static_cast<int64_t>(v_row_bytes());
    for (int l = 0; l < n_layer_; ++l) {
      const KvView v = layer(l);
      // Runs of positions that stay inside one block at the source and at the destination. A run is
      // read whole before it is written, and runs go up from the lowest, so a destination row never
      // holds a source row not yet read.
      for (int p = first; p < n;) {
        const int q = p - discard;
        const int run = std::min({n - p, kKvBlockTokens - p % kKvBlockTokens, kKvBlockTokens - q % kKvBlockTokens});
        be.ReadKvBytes(rows, w_.k, v.k_row(p), kb, run, w_.k, k_type_);  // rows (run, k width)
        if (hp.mla) {
          be.CopyRows(part, rope_dim, rows + rope_off, w_.k, run, rope_dim);  // part (run, rope_dim)
          be.Rope(part, run, 1, rope_dim, delta, hp.rope_theta, hp.rope_style, rp);
          be.CopyRows(rows + rope_off, w_.k, part, rope_dim, run, rope_dim);
        } else {
          be.Rope(rows, run, rope_heads, rope_dim, delta, hp.rope_theta, hp.rope_style, rp);
        }
        be.WriteKvBytes(v.k_row(q), kb, rows, w_.k, run, w_.k, k_type_);
        if (w_.v > 0) {
          // Values move as they are (decoding and encoding again gives the same f16 or q8_0 bytes).
          be.ReadKvBytes(rows, w_.v, v.v_row(p), vb, run, w_.v, v_type_);
          be.WriteKvBytes(v.v_row(q), vb, rows, w_.v, run, w_.v, v_type_);
        }
        p += run;
      }
    }
    // The scratch goes once the queued work that reads it is done.
    float sink;
    be.Download(&sink, rows, sizeof sink);
    STRATA_RETURN_IF_ERROR(be.TakeError());
  }
  // The mask follows the rows; the positions left past the end are cleared.
  std::copy(masked_.begin() + first, masked_.begin() + n, masked_.begin() + keep);
  std::fill(masked_.begin() + (n - discard), masked_.begin() + n, 0);
  MaskChanged(static_cast<size_t>(keep), static_cast<size_t>(n));
  RecountMask();
  Trim(n - discard);
  return absl::OkStatus();
}

}  // namespace strata::model
