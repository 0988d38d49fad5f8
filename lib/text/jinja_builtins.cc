// The Jinja built-ins chat templates use: the str / dict / list methods jinja2's immutable sandbox
// allows, Python's operators, attribute and item lookup, and transformers' globals (raise_exception,
// strftime_now) and tojson (json.dumps with ensure_ascii=False). Filters and tests are in
// jinja_filters.cc, Python's string algorithms in jinja_strings.cc.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>

#include "lib/text/jinja_eval.h"
#include "lib/text/unicode.h"

namespace strata::text::jinja {
namespace internal {

absl::Status Bad(std::string msg) { return MakeError(MOE_ERR_INVALID_ARGUMENT, std::move(msg)); }

absl::Status UndefinedError(const Value &v) { return Bad(v.str.empty() ? "an undefined value was used" : v.str); }

// Python's str() of a value without caller spans.
std::string S(const Value &v) { return ToStr(v); }

int64_t Len(const Value &v) {
  switch (v.kind) {
    case Kind::kString:
      return static_cast<int64_t>(CodePoints(v.str).size());
    case Kind::kList:
    case Kind::kTuple:
      return static_cast<int64_t>(v.list->size());
    case Kind::kDict:
    case Kind::kNamespace:
      return static_cast<int64_t>(v.dict->items.size());
    default:
      return 0;
  }
}

absl::StatusOr<int64_t> ToIndex(const Value &v, const char *what) {
  if (v.kind == Kind::kInt || v.kind == Kind::kBool) return v.i;
  return Bad(std::string(what) + " must be an integer, not " + TypeName(v));
}

// Python's str % args for the conversions templates use (%s %d %i %r %f %%).
absl::StatusOr<Value> PercentFormat(const Value &fmt, const Value &args) {
  List items;
  if (args.kind == Kind::kTuple)
    items = *args.list;
  else
    items.push_back(args);
  Value out = Value::Str("");
  size_t next = 0;
  const std::string &f = fmt.str;
  for (size_t k = 0; k < f.size(); ++k) {
    if (f[k] != '%') {
      out.str += f[k];
      continue;
    }
    if (++k >= f.size()) return Bad("incomplete format");
    const char c = f[k];
    if (c == '%') {
      out.str += '%';
      continue;
    }
    if (next >= items.size()) return Bad("not enough arguments for format string");
    const Value &a = items[next++];
    if (c == 's')
      AppendStr(a, &out.str, &out.spans);
    else if (c == 'r')
      AppendRepr(a, &out.str);
    else if ((c == 'd' || c == 'i') && a.is_number())
      out.str += std::to_string(a.kind == Kind::kFloat ? static_cast<int64_t>(a.f) : a.i);
    else if (c == 'f' && a.is_number())
      out.str += StrFormat("%f", a.as_double());
    else
      return Bad(std::string("unsupported format character '") + c + "' or argument type");
  }
  if (next < items.size() && args.kind == Kind::kTuple)
    return Bad("not all arguments converted during string formatting");
  if (fmt.tainted()) return Derived(fmt, out.str);
  return out;
}

// Python's str.format for {} / {0} / {name} fields (no format specs beyond none).
absl::StatusOr<Value> BraceFormat(const Value &fmt, CallArgs &args) {
  Value out = Value::Str("");
  const std::string &f = fmt.str;
  size_t auto_index = 0;
  for (size_t k = 0; k < f.size(); ++k) {
    const char c = f[k];
    if (c == '{' && k + 1 < f.size() && f[k + 1] == '{') {
      out.str += '{';
      ++k;
    } else if (c == '}' && k + 1 < f.size() && f[k + 1] == '}') {
      out.str += '}';
      ++k;
    } else if (c == '{') {
      const size_t e = f.find('}', k);
      if (e == std::string::npos) return Bad("format: a '{' is never closed");
      const std::string field = f.substr(k + 1, e - k - 1);
      Value v;
      if (field.empty()) {
        if (auto_index >= args.pos.size()) return Bad("format: not enough positional arguments");
        v = args.pos[auto_index++];
      } else if (std::all_of(field.begin(), field.end(), [](char d) { return d >= '0' && d <= '9'; })) {
        const size_t idx = std::stoul(field);
        if (idx >= args.pos.size()) return Bad("format: index " + field + " out of range");
        v = args.pos[idx];
      } else {
        bool found = false;
        for (auto &kv : args.kw)
          if (kv.first == field) v = kv.second, found = true;
        if (!found) return Bad("format: no argument named '" + field + "'");
      }
      AppendStr(v, &out.str, &out.spans);
      k = e;
    } else if (c == '}') {
      return Bad("format: single '}' encountered");
    } else {
      out.str += c;
    }
  }
  if (fmt.tainted()) return Derived(fmt, out.str);
  return out;
}

absl::StatusOr<bool> Less(const Value &a, const Value &b) {
  if (a.is_number() && b.is_number()) return a.as_double() < b.as_double();
  if (a.is_string() && b.is_string()) return a.str < b.str;
  if (a.is_list() && b.is_list() && a.kind == b.kind) {
    const size_t n = std::min(a.list->size(), b.list->size());
    for (size_t k = 0; k < n; ++k) {
      if (Equal((*a.list)[k], (*b.list)[k])) continue;
      return Less((*a.list)[k], (*b.list)[k]);
    }
    return a.list->size() < b.list->size();
  }
  return Bad("'<' not supported between instances of '" + TypeName(a).substr(0, TypeName(a).find(' ')) + "' and '" +
             TypeName(b).substr(0, TypeName(b).find(' ')) + "'");
}

// Sort key for jinja2's case-insensitive filters (sort, dictsort, unique, min, max).
Value Folded(const Value &v, bool case_sensitive) {
  if (!case_sensitive && v.is_string()) return Value::Str(PyLower(v.str));
  return v;
}

// obj.a.b for the filters' `attribute=` arguments (dots walk, digits index).
absl::StatusOr<Value> AttrPath(Evaluator &ev, const Value &obj, const std::string &path) {
  Value cur = obj;
  size_t at = 0;
  while (at <= path.size()) {
    size_t dot = path.find('.', at);
    if (dot == std::string::npos) dot = path.size();
    const std::string part = path.substr(at, dot - at);
    if (cur.is_undefined()) return cur;
    if (!part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      STRATA_ASSIGN_OR_RETURN(cur, GetItem(ev, cur, Value::Int(std::stoll(part))));
    } else {
      STRATA_ASSIGN_OR_RETURN(cur, GetItem(ev, cur, Value::Str(part)));
    }
    at = dot + 1;
  }
  return cur;
}

absl::StatusOr<Value> ToJson(const Value &v, CallArgs &args, size_t cap) {
  // transformers: tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)
  JsonStyle style;
  style.ensure_ascii = Truthy(args.Get(0, "ensure_ascii", Value::Bool(false)));
  const Value indent = args.Get(1, "indent", Value::None());
  if (indent.kind == Kind::kInt || indent.kind == Kind::kBool) {
    style.indent = static_cast<int>(std::max<int64_t>(0, std::min<int64_t>(indent.i, 64)));
  } else if (!indent.is_none() && !indent.is_undefined()) {
    return Bad("tojson: indent must be an integer");
  }
  if (style.indent >= 0) style.item_sep = ",";
  const Value seps = args.Get(2, "separators", Value::None());
  if (seps.is_list() && seps.list->size() == 2) {
    style.item_sep = S((*seps.list)[0]);
    style.key_sep = S((*seps.list)[1]);
  }
  style.sort_keys = Truthy(args.Get(3, "sort_keys", Value::Bool(false)));
  style.max_bytes = cap;
  std::string out;
  STRATA_RETURN_IF_ERROR(AppendJson(v, style, 0, &out));
  return Derived(v, std::move(out));
}

// jinja2's indent filter (width may be a string used as the indentation).
absl::StatusOr<Value> Indent(const Value &v, CallArgs &args, size_t cap) {
  const Value width = args.Get(0, "width", Value::Int(4));
  const bool first = Truthy(args.Get(1, "first", Value::Bool(false)));
  const bool blank = Truthy(args.Get(2, "blank", Value::Bool(false)));
  std::string ind;
  if (width.is_string())
    ind = width.str;
  else if (width.kind == Kind::kInt)
    ind.assign(static_cast<size_t>(std::max<int64_t>(0, std::min<int64_t>(width.i, 256))), ' ');
  else
    return Bad("indent: width must be an integer or a string");
  const std::vector<std::string> lines = SplitLines(S(v) + "\n");
  std::string rv;
  if (blank) {
    for (size_t k = 0; k < lines.size(); ++k) {
      rv += (k ? "\n" + ind : "") + lines[k];
      if (rv.size() > cap)
        return MakeError(MOE_ERR_LIMIT, "indent: the result would pass " + std::to_string(cap) + " bytes");
    }
  } else {
    rv = lines.empty() ? "" : lines[0];
    for (size_t k = 1; k < lines.size(); ++k) {
      rv += "\n" + (lines[k].empty() ? "" : ind + lines[k]);
      if (rv.size() > cap)
        return MakeError(MOE_ERR_LIMIT, "indent: the result would pass " + std::to_string(cap) + " bytes");
    }
  }
  if (first) rv = ind + rv;
  return Derived(v, std::move(rv));  // charges the text made
}

double PyRound(double x, int64_t digits) {
  // Python rounds the exact binary value to `digits` decimals, ties to even: what printf's %.*f
  // does (7.45 is 7.4500000000000001776..., so it rounds up).
  if (!std::isfinite(x)) return x;
  if (digits >= 0) {
    char buf[512];
    std::snprintf(buf, sizeof buf, "%.*f", static_cast<int>(std::min<int64_t>(digits, 300)), x);
    return std::strtod(buf, nullptr);
  }
  const double m = std::pow(10.0, static_cast<double>(-digits));
  return std::nearbyint(x / m) * m;
}

}  // namespace internal

using namespace internal;

Value Derived(const Value &src, std::string s) {
  work::ChargeBytes(s.size());
  return src.tainted() ? Value::CallerStr(std::move(s)) : Value::Str(std::move(s));
}

absl::StatusOr<List> Iterate(const Value &v) {
  if (v.is_list()) work::Charge(v.list->size());
  if (v.is_mapping()) work::Charge(v.dict->items.size());
  if (v.is_string()) work::ChargeBytes(v.str.size() * 64);  // one unit per character made
  switch (v.kind) {
    case Kind::kUndefined:
      return List{};
    case Kind::kList:
    case Kind::kTuple:
      return *v.list;
    case Kind::kDict: {
      List keys;
      for (const auto &kv : v.dict->items) keys.push_back(kv.first);
      return keys;
    }
    case Kind::kString: {
      List chars;
      for (auto cp : CodePoints(v.str)) chars.push_back(Derived(v, std::string(cp)));
      return chars;
    }
    default:
      return Bad("'" + TypeName(v) + "' is not iterable");
  }
}

// ---- operators ----

absl::StatusOr<Value> BinaryOp(Evaluator &ev, std::string_view op, const Value &a, const Value &b) {
  if (op == "~") {
    Value out = ToStrValue(a);
    const Value r = ToStrValue(b);
    STRATA_RETURN_IF_ERROR(ev.CheckSize(out.str.size() + r.str.size()));
    AppendTainted(&out.str, &out.spans, r.str, r.spans);
    return out;
  }
  if (a.is_undefined()) return UndefinedError(a);
  if (b.is_undefined()) return UndefinedError(b);
  const bool nums = a.is_number() && b.is_number();
  const bool ints = nums && a.kind != Kind::kFloat && b.kind != Kind::kFloat;
  auto type_error = [&]() {
    return Bad("unsupported operand type(s) for " + std::string(op) + ": '" +
               TypeName(a).substr(0, TypeName(a).find(' ')) + "' and '" + TypeName(b).substr(0, TypeName(b).find(' ')) +
               "'");
  };
  if (op == "+") {
    if (ints) {
      int64_t r;
      if (__builtin_add_overflow(a.i, b.i, &r)) return Bad("integer overflow");
      return Value::Int(r);
    }
    if (nums) return Value::Float(a.as_double() + b.as_double());
    if (a.is_string() && b.is_string()) {
      STRATA_RETURN_IF_ERROR(ev.CheckSize(a.str.size() + b.str.size()));
      Value out = a;
      AppendTainted(&out.str, &out.spans, b.str, b.spans);
      return out;
    }
    if (a.is_list() && a.kind == b.kind) {
      STRATA_RETURN_IF_ERROR(ev.CheckItems(a.list->size() + b.list->size()));
      List items = *a.list;
      items.insert(items.end(), b.list->begin(), b.list->end());
      return Value::MakeList(std::move(items), a.kind == Kind::kTuple);
    }
    if (a.is_string())
      return Bad("can only concatenate str (not \"" + TypeName(b).substr(0, TypeName(b).find(' ')) + "\") to str");
    return type_error();
  }
  if (op == "*") {
    if (ints) {
      int64_t r;
      if (__builtin_mul_overflow(a.i, b.i, &r)) return Bad("integer overflow");
      return Value::Int(r);
    }
    if (nums) return Value::Float(a.as_double() * b.as_double());
    const Value *seq = a.is_string() || a.is_list() ? &a : &b;
    const Value *times = seq == &a ? &b : &a;
    if ((seq->is_string() || seq->is_list()) && (times->kind == Kind::kInt || times->kind == Kind::kBool)) {
      const int64_t n = std::max<int64_t>(0, times->i);
      const size_t unit = seq->is_string() ? seq->str.size() : seq->list->size();
      const size_t cap = seq->is_string() ? ev.limits().max_output : ev.limits().max_items;
      if (unit > 0 && static_cast<uint64_t>(n) > cap / unit) {
        return seq->is_string() ? ev.CheckSize(SIZE_MAX) : ev.CheckItems(SIZE_MAX);
      }
      if (seq->is_string()) {
        std::string s;
        for (int64_t k = 0; k < n; ++k) s += seq->str;
        return Derived(*seq, std::move(s));
      }
      List items;
      for (int64_t k = 0; k < n; ++k) items.insert(items.end(), seq->list->begin(), seq->list->end());
      return Value::MakeList(std::move(items), seq->kind == Kind::kTuple);
    }
    return type_error();
  }
  if (op == "%" && a.is_string()) return PercentFormat(a, b);
  if (!nums) return type_error();
  if (op == "-") {
    if (ints) {
      int64_t r;
      if (__builtin_sub_overflow(a.i, b.i, &r)) return Bad("integer overflow");
      return Value::Int(r);
    }
    return Value::Float(a.as_double() - b.as_double());
  }
  if (op == "/") {
    if (b.as_double() == 0) return Bad("division by zero");
    return Value::Float(a.as_double() / b.as_double());
  }
  if (op == "//" || op == "%") {
    if (b.as_double() == 0) return Bad(op == "//" ? "integer division or modulo by zero" : "modulo by zero");
    if (ints) {
      if (a.i == INT64_MIN && b.i == -1) return Bad("integer overflow");
      int64_t q = a.i / b.i, r = a.i % b.i;
      if (r != 0 && ((r < 0) != (b.i < 0))) --q, r += b.i;
      return Value::Int(op == "//" ? q : r);
    }
    const double x = a.as_double(), y = b.as_double();
    double r = std::fmod(x, y);
    if (r != 0 && ((r < 0) != (y < 0))) r += y;
    if (op == "%") return Value::Float(r);
    return Value::Float(std::floor((x - r) / y + 0.5));
  }
  if (op == "**") {
    if (ints && b.i >= 0) {
      int64_t r = 1;
      for (int64_t k = 0; k < b.i; ++k)
        if (__builtin_mul_overflow(r, a.i, &r)) return Bad("integer overflow");
      return Value::Int(r);
    }
    return Value::Float(std::pow(a.as_double(), b.as_double()));
  }
  return Bad("unknown operator " + std::string(op));
}

absl::StatusOr<bool> CompareOp(std::string_view op, const Value &a, const Value &b) {
  if (op == "==") return Equal(a, b);
  if (op == "!=") return !Equal(a, b);
  if (op == "in" || op == "not in") {
    bool found = false;
    if (b.is_string()) {
      if (!a.is_string()) {
        if (a.is_undefined()) return UndefinedError(a);
        return Bad("'in <string>' requires string as left operand, not " +
                   TypeName(a).substr(0, TypeName(a).find(' ')));
      }
      work::ChargeBytes(b.str.size());
      found = b.str.find(a.str) != std::string::npos;
    } else if (b.is_list()) {
      for (const Value &x : *b.list) found = found || Equal(a, x);
    } else if (b.kind == Kind::kDict) {
      found = b.dict->Find(a) != nullptr;
    } else if (!b.is_undefined()) {
      return Bad("argument of type '" + TypeName(b).substr(0, TypeName(b).find(' ')) + "' is not iterable");
    }
    return op == "in" ? found : !found;
  }
  if (a.is_undefined()) return UndefinedError(a);
  if (b.is_undefined()) return UndefinedError(b);
  if (op == "<") return Less(a, b);
  if (op == ">") return Less(b, a);
  if (op == "<=") {
    STRATA_ASSIGN_OR_RETURN(bool gt, Less(b, a));
    return !gt;
  }
  if (op == ">=") {
    STRATA_ASSIGN_OR_RETURN(bool lt, Less(a, b));
    return !lt;
  }
  return Bad("unknown comparison " + std::string(op));
}

// ---- attributes and items ----

namespace {

Value Method(std::string name, Function fn) { return Value::Fn(std::move(name), std::move(fn)); }

absl::StatusOr<Value> StrMethod(const Value &obj, const std::string &name) {
  const Value self = obj;
  // Every method scans its string once: charged when called.
  auto m = [&](Function fn) {
    const size_t size = obj.str.size();
    return Method("str." + name, [fn = std::move(fn), size](Evaluator &ev, CallArgs &a) {
      work::ChargeBytes(size);
      return fn(ev, a);
    });
  };
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    const bool l = name != "rstrip", r = name != "lstrip";
    return m([self, l, r](Evaluator &, CallArgs &a) -> absl::StatusOr<Value> {
      const Value chars = a.Get(0, "chars", Value::None());
      if (chars.is_none()) return Derived(self, std::string(PyStrip(self.str, l, r)));
      return Derived(self, std::string(PyStripChars(self.str, S(chars), l, r)));
    });
  }
  if (name == "split" || name == "rsplit") {
    const bool right = name == "rsplit";
    return m([self, right](Evaluator &, CallArgs &a) -> absl::StatusOr<Value> {
      const Value sep = a.Get(0, "sep", Value::None());
      const Value max = a.Get(1, "maxsplit", Value::Int(-1));
      if (!sep.is_none() && !sep.is_string()) return Bad("split: the separator must be a string or None");
      if (sep.is_string() && sep.str.empty()) return Bad("empty separator");
      STRATA_ASSIGN_OR_RETURN(int64_t n, ToIndex(max, "maxsplit"));
      std::vector<std::string> parts =
          right && sep.is_string() ? RSplit(self.str, sep.str, n) : Split(self.str, sep, n);
      List items;
      for (auto &p : parts) items.push_back(Derived(self, std::move(p)));
      return Value::MakeList(std::move(items));
    });
  }
  if (name == "startswith" || name == "endswith") {
    const bool start = name == "startswith";
    return m([self, start](Evaluator &, CallArgs &a) -> absl::StatusOr<Value> {
      const Value p = a.Get(0, "prefix");
      List options;
      if (p.is_list())
        options = *p.list;
      else
        options.push_back(p);
      for (const Value &o : options) {
        if (!o.is_string())
          return Bad(std::string(start ? "startswith" : "endswith") + " needs a string or a tuple of strings");
        const std::string &s = self.str;
        if (start ? s.compare(0, o.str.size(), o.str) == 0
                  : s.size() >= o.str.size() && s.compare(s.size() - o.str.size(), o.str.size(), o.str) == 0)
          return Value::Bool(true);
      }
      return Value::Bool(false);
    });
  }
  if (name == "upper" || name == "lower" || name == "title" || name == "capitalize") {
    return m([self, name](Evaluator &, CallArgs &) -> absl::StatusOr<Value> {
      if (name == "upper") return Derived(self, PyUpper(self.str));
      if (name == "lower") return Derived(self, PyLower(self.str));
      if (name == "title") return Derived(self, PyTitle(self.str));
      return Derived(self, Capitalize(self.str));
    });
  }
  if (name == "replace") {
    return m([self](Evaluator &ev, CallArgs &a) -> absl::StatusOr<Value> {
      const Value from = a.Get(0, "old"), to = a.Get(1, "new");
      if (!from.is_string() || !to.is_string()) return Bad("replace needs two strings");
      STRATA_ASSIGN_OR_RETURN(int64_t n, ToIndex(a.Get(2, "count", Value::Int(-1)), "count"));
      STRATA_ASSIGN_OR_RETURN(std::string r, Replace(self.str, from.str, to.str, n, ev.limits().max_output));
      return self.tainted() || to.tainted() ? Value::CallerStr(std::move(r)) : Value::Str(std::move(r));
    });
  }
  if (name == "format") {
    return m([self](Evaluator &, CallArgs &a) { return BraceFormat(self, a); });
  }
  if (name == "join") {
    return m([self](Evaluator &, CallArgs &a) -> absl::StatusOr<Value> {
      STRATA_ASSIGN_OR_RETURN(List items, Iterate(a.Get(0, "iterable")));
      Value out = Value::Str("");
      for (size_t k = 0; k < items.size(); ++k) {
        if (!items[k].is_string()) return Bad("sequence item " + std::to_string(k) + ": expected str instance");
        if (k) AppendTainted(&out.str, &out.spans, self.str, self.spans);
        AppendTainted(&out.str, &out.spans, items[k].str, items[k].spans);
      }
      return out;
    });
  }
  if (name == "find" || name == "rfind" || name == "count" || name == "index") {
    return m([self, name](Evaluator &, CallArgs &a) -> absl::StatusOr<Value> {
      const Value sub = a.Get(0, "sub");
      if (!sub.is_string()) return Bad(name + " needs a string");
      const std::string &s = self.str;
      if (name == "count") {
        if (sub.str.empty()) return Value::Int(Len(self) + 1);
        int64_t n = 0;
        for (size_t at = s.find(sub.str); at != std::string::npos; at = s.find(sub.str, at + sub.str.size())) ++n;
        return Value::Int(n);
      }
      const size_t at = name == "rfind" ? s.rfind(sub.str) : s.find(sub.str);
      if (at == std::string::npos) {
        if (name == "index") return Bad("substring not found");
        return Value::Int(-1);
      }
      return Value::Int(static_cast<int64_t>(CodePoints(s.substr(0, at)).size()));
    });
  }
  if (name == "splitlines") {
    return m([self](Evaluator &, CallArgs &) -> absl::StatusOr<Value> {
      List items;
      for (auto &l : SplitLines(self.str)) items.push_back(Derived(self, std::move(l)));
      return Value::MakeList(std::move(items));
    });
  }
  if (name == "isdigit" || name == "isalpha" || name == "isalnum" || name == "isspace" || name == "islower" ||
      name == "isupper") {
    return m([self, name](Evaluator &, CallArgs &) -> absl::StatusOr<Value> {
      const std::string &s = self.str;
      if (s.empty()) return Value::Bool(false);
      bool ok = true, cased = false;
      for (size_t k = 0; k < s.size(); ++k) {
        const char c = s[k];
        size_t len;
        if (name == "isdigit")
          ok = ok && c >= '0' && c <= '9';
        else if (name == "isalpha")
          ok = ok && IsAlpha(c);
        else if (name == "isalnum")
          ok = ok && (IsAlpha(c) || (c >= '0' && c <= '9'));
        else if (name == "isspace") {
          ok = ok && PySpaceAt(s, k, &len);
          if (ok) k += len - 1;
        } else if (name == "islower") {
          ok = ok && !(c >= 'A' && c <= 'Z');
          cased = cased || (c >= 'a' && c <= 'z');
        } else {
          ok = ok && !(c >= 'a' && c <= 'z');
          cased = cased || (c >= 'A' && c <= 'Z');
        }
      }
      if (name == "islower" || name == "isupper") ok = ok && cased;
      return Value::Bool(ok);
    });
  }
  return Value::Undefined("'str object' has no attribute '" + name + "'");
}

absl::StatusOr<Value> DictMethod(const Value &obj, const std::string &name) {
  const Value self = obj;
  if (name == "get") {
    return Method("dict.get", [self](Evaluator &, CallArgs &a) -> absl::StatusOr<Value> {
      const Value *v = self.dict->Find(a.Get(0, "key"));
      return v ? *v : a.Get(1, "default", Value::None());
    });
  }
  if (name == "items" || name == "keys" || name == "values") {
    return Method("dict." + name, [self, name](Evaluator &, CallArgs &) -> absl::StatusOr<Value> {
      List items;
      for (const auto &kv : self.dict->items) {
        if (name == "items")
          items.push_back(Value::MakeList({kv.first, kv.second}, true));
        else
          items.push_back(name == "keys" ? kv.first : kv.second);
      }
      return Value::MakeList(std::move(items));
    });
  }
  if (name == "copy") {
    return Method("dict.copy", [self](Evaluator &, CallArgs &) -> absl::StatusOr<Value> {
      Value d = Value::MakeDict();
      *d.dict = *self.dict;
      d.depth = self.depth;
      return d;
    });
  }
  return Value::Undefined();
}

bool Unsafe(const Value &obj, const std::string &name) {
  // ImmutableSandboxedEnvironment refuses the methods that change a list or dict.
  static const char *kList[] = {"append", "extend", "insert",  "pop",        "remove",
                                "clear",  "sort",   "reverse", "__setitem__"};
  static const char *kDict[] = {"pop", "popitem", "setdefault", "update", "clear", "__setitem__"};
  if (obj.is_list()) {
    for (const char *m : kList)
      if (name == m) return true;
  }
  if (obj.kind == Kind::kDict) {
    for (const char *m : kDict)
      if (name == m) return true;
  }
  return false;
}

}  // namespace

