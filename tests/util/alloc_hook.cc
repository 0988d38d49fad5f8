// Replaces the global operator new / delete of the test executable (every form, aligned included)
// with malloc-backed ones that count the bytes held and can fail the n-th allocation of a thread
// (alloc_hook.h). Blocks come from malloc / aligned_alloc and go back through free, so the
// sanitizers still see every allocation.
#include "tests/util/alloc_hook.h"

#include <malloc.h>

#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <new>

namespace {

std::atomic<int64_t> g_in_use{0};
// Plain thread-locals (no constructor), safe to touch from operator new at any point of a thread.
thread_local uint64_t t_count = 0;
thread_local uint64_t t_fail_at = 0;  // t_count value whose allocation fails; 0 = none
thread_local bool t_failed = false;

// True when this allocation is the one armed to fail.
bool ShouldFail() {
  ++t_count;
  if (t_fail_at != 0 && t_count == t_fail_at) {
    t_fail_at = 0;
    t_failed = true;
    return true;
  }
  return false;
}

void *Allocate(std::size_t n, std::size_t align) {
  if (ShouldFail()) return nullptr;
  if (n == 0) n = 1;
  void *p = nullptr;
  if (align <= alignof(std::max_align_t)) {
    p = std::malloc(n);
  } else if (posix_memalign(&p, align, n) != 0) {
    p = nullptr;
  }
  if (p != nullptr) g_in_use.fetch_add(static_cast<int64_t>(malloc_usable_size(p)), std::memory_order_relaxed);
  return p;
}

void Release(void *p) {
  if (p == nullptr) return;
  g_in_use.fetch_sub(static_cast<int64_t>(malloc_usable_size(p)), std::memory_order_relaxed);
  std::free(p);
}

void *AllocateOrThrow(std::size_t n, std::size_t align) {
  void *p = Allocate(n, align);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}

}  // namespace

namespace strata::testing {

int64_t HeapBytesInUse() { return g_in_use.load(std::memory_order_relaxed); }
uint64_t ThreadAllocations() { return t_count; }
void FailNthThreadAllocation(uint64_t n) {
  t_failed = false;
  t_fail_at = n == 0 ? 0 : t_count + n;
}
bool ThreadAllocationFailed() { return t_failed; }

}  // namespace strata::testing

constexpr std::size_t kDefaultAlign = alignof(std::max_align_t);

void *operator new(std::size_t n) { return AllocateOrThrow(n, kDefaultAlign); }
void *operator new[](std::size_t n) { return AllocateOrThrow(n, kDefaultAlign); }
void *operator new(std::size_t n, const std::nothrow_t &) noexcept { return Allocate(n, kDefaultAlign); }
void *operator new[](std::size_t n, const std::nothrow_t &) noexcept { return Allocate(n, kDefaultAlign); }
void *operator new(std::size_t n, std::align_val_t a) { return AllocateOrThrow(n, static_cast<std::size_t>(a)); }
void *operator new[](std::size_t n, std::align_val_t a) { return AllocateOrThrow(n, static_cast<std::size_t>(a)); }
void *operator new(std::size_t n, std::align_val_t a, const std::nothrow_t &) noexcept {
  return Allocate(n, static_cast<std::size_t>(a));
}
void *operator new[](std::size_t n, std::align_val_t a, const std::nothrow_t &) noexcept {
  return Allocate(n, static_cast<std::size_t>(a));
}

void operator delete(void *p) noexcept { Release(p); }
void operator delete[](void *p) noexcept { Release(p); }
void operator delete(void *p, std::size_t) noexcept { Release(p); }
void operator delete[](void *p, std::size_t) noexcept { Release(p); }
void operator delete(void *p, const std::nothrow_t &) noexcept { Release(p); }
void operator delete[](void *p, const std::nothrow_t &) noexcept { Release(p); }
void operator delete(void *p, std::align_val_t) noexcept { Release(p); }
void operator delete[](void *p, std::align_val_t) noexcept { Release(p); }
void operator delete(void *p, std::size_t, std::align_val_t) noexcept { Release(p); }
void operator delete[](void *p, std::size_t, std::align_val_t) noexcept { Release(p); }
void operator delete(void *p, std::align_val_t, const std::nothrow_t &) noexcept { Release(p); }
void operator delete[](void *p, std::align_val_t, const std::nothrow_t &) noexcept { Release(p); }
