// Python's str operations for the Jinja engine (jinja_builtins.cc, jinja_filters.cc): case
// mapping, title and capitalize, replace, split and splitlines, each as CPython computes it for
// the text chat templates handle.
#include <algorithm>

#include "lib/text/jinja_eval.h"
#include "lib/text/unicode.h"

namespace strata::text::jinja {
namespace internal {

// Python's simple case mapping for the scripts chat templates meet: ASCII, Latin-1, Latin
// Extended-A, Greek and Cyrillic (other code points keep their case); the one-to-many mappings
// Python applies there too (ß -> SS, İ -> i̇, ŉ -> ʼN) and Greek final sigma.
uint32_t LowerCp(uint32_t c) {
  if (c < 0x80) return c >= 'A' && c <= 'Z' ? c + 32 : c;
  if (c >= 0xC0 && c <= 0xDE && c != 0xD7) return c + 32;
  if ((c >= 0x100 && c <= 0x137 && c != 0x130) || (c >= 0x14A && c <= 0x177)) return c | 1;
  if ((c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E)) return c & 1 ? c + 1 : c;
  if (c == 0x178) return 0xFF;
  if (c >= 0x391 && c <= 0x3A9 && c != 0x3A2) return c + 32;
  if (c == 0x386) return 0x3AC;
  if (c >= 0x388 && c <= 0x38A) return c + 37;
  if (c == 0x38C) return 0x3CC;
  if (c == 0x38E || c == 0x38F) return c + 63;
  if (c >= 0x410 && c <= 0x42F) return c + 32;
  if (c >= 0x400 && c <= 0x40F) return c + 80;
  return c;
}

uint32_t UpperCp(uint32_t c) {
  if (c < 0x80) return c >= 'a' && c <= 'z' ? c - 32 : c;
  if (c >= 0xE0 && c <= 0xFE && c != 0xF7) return c - 32;
  if (c == 0xFF) return 0x178;
  if (c == 0xB5) return 0x39C;
  if (c == 0x131) return 'I';
  if (c == 0x17F) return 'S';
  if ((c >= 0x100 && c <= 0x137 && c != 0x130) || (c >= 0x14A && c <= 0x177)) return c & ~1u;
  if ((c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E)) return c & 1 ? c : c - 1;
  if (c == 0x3C2) return 0x3A3;
  if (c >= 0x3B1 && c <= 0x3C9) return c - 32;
  if (c == 0x3AC) return 0x386;
  if (c >= 0x3AD && c <= 0x3AF) return c - 37;
  if (c == 0x3CC) return 0x38C;
  if (c == 0x3CD || c == 0x3CE) return c - 63;
  if (c >= 0x430 && c <= 0x44F) return c - 32;
  if (c >= 0x450 && c <= 0x45F) return c - 80;
  return c;
}

// Whether a code point has case (what Python's title() and final-sigma rules look at).
bool Cased(uint32_t c) { return LowerCp(c) != c || UpperCp(c) != c || c == 0xDF || c == 0x149 || c == 0x130; }

void AppendUpper(uint32_t c, std::string *out) {
  if (c == 0xDF)
    out->append("SS");
  else if (c == 0x149)
    out->append("\xCA\xBCN");
  else
    AppendUtf8(UpperCp(c), out);
}

std::vector<uint32_t> Decode(const std::string &s) {
  std::vector<uint32_t> cps;
  for (size_t k = 0; k < s.size();) {
    size_t len;
    const uint32_t c = DecodeUtf8(s, k, &len);
    // An invalid byte stays itself (kept as a raw byte, marked above the Unicode range).
    cps.push_back(c == 0xFFFD && len == 1 && static_cast<unsigned char>(s[k]) >= 0x80
                      ? 0x80000000u | static_cast<unsigned char>(s[k])
                      : c);
    k += len;
  }
  return cps;
}

void Encode(uint32_t c, std::string *out) {
  if (c & 0x80000000u)
    out->push_back(static_cast<char>(c & 0xFF));
  else
    AppendUtf8(c, out);
}

void AppendLower(const std::vector<uint32_t> &cps, size_t k, std::string *out) {
  const uint32_t c = cps[k];
  if (c == 0x130) {
    out->append("i\xCC\x87");
  } else if (c == 0x3A3) {
    // Final sigma: after a cased letter and not before one.
    const bool after = k > 0 && Cased(cps[k - 1]);
    const bool before = k + 1 < cps.size() && Cased(cps[k + 1]);
    AppendUtf8(after && !before ? 0x3C2 : 0x3C3, out);
  } else if (c & 0x80000000u) {
    Encode(c, out);
  } else {
    AppendUtf8(LowerCp(c), out);
  }
}

std::string PyLower(std::string s) {
  const std::vector<uint32_t> cps = Decode(s);
  std::string out;
  for (size_t k = 0; k < cps.size(); ++k) AppendLower(cps, k, &out);
  return out;
}

std::string PyUpper(std::string s) {
  std::string out;
  for (uint32_t c : Decode(s)) {
    if (c & 0x80000000u)
      Encode(c, &out);
    else
      AppendUpper(c, &out);
  }
  return out;
}

bool IsAlpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

// Python's str.title(): a cased letter after an uncased character is upper-cased, later ones
// lower-cased.
std::string PyTitle(const std::string &s) {
  const std::vector<uint32_t> cps = Decode(s);
  std::string out;
  bool prev_cased = false;
  for (size_t k = 0; k < cps.size(); ++k) {
    const bool cased = !(cps[k] & 0x80000000u) && Cased(cps[k]);
    if (cased && !prev_cased)
      AppendUpper(cps[k], &out);
    else
      AppendLower(cps, k, &out);
    prev_cased = cased;
  }
  return out;
}

// Python's str.capitalize(): the first character upper-cased, the rest lower-cased.
std::string Capitalize(const std::string &s) {
  const std::vector<uint32_t> cps = Decode(s);
  std::string out;
  for (size_t k = 0; k < cps.size(); ++k) {
    if (k == 0 && !(cps[0] & 0x80000000u))
      AppendUpper(cps[0], &out);
    else
      AppendLower(cps, k, &out);
  }
  return out;
}

// jinja2's title filter: each word (split after runs of whitespace, '-', '(', '{', '[' or '<')
// gets its first character upper-cased and the rest lower-cased.
std::string JinjaTitle(const std::string &s) {
  const std::vector<uint32_t> cps = Decode(s);
  std::string out;
  bool at_start = true;
  for (size_t k = 0; k < cps.size(); ++k) {
    const uint32_t c = cps[k];
    const bool sep = (!(c & 0x80000000u) && (IsWhitespace(c) || (c >= 0x1c && c <= 0x1f))) || c == '-' || c == '(' ||
                     c == '{' || c == '[' || c == '<';
    if (sep) {
      Encode(c, &out);
      at_start = true;
    } else {
      if (at_start && !(c & 0x80000000u))
        AppendUpper(c, &out);
      else
        AppendLower(cps, k, &out);
      at_start = false;
    }
  }
  return out;
}

absl::StatusOr<std::string> Replace(const std::string &s, const std::string &from, const std::string &to, int64_t count,
                                    size_t cap) {
  std::string out;
  auto too_big = [&]() { return out.size() > cap; };
  if (from.empty()) {
    // Python inserts `to` around every character.
    const auto cps = CodePoints(s);
    int64_t n = 0;
    for (size_t k = 0; k <= cps.size(); ++k) {
      if (count < 0 || n < count) {
        out += to;
        ++n;
      }
      if (k < cps.size()) out.append(cps[k]);
      if (too_big())
        return MakeError(MOE_ERR_LIMIT, "replace: the result would pass " + std::to_string(cap) + " bytes");
    }
    return out;
  }
  size_t at = 0;
  int64_t n = 0;
  while (count < 0 || n < count) {
    const size_t f = s.find(from, at);
    if (f == std::string::npos) break;
    out.append(s, at, f - at);
    out += to;
    at = f + from.size();
    ++n;
    if (too_big()) return MakeError(MOE_ERR_LIMIT, "replace: the result would pass " + std::to_string(cap) + " bytes");
  }
  out.append(s, at, std::string::npos);
  work::ChargeBytes(out.size());
  return out;
}

std::vector<std::string> Split(const std::string &s, const Value &sep, int64_t maxsplit) {
  std::vector<std::string> parts;
  if (sep.is_none() || sep.is_undefined()) {
    size_t k = 0, len;
    while (true) {
      while (k < s.size() && PySpaceAt(s, k, &len)) k += len;
      if (k >= s.size()) break;
      if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) >= maxsplit) {
        parts.push_back(std::string(PyStrip(std::string_view(s).substr(k), false, true)));
        break;
      }
      size_t e = k;
      while (e < s.size() && !PySpaceAt(s, e, &len)) {
        DecodeUtf8(s, e, &len);
        e += len;
      }
      parts.push_back(s.substr(k, e - k));
      k = e;
    }
    return parts;
  }
  const std::string &d = sep.str;
  size_t at = 0;
  while (maxsplit < 0 || static_cast<int64_t>(parts.size()) < maxsplit) {
    const size_t f = s.find(d, at);
    if (f == std::string::npos) break;
    parts.push_back(s.substr(at, f - at));
    at = f + d.size();
  }
  parts.push_back(s.substr(at));
  return parts;
}

