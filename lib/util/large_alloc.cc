#include "lib/util/large_alloc.h"

#include <sys/mman.h>

#include <cstdlib>

#include "lib/util/tunables.h"

namespace strata {

bool LargeAllocHugePages() { return tunables::Get().huge_pages; }

void *AllocateLarge(size_t bytes) { return AllocateLarge(bytes, LargeAllocHugePages()); }

void *AllocateLarge(size_t bytes, bool huge_pages) {
  if (bytes == 0) return nullptr;
  if (bytes < kHugePageBytes) return std::aligned_alloc(kPageBytes, (bytes + kPageBytes - 1) & ~(kPageBytes - 1));
  const size_t rounded = (bytes + kHugePageBytes - 1) & ~(kHugePageBytes - 1);
  if (rounded < bytes) return nullptr;  // wrapped
  void *p = std::aligned_alloc(kHugePageBytes, rounded);
#ifdef MADV_HUGEPAGE
  // Advice only: a kernel without THP (or with it off) refuses and the pages stay small.
  if (p != nullptr && huge_pages) (void)madvise(p, rounded, MADV_HUGEPAGE);
#endif
  return p;
}

void FreeLarge(void *p) { std::free(p); }

}  // namespace strata
