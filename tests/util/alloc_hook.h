// A test-only hook on the global operator new / delete of the test executable (alloc_hook.cc
// replaces them): the bytes held through them, and a way to make the n-th allocation of the
// calling thread fail, so out-of-memory paths can be walked one allocation at a time.
#pragma once

#include <cstdint>

namespace strata::testing {

// Bytes currently held through operator new, by all threads (malloc_usable_size of each block).
int64_t HeapBytesInUse();

// Allocations through operator new made by the calling thread so far.
uint64_t ThreadAllocations();

// Makes the n-th operator new of the calling thread from now on (n >= 1) fail once: the throwing
// forms throw std::bad_alloc, the nothrow forms return nullptr. n = 0 disarms. Other threads are
// never failed: an allocation there has no caller that could receive the error.
void FailNthThreadAllocation(uint64_t n);
// Whether the armed failure has happened (and so is spent).
bool ThreadAllocationFailed();

// Arms FailNthThreadAllocation(n) for its lifetime, disarmed on exit.
class ScopedAllocationFailure {
 public:
  explicit ScopedAllocationFailure(uint64_t n) { FailNthThreadAllocation(n); }
  ~ScopedAllocationFailure() { FailNthThreadAllocation(0); }
  ScopedAllocationFailure(const ScopedAllocationFailure &) = delete;
  ScopedAllocationFailure &operator=(const ScopedAllocationFailure &) = delete;
  bool failed() const { return ThreadAllocationFailed(); }
};

}  // namespace strata::testing
