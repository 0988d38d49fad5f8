// A lowered RLIMIT_MEMLOCK that binds, for tests of a partial lock: the soft limit set for the scope
// and, where the thread holds CAP_IPC_LOCK (root), the capability dropped from its effective set
// (it stays permitted, so it comes back at the end). Capabilities are per thread: the locking must
// run on the thread that holds the scope.
#pragma once

#include <linux/capability.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <string>

namespace strata::testing {

// The process's locked memory (VmLck) in bytes, or 0 when /proc does not say.
inline uint64_t LockedBytesNow() {
  std::ifstream f("/proc/self/status");
  std::string key;
  while (f >> key) {
    if (key == "VmLck:") {
      uint64_t kb = 0;
      f >> kb;
      return kb * 1024;
    }
  }
  return 0;
}

// ASan and TSan replace mlock(2) by a call that locks nothing and succeeds, so no limit binds there.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr bool kMlockIsReal = false;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
inline constexpr bool kMlockIsReal = false;
#else
inline constexpr bool kMlockIsReal = true;
#endif
#else
inline constexpr bool kMlockIsReal = true;
#endif

class MemlockLimit {
 public:
  // Lets the process lock `extra` bytes past what it has locked now. Never active where mlock(2) is
  // not real (a sanitizer build).
  explicit MemlockLimit(uint64_t extra) {
    if (!kMlockIsReal) return;
    if (getrlimit(RLIMIT_MEMLOCK, &saved_) != 0) return;
    if (syscall(SYS_capget, &hdr_, caps_) != 0) return;
    const uint32_t bit = 1u << (CAP_IPC_LOCK % 32);
    had_cap_ = (caps_[CAP_IPC_LOCK / 32].effective & bit) != 0;
    if (had_cap_) {
      __user_cap_data_struct dropped[2] = {caps_[0], caps_[1]};
      dropped[CAP_IPC_LOCK / 32].effective &= ~bit;
      if (syscall(SYS_capset, &hdr_, dropped) != 0) return;
    }
    rlimit lowered = saved_;
    lowered.rlim_cur = LockedBytesNow() + extra;
    if (saved_.rlim_max != RLIM_INFINITY && lowered.rlim_cur > saved_.rlim_max) lowered.rlim_cur = saved_.rlim_max;
    if (setrlimit(RLIMIT_MEMLOCK, &lowered) != 0) {
      Restore();
      return;
    }
    limit_ = lowered.rlim_cur;
    active_ = true;
  }
  ~MemlockLimit() {
    if (active_) {
      setrlimit(RLIMIT_MEMLOCK, &saved_);
      Restore();
    }
  }
  MemlockLimit(const MemlockLimit &) = delete;
  MemlockLimit &operator=(const MemlockLimit &) = delete;

  // Whether the lowered limit is in force (false: the host refused to lower it or drop the
  // capability, or mlock is a sanitizer's no-op).
  bool active() const { return active_; }
  uint64_t limit() const { return limit_; }

 private:
  void Restore() {
    if (had_cap_) syscall(SYS_capset, &hdr_, caps_);
  }

  __user_cap_header_struct hdr_{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct caps_[2] = {};
  rlimit saved_{};
  bool had_cap_ = false;
  bool active_ = false;
  uint64_t limit_ = 0;
};

}  // namespace strata::testing