std::vector<std::string> RSplit(const std::string &s, const std::string &d, int64_t maxsplit) {
  std::vector<std::string> parts;
  size_t end = s.size();
  while (maxsplit < 0 || static_cast<int64_t>(parts.size()) < maxsplit) {
    if (end < d.size()) break;
    const size_t f = s.rfind(d, end - d.size());
    if (f == std::string::npos) break;
    parts.push_back(s.substr(f + d.size(), end - f - d.size()));
    end = f;
  }
  parts.push_back(s.substr(0, end));
  std::reverse(parts.begin(), parts.end());
  return parts;
}

// Python's str.splitlines().
std::vector<std::string> SplitLines(const std::string &s) {
  std::vector<std::string> lines;
  size_t start = 0, k = 0;
  while (k < s.size()) {
    size_t len;
    const uint32_t cp = DecodeUtf8(s, k, &len);
    const bool brk = cp == '\n' || cp == '\r' || cp == 0x0b || cp == 0x0c || cp == 0x1c || cp == 0x1d || cp == 0x1e ||
                     cp == 0x85 || cp == 0x2028 || cp == 0x2029;
    if (!brk) {
      k += len;
      continue;
    }
    lines.push_back(s.substr(start, k - start));
    k += len;
    if (cp == '\r' && k < s.size() && s[k] == '\n') ++k;
    start = k;
  }
  if (start < s.size()) lines.push_back(s.substr(start));
  return lines;
}

}  // namespace internal
}  // namespace strata::text::jinja
