// Helpers shared by the fuzz targets: a loud stop on a broken invariant, the check that a failure
// is a status of an expected category with a message, and the split of one input into fields.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <string_view>
#include <vector>

#include "lib/util/status.h"

namespace strata::fuzz {

// A result breaking an invariant the code promises is a bug: stop loudly (libFuzzer reports it).
inline void Require(bool ok) {
  if (!ok) __builtin_trap();
}

// Require, printing the status the check was about first.
inline void Require(bool ok, const absl::Status &st) {
  if (!ok) std::fprintf(stderr, "broken invariant; status: %s\n", st.ToString().c_str());
  Require(ok);
}

// A refusal must be a status of one of `categories` (MOE_ERR_FORMAT, ...) with a message.
inline void RequireRefusal(const absl::Status &st, std::initializer_list<moe_status> categories) {
  Require(!st.ok(), st);
  Require(!st.message().empty(), st);
  const moe_status cat = MOE_STATUS_CATEGORY(StatusToMoe(st));
  bool known = false;
  for (moe_status c : categories) known = known || cat == c;
  Require(known, st);
}

// The input's bytes cut at each NUL into at most `max_fields` fields (the last takes the rest).
inline std::vector<std::string_view> SplitFields(const uint8_t *data, size_t size, size_t max_fields) {
  std::vector<std::string_view> out;
  std::string_view rest(reinterpret_cast<const char *>(data), size);
  while (out.size() + 1 < max_fields) {
    const size_t nul = rest.find('\0');
    if (nul == std::string_view::npos) break;
    out.push_back(rest.substr(0, nul));
    rest.remove_prefix(nul + 1);
  }
  out.push_back(rest);
  return out;
}

}  // namespace strata::fuzz