absl::StatusOr<Value> GetAttr(Evaluator &ev, const Value &obj, const std::string &name) {
  if (obj.is_undefined()) return UndefinedError(obj);
  if (Unsafe(obj, name)) {
    return Bad("access to attribute '" + name + "' of '" + TypeName(obj).substr(0, TypeName(obj).find(' ')) +
               "' object is unsafe (templates cannot change values)");
  }
  switch (obj.kind) {
    case Kind::kString: {
      STRATA_ASSIGN_OR_RETURN(Value m, StrMethod(obj, name));
      return m;
    }
    case Kind::kDict: {
      STRATA_ASSIGN_OR_RETURN(Value m, DictMethod(obj, name));
      if (!m.is_undefined()) return m;
      if (const Value *v = obj.dict->Find(name)) return *v;
      return Value::Undefined("'dict object' has no attribute '" + name + "'");
    }
    case Kind::kNamespace:
      if (const Value *v = obj.dict->Find(name)) return *v;
      return Value::Undefined("'Namespace object' has no attribute '" + name + "'");
    case Kind::kList:
    case Kind::kTuple:
      if (name == "index" || name == "count") {
        const Value self = obj;
        return Method("list." + name, [self, name](Evaluator &, CallArgs &a) -> absl::StatusOr<Value> {
          const Value x = a.Get(0, "value");
          int64_t n = 0;
          for (size_t k = 0; k < self.list->size(); ++k) {
            if (!Equal((*self.list)[k], x)) continue;
            if (name == "index") return Value::Int(static_cast<int64_t>(k));
            ++n;
          }
          if (name == "index") return Bad("the value is not in the list");
          return Value::Int(n);
        });
      }
      break;
    default:
      break;
  }
  return Value::Undefined("'" + TypeName(obj) + "' has no attribute '" + name + "'");
}

