// Status helpers: the moe_status payload and the mapping from absl codes.
#include "lib/util/status.h"

#include <cstring>

#include "absl/strings/cord.h"

namespace strata {
namespace {
constexpr char kPayloadUrl[] = "strata/moe_status";
}

absl::Status MakeError(moe_status code, std::string message) {
  absl::StatusCode ac = absl::StatusCode::kUnknown;
  switch (MOE_STATUS_CATEGORY(code)) {
    case MOE_ERR_INVALID_ARGUMENT: ac = absl::StatusCode::kInvalidArgument; break;
    case MOE_ERR_IO: ac = absl::StatusCode::kUnavailable; break;
    case MOE_ERR_FORMAT: ac = absl::StatusCode::kDataLoss; break;
    case MOE_ERR_UNSUPPORTED: ac = absl::StatusCode::kUnimplemented; break;
    case MOE_ERR_NO_MEMORY: ac = absl::StatusCode::kResourceExhausted; break;
    case MOE_ERR_STATE: ac = absl::StatusCode::kFailedPrecondition; break;
    case MOE_ERR_BACKEND: ac = absl::StatusCode::kAborted; break;
    case MOE_ERR_LIMIT: ac = absl::StatusCode::kOutOfRange; break;
    default: ac = absl::StatusCode::kInternal; break;
  }
  absl::Status st(ac, message);
  char buf[sizeof(int32_t)];
  std::memcpy(buf, &code, sizeof buf);
  st.SetPayload(kPayloadUrl, absl::Cord(absl::string_view(buf, sizeof buf)));
  return st;
}

moe_status StatusToMoe(const absl::Status &st) {
  if (st.ok()) return MOE_OK;
  if (auto p = st.GetPayload(kPayloadUrl); p.has_value() && p->size() == sizeof(int32_t)) {
    std::string s(*p);
    int32_t code;
    std::memcpy(&code, s.data(), sizeof code);
    return code;
  }
  switch (st.code()) {
    case absl::StatusCode::kInvalidArgument: return MOE_ERR_INVALID_ARGUMENT;
    case absl::StatusCode::kNotFound: return MOE_ERR_IO_OPEN;
    case absl::StatusCode::kUnavailable: return MOE_ERR_IO;
    case absl::StatusCode::kDataLoss: return MOE_ERR_FORMAT;
    case absl::StatusCode::kUnimplemented: return MOE_ERR_UNSUPPORTED;
    case absl::StatusCode::kResourceExhausted: return MOE_ERR_NO_MEMORY;
    case absl::StatusCode::kFailedPrecondition: return MOE_ERR_STATE;
    case absl::StatusCode::kOutOfRange: return MOE_ERR_LIMIT;
    case absl::StatusCode::kAborted: return MOE_ERR_BACKEND;
    default: return MOE_ERR_INTERNAL;
  }
}

absl::Status Annotate(const absl::Status &st, absl::string_view context) {
  if (st.ok()) return st;
  absl::Status out(st.code(), absl::StrCat(context, ": ", st.message()));
  st.ForEachPayload([&](absl::string_view url, const absl::Cord &payload) { out.SetPayload(url, payload); });
  return out;
}

}  // namespace strata
