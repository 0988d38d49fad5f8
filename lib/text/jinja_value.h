// Values of the Jinja engine (lib/text/jinja.h): Python's data model as jinja2 sees it — None, bool,
// int, float, str, list, tuple, dict (insertion-ordered), namespace, callables and jinja2's default
// Undefined. Strings carry the byte ranges that came from the caller (message contents, roles, tool
// schemas), so the rendered text can tell the template's own bytes from the caller's.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "lib/util/status.h"

namespace strata::text::jinja {

// A byte range [begin, end) of a string that came from the caller.
struct Span {
  size_t begin, end;
};

// Appends `s` (with its caller spans `spans`, relative to s) to `out` / `out_spans`, merging spans
// that touch.
void AppendTainted(std::string *out, std::vector<Span> *out_spans, std::string_view s, const std::vector<Span> &spans);

// Values nest at most this deep (the evaluator refuses deeper ones, except through a namespace that
// holds itself, which printing cuts off here).
constexpr uint32_t kMaxNesting = 128;
constexpr int kMaxReprDepth = 256;
constexpr size_t kMaxText = size_t{8} << 20;        // printing stops past this many bytes
constexpr uint64_t kMaxVisits = uint64_t{1} << 22;  // values one comparison or taint check visits

// The work one render does inside single operations: values visited by comparisons, taint checks
// and printing, bytes scanned by string operations (one unit per 64), items scanned by lookups.
// Counted per thread (a render runs on one thread); the evaluator starts it and refuses to go on
// once it passes the limit, so a loop cannot repeat an expensive operation without end.
namespace work {
void Start(uint64_t limit);
void Charge(uint64_t units);
inline void ChargeBytes(size_t n) { Charge(n / 64 + 1); }
bool Exhausted();
}  // namespace work

enum class Kind : uint8_t {
  kUndefined,
  kNone,
  kBool,
  kInt,
  kFloat,
  kString,
  kList,
  kTuple,
  kDict,
  kNamespace,
  kCallable
};

class Value;
struct Dict;
struct CallArgs;
class Evaluator;
using List = std::vector<Value>;
using Function = std::function<absl::StatusOr<Value>(Evaluator &, CallArgs &)>;

class Value {
 public:
  Value() = default;
  static Value Undefined(std::string hint = "") {
    Value v;
    v.str = std::move(hint);
    return v;
  }
  static Value None() { return Of(Kind::kNone); }
  static Value Bool(bool b) {
    Value v = Of(Kind::kBool);
    v.i = b;
    return v;
  }
  static Value Int(int64_t x) {
    Value v = Of(Kind::kInt);
    v.i = x;
    return v;
  }
  static Value Float(double x) {
    Value v = Of(Kind::kFloat);
    v.f = x;
    return v;
  }
  static Value Str(std::string s) {
    Value v = Of(Kind::kString);
    v.str = std::move(s);
    return v;
  }
  // A string wholly from the caller.
  static Value CallerStr(std::string s) {
    Value v = Str(std::move(s));
    if (!v.str.empty()) v.spans.push_back({0, v.str.size()});
    return v;
  }
  static Value MakeList(List items, bool tuple = false) {
    Value v = Of(tuple ? Kind::kTuple : Kind::kList);
    for (const Value &x : items) v.depth = std::max(v.depth, x.depth + 1);
    v.list = std::make_shared<List>(std::move(items));
    return v;
  }
  static Value MakeDict();
  static Value MakeNamespace();
  static Value Fn(std::string name, Function fn) {
    Value v = Of(Kind::kCallable);
    v.str = std::move(name);
    v.fn = std::make_shared<Function>(std::move(fn));
    return v;
  }

