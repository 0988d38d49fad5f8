// jinja2's filters and tests, as chat templates use them; tojson is transformers' (json.dumps with
// ensure_ascii=False, no HTML escaping). A filter given a value of the wrong type is an error
// naming the filter, never a guess.
#include <algorithm>
#include <cmath>

#include "lib/text/jinja_eval.h"

namespace strata::text::jinja {

using namespace internal;

namespace {

constexpr const char *kFilters[] = {
    "abs",   "attr",   "capitalize", "count",      "d",      "default", "dictsort",   "e",        "escape",
    "first", "float",  "format",     "indent",     "int",    "items",   "join",       "last",     "length",
    "list",  "lower",  "map",        "max",        "min",    "reject",  "rejectattr", "replace",  "reverse",
    "round", "safe",   "select",     "selectattr", "sort",   "string",  "sum",        "title",    "tojson",
    "trim",  "unique", "upper",      "wordcount",  "center", "batch",   "groupby",    "truncate",
};
constexpr const char *kTests[] = {
    "boolean",  "callable", "defined",  "divisibleby", "eq",          "equalto", "escaped", "even",
    "false",    "filter",   "float",    "ge",          "greaterthan", "gt",      "in",      "integer",
    "iterable", "le",       "lessthan", "lower",       "lt",          "mapping", "ne",      "none",
    "number",   "odd",      "sameas",   "sequence",    "string",      "test",    "true",    "undefined",
    "upper",    "==",       "!=",       "<",           "<=",          ">",       ">=",
};

bool In(std::string_view name, const char *const *begin, const char *const *end) {
  for (auto p = begin; p != end; ++p)
    if (name == *p) return true;
  return false;
}

absl::StatusOr<List> Items(const Value &v, const char *filter) {
  if (v.is_none()) return Bad(std::string(filter) + ": 'NoneType' object is not iterable");
  return Iterate(v);
}

// select / reject / selectattr / rejectattr.
absl::StatusOr<Value> Select(Evaluator &ev, const Value &v, CallArgs &args, bool attr, bool keep) {
  STRATA_ASSIGN_OR_RETURN(List items, Items(v, "select"));
  size_t next = 0;
  std::string path;
  if (attr) {
    const Value a = args.Get(next++, "attribute");
    if (!a.is_string()) return Bad("selectattr / rejectattr need an attribute name");
    path = a.str;
  }
  std::string test;
  if (next < args.pos.size()) {
    test = S(args.pos[next++]);
    if (!IsTest(test)) return Bad("no test named '" + test + "'");
  }
  CallArgs rest;
  rest.pos.assign(args.pos.begin() + std::min(next, args.pos.size()), args.pos.end());
  List out;
  for (const Value &item : items) {
    STRATA_RETURN_IF_ERROR(ev.Step());
    Value x = item;
    if (attr) {
      STRATA_ASSIGN_OR_RETURN(x, AttrPath(ev, item, path));
    }
    bool r;
    if (test.empty()) {
      r = Truthy(x);
    } else {
      CallArgs a = rest;
      STRATA_ASSIGN_OR_RETURN(r, ApplyTest(ev, test, x, a));
    }
    if (r == keep) out.push_back(item);
  }
  return Value::MakeList(std::move(out));
}

absl::StatusOr<Value> Map(Evaluator &ev, const Value &v, CallArgs &args) {
  STRATA_ASSIGN_OR_RETURN(List items, Items(v, "map"));
  List out;
  const Value attribute = args.Get(99, "attribute");
  if (attribute.is_string()) {
    const Value dflt = args.Get(99, "default");
    for (const Value &item : items) {
      STRATA_ASSIGN_OR_RETURN(Value x, AttrPath(ev, item, attribute.str));
      out.push_back(x.is_undefined() && !dflt.is_undefined() ? dflt : x);
    }
    return Value::MakeList(std::move(out));
  }
  if (args.pos.empty()) return Bad("map needs a filter name or attribute=");
  const std::string filter = S(args.pos[0]);
  if (!IsFilter(filter)) return Bad("no filter named '" + filter + "'");
  CallArgs rest;
  rest.pos.assign(args.pos.begin() + 1, args.pos.end());
  rest.kw = args.kw;
  for (const Value &item : items) {
    STRATA_RETURN_IF_ERROR(ev.Step());
    CallArgs a = rest;
    STRATA_ASSIGN_OR_RETURN(Value x, ApplyFilter(ev, filter, item, a));
    out.push_back(std::move(x));
  }
  return Value::MakeList(std::move(out));
}

absl::Status SortValues(List *items, bool case_sensitive, bool reverse,
                        const std::function<Value(const Value &)> &key) {
  absl::Status st;
  std::stable_sort(items->begin(), items->end(), [&](const Value &a, const Value &b) {
    if (!st.ok()) return false;
    auto r = Less(Folded(key(reverse ? b : a), case_sensitive), Folded(key(reverse ? a : b), case_sensitive));
    if (!r.ok()) {
      st = r.status();
      return false;
    }
    return *r;
  });
  return st;
}

std::string HtmlEscape(const std::string &s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

}  // namespace

bool IsFilter(std::string_view name) { return In(name, std::begin(kFilters), std::end(kFilters)); }
bool IsTest(std::string_view name) { return In(name, std::begin(kTests), std::end(kTests)); }

absl::StatusOr<Value> ApplyFilter(Evaluator &ev, std::string_view name, const Value &v, CallArgs &args) {
  STRATA_RETURN_IF_ERROR(ev.Step());
  // A filter scans its input once (the work of visiting nested values is charged where it happens).
  if (v.is_string()) work::ChargeBytes(v.str.size());
  if (v.is_list()) work::Charge(v.list->size());
  const std::string n(name);
  if (n == "default" || n == "d") {
    const bool boolean = Truthy(args.Get(1, "boolean", Value::Bool(false)));
    if (v.is_undefined() || (boolean && !Truthy(v))) return args.Get(0, "default_value", Value::Str(""));
    return v;
  }
  if (n == "safe") return v;
  if (n == "string") {
    Value r = ToStrValue(v);
    STRATA_RETURN_IF_ERROR(ev.CheckSize(r.str.size()));
    return r;
  }
  if (n == "tojson") return ToJson(v, args, ev.limits().max_output);
  if (n == "length" || n == "count") {
    if (v.is_number() || v.is_none() || v.kind == Kind::kCallable)
      return Bad(n + ": object of type '" + TypeName(v) + "' has no len()");
    return Value::Int(Len(v));
  }
  if (n == "trim") {
    const Value chars = args.Get(0, "chars", Value::None());
    const Value s = ToStrValue(v);
    if (chars.is_none()) return Derived(s, std::string(PyStrip(s.str, true, true)));
    return Derived(s, std::string(PyStripChars(s.str, S(chars), true, true)));
  }
  if (n == "upper" || n == "lower" || n == "capitalize" || n == "title") {
    const Value s = ToStrValue(v);
    if (n == "upper") return Derived(s, PyUpper(s.str));
    if (n == "lower") return Derived(s, PyLower(s.str));
    if (n == "capitalize") return Derived(s, Capitalize(s.str));
    return Derived(s, JinjaTitle(s.str));
  }
  if (n == "replace") {
    const Value s = ToStrValue(v);
    const Value from = ToStrValue(args.Get(0, "old")), to = ToStrValue(args.Get(1, "new"));
    const Value count = args.Get(2, "count", Value::None());
    int64_t c = -1;
    if (!count.is_none()) {
      STRATA_ASSIGN_OR_RETURN(c, ToIndex(count, "replace count"));
    }
    STRATA_ASSIGN_OR_RETURN(std::string r, Replace(s.str, from.str, to.str, c, ev.limits().max_output));
    return s.tainted() || to.tainted() ? Value::CallerStr(std::move(r)) : Value::Str(std::move(r));
  }
  if (n == "e" || n == "escape") return Derived(v, HtmlEscape(S(v)));
  if (n == "format") {
    Value tuple = Value::MakeList(args.pos, true);
    return PercentFormat(ToStrValue(v), tuple);
  }
  if (n == "indent") return Indent(v, args, ev.limits().max_output);
  if (n == "center" || n == "truncate" || n == "wordcount") {
    const std::string s = S(v);
    if (n == "wordcount") {
      int64_t words = 0;
      bool in_word = false;
      for (char c : s) {
        const bool w = std::isalnum(static_cast<unsigned char>(c)) || c == '_' || static_cast<unsigned char>(c) >= 0x80;
        if (w && !in_word) ++words;
        in_word = w;
      }
      return Value::Int(words);
    }
    return Bad("the '" + n + "' filter is not supported");
  }
  if (n == "int") {
    const Value dflt = args.Get(0, "default", Value::Int(0));
    if (v.kind == Kind::kInt || v.kind == Kind::kBool) return Value::Int(v.i);
    if (v.kind == Kind::kFloat) {
      if (!std::isfinite(v.f) || std::fabs(v.f) > 9.2e18) return dflt;
      return Value::Int(static_cast<int64_t>(v.f));
    }
    if (v.is_string()) {
      const std::string t(PyStrip(v.str, true, true));
      char *end = nullptr;
      errno = 0;
      const long long x = std::strtoll(t.c_str(), &end, 10);
      if (!t.empty() && end == t.c_str() + t.size() && errno == 0) return Value::Int(x);
      const double d = std::strtod(t.c_str(), &end);
      if (!t.empty() && end == t.c_str() + t.size() && std::isfinite(d) && std::fabs(d) < 9.2e18)
        return Value::Int(static_cast<int64_t>(d));
    }
    return dflt;
  }
  if (n == "float") {
    const Value dflt = args.Get(0, "default", Value::Float(0));
    if (v.is_number()) return Value::Float(v.as_double());
    if (v.is_string()) {
      const std::string t(PyStrip(v.str, true, true));
      char *end = nullptr;
      const double d = std::strtod(t.c_str(), &end);
      if (!t.empty() && end == t.c_str() + t.size()) return Value::Float(d);
    }
    return dflt;
  }
  if (n == "abs") {
    if (v.kind == Kind::kFloat) return Value::Float(std::fabs(v.f));
    if (v.kind == Kind::kInt || v.kind == Kind::kBool) {
      if (v.i == INT64_MIN) return Bad("integer overflow");
      return Value::Int(v.i < 0 ? -v.i : v.i);
    }
    return Bad("abs: bad operand type '" + TypeName(v) + "'");
  }
  if (n == "round") {
    if (!v.is_number()) return Bad("round: needs a number, not " + TypeName(v));
    STRATA_ASSIGN_OR_RETURN(int64_t prec, ToIndex(args.Get(0, "precision", Value::Int(0)), "round precision"));
    const std::string method = S(args.Get(1, "method", Value::Str("common")));
    if (method == "common") {
      if (v.kind != Kind::kFloat) return Value::Int(v.i);
      return Value::Float(PyRound(v.f, prec));
    }
    const double m = std::pow(10.0, static_cast<double>(prec));
    if (method == "ceil") return Value::Float(std::ceil(v.as_double() * m) / m);
    if (method == "floor") return Value::Float(std::floor(v.as_double() * m) / m);
    return Bad("round: method must be 'common', 'ceil' or 'floor'");
  }
  if (n == "first" || n == "last") {
    if (v.is_undefined()) return UndefinedError(v);
    STRATA_ASSIGN_OR_RETURN(List items, Items(v, n.c_str()));
    if (items.empty()) return Value::Undefined(std::string("No ") + n + " item, sequence was empty.");
    return n == "first" ? items.front() : items.back();
  }
  if (n == "list") {
    STRATA_ASSIGN_OR_RETURN(List items, Items(v, "list"));
    return Value::MakeList(std::move(items));
  }
  if (n == "items") {
    if (v.is_undefined()) return Value::MakeList({});
    if (v.kind != Kind::kDict) return Bad("items: can only get item pairs from a mapping, not " + TypeName(v));
    List items;
    for (const auto &kv : v.dict->items) items.push_back(Value::MakeList({kv.first, kv.second}, true));
    return Value::MakeList(std::move(items));
  }
  if (n == "dictsort") {
    if (v.kind != Kind::kDict) return Bad("dictsort: needs a mapping, not " + TypeName(v));
    const bool cs = Truthy(args.Get(0, "case_sensitive", Value::Bool(false)));
    const std::string by = S(args.Get(1, "by", Value::Str("key")));
    const bool reverse = Truthy(args.Get(2, "reverse", Value::Bool(false)));
    const size_t pos = by == "value" ? 1 : 0;
    if (by != "key" && by != "value") return Bad("dictsort: 'by' must be 'key' or 'value'");
    List items;
    for (const auto &kv : v.dict->items) items.push_back(Value::MakeList({kv.first, kv.second}, true));
    STRATA_RETURN_IF_ERROR(SortValues(&items, cs, reverse, [pos](const Value &x) { return (*x.list)[pos]; }));
    return Value::MakeList(std::move(items));
  }
  if (n == "sort") {
    STRATA_ASSIGN_OR_RETURN(List items, Items(v, "sort"));
    const bool reverse = Truthy(args.Get(0, "reverse", Value::Bool(false)));
    const bool cs = Truthy(args.Get(1, "case_sensitive", Value::Bool(false)));
    const Value attribute = args.Get(2, "attribute", Value::None());
    std::vector<std::pair<Value, Value>> keyed;
    for (const Value &x : items) {
      Value k = x;
      if (attribute.is_string()) {
        STRATA_ASSIGN_OR_RETURN(k, AttrPath(ev, x, attribute.str));
      }
      keyed.emplace_back(std::move(k), x);
    }
    List wrapped;
    for (auto &kv : keyed) wrapped.push_back(Value::MakeList({kv.first, kv.second}, true));
    STRATA_RETURN_IF_ERROR(SortValues(&wrapped, cs, reverse, [](const Value &x) { return (*x.list)[0]; }));
    List out;
    for (const Value &w : wrapped) out.push_back((*w.list)[1]);
    return Value::MakeList(std::move(out));
  }
  if (n == "reverse") {
    if (v.is_string()) {
      auto cps = CodePoints(v.str);
      std::string r;
      for (size_t k = cps.size(); k-- > 0;) r.append(cps[k]);
      return Derived(v, std::move(r));
    }
    STRATA_ASSIGN_OR_RETURN(List items, Items(v, "reverse"));
    std::reverse(items.begin(), items.end());
    return Value::MakeList(std::move(items));
  }
  if (n == "join") {
    STRATA_ASSIGN_OR_RETURN(List items, Items(v, "join"));
    const Value sep = ToStrValue(args.Get(0, "d", Value::Str("")));
    const Value attribute = args.Get(1, "attribute", Value::None());
    Value out = Value::Str("");
    for (size_t k = 0; k < items.size(); ++k) {
      Value x = items[k];
      if (attribute.is_string()) {
        STRATA_ASSIGN_OR_RETURN(x, AttrPath(ev, x, attribute.str));
      }
      const Value s = ToStrValue(x);
      if (k) AppendTainted(&out.str, &out.spans, sep.str, sep.spans);
      AppendTainted(&out.str, &out.spans, s.str, s.spans);
      STRATA_RETURN_IF_ERROR(ev.CheckSize(out.str.size()));
    }
    return out;
  }
  if (n == "unique") {
    STRATA_ASSIGN_OR_RETURN(List items, Items(v, "unique"));
    const bool cs = Truthy(args.Get(0, "case_sensitive", Value::Bool(false)));
    const Value attribute = args.Get(1, "attribute", Value::None());
    List out, seen;
    for (const Value &x : items) {
      Value k = x;
      if (attribute.is_string()) {
        STRATA_ASSIGN_OR_RETURN(k, AttrPath(ev, x, attribute.str));
      }
      k = Folded(k, cs);
      bool dup = false;
      for (const Value &s : seen) dup = dup || Equal(s, k);
      if (dup) continue;
      seen.push_back(k);
      out.push_back(x);
    }
    return Value::MakeList(std::move(out));
  }
  if (n == "min" || n == "max") {
    STRATA_ASSIGN_OR_RETURN(List items, Items(v, n.c_str()));
    const bool cs = Truthy(args.Get(0, "case_sensitive", Value::Bool(false)));
    const Value attribute = args.Get(1, "attribute", Value::None());
    if (items.empty()) return Value::Undefined("No aggregated item, sequence was empty.");
    Value best = items[0], best_key;
    for (size_t k = 0; k < items.size(); ++k) {
      Value key = items[k];
      if (attribute.is_string()) {
        STRATA_ASSIGN_OR_RETURN(key, AttrPath(ev, items[k], attribute.str));
      }
      key = Folded(key, cs);
      if (k == 0) {
        best_key = key;
        continue;
      }
      STRATA_ASSIGN_OR_RETURN(bool better, n == "min" ? Less(key, best_key) : Less(best_key, key));
      if (better) best = items[k], best_key = key;
    }
    return best;
  }
  if (n == "sum") {
    STRATA_ASSIGN_OR_RETURN(List items, Items(v, "sum"));
    const Value attribute = args.Get(0, "attribute", Value::None());
    Value total = args.Get(1, "start", Value::Int(0));
    for (const Value &x : items) {
      Value y = x;
      if (attribute.is_string()) {
        STRATA_ASSIGN_OR_RETURN(y, AttrPath(ev, x, attribute.str));
      }
      STRATA_ASSIGN_OR_RETURN(total, BinaryOp(ev, "+", total, y));
    }
    return total;
  }
  if (n == "map") return Map(ev, v, args);
  if (n == "select") return Select(ev, v, args, false, true);
  if (n == "reject") return Select(ev, v, args, false, false);
  if (n == "selectattr") return Select(ev, v, args, true, true);
  if (n == "rejectattr") return Select(ev, v, args, true, false);
  if (n == "attr") return GetAttr(ev, v, S(args.Get(0, "name")));
  if (n == "batch" || n == "groupby") return Bad("the '" + n + "' filter is not supported");
  return Bad("unknown filter '" + n + "'");
}

absl::StatusOr<bool> ApplyTest(Evaluator &ev, std::string_view name, const Value &v, CallArgs &args) {
  const std::string n(name);
  if (n == "defined") return !v.is_undefined();
  if (n == "undefined") return v.is_undefined();
  if (n == "none") return v.is_none();
  if (n == "boolean") return v.kind == Kind::kBool;
  if (n == "true") return v.kind == Kind::kBool && v.i == 1;
  if (n == "false") return v.kind == Kind::kBool && v.i == 0;
  if (n == "integer") return v.kind == Kind::kInt;
  if (n == "float") return v.kind == Kind::kFloat;
  if (n == "number") return v.is_number();
  if (n == "string") return v.is_string();
  if (n == "mapping") return v.kind == Kind::kDict;
  if (n == "iterable") return v.is_string() || v.is_list() || v.kind == Kind::kDict || v.is_undefined();
  if (n == "sequence") return v.is_string() || v.is_list() || v.kind == Kind::kDict;
  if (n == "callable") return v.kind == Kind::kCallable;
  if (n == "escaped") return false;
  if (n == "lower" || n == "upper") {
    if (!v.is_string()) return Bad("the '" + n + "' test needs a string");
    return n == "lower" ? PyLower(v.str) == v.str : PyUpper(v.str) == v.str;
  }
  if (n == "even" || n == "odd" || n == "divisibleby") {
    if (v.kind != Kind::kInt && v.kind != Kind::kBool)
      return Bad("the '" + n + "' test needs an integer, not " + TypeName(v));
    int64_t d = 2;
    if (n == "divisibleby") {
      STRATA_ASSIGN_OR_RETURN(d, ToIndex(args.Get(0, "num"), "divisibleby"));
      if (d == 0) return Bad("integer division or modulo by zero");
    }
    const int64_t r = d == -1 ? 0 : v.i % d;
    return n == "odd" ? r != 0 : r == 0;
  }
  if (n == "filter") return v.is_string() && IsFilter(v.str);
  if (n == "test") return v.is_string() && IsTest(v.str);
  const Value other = args.Get(0, "other");
  if (n == "sameas") {
    if (v.kind != other.kind) return false;
    if (v.is_list()) return v.list == other.list;
    if (v.is_mapping()) return v.dict == other.dict;
    return Equal(v, other);
  }
  if (n == "in") return CompareOp("in", v, args.Get(0, "seq"));
  if (n == "eq" || n == "equalto" || n == "==") return Equal(v, other);
  if (n == "ne" || n == "!=") return !Equal(v, other);
  if (n == "lt" || n == "lessthan" || n == "<") return CompareOp("<", v, other);
  if (n == "le" || n == "<=") return CompareOp("<=", v, other);
  if (n == "gt" || n == "greaterthan" || n == ">") return CompareOp(">", v, other);
  if (n == "ge" || n == ">=") return CompareOp(">=", v, other);
  (void)ev;
  return Bad("unknown test '" + n + "'");
}

}  // namespace strata::text::jinja
