// SafeText: whatever bytes go in, one line of valid UTF-8 without control characters comes out,
// and text that was already safe comes out unchanged.
#include <catch2/catch.hpp>

#include <random>
#include <string>

#include "lib/util/safe_text.h"

namespace {

// True when `s` is well-formed UTF-8 with no C0/C1 control character and no DEL.
bool IsSafe(const std::string &s) {
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c == 0x7F) return false;
    if (c < 0x80) { ++i; continue; }
    size_t n = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC2 ? 2 : 0;
    if (n == 0 || c > 0xF4 || i + n > s.size()) return false;
    uint32_t cp = c & (n == 2 ? 0x1F : n == 3 ? 0x0F : 0x07);
    for (size_t k = 1; k < n; ++k) {
      const auto b = static_cast<unsigned char>(s[i + k]);
      if ((b & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (b & 0x3F);
    }
    if ((n == 3 && cp < 0x800) || (n == 4 && (cp < 0x10000 || cp > 0x10FFFF))) return false;
    if (cp >= 0xD800 && cp <= 0xDFFF) return false;
    if (cp >= 0x80 && cp <= 0x9F) return false;
    i += n;
  }
  return true;
}

}  // namespace

TEST_CASE("SafeText escapes controls, NUL and invalid UTF-8, and nothing else", "[util]") {
  CHECK(strata::SafeText(std::string("a\0b", 3)) == "a\\x00b");
  CHECK(strata::SafeText("x\xff\x1b[2Jy\n") == "x\\xff\\x1b[2Jy\\n");
  CHECK(strata::SafeText("\xed\xa0\x80") == "\\xed\\xa0\\x80");      // a surrogate
  CHECK(strata::SafeText("\xc0\xaf") == "\\xc0\\xaf");                // overlong '/'
  CHECK(strata::SafeText("\xc2\x9b") == "\\xc2\\x9b");                // C1 CSI
  CHECK(strata::SafeText("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80") == "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80");
  CHECK(strata::SafeText(std::string(100, 'a'), 10) == std::string(10, 'a') + "...");
  std::mt19937 rng(std::random_device{}());
  for (int round = 0; round < 2000; ++round) {
    std::string in(rng() % 64, '\0');
    for (char &c : in) c = static_cast<char>(rng());
    const std::string out = strata::SafeText(in);
    INFO("round " << round);
    CHECK(IsSafe(out));
    // Safe text passes through unchanged.
    if (IsSafe(in)) CHECK(out == in);
    CHECK(strata::SafeText(out) == out);
  }
}