absl::StatusOr<Value> GetItem(Evaluator &ev, const Value &obj, const Value &key) {
  if (obj.is_undefined()) return UndefinedError(obj);
  if (obj.is_list() || obj.is_string()) {
    if (key.kind == Kind::kInt || key.kind == Kind::kBool) {
      if (obj.is_list()) {
        const int64_t n = static_cast<int64_t>(obj.list->size());
        const int64_t k = key.i < 0 ? key.i + n : key.i;
        if (k < 0 || k >= n) return Value::Undefined(TypeName(obj) + " has no element " + std::to_string(key.i));
        return (*obj.list)[static_cast<size_t>(k)];
      }
      const auto cps = CodePoints(obj.str);
      const int64_t n = static_cast<int64_t>(cps.size());
      const int64_t k = key.i < 0 ? key.i + n : key.i;
      if (k < 0 || k >= n) return Value::Undefined("'str object' has no element " + std::to_string(key.i));
      return Derived(obj, std::string(cps[static_cast<size_t>(k)]));
    }
  } else if (obj.is_mapping()) {
    if (const Value *v = obj.dict->Find(key)) return *v;
  }
  if (key.is_string()) return GetAttr(ev, obj, key.str);
  std::string k;
  AppendRepr(key, &k);
  return Value::Undefined("'" + TypeName(obj) + "' has no element " + k);
}