  Kind kind = Kind::kUndefined;
  uint32_t depth = 0;            // containers: 1 + the deepest value inside (as built; bounds recursion)
  int64_t i = 0;                 // kBool (0/1), kInt
  double f = 0;                  // kFloat
  std::string str;               // kString: the text; kUndefined: why it is undefined; kCallable: its name
  std::vector<Span> spans;       // kString: caller bytes, sorted and disjoint
  std::shared_ptr<List> list;    // kList, kTuple
  std::shared_ptr<Dict> dict;    // kDict, kNamespace
  std::shared_ptr<Function> fn;  // kCallable

  bool is_undefined() const { return kind == Kind::kUndefined; }
  bool is_none() const { return kind == Kind::kNone; }
  bool is_string() const { return kind == Kind::kString; }
  bool is_number() const { return kind == Kind::kInt || kind == Kind::kFloat || kind == Kind::kBool; }
  bool is_list() const { return kind == Kind::kList || kind == Kind::kTuple; }
  bool is_mapping() const { return kind == Kind::kDict || kind == Kind::kNamespace; }
  // Any caller byte inside (recursively for containers; true past kMaxVisits values, which only a
  // list built from copies of itself reaches).
  bool tainted() const;
  // Sets key -> value in a dict or namespace, keeping `depth`.
  void Set(Value key, Value value);
  double as_double() const { return kind == Kind::kFloat ? f : static_cast<double>(i); }

 private:
  static Value Of(Kind k) {
    Value v;
    v.kind = k;
    return v;
  }
};

// Insertion-ordered mapping (Python dict); keys are compared with Python equality.
struct Dict {
  std::vector<std::pair<Value, Value>> items;
  const Value *Find(const Value &key) const;
  const Value *Find(std::string_view key) const;
  void Set(Value key, Value value);
};

struct CallArgs {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
  // Takes the argument by position or keyword; `fallback` when neither was given.
  Value Get(size_t index, std::string_view name, Value fallback = Value::Undefined()) const;
  bool Has(size_t index, std::string_view name) const;
};

// Python truthiness (jinja2's Undefined is falsy).
bool Truthy(const Value &v);
// Python == (identical containers are equal without a visit; past kMaxVisits values compared,
// unequal: only lists built from copies of themselves get there).
bool Equal(const Value &a, const Value &b);
// Python's str(v) as jinja2 prints it ({{ v }}); `out_spans` gets the caller spans (a container's
// text is wholly the caller's when anything inside it is).
// Appending stops once *out passes `limit` bytes (the caller checks its size).
void AppendStr(const Value &v, std::string *out, std::vector<Span> *out_spans, size_t limit = kMaxText);
std::string ToStr(const Value &v);
Value ToStrValue(const Value &v);
// Python's repr(v).
void AppendRepr(const Value &v, std::string *out, int level = 0, size_t limit = kMaxText);
// json.dumps(v, ensure_ascii, indent=indent (<0: none), sort_keys) with the given separators.
struct JsonStyle {
  bool ensure_ascii = false;
  int indent = -1;
  std::string item_sep = ", ", key_sep = ": ";
  bool sort_keys = false;
  size_t max_bytes = SIZE_MAX;  // MOE_ERR_LIMIT past this much text
};
absl::Status AppendJson(const Value &v, const JsonStyle &style, int depth, std::string *out);
// Python's repr of a float ("1.0", "0.1", "1e+20").
std::string FloatRepr(double d);
// The name jinja2 gives a value's type in messages ("dict object", "str object").
std::string TypeName(const Value &v);

// Code points of UTF-8 text (an invalid byte is one code point), for Python's str indexing.
std::vector<std::string_view> CodePoints(std::string_view s);

// Python whitespace (str.isspace) at s[i]; sets *len.
bool PySpaceAt(std::string_view s, size_t i, size_t *len);
// str.strip / lstrip / rstrip without arguments (Unicode whitespace) or with a set of characters.
std::string_view PyStrip(std::string_view s, bool left, bool right);
std::string_view PyStripChars(std::string_view s, std::string_view chars, bool left, bool right);

}  // namespace strata::text::jinja
