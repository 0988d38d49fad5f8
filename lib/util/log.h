// The library's one way to say something outside a returned status: warnings, and the traces the
// STRATA_*_TRACE / profile tunables turn on. Lines go to stderr, or to the host's callback once one
// is set (moe_log_set), and then nothing the library prints reaches stderr. The CLI prints its own
// output and errors itself.
#pragma once

#include <cstdarg>
#include <string>

#include "include/strata/moe.h"

namespace strata {

// The levels of moe.h (MOE_LOG_ERROR .. MOE_LOG_DEBUG).
enum class LogLevel : int32_t {
  kError = MOE_LOG_ERROR,
  kWarn = MOE_LOG_WARN,
  kInfo = MOE_LOG_INFO,
  kDebug = MOE_LOG_DEBUG,
};

// Sets the callback every line goes to (fn NULL: stderr again). Once this returns, the previous
// callback is not running and is never called again. Thread-safe.
void SetLogCallback(moe_log_fn fn, void *user);

// Whether a host callback is set (so stderr is the host's: progress bars stay quiet).
bool LogToHost();

// In a plugin (a backend's shared object, backends/cuda_plugin.h), which holds its own copy of this
// file: every line goes to the library's LogLine and LogToHost answers the library's, so the one
// callback moe_log_set chose sees the plugin's lines too. Set once, when the plugin is opened.
void SetLogForward(void (*line)(LogLevel level, const std::string &line), bool (*to_host)());

// One line (a trailing newline is dropped): to the callback, else to stderr with a newline.
void LogLine(LogLevel level, const std::string &line);

// printf-style LogLine, for the traces (format strings as for std::fprintf).
void LogPrintf(LogLevel level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
// LogPrintf at kDebug (the traces tunables turn on) and at kWarn.
void LogDebug(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void LogWarn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

}  // namespace strata