absl::StatusOr<Value> GetSlice(Evaluator &ev, const Value &obj, const Value &start, const Value &stop,
                               const Value &step) {
  if (obj.is_undefined()) return UndefinedError(obj);
  if (!obj.is_list() && !obj.is_string()) return Bad("'" + TypeName(obj) + "' cannot be sliced");
  std::vector<std::string_view> cps;
  if (obj.is_string()) cps = CodePoints(obj.str);
  const int64_t n = obj.is_string() ? static_cast<int64_t>(cps.size()) : static_cast<int64_t>(obj.list->size());
  int64_t st = 1;
  if (!step.is_none()) {
    STRATA_ASSIGN_OR_RETURN(st, ToIndex(step, "slice step"));
    if (st == 0) return Bad("slice step cannot be zero");
  }
  auto bound = [&](const Value &v, int64_t dflt, int64_t *out) -> absl::Status {
    if (v.is_none()) {
      *out = dflt;
      return absl::OkStatus();
    }
    STRATA_ASSIGN_OR_RETURN(int64_t x, ToIndex(v, "slice index"));
    if (x < 0) x += n;
    if (st > 0)
      x = std::min(std::max<int64_t>(x, 0), n);
    else
      x = std::min(std::max<int64_t>(x, -1), n - 1);
    *out = x;
    return absl::OkStatus();
  };
  int64_t b, e;
  STRATA_RETURN_IF_ERROR(bound(start, st > 0 ? 0 : n - 1, &b));
  STRATA_RETURN_IF_ERROR(bound(stop, st > 0 ? n : -1, &e));
  std::string s;
  List items;
  for (int64_t k = b; st > 0 ? k < e : k > e; k += st) {
    if (obj.is_string())
      s.append(cps[static_cast<size_t>(k)]);
    else
      items.push_back((*obj.list)[static_cast<size_t>(k)]);
  }
  if (obj.is_string()) return Derived(obj, std::move(s));
  return Value::MakeList(std::move(items), obj.kind == Kind::kTuple);
}

