// Large host buffers (the model's weights, the expert cache) in transparent huge pages where the
// host offers them: 2 MiB aligned and advised MADV_HUGEPAGE before the first touch, so loading
// gigabytes of weights faults in 512 times fewer pages (a 16.75 GiB model loaded in 6.4 s instead
// of 11.1 on the H200's host, whose THP mode is "madvise"; decode measured the same). Hosts without
// THP, or STRATA_HUGEPAGES=0, get ordinary pages; the bytes are the same either way.
#pragma once

#include <cstddef>

namespace strata {

inline constexpr size_t kPageBytes = 4096;
inline constexpr size_t kHugePageBytes = size_t{2} << 20;

// `bytes` of uninitialised memory aligned to a page at least (reads with O_DIRECT may land in it),
// to kHugePageBytes from that size on; nullptr when out of memory. Free with FreeLarge.
void *AllocateLarge(size_t bytes);
void FreeLarge(void *p);

// Whether AllocateLarge asks for huge pages (false with STRATA_HUGEPAGES=0).
bool LargeAllocHugePages();

}  // namespace strata
