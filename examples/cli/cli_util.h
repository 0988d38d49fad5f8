// Small parsers shared by the CLI's commands: sizes ("512M", "8G", plain bytes), integer lists.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace strata::cli {

// "123", "512K", "512M", "8G", "1T" (binary multiples; optional trailing "B" or "iB").
std::optional<uint64_t> ParseSize(const std::string &s);
// "1,2,3" -> {1,2,3}; nullopt on anything else (empty items, signs, overflow).
std::optional<std::vector<int32_t>> ParseTokenList(const std::string &s);
std::optional<int64_t> ParseInt(const std::string &s, int64_t lo, int64_t hi);

}  // namespace strata::cli
