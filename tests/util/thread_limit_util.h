// Tests under a limit on threads: a forked child whose user may start only a few more threads
// (RLIMIT_NPROC), so that std::thread fails there as it does on a host at its process limit.
// Root is exempt from RLIMIT_NPROC, so as root the child first becomes user nobody.
#pragma once

#include <dirent.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>

namespace strata::testing {

// Tasks (threads) whose real user is uid: what RLIMIT_NPROC counts.
inline long TasksOfUser(uid_t uid) {
  long n = 0;
  DIR *d = opendir("/proc");
  if (d == nullptr) return -1;
  while (dirent *e = readdir(d)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    FILE *f = std::fopen((std::string("/proc/") + e->d_name + "/status").c_str(), "r");
    if (f == nullptr) continue;
    char line[256];
    long threads = 0;
    bool mine = false;
    while (std::fgets(line, sizeof line, f) != nullptr) {
      unsigned long real = 0;
      if (std::sscanf(line, "Uid: %lu", &real) == 1) mine = real == uid;
      std::sscanf(line, "Threads: %ld", &threads);
    }
    std::fclose(f);
    if (mine) n += threads;
  }
  closedir(d);
  return n;
}

// In the calling (forked) process: from now on at most `extra` more threads may start (about:
// other processes of the same user come and go). False when the limit cannot be set.
inline bool LimitThreads(long extra) {
  if (geteuid() == 0) {
    if (setgid(65534) != 0) {
      // A group change may be refused where setuid is not; the user is what the limit counts.
    }
    if (setuid(65534) != 0) return false;
  }
  const long now = TasksOfUser(getuid());
  if (now < 0) return false;
  rlimit r{};
  if (getrlimit(RLIMIT_NPROC, &r) != 0) return false;
  r.rlim_cur = static_cast<rlim_t>(now + extra);
  if (r.rlim_max != RLIM_INFINITY && r.rlim_cur > r.rlim_max) r.rlim_cur = r.rlim_max;
  return setrlimit(RLIMIT_NPROC, &r) == 0;
}

// Raises the soft limit back to the hard one.
inline void UnlimitThreads() {
  rlimit r{};
  if (getrlimit(RLIMIT_NPROC, &r) == 0) {
    r.rlim_cur = r.rlim_max;
    setrlimit(RLIMIT_NPROC, &r);
  }
}

// Runs fn in a forked child that an alarm kills after timeout_s seconds (a hang is a failure,
// not a stuck test run). Returns fn's value (the child's exit status), or 128 + the signal that
// ended the child.
inline int RunInChild(int timeout_s, const std::function<int()> &fn) {
  std::fflush(nullptr);
  const pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    alarm(static_cast<unsigned>(timeout_s));
    _exit(fn());
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

}  // namespace strata::testing
