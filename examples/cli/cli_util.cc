// CLI parsers: strict, whole-string, overflow-checked.
#include "examples/cli/cli_util.h"

#include <cctype>

namespace strata::cli {

std::optional<int64_t> ParseInt(const std::string &s, int64_t lo, int64_t hi) {
  if (s.empty()) return std::nullopt;
  size_t i = 0;
  bool neg = false;
  if (s[0] == '-') {
    neg = true;
    i = 1;
  }
  if (i == s.size()) return std::nullopt;
  uint64_t v = 0;
  for (; i < s.size(); ++i) {
    if (!std::isdigit(static_cast<unsigned char>(s[i]))) return std::nullopt;
    if (v > (UINT64_MAX - 9) / 10) return std::nullopt;
    v = v * 10 + static_cast<uint64_t>(s[i] - '0');
    if (v > (1ull << 62)) return std::nullopt;
  }
  int64_t r = neg ? -static_cast<int64_t>(v) : static_cast<int64_t>(v);
  if (r < lo || r > hi) return std::nullopt;
  return r;
}

std::optional<uint64_t> ParseSize(const std::string &s) {
  size_t i = 0;
  uint64_t v = 0;
  while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) {
    if (v > (UINT64_MAX - 9) / 10) return std::nullopt;
    v = v * 10 + static_cast<uint64_t>(s[i] - '0');
    ++i;
  }
  if (i == 0) return std::nullopt;
  std::string suf = s.substr(i);
  for (auto &c : suf) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (suf.size() >= 2 && suf.compare(suf.size() - 2, 2, "IB") == 0) suf.resize(suf.size() - 2);
  else if (suf.size() >= 2 && suf.back() == 'B') suf.pop_back();
  int shift = 0;
  if (suf.empty() || suf == "B") shift = 0;
  else if (suf == "K") shift = 10;
  else if (suf == "M") shift = 20;
  else if (suf == "G") shift = 30;
  else if (suf == "T") shift = 40;
  else return std::nullopt;
  if (shift && v > (UINT64_MAX >> shift)) return std::nullopt;
  return v << shift;
}

std::optional<std::vector<int32_t>> ParseTokenList(const std::string &s) {
  std::vector<int32_t> out;
  size_t start = 0;
  if (s.empty()) return std::nullopt;
  while (start <= s.size()) {
    size_t comma = s.find(',', start);
    std::string item = s.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    auto v = ParseInt(item, 0, INT32_MAX);
    if (!v) return std::nullopt;
    out.push_back(static_cast<int32_t>(*v));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

}  // namespace strata::cli
