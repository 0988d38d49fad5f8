// SafeText: escapes control bytes and malformed UTF-8 (RFC 3629: no overlong forms, no surrogates,
// nothing above U+10FFFF) in text that a message quotes.
#include "lib/util/safe_text.h"

#include <cstdint>

namespace strata {
namespace {

void Hex(std::string &out, uint8_t b) {
  static constexpr char kDigits[] = "0123456789abcdef";
  out += "\\x";
  out += kDigits[b >> 4];
  out += kDigits[b & 15];
}

// Length of the well-formed UTF-8 sequence at s[i] (2-4), or 0 when there is none.
size_t Utf8Length(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<uint8_t>(s[i + k]); };
  const uint8_t c = b(0);
  size_t n;
  uint8_t lo = 0x80, hi = 0xBF;  // the second byte's range
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    if (c == 0xE0) lo = 0xA0;  // overlong
    if (c == 0xED) hi = 0x9F;  // surrogates
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    if (c == 0xF0) lo = 0x90;  // overlong
    if (c == 0xF4) hi = 0x8F;  // above U+10FFFF
  } else {
    return 0;
  }
  if (i + n > s.size()) return 0;
  if (b(1) < lo || b(1) > hi) return 0;
  for (size_t k = 2; k < n; ++k) {
    if (b(k) < 0x80 || b(k) > 0xBF) return 0;
  }
  return n;
}

}  // namespace

std::string SafeText(std::string_view s, size_t max_bytes) {
  std::string out;
  out.reserve(s.size() < max_bytes ? s.size() : max_bytes);
  size_t i = 0;
  while (i < s.size()) {
    if (out.size() >= max_bytes) {
      out += "...";
      break;
    }
    const uint8_t c = static_cast<uint8_t>(s[i]);
    if (c >= 0x20 && c < 0x7F) {
      out += static_cast<char>(c);
      ++i;
    } else if (c == '\n') {
      out += "\\n", ++i;
    } else if (c == '\t') {
      out += "\\t", ++i;
    } else if (c == '\r') {
      out += "\\r", ++i;
    } else if (const size_t n = c >= 0x80 ? Utf8Length(s, i) : 0; n > 0) {
      if (n == 2 && c == 0xC2 && static_cast<uint8_t>(s[i + 1]) < 0xA0) {
        Hex(out, c);  // a C1 control (U+0080..U+009F): terminals act on some of them
        Hex(out, static_cast<uint8_t>(s[i + 1]));
      } else {
        out.append(s.data() + i, n);
      }
      i += n;
    } else {
      Hex(out, c);
      ++i;
    }
  }
  return out;
}

}  // namespace strata
