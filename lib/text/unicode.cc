// UTF-8 decoding and category lookup (binary search over kGcRanges). Decoding is strict (no
// overlongs, no surrogates, nothing above U+10FFFF) and total: every byte position yields a code point.
#include "lib/text/unicode.h"

#include <algorithm>

namespace strata::text {

Gc Category(uint32_t cp) {
  const GcRange *end = kGcRanges + kGcRangeCount;
  const GcRange *it = std::upper_bound(kGcRanges, end, cp,
                                       [](uint32_t v, const GcRange &r) { return v < r.first; });
  if (it == kGcRanges) return Gc::kCn;
  --it;
  return cp <= it->last ? static_cast<Gc>(it->gc) : Gc::kCn;
}

bool IsWhitespace(uint32_t cp) {
  if (cp >= 0x09 && cp <= 0x0D) return true;
  switch (cp) {
    case 0x20: case 0x85: case 0xA0: case 0x1680: case 0x2028: case 0x2029: case 0x202F:
    case 0x205F: case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

uint32_t DecodeUtf8(std::string_view s, size_t i, size_t *len) {
  const auto b = [&](size_t k) { return static_cast<uint8_t>(s[k]); };
  uint8_t c = b(i);
  *len = 1;
  if (c < 0x80) return c;
  size_t n;
  uint32_t cp, min;
  if ((c & 0xE0) == 0xC0) { n = 2; cp = c & 0x1F; min = 0x80; }
  else if ((c & 0xF0) == 0xE0) { n = 3; cp = c & 0x0F; min = 0x800; }
  else if ((c & 0xF8) == 0xF0) { n = 4; cp = c & 0x07; min = 0x10000; }
  else return 0xFFFD;
  if (i + n > s.size()) return 0xFFFD;
  for (size_t k = 1; k < n; ++k) {
    if ((b(i + k) & 0xC0) != 0x80) return 0xFFFD;
    cp = (cp << 6) | (b(i + k) & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0xFFFD;
  *len = n;
  return cp;
}

void AppendUtf8(uint32_t cp, std::string *out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

size_t ValidUtf8Prefix(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    size_t len;
    uint32_t cp = DecodeUtf8(s, i, &len);
    if (cp == 0xFFFD && len == 1) break;  // a real U+FFFD has len 3
    i += len;
  }
  return i;
}

}  // namespace strata::text
