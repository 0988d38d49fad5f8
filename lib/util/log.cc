// The library's log sink: a host callback (moe_log_set) or stderr. Lines are delivered under one
// mutex, so a callback sees whole lines one at a time and is never called after it was replaced.
#include "lib/util/log.h"

#include <atomic>
#include <cstdio>
#include <mutex>

namespace strata {
namespace {

std::mutex &LogMutex() {
  static std::mutex *mu = new std::mutex();  // never destroyed: threads may log during exit
  return *mu;
}
moe_log_fn g_fn = nullptr;  // under LogMutex()
void *g_user = nullptr;
std::atomic<bool> g_to_host{false};
// A plugin's: the library's sink (SetLogForward); null in the library itself.
std::atomic<void (*)(LogLevel, const std::string &)> g_forward_line{nullptr};
std::atomic<bool (*)()> g_forward_to_host{nullptr};

}  // namespace

void SetLogForward(void (*line)(LogLevel level, const std::string &line), bool (*to_host)()) {
  g_forward_to_host.store(to_host, std::memory_order_release);
  g_forward_line.store(line, std::memory_order_release);
}

void SetLogCallback(moe_log_fn fn, void *user) {
  std::lock_guard<std::mutex> lk(LogMutex());
  g_fn = fn;
  g_user = user;
  g_to_host.store(fn != nullptr, std::memory_order_release);
}

bool LogToHost() {
  if (bool (*to_host)() = g_forward_to_host.load(std::memory_order_acquire); to_host != nullptr) return to_host();
  return g_to_host.load(std::memory_order_acquire);
}

void LogLine(LogLevel level, const std::string &line) {
  if (auto *forward = g_forward_line.load(std::memory_order_acquire); forward != nullptr) {
    forward(level, line);
    return;
  }
  size_t n = line.size();
  if (n > 0 && line[n - 1] == '\n') --n;
  std::lock_guard<std::mutex> lk(LogMutex());
  if (g_fn != nullptr) {
    try {
      const std::string text(line, 0, n);
      g_fn(static_cast<int32_t>(level), text.c_str(), g_user);
    } catch (...) {
      // Out of memory copying the line: it is dropped rather than written where the host said not to.
    }
    return;
  }
  std::fwrite(line.data(), 1, n, stderr);
  std::fputc('\n', stderr);
}

namespace {

void LogV(LogLevel level, const char *fmt, va_list ap) {
  char small[512];
  va_list again;
  va_copy(again, ap);
  const int len = std::vsnprintf(small, sizeof small, fmt, ap);
  std::string text;
  try {
    if (len >= 0 && static_cast<size_t>(len) < sizeof small) {
      text.assign(small, static_cast<size_t>(len));
    } else if (len >= 0) {
      text.resize(static_cast<size_t>(len));
      std::vsnprintf(&text[0], text.size() + 1, fmt, again);
    }
  } catch (...) {
    text.clear();  // a line that cannot be allocated is dropped: logging never fails the caller
  }
  va_end(again);
  if (!text.empty()) LogLine(level, text);
}

}  // namespace

void LogPrintf(LogLevel level, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  LogV(level, fmt, ap);
  va_end(ap);
}

void LogDebug(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  LogV(LogLevel::kDebug, fmt, ap);
  va_end(ap);
}

void LogWarn(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  LogV(LogLevel::kWarn, fmt, ap);
  va_end(ap);
}

}  // namespace strata
