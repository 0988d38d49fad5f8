// Large host buffers (the model's weights, the expert cache) in transparent huge pages where the
// host offers them: 2 MiB aligned and advised MADV_HUGEPAGE before the first touch, so loading
// gigabytes of weights faults in 512 times fewer pages and loads faster (bench/README.md). Hosts
// without THP, or with huge pages turned off (moe_params.huge_pages, STRATA_HUGEPAGES=0), get
// ordinary pages; the bytes are the same either way.
#pragma once

#include <cstddef>

namespace strata {

inline constexpr size_t kPageBytes = 4096;
inline constexpr size_t kHugePageBytes = size_t{2} << 20;

// `bytes` of uninitialised memory aligned to a page at least (reads with O_DIRECT may land in it),
// to kHugePageBytes from that size on; nullptr when out of memory. Free with FreeLarge.
// Huge pages as LargeAllocHugePages says, or as `huge_pages` says.
void *AllocateLarge(size_t bytes);
void *AllocateLarge(size_t bytes, bool huge_pages);
void FreeLarge(void *p);

// Whether AllocateLarge(bytes) asks for huge pages: the STRATA_HUGEPAGES tunable.
bool LargeAllocHugePages();

}  // namespace strata
