// Locking a large buffer in RAM piece by piece: mlock in capped pieces from the start, stopping at
// the first refusal (RLIMIT_MEMLOCK, ENOMEM), so the locked part is a known prefix and the reason for
// the rest is said rather than swallowed. What was locked stays locked until UnlockPrefix.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace strata {

// The piece one mlock call takes. A call faults in and pins its whole range before it returns and
// cannot be interrupted meanwhile, and one the limit refuses locks none of its range (one call over a
// slab past RLIMIT_MEMLOCK locks nothing): pieces keep each call short, keep what fits under the
// limit, and count the locked part to within a piece. 64 MiB (32 huge pages) keeps a slab of tens
// of GiB to a few hundred calls.
inline constexpr uint64_t kLockPieceBytes = uint64_t{64} << 20;

// mlock's contract: 0, or -1 with errno set. A stand-in lets tests refuse a chosen piece.
using LockFn = int (*)(const void *addr, size_t len);

struct LockResult {
  uint64_t locked_bytes = 0;  // [p, p + locked_bytes) is locked: whole pieces, or all of the buffer
  // Why the rest is not locked, for a person: "RLIMIT_MEMLOCK 8.0 MiB" when the limit refused it,
  // else "mlock: <the error>"; empty when all of it is locked.
  std::string shortfall;
};

// Locks [p, p + bytes) in pieces of `piece` bytes (a multiple of the page size; 0 = kLockPieceBytes)
// through `lock` (nullptr = mlock), stopping at the first piece refused.
LockResult LockInPieces(void *p, uint64_t bytes, uint64_t piece = 0, LockFn lock = nullptr);

// Unlocks what LockInPieces locked (munlock of [p, p + locked_bytes)); nothing for 0 bytes.
void UnlockPrefix(void *p, uint64_t locked_bytes);

// "512 B", "8.0 MiB", "1.2 GiB": a size for a person to read in a message.
std::string FormatBytes(uint64_t bytes);

}  // namespace strata
