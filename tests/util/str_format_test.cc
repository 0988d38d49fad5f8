// strata::StrFormat formats as absl::StrFormat does, and an allocation failure anywhere in it is a
// std::bad_alloc the caller can catch (absl's own ends the process: its sink flushes from a
// destructor), leaving nothing allocated.
#include <catch2/catch.hpp>

#include <cstdint>
#include <new>
#include <random>
#include <string>

#include "lib/util/str_format.h"
#include "tests/util/alloc_hook.h"

TEST_CASE("StrFormat formats as absl::StrFormat", "[util][format]") {
  std::mt19937 rng(std::random_device{}());
  const int n = static_cast<int>(rng() % 100000);
  const std::string s(rng() % 300, 'q');
  CHECK(strata::StrFormat("%d %s %u %.3f %x", n, s, 7u, 0.5, 255) ==
        absl::StrFormat("%d %s %u %.3f %x", n, s, 7u, 0.5, 255));
  CHECK(strata::StrFormat("plain").size() == 5);
}

TEST_CASE("StrFormat: every allocation failing in turn is a catchable bad_alloc, nothing leaked", "[util][format][alloc]") {
  std::mt19937 rng(std::random_device{}());
  // Long enough that the output is flushed from the sink more than once.
  const std::string big(300 + rng() % 2000, 'x');
  uint64_t allocations = 0;
  {
    const uint64_t at = strata::testing::ThreadAllocations();
    const std::string out = strata::StrFormat("%s|%d|%s|%s", big, 42, big, big);
    allocations = strata::testing::ThreadAllocations() - at;
    CHECK(out.size() == 3 * big.size() + 5);
  }
  REQUIRE(allocations > 0);
  for (uint64_t k = 1; k <= allocations; ++k) {
    bool caught = false;
    const int64_t before = strata::testing::HeapBytesInUse();
    {
      strata::testing::ScopedAllocationFailure fail(k);
      try {
        (void)strata::StrFormat("%s|%d|%s|%s", big, 42, big, big);
      } catch (const std::bad_alloc &) {
        caught = true;
      }
    }
    const int64_t after = strata::testing::HeapBytesInUse();
    INFO("allocation " << k << " of " << allocations);
    CHECK(caught);
    CHECK(after == before);
  }
}
