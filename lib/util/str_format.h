// strata::StrFormat: absl::StrFormat's format strings and checks, with an allocation failure that
// unwinds. absl::StrFormat appends its last piece from the destructor of its internal sink; a
// destructor may not throw, so a std::bad_alloc there ends the process (std::terminate) instead of
// becoming MOE_ERR_NO_MEMORY at the C ABI. Here the sink's flush catches the failure, remembers it,
// and std::bad_alloc is thrown once formatting is over. The library formats only through this
// (tests/runtime/layering_test.cc keeps it so).
#pragma once

#include <new>
#include <string>

#include "absl/strings/str_format.h"

namespace strata {
namespace str_format_internal {

struct NoThrowSink {
  std::string *out;
  bool failed = false;
};

inline void AbslFormatFlush(NoThrowSink *sink, absl::string_view piece) {
  if (sink->failed) return;
  try {
    sink->out->append(piece.data(), piece.size());
  } catch (...) {
    sink->failed = true;
  }
}

}  // namespace str_format_internal

template <typename... Args>
std::string StrFormat(const absl::FormatSpec<Args...> &format, const Args &...args) {
  std::string out;
  str_format_internal::NoThrowSink sink{&out};
  absl::Format(&sink, format, args...);
  if (sink.failed) throw std::bad_alloc();
  return out;
}

}  // namespace strata
