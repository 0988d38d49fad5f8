// LockInPieces: mlock piece by piece and, at a refusal, whether RLIMIT_MEMLOCK was the cause (a
// finite soft limit, no CAP_IPC_LOCK to lift it, and the locked memory plus the piece past it).
#include "lib/util/str_format.h"
#include "lib/util/memory_lock.h"

#include <errno.h>
#include <linux/capability.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>

#include "absl/strings/str_format.h"

namespace strata {

namespace {

// CAP_IPC_LOCK in the effective set: the kernel then ignores RLIMIT_MEMLOCK.
bool CanLockPastLimit() {
  __user_cap_header_struct hdr{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[2] = {};
  if (syscall(SYS_capget, &hdr, data) != 0) return false;
  return (data[CAP_IPC_LOCK / 32].effective & (1u << (CAP_IPC_LOCK % 32))) != 0;
}

// The process's locked memory (VmLck), or UINT64_MAX when /proc does not say.
uint64_t LockedNow() {
  std::ifstream f("/proc/self/status");
  std::string key;
  while (f >> key) {
    if (key == "VmLck:") {
      uint64_t kb = 0;
      return f >> kb ? kb * 1024 : UINT64_MAX;
    }
    f.ignore(1 << 16, '\n');
  }
  return UINT64_MAX;
}

std::string Shortfall(int err, uint64_t piece) {
  rlimit rl{};
  if ((err == ENOMEM || err == EPERM || err == EAGAIN) && getrlimit(RLIMIT_MEMLOCK, &rl) == 0 &&
      rl.rlim_cur != RLIM_INFINITY && !CanLockPastLimit()) {
    const uint64_t locked = LockedNow();
    if (locked == UINT64_MAX || locked + piece > rl.rlim_cur) {
      return "RLIMIT_MEMLOCK " + FormatBytes(rl.rlim_cur);
    }
  }
  return std::string("mlock: ") + std::strerror(err);
}

}  // namespace

LockResult LockInPieces(void *p, uint64_t bytes, uint64_t piece, LockFn lock) {
  LockResult r;
  if (piece == 0) piece = kLockPieceBytes;
  if (lock == nullptr) lock = ::mlock;
  auto *base = static_cast<uint8_t *>(p);
  while (r.locked_bytes < bytes) {
    const uint64_t n = std::min(piece, bytes - r.locked_bytes);
    if (lock(base + r.locked_bytes, static_cast<size_t>(n)) != 0) {
      const int err = errno;
      // A refused piece may be locked in part (population failing midway leaves the pages it
      // reached locked): let it go, so the locked part is exactly the prefix reported.
      ::munlock(base + r.locked_bytes, static_cast<size_t>(n));
      r.shortfall = Shortfall(err, n);
      return r;
    }
    r.locked_bytes += n;
  }
  return r;
}

void UnlockPrefix(void *p, uint64_t locked_bytes) {
  if (p != nullptr && locked_bytes > 0) ::munlock(p, static_cast<size_t>(locked_bytes));
}

std::string FormatBytes(uint64_t bytes) {
  if (bytes < 1024) return strata::StrFormat("%u B", bytes);
  const char *units[] = {"KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes) / 1024;
  int u = 0;
  while (v >= 1024 && u < 3) {
    v /= 1024;
    ++u;
  }
  return strata::StrFormat("%.1f %s", v, units[u]);
}

}  // namespace strata
