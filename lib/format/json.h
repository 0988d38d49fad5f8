// The one JSON reader of Strata (config.json, model.safetensors.index.json, tokenizer.json,
// tokenizer_config.json, safetensors headers): it never throws, never recurses, refuses documents
// nested deeper than a fixed limit (so no later copy, walk or dump of the value can exhaust the stack)
// and can refuse duplicate keys. JsonExcerpt quotes a value in a message with a bounded length.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "lib/util/status.h"
#include "nlohmann/json.hpp"

namespace strata::format {

// Deeper than any real file (tokenizer.json nests about 6 levels); shallow enough that a recursive
// copy, comparison or dump of an accepted value uses a few hundred KiB of stack at most.
inline constexpr int kJsonMaxDepth = 128;

struct JsonOptions {
  bool reject_duplicates = false;  // otherwise the last of two equal keys wins, as in Python
  int max_depth = kJsonMaxDepth;   // arrays and objects nested deeper are refused
};

// Parses `text` as one JSON document. On a syntax error, a document nested past max_depth or a
// refused duplicate key: `code` with "<name>: <what and where>".
absl::StatusOr<nlohmann::json> ParseJson(std::string_view text, moe_status code, const std::string &name,
                                         const JsonOptions &options = {});

// `value` serialised for a message, cut at about `max_chars` (then ending in "..."); the work is
// bounded by max_chars and the depth limit, not by the size of the value.
std::string JsonExcerpt(const nlohmann::json &value, size_t max_chars = 120);

}  // namespace strata::format
