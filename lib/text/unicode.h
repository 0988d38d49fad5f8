// Unicode for the pre-tokenizers: UTF-8 decoding that never fails (an invalid byte decodes as one
// code point U+FFFD of length 1), general categories from the generated table in unicode_tables.cc,
// and White_Space as Oniguruma's \s sees it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace strata::text {

// General categories; the order is the generator's (scripts/text/gen_unicode_tables.py).
enum class Gc : uint8_t {
  kCn, kLu, kLl, kLt, kLm, kLo, kMn, kMc, kMe, kNd, kNl, kNo, kPc, kPd, kPs,
  kPe, kPi, kPf, kPo, kSm, kSc, kSk, kSo, kZs, kZl, kZp, kCc, kCf, kCs, kCo,
};

struct GcRange {
  uint32_t first, last;
  uint8_t gc;
};
extern const GcRange kGcRanges[];
extern const size_t kGcRangeCount;
extern const char kUnicodeVersion[];

Gc Category(uint32_t cp);
inline bool IsLetter(Gc g) { return g >= Gc::kLu && g <= Gc::kLo; }
inline bool IsMark(Gc g) { return g >= Gc::kMn && g <= Gc::kMe; }
inline bool IsNumber(Gc g) { return g >= Gc::kNd && g <= Gc::kNo; }
inline bool IsPunct(Gc g) { return g >= Gc::kPc && g <= Gc::kPo; }
inline bool IsSymbol(Gc g) { return g >= Gc::kSm && g <= Gc::kSo; }
// Unicode White_Space (what \s matches in Oniguruma and Rust regex).
bool IsWhitespace(uint32_t cp);

// Decodes the code point at s[i]; sets *len to its byte length (1..4). Invalid or truncated
// sequences, overlongs and surrogates decode as 0xFFFD with *len = 1.
uint32_t DecodeUtf8(std::string_view s, size_t i, size_t *len);
void AppendUtf8(uint32_t cp, std::string *out);
// Length of the longest prefix of `s` that is a sequence of complete, valid UTF-8 characters.
size_t ValidUtf8Prefix(std::string_view s);

}  // namespace strata::text
