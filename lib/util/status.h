// Errors inside Strata: absl::Status everywhere, with the C ABI status code (moe_status) carried as
// a payload so lib/capi can hand the exact code to the host. Build errors with the helpers below;
// a Status without the payload is mapped by its absl code.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "include/strata/moe.h"
#include "lib/util/str_format.h"

namespace strata {

// Returns a Status carrying `code` (a moe_status) and `message`.
absl::Status MakeError(moe_status code, std::string message);

// The moe_status of `st`: its payload if it has one, else a mapping of its absl code.
moe_status StatusToMoe(const absl::Status &st);

template <typename... Args>
absl::Status Errorf(moe_status code, const absl::FormatSpec<Args...> &fmt, const Args &...args) {
  return MakeError(code, strata::StrFormat(fmt, args...));
}

// Prefixes the message of a failed status with context ("reading tensor 'x': ..."), keeping the code.
absl::Status Annotate(const absl::Status &st, absl::string_view context);

}  // namespace strata

#define STRATA_STATUS_CONCAT_INNER_(a, b) a##b
#define STRATA_STATUS_CONCAT_(a, b) STRATA_STATUS_CONCAT_INNER_(a, b)

#define STRATA_RETURN_IF_ERROR(expr)                 \
  do {                                               \
    ::absl::Status strata_status_ = (expr);          \
    if (!strata_status_.ok()) return strata_status_; \
  } while (0)

#define STRATA_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                  \
  if (!tmp.ok()) return std::move(tmp).status();      \
  lhs = std::move(tmp).value()

#define STRATA_ASSIGN_OR_RETURN(lhs, expr) \
  STRATA_ASSIGN_OR_RETURN_IMPL_(STRATA_STATUS_CONCAT_(strata_statusor_, __LINE__), lhs, expr)
