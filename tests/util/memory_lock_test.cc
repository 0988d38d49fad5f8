// Locking in pieces: a refusal at the Nth piece (N = 1, 2, ...) keeps exactly the N - 1 pieces before
// it and says why; a lowered RLIMIT_MEMLOCK (binding even for root, the capability dropped) stops
// the real mlock at the piece past the limit and is named as the reason.
#include "lib/util/memory_lock.h"

#include <catch2/catch.hpp>
#include <errno.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "tests/util/memory_lock_util.h"

namespace {

// The injected lock: records each call and refuses the g_refuse-th (1-based; 0 = none) with ENOMEM.
int g_refuse = 0;
std::vector<std::pair<const void *, size_t>> g_calls;

int RefuseNth(const void *p, size_t n) {
  g_calls.emplace_back(p, n);
  if (static_cast<int>(g_calls.size()) == g_refuse) {
    errno = ENOMEM;
    return -1;
  }
  return 0;
}

struct Aligned {
  explicit Aligned(size_t bytes) : p(static_cast<uint8_t *>(std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096))) {}
  ~Aligned() { std::free(p); }
  uint8_t *p;
};

}  // namespace

TEST_CASE("memory lock: a refused piece keeps the pieces before it and says why", "[memlock]") {
  std::mt19937 rng(std::random_device{}());
  const uint64_t piece = 4096u * (1 + rng() % 8);
  const uint64_t bytes = piece * (2 + rng() % 6) + 4096u * (rng() % 3);  // often a short last piece
  const int n_pieces = static_cast<int>((bytes + piece - 1) / piece);
  INFO("piece " << piece << ", bytes " << bytes);
  Aligned buf(bytes);
  REQUIRE(buf.p != nullptr);
  for (int refuse = 1; refuse <= n_pieces + 1; ++refuse) {
    INFO("refusing call " << refuse);
    g_refuse = refuse;
    g_calls.clear();
    const strata::LockResult r = strata::LockInPieces(buf.p, bytes, piece, RefuseNth);
    if (refuse > n_pieces) {
      CHECK(r.locked_bytes == bytes);
      CHECK(r.shortfall.empty());
      CHECK(static_cast<int>(g_calls.size()) == n_pieces);
    } else {
      CHECK(r.locked_bytes == static_cast<uint64_t>(refuse - 1) * piece);
      CHECK(r.shortfall == std::string("mlock: ") + std::strerror(ENOMEM));
      CHECK(static_cast<int>(g_calls.size()) == refuse);  // nothing tried past the refusal
    }
    // The pieces tile the buffer from its start, each whole but the last.
    uint64_t at = 0;
    for (const auto &[p, n] : g_calls) {
      CHECK(p == buf.p + at);
      CHECK(n == std::min<uint64_t>(piece, bytes - at));
      at += n;
    }
  }
}

TEST_CASE("memory lock: RLIMIT_MEMLOCK stops the real lock at the limit and is named", "[memlock]") {
  std::mt19937 rng(std::random_device{}());
  const uint64_t piece = 4096u * (4 + rng() % 13);
  const int fit = 1 + static_cast<int>(rng() % 4);  // pieces under the limit
  const uint64_t bytes = piece * (fit + 2 + rng() % 3);
  INFO("piece " << piece << ", pieces that fit " << fit << ", bytes " << bytes);
  Aligned buf(bytes);
  REQUIRE(buf.p != nullptr);
  strata::LockResult r;
  uint64_t limit = 0;
  {
    strata::testing::MemlockLimit lowered(fit * piece + piece / 2);
    if (!lowered.active()) {
      WARN("cannot lower RLIMIT_MEMLOCK (or drop CAP_IPC_LOCK) here: not tested");
      return;
    }
    limit = lowered.limit();
    r = strata::LockInPieces(buf.p, bytes, piece);
  }
  CHECK(r.locked_bytes == fit * piece);
  CHECK(r.shortfall == "RLIMIT_MEMLOCK " + strata::FormatBytes(limit));
  strata::UnlockPrefix(buf.p, r.locked_bytes);
  // With the limit back, the same buffer locks whole.
  const strata::LockResult whole = strata::LockInPieces(buf.p, bytes, piece);
  if (whole.shortfall.empty()) {
    CHECK(whole.locked_bytes == bytes);
    strata::UnlockPrefix(buf.p, whole.locked_bytes);
  }
}

TEST_CASE("memory lock: sizes for a person", "[memlock]") {
  std::mt19937 rng(std::random_device{}());
  const uint64_t b = rng() % 1024;
  CHECK(strata::FormatBytes(b) == std::to_string(b) + " B");
  CHECK(strata::FormatBytes(uint64_t{8} << 20) == "8.0 MiB");
  CHECK(strata::FormatBytes((uint64_t{3} << 30) / 2) == "1.5 GiB");
  CHECK(strata::FormatBytes(1024) == "1.0 KiB");
}
