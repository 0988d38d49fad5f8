// Builds the lattices of iq_lattice.h from the format grids (iq_grids.h). Only keys whose levels
// the quantizers can produce get a neighbour list: 0..2 per element for the 2-bit grids (their
// searches clamp to three levels), every key for the 3-bit ones.
#include "lib/quant/iq_lattice.h"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <utility>
#include <vector>

#include "lib/quant/iq_grids.h"

namespace strata::quant::internal {
namespace {

// grid: packed entries with `grid_bits` bits per element (iq_grids.h); key_bits: bits per element in
// a key; max_level: the highest level a searched key holds; nwant: distinct distances kept.
Lattice Build(const uint16_t *grid, int grid_size, int grid_bits, int dims, int key_bits, int max_level,
              int nwant) {
  Lattice lat;
  lat.dims = dims;
  lat.bits = key_bits;
  lat.grid_size = grid_size;
  lat.pos.resize(static_cast<size_t>(grid_size) * dims);
  const int n_keys = 1 << (key_bits * dims);
  lat.slot.assign(n_keys, INT32_MIN);
  const int grid_mask = (1 << grid_bits) - 1;
  for (int g = 0; g < grid_size; ++g) {
    int key = 0;
    for (int i = 0; i < dims; ++i) {
      const int l = (grid[g] >> (grid_bits * i)) & grid_mask;
      lat.pos[static_cast<size_t>(g) * dims + i] = static_cast<int8_t>(2 * l + 1);
      key |= l << (key_bits * i);
    }
    lat.slot[key] = g;
  }
  std::vector<int> d2(grid_size);
  std::vector<std::pair<int, int>> near;
  int8_t want[8];
  const int key_mask = (1 << key_bits) - 1;
  for (int key = 0; key < n_keys; ++key) {
    if (lat.slot[key] >= 0) continue;
    bool searched = true;
    for (int i = 0; i < dims; ++i) {
      const int l = (key >> (key_bits * i)) & key_mask;
      if (l > max_level) searched = false;
      want[i] = static_cast<int8_t>(2 * l + 1);
    }
    if (!searched) continue;
    // The nwant smallest distinct distances, ascending.
    int smallest[4];
    int n_small = 0;
    for (int g = 0; g < grid_size; ++g) {
      const int8_t *p = lat.pos.data() + static_cast<size_t>(g) * dims;
      int d = 0;
      for (int i = 0; i < dims; ++i) d += (p[i] - want[i]) * (p[i] - want[i]);
      d2[g] = d;
      int at = 0;
      while (at < n_small && smallest[at] < d) ++at;
      if (at < n_small && smallest[at] == d) continue;
      if (at >= nwant) continue;
      for (int k = std::min(n_small, nwant - 1); k > at; --k) smallest[k] = smallest[k - 1];
      smallest[at] = d;
      n_small = std::min(n_small + 1, nwant);
    }
    const int limit = smallest[n_small - 1];
    near.clear();
    for (int g = 0; g < grid_size; ++g) {
      if (d2[g] <= limit) near.emplace_back(d2[g], g);
    }
    std::sort(near.begin(), near.end());
    lat.slot[key] = -1 - static_cast<int32_t>(lat.neighbours.size());
    lat.neighbours.push_back(static_cast<uint16_t>(near.size()));
    for (const auto &e : near) lat.neighbours.push_back(static_cast<uint16_t>(e.second));
  }
  return lat;
}

}  // namespace

const Lattice &LatticeIQ2XXS() {
  static const Lattice lat = Build(kIQ2XXSGrid, 256, 2, 8, 2, 2, 2);
  return lat;
}
const Lattice &LatticeIQ2XS() {
  static const Lattice lat = Build(kIQ2XSGrid, 512, 2, 8, 2, 2, 2);
  return lat;
}
const Lattice &LatticeIQ2S() {
  static const Lattice lat = Build(kIQ2SGrid, 1024, 2, 8, 2, 2, 1);
  return lat;
}
const Lattice &LatticeIQ1S() {
  static const Lattice lat = Build(kIQ1SGrid, 2048, 2, 8, 2, 2, 3);
  return lat;
}
const Lattice &LatticeIQ3XXS() {
  static const Lattice lat = Build(kIQ3XXSGrid, 256, 4, 4, 3, 7, 2);
  return lat;
}
const Lattice &LatticeIQ3S() {
  static const Lattice lat = Build(kIQ3SGrid, 512, 4, 4, 3, 7, 3);
  return lat;
}

}  // namespace strata::quant::internal
