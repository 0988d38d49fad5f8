// Text from users and files, made safe to print in a message: one line of valid UTF-8 with no
// terminal controls, whatever the input held (a NUL, an escape sequence, bytes that are not UTF-8).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace strata {

// `s` with each C0/C1 control character, DEL and each byte that is not part of a well-formed
// UTF-8 sequence written as \xNN (\n, \t and \r as such), so no byte of it reaches a terminal or a
// C string unescaped; longer than `max_bytes`, the rest is replaced by "...". Printable ASCII and
// valid UTF-8 pass through unchanged; backslashes are kept as they are.
std::string SafeText(std::string_view s, size_t max_bytes = 4096);

}  // namespace strata
