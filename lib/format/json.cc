// The bounded JSON reader: nlohmann's SAX parser (iterative: it keeps its own stack of open values)
// feeding nlohmann's DOM builder through a front end that counts the nesting depth, catches duplicate
// keys and records syntax errors instead of throwing. Nothing here recurses on the input's shape
// except JsonExcerpt, whose recursion the depth limit bounds.
#include "lib/util/hash_containers.h"
#include "lib/format/json.h"

#include <algorithm>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"

namespace strata::format {
namespace {

using json = nlohmann::json;

// Parser messages quote the offending token, which in a hostile file can be megabytes long.
std::string Clip(std::string s, size_t max = 200) {
  if (s.size() > max) {
    s.resize(max);
    s += "...";
  }
  return s;
}

// SAX front end over nlohmann's DOM builder: forwards every event, stops at the first array or object
// past the depth limit, tracks the keys of each open object so a duplicate is caught (and named, with
// the top-level key it sits under), and records the parse error instead of throwing.
class CheckingSax {
 public:
  using number_integer_t = json::number_integer_t;
  using number_unsigned_t = json::number_unsigned_t;
  using number_float_t = json::number_float_t;
  using string_t = json::string_t;
  using binary_t = json::binary_t;

  CheckingSax(json *root, const JsonOptions &options)
      : dom_(*root, /*allow_exceptions=*/false), options_(options) {}

  bool null() { return dom_.null(); }
  bool boolean(bool v) { return dom_.boolean(v); }
  bool number_integer(number_integer_t v) { return dom_.number_integer(v); }
  bool number_unsigned(number_unsigned_t v) { return dom_.number_unsigned(v); }
  bool number_float(number_float_t v, const string_t &s) { return dom_.number_float(v, s); }
  bool string(string_t &v) { return dom_.string(v); }
  bool binary(binary_t &v) { return dom_.binary(v); }
  bool start_object(std::size_t n) {
    if (!Enter()) return false;
    if (options_.reject_duplicates) keys_.emplace_back();
    return dom_.start_object(n);
  }
  bool key(string_t &k) {
    if (depth_ == 1) top_key_ = k;
    if (options_.reject_duplicates && !keys_.back().insert(k).second) {
      duplicate_ = k;
      duplicate_depth_ = keys_.size();
      return false;  // stop: the document is refused anyway
    }
    return dom_.key(k);
  }
  bool end_object() {
    --depth_;
    if (options_.reject_duplicates) keys_.pop_back();
    return dom_.end_object();
  }
  bool start_array(std::size_t n) { return Enter() && dom_.start_array(n); }
  bool end_array() {
    --depth_;
    return dom_.end_array();
  }
  bool parse_error(std::size_t pos, const std::string &, const nlohmann::detail::exception &ex) {
    error_pos_ = pos;
    error_ = Clip(ex.what());
    return false;
  }

  bool too_deep_ = false;
  std::optional<std::string> duplicate_;
  size_t duplicate_depth_ = 0;
  std::string top_key_;  // the top-level key being parsed (a tensor name in safetensors)
  std::optional<std::string> error_;
  size_t error_pos_ = 0;

 private:
  bool Enter() {
    if (++depth_ > options_.max_depth) {
      too_deep_ = true;
      return false;
    }
    return true;
  }

  nlohmann::detail::json_sax_dom_parser<json> dom_;
  const JsonOptions &options_;
  int depth_ = 0;
  std::vector<HashSet<std::string>> keys_;
};

// A string as JSON text, cut to about `room` bytes first (invalid UTF-8 from the cut is replaced).
void QuoteInto(const std::string &s, size_t room, std::string *out) {
  *out += json(s.substr(0, std::min(s.size(), room + 1))).dump(-1, ' ', false, json::error_handler_t::replace);
}

void ExcerptInto(const json &v, size_t max, int depth, std::string *out) {
  if (out->size() > max) return;
  const bool object = v.is_object();
  if (object || v.is_array()) {
    if (depth >= kJsonMaxDepth) {
      *out += object ? "{...}" : "[...]";
      return;
    }
    *out += object ? '{' : '[';
    bool first = true;
    for (auto it = v.begin(); it != v.end(); ++it) {
      if (out->size() > max) return;
      if (!first) *out += ',';
      first = false;
      if (object) {
        QuoteInto(it.key(), max - std::min(max, out->size()), out);
        *out += ':';
      }
      ExcerptInto(*it, max, depth + 1, out);
    }
    *out += object ? '}' : ']';
  } else if (v.is_string()) {
    QuoteInto(v.get_ref<const std::string &>(), max - std::min(max, out->size()), out);
  } else {
    *out += v.dump();  // a number, a boolean or null: a few bytes
  }
}

}  // namespace

absl::StatusOr<json> ParseJson(std::string_view text, moe_status code, const std::string &name,
                               const JsonOptions &options) {
  json value;
  CheckingSax sax(&value, options);
  const bool ok = json::sax_parse(text.data(), text.data() + text.size(), &sax, json::input_format_t::json,
                                  /*strict=*/true, /*ignore_comments=*/false);
  if (sax.too_deep_) {
    return Errorf(code, "%s: arrays and objects nested more than %d levels deep", name, options.max_depth);
  }
  if (sax.duplicate_) {
    if (sax.duplicate_depth_ == 1) {
      return MakeError(code, absl::StrCat(name, ": duplicate key '", Clip(*sax.duplicate_), "'"));
    }
    return MakeError(code, absl::StrCat(name, ": duplicate key '", Clip(*sax.duplicate_), "' inside '",
                                        Clip(sax.top_key_), "'"));
  }
  if (sax.error_) {
    return MakeError(code, absl::StrCat(name, ": not valid JSON at byte ", sax.error_pos_, ": ", *sax.error_));
  }
  if (!ok) return MakeError(code, absl::StrCat(name, ": not valid JSON"));
  return value;
}

std::string JsonExcerpt(const json &value, size_t max_chars) {
  std::string out;
  ExcerptInto(value, max_chars, 0, &out);
  if (out.size() > max_chars) {
    size_t n = max_chars;
    while (n > 0 && (static_cast<unsigned char>(out[n]) & 0xC0) == 0x80) --n;  // not inside a character
    out.resize(n);
    out += "...";
  }
  return out;
}

}  // namespace strata::format
