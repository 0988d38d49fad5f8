// A Jinja template engine for chat templates: the subset of jinja2 that the templates in GGUF files
// (tokenizer.chat_template) and HF tokenizer_config.json use, rendering byte-identical to
// transformers' apply_chat_template (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks,
// loopcontrols, its tojson / raise_exception / strftime_now). Templates are untrusted input: every
// malformed one is an error naming the line, and rendering is bounded in depth, steps and output.
// Split by concern: jinja_lexer.cc, jinja_parser.cc (syntax, jinja_ast.h), jinja_eval.cc
// (statements and expressions), jinja_builtins.cc (methods, operators, lookups, globals),
// jinja_filters.cc (filters and tests), jinja_strings.cc (Python's string algorithms),
// jinja_value.{h,cc} (Python's data model and printing).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "lib/text/jinja_value.h"
#include "nlohmann/json_fwd.hpp"

namespace strata::text::jinja {

struct Program;

struct RenderLimits {
  size_t max_output = size_t{8} << 20;  // bytes of output, and of any one string built
  size_t max_items = size_t{1} << 18;   // items of any one list built (range, +, *)
  uint64_t max_steps = 2'000'000;       // statements run, loop iterations, filters and calls
  uint64_t max_work = 128'000'000;      // work inside operations (jinja_value.h, namespace work)
  int max_depth = 256;                  // nested evaluation (expressions, blocks, macro calls)
};

// Rendered text and the byte ranges of it that came from the caller's values (sorted, disjoint).
struct Rendered {
  std::string text;
  std::vector<Span> caller_spans;
};

class Template {
 public:
  // Parses `source`; MOE_ERR_INVALID_ARGUMENT naming the line and the fault (unclosed block, bad
  // syntax, unknown filter or test, unsupported tag).
  static absl::StatusOr<Template> Parse(std::string_view source);

  // Renders with the variables of `context` (a dict; its entries shadow the globals range,
  // namespace, dict, raise_exception and strftime_now). Errors: MOE_ERR_INVALID_ARGUMENT naming the
  // line for a runtime fault or raise_exception's message; MOE_ERR_LIMIT when a limit is reached.
  absl::StatusOr<Rendered> Render(const Value &context, const RenderLimits &limits = {}) const;

 private:
  explicit Template(std::shared_ptr<const Program> p) : program_(std::move(p)) {}
  std::shared_ptr<const Program> program_;
};

// A JSON document as a Jinja value (objects keep their key order); strings are the caller's when
// `caller` is set.
Value FromJson(const nlohmann::ordered_json &j, bool caller);

}  // namespace strata::text::jinja
