// Large host buffers (lib/util/large_alloc.h): aligned for huge pages from 2 MiB on, every byte
// writable and read back, and the host's own answer on whether the pages came huge.
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "lib/util/large_alloc.h"

using strata::AllocateLarge;
using strata::FreeLarge;
using strata::kHugePageBytes;

TEST_CASE("large_alloc: alignment by size, every byte usable", "[util]") {
  std::mt19937_64 rng(std::random_device{}());
  for (size_t bytes : {size_t{1}, size_t{100}, kHugePageBytes - 1, kHugePageBytes, 3 * kHugePageBytes + 4097}) {
    INFO(bytes << " bytes");
    auto *p = static_cast<uint8_t *>(AllocateLarge(bytes));
    REQUIRE(p != nullptr);
    const uintptr_t a = reinterpret_cast<uintptr_t>(p);
    CHECK(a % strata::kPageBytes == 0);  // O_DIRECT reads land in the expert cache's slab
    if (bytes >= kHugePageBytes) CHECK(a % kHugePageBytes == 0);
    std::vector<uint8_t> want(bytes);
    for (auto &b : want) b = static_cast<uint8_t>(rng());
    std::memcpy(p, want.data(), bytes);
    CHECK(std::memcmp(p, want.data(), bytes) == 0);
    FreeLarge(p);
  }
  CHECK(AllocateLarge(0) == nullptr);
  CHECK(AllocateLarge(~size_t{0} - 5) == nullptr);  // rounding up would wrap
  FreeLarge(nullptr);
}

TEST_CASE("large_alloc: huge pages where the host gives them to advised memory", "[util]") {
  std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string mode;
  std::getline(f, mode);
  if (mode.find("[never]") != std::string::npos || mode.empty() || !strata::LargeAllocHugePages()) {
    SUCCEED("no transparent huge pages here");
    return;
  }
  const size_t bytes = 16 * kHugePageBytes;
  auto *p = static_cast<uint8_t *>(AllocateLarge(bytes));
  REQUIRE(p != nullptr);
  std::memset(p, 0x5a, bytes);  // first touch
  // The region's AnonHugePages in /proc/self/smaps: the kernel's own count.
  std::ifstream smaps("/proc/self/smaps");
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  std::string line;
  bool inside = false;
  long huge_kb = -1;
  while (std::getline(smaps, line)) {
    unsigned long lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &lo, &hi) == 2 && line.find(':') > line.find(' ')) {
      inside = lo <= a && a < hi;
    } else if (inside && line.rfind("AnonHugePages:", 0) == 0) {
      huge_kb = std::stol(line.substr(14));
      break;
    }
  }
  INFO("AnonHugePages of the region: " << huge_kb << " kB (THP: " << mode << ")");
  // Fragmented memory may leave a page or two small; most must come huge.
  CHECK(huge_kb >= static_cast<long>(bytes / 1024 / 2));
  FreeLarge(p);
}