// ---- globals ----

Value Global(std::string_view name) {
  if (name == "range") {
    return Value::Fn("range", [](Evaluator &ev, CallArgs &a) -> absl::StatusOr<Value> {
      int64_t start = 0, stop = 0, step = 1;
      if (a.pos.size() == 1) {
        STRATA_ASSIGN_OR_RETURN(stop, ToIndex(a.pos[0], "range() stop"));
      } else if (a.pos.size() == 2 || a.pos.size() == 3) {
        STRATA_ASSIGN_OR_RETURN(start, ToIndex(a.pos[0], "range() start"));
        STRATA_ASSIGN_OR_RETURN(stop, ToIndex(a.pos[1], "range() stop"));
        if (a.pos.size() == 3) {
          STRATA_ASSIGN_OR_RETURN(step, ToIndex(a.pos[2], "range() step"));
        }
      } else {
        return Bad("range expected 1 to 3 arguments, got " + std::to_string(a.pos.size()));
      }
      if (step == 0) return Bad("range() arg 3 must not be zero");
      const double count =
          std::ceil((static_cast<double>(stop) - static_cast<double>(start)) / static_cast<double>(step));
      if (count > 0) STRATA_RETURN_IF_ERROR(ev.CheckItems(static_cast<size_t>(std::min(count, 1e18))));
      List items;
      for (int64_t k = start; step > 0 ? k < stop : k > stop; k += step) items.push_back(Value::Int(k));
      return Value::MakeList(std::move(items));
    });
  }
  if (name == "namespace" || name == "dict") {
    const bool ns = name == "namespace";
    return Value::Fn(std::string(name), [ns](Evaluator &ev, CallArgs &a) -> absl::StatusOr<Value> {
      Value d = ns ? Value::MakeNamespace() : Value::MakeDict();
      for (const Value &p : a.pos) {
        if (p.kind != Kind::kDict) return Bad(std::string(ns ? "namespace" : "dict") + "() takes a mapping");
        for (const auto &kv : p.dict->items) d.Set(kv.first, kv.second);
      }
      for (const auto &kv : a.kw) d.Set(Value::Str(kv.first), kv.second);
      if (ns) ev.Track(d);
      return d;
    });
  }
  if (name == "raise_exception") {
    return Value::Fn("raise_exception", [](Evaluator &, CallArgs &a) -> absl::StatusOr<Value> {
      return Bad("the template refused the conversation: " + S(a.Get(0, "message")));
    });
  }
  if (name == "strftime_now") {
    return Value::Fn("strftime_now", [](Evaluator &, CallArgs &a) -> absl::StatusOr<Value> {
      const std::string fmt = S(a.Get(0, "format"));
      const std::time_t now = std::time(nullptr);
      std::tm tm{};
      localtime_r(&now, &tm);
      char buf[256];
      const size_t n = fmt.size() < 128 ? std::strftime(buf, sizeof buf, fmt.c_str(), &tm) : 0;
      return Value::Str(std::string(buf, n));
    });
  }
  return Value::Undefined();
}

// Filters and tests are in jinja_filters.cc.

}  // namespace strata::text::jinja
