// Runs a piece of a test in a forked child with a deadline and a memory cap, so a case that would
// crash (stack overflow), hang (open() of a FIFO) or eat memory (a device read without bound) is a
// failed check in the parent instead of a dead or stuck test binary.
#pragma once

#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>

namespace strata::testing {

struct ChildOutcome {
  bool finished = false;  // the child returned from its function (no crash, no timeout)
  bool timed_out = false;
  int signal = 0;         // the signal that ended the child, when it crashed or was killed
  int32_t code = -1;      // what the function returned (a moe_status in most tests)
  std::string message;    // what the function put in its message
  std::string Describe() const {
    if (timed_out) return "timed out (the child hung)";
    if (!finished) return "the child died of signal " + std::to_string(signal);
    return "code " + std::to_string(code) + ", message: " + message;
  }
};

// The current virtual size in bytes, from /proc/self/statm (0 when unknown).
inline uint64_t VirtualBytesNow() {
  unsigned long pages = 0;
  FILE *f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return 0;
  if (std::fscanf(f, "%lu", &pages) != 1) pages = 0;
  std::fclose(f);
  return static_cast<uint64_t>(pages) * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
}

// Runs `fn` in a child process; `fn` fills `*message` and returns a code. The child may grow its
// address space by `extra_vm_bytes` at most and is killed after `timeout_s` seconds.
inline ChildOutcome RunInChild(const std::function<int32_t(std::string *message)> &fn, double timeout_s = 5.0,
                               uint64_t extra_vm_bytes = uint64_t{1} << 30) {
  ChildOutcome out;
  int fds[2];
  if (pipe(fds) != 0) return out;
  const uint64_t vm = VirtualBytesNow();
  std::fflush(nullptr);
  pid_t pid = fork();
  if (pid < 0) {
    close(fds[0]);
    close(fds[1]);
    return out;
  }
  if (pid == 0) {
    close(fds[0]);
    // The test framework's handlers would report a crash as the parent's; the parent reports it.
    for (int sig : {SIGSEGV, SIGBUS, SIGABRT, SIGILL, SIGFPE, SIGTERM, SIGINT}) signal(sig, SIG_DFL);
    if (vm > 0) {
      struct rlimit rl;
      rl.rlim_cur = rl.rlim_max = vm + extra_vm_bytes;
      setrlimit(RLIMIT_AS, &rl);
    }
    std::string message;
    int32_t code = fn(&message);
    std::string blob(reinterpret_cast<const char *>(&code), sizeof code);
    blob += message;
    size_t done = 0;
    while (done < blob.size()) {
      ssize_t w = write(fds[1], blob.data() + done, blob.size() - done);
      if (w <= 0) break;
      done += static_cast<size_t>(w);
    }
    _exit(0);
  }
  close(fds[1]);
  std::string blob;
  struct timespec start;
  clock_gettime(CLOCK_MONOTONIC, &start);
  for (;;) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    const double left = timeout_s - ((now.tv_sec - start.tv_sec) + (now.tv_nsec - start.tv_nsec) * 1e-9);
    if (left <= 0) {
      out.timed_out = true;
      break;
    }
    struct pollfd p = {fds[0], POLLIN, 0};
    int r = poll(&p, 1, static_cast<int>(left * 1000) + 1);
    if (r < 0) continue;  // EINTR
    if (r == 0) continue;  // the deadline is checked at the top
    char buf[4096];
    ssize_t got = read(fds[0], buf, sizeof buf);
    if (got <= 0) break;  // EOF: the child wrote everything or died
    blob.append(buf, static_cast<size_t>(got));
  }
  close(fds[0]);
  if (out.timed_out) kill(pid, SIGKILL);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFSIGNALED(status)) out.signal = WTERMSIG(status);
  if (!out.timed_out && WIFEXITED(status) && blob.size() >= sizeof(int32_t)) {
    out.finished = true;
    std::memcpy(&out.code, blob.data(), sizeof(int32_t));
    out.message = blob.substr(sizeof(int32_t));
  }
  return out;
}

}  // namespace strata::testing
