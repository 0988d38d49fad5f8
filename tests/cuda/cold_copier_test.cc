// The copier's host side that needs no device: joining a request's adjacent copies.
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "backends/cuda/cold_copier.h"

namespace strata::cuda {
namespace {

TEST_CASE("CoalesceCopies joins copies whose both ends meet and moves the same bytes", "[grouped]") {
  const unsigned seed = std::random_device{}();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  std::vector<uint8_t> src(1 << 17);  // a round reads at most 24 x (1,500 + 80) bytes past a start
  for (auto &b : src) b = static_cast<uint8_t>(rng());
  for (int round = 0; round < 200; ++round) {
    // Copies laid out one after another in the destination; each either continues the one before
    // in both buffers, continues it in one buffer only, or starts elsewhere.
    const size_t n = 1 + rng() % 24;
    std::vector<void *> dst(n);
    std::vector<const void *> from(n);
    std::vector<size_t> size(n);
    std::vector<uint8_t> out_a(1 << 17, 0xA5), out_b(1 << 17, 0xA5);
    size_t at_dst = rng() % 64, at_src = rng() % 64, runs = 0;
    for (size_t i = 0; i < n; ++i) {
      size[i] = 1 + rng() % 1500;
      const int kind = i == 0 ? 2 : static_cast<int>(rng() % 4);
      if (kind == 1) at_src += 16 + rng() % 64;  // the destination meets, the source does not
      if (kind == 2) {  // neither
        at_dst += 16 + rng() % 64;
        at_src = rng() % (src.size() - (48 << 10));
      }
      if (kind == 3) at_dst += 16 + rng() % 64;  // the source meets, the destination does not
      runs += kind != 0 ? 1 : 0;
      dst[i] = out_b.data() + at_dst;
      from[i] = src.data() + at_src;
      std::memcpy(out_a.data() + at_dst, src.data() + at_src, size[i]);
      at_dst += size[i];
      at_src += size[i];
    }
    size_t bytes = 0;
    for (size_t x : size) bytes += x;
    const size_t k = CoalesceCopies(dst.data(), from.data(), size.data(), n);
    INFO("round " << round << ", " << n << " copies");
    CHECK(k == runs);
    size_t total = 0;
    for (size_t i = 0; i < k; ++i) {
      std::memcpy(dst[i], from[i], size[i]);
      total += size[i];
      if (i > 0) {  // none left that could be joined
        CHECK(!(static_cast<uint8_t *>(dst[i - 1]) + size[i - 1] == dst[i] &&
                static_cast<const uint8_t *>(from[i - 1]) + size[i - 1] == from[i]));
      }
    }
    CHECK(total == bytes);
    CHECK(out_a == out_b);
  }
  CHECK(CoalesceCopies(nullptr, nullptr, nullptr, 0) == 0);
}

}  // namespace
}  // namespace strata::cuda
