// Lookup structures the lattice i-quant quantizers search (IQ2_XXS, IQ2_XS, IQ2_S, IQ1_S, IQ1_M,
// IQ3_XXS, IQ3_S), built once on first use from the grids of iq_grids.h.
//
// A point of a group (8 elements for the IQ2/IQ1 grids, 4 for IQ3) is described by a key: element i
// holds a level index l (0..2 for the 2-bit grids, 0..7 for IQ3) in bits [bits * i, bits * (i + 1)).
// A key either names a grid entry, or lists the grid entries nearest to it: every entry whose
// squared distance (in units of 2l + 1) is among the `nwant` smallest distances found, ordered by
// distance and then by index. This is the neighbourhood ggml's quantizers search, so a search over
// it picks the same entry ggml picks. Not installed; only lib/quant includes it.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

namespace strata::quant::internal {

struct Lattice {
  int dims = 0;       // elements of a group: 8 or 4
  int bits = 0;       // key bits per element: 2 or 3
  int grid_size = 0;  // entries of the grid
  // Entry g's element i is pos[g * dims + i] = 2 l + 1, l its level index.
  std::vector<int8_t> pos;
  // Per key: the grid entry it names (>= 0), or -1 - offset of its neighbour list in `neighbours`
  // (count first, then the entries).
  std::vector<int32_t> slot;
  std::vector<uint16_t> neighbours;

  int Key(const int8_t *levels) const {
    int key = 0;
    for (int i = 0; i < dims; ++i) key |= levels[i] << (bits * i);
    return key;
  }
  // The neighbour list of a key that names no entry: list[0] entries follow it.
  const uint16_t *NeighboursOf(int key) const { return neighbours.data() + (-1 - slot[key]); }
};

// The lattice searches index their tables by levels that a NaN or an infinity would put out of range:
// a block holding one is searched as a copy in `buf` (n floats) with every non-finite value made 0.
// A finite block is returned as it is.
inline const float *FiniteBlock(const float *x, int n, float *buf) {
  bool finite = true;
  for (int i = 0; i < n && finite; ++i) finite = std::isfinite(x[i]);
  if (finite) return x;
  for (int i = 0; i < n; ++i) buf[i] = std::isfinite(x[i]) ? x[i] : 0.0f;
  return buf;
}

// Quantizes n values (a multiple of 256) a 256-value super-block at a time with Block, which writes
// kBytes per block; blocks holding a non-finite value (or weight) go in as FiniteBlock copies.
template <void (*Block)(const float *, uint8_t *, const float *), int64_t kBytes>
void LatticeRows(const float *src, void *dst, int64_t n, const float *weights) {
  constexpr int kQK = 256;
  auto *b = static_cast<uint8_t *>(dst);
  float xs[kQK], ws[kQK];
  for (int64_t i = 0; i < n; i += kQK) {
    const float *w = weights != nullptr ? FiniteBlock(weights + i, kQK, ws) : nullptr;
    Block(FiniteBlock(src + i, kQK, xs), b + i / kQK * kBytes, w);
  }
}

// The lattices, one per grid (IQ1_S and IQ1_M share theirs). Thread-safe; built on first call.
const Lattice &LatticeIQ2XXS();
const Lattice &LatticeIQ2XS();
const Lattice &LatticeIQ2S();
const Lattice &LatticeIQ1S();
const Lattice &LatticeIQ3XXS();
const Lattice &LatticeIQ3S();

}  // namespace strata::quant::internal
