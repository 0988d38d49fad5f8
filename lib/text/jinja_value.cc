// Python's printing, equality, truthiness and json.dumps for Jinja values, to the byte: the engine's
// output must equal jinja2's (tests/text/fixtures/jinja).
#include "lib/text/jinja_value.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "lib/text/unicode.h"

namespace strata::text::jinja {

namespace work {
namespace {
struct Meter {
  uint64_t used = 0;
  uint64_t limit = UINT64_MAX;
};
thread_local Meter meter;
}  // namespace

void Start(uint64_t limit) { meter = Meter{0, limit}; }
void Charge(uint64_t units) { meter.used = meter.used > UINT64_MAX - units ? UINT64_MAX : meter.used + units; }
bool Exhausted() { return meter.used > meter.limit; }

}  // namespace work

void AppendTainted(std::string *out, std::vector<Span> *out_spans, std::string_view s, const std::vector<Span> &spans) {
  work::ChargeBytes(s.size());
  const size_t base = out->size();
  out->append(s.data(), s.size());
  if (out_spans == nullptr) return;
  for (const Span &sp : spans) {
    if (sp.end <= sp.begin || sp.end > s.size()) continue;
    const Span shifted{base + sp.begin, base + sp.end};
    if (!out_spans->empty() && out_spans->back().end >= shifted.begin) {
      out_spans->back().end = std::max(out_spans->back().end, shifted.end);
    } else {
      out_spans->push_back(shifted);
    }
  }
}

Value Value::MakeDict() {
  Value v = Of(Kind::kDict);
  v.dict = std::make_shared<Dict>();
  return v;
}

Value Value::MakeNamespace() {
  Value v = Of(Kind::kNamespace);
  v.dict = std::make_shared<Dict>();
  return v;
}

void Value::Set(Value key, Value value) {
  depth = std::max({depth, key.depth + 1, value.depth + 1});
  dict->Set(std::move(key), std::move(value));
}

namespace {

bool Tainted(const Value &v, int level, uint64_t *visits) {
  if (level > kMaxReprDepth || ++*visits > kMaxVisits) return true;  // assume the caller's
  work::Charge(1);
  switch (v.kind) {
    case Kind::kString:
      return !v.spans.empty();
    case Kind::kList:
    case Kind::kTuple:
      for (const Value &x : *v.list)
        if (Tainted(x, level + 1, visits)) return true;
      return false;
    case Kind::kDict:
    case Kind::kNamespace:
      for (const auto &kv : v.dict->items)
        if (Tainted(kv.first, level + 1, visits) || Tainted(kv.second, level + 1, visits)) return true;
      return false;
    default:
      return false;
  }
}

}  // namespace

bool Value::tainted() const {
  uint64_t visits = 0;
  return Tainted(*this, 0, &visits);
}

const Value *Dict::Find(const Value &key) const {
  work::Charge(items.size());
  for (const auto &kv : items)
    if (Equal(kv.first, key)) return &kv.second;
  return nullptr;
}

const Value *Dict::Find(std::string_view key) const {
  work::Charge(items.size());
  for (const auto &kv : items)
    if (kv.first.kind == Kind::kString && kv.first.str == key) return &kv.second;
  return nullptr;
}

void Dict::Set(Value key, Value value) {
  for (auto &kv : items) {
    if (Equal(kv.first, key)) {
      kv.second = std::move(value);
      return;
    }
  }
  items.emplace_back(std::move(key), std::move(value));
}

Value CallArgs::Get(size_t index, std::string_view name, Value fallback) const {
  if (index < pos.size()) return pos[index];
  for (const auto &kv : kw)
    if (kv.first == name) return kv.second;
  return fallback;
}

bool CallArgs::Has(size_t index, std::string_view name) const {
  if (index < pos.size()) return true;
  for (const auto &kv : kw)
    if (kv.first == name) return true;
  return false;
}

bool Truthy(const Value &v) {
  switch (v.kind) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
    case Kind::kInt:
      return v.i != 0;
    case Kind::kFloat:
      return v.f != 0;
    case Kind::kString:
      return !v.str.empty();
    case Kind::kList:
    case Kind::kTuple:
      return !v.list->empty();
    case Kind::kDict:
      return !v.dict->items.empty();
    case Kind::kNamespace:
    case Kind::kCallable:
      return true;
  }
  return false;
}

namespace {

bool EqualImpl(const Value &a, const Value &b, uint64_t *visits) {
  if (++*visits > kMaxVisits) return false;
  work::Charge(1);
  if (a.is_number() && b.is_number()) {
    if (a.kind == Kind::kFloat || b.kind == Kind::kFloat) return a.as_double() == b.as_double();
    return a.i == b.i;
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Kind::kUndefined:
    case Kind::kNone:
      return true;
    case Kind::kString:
      work::ChargeBytes(std::min(a.str.size(), b.str.size()));
      return a.str == b.str;
    case Kind::kList:
    case Kind::kTuple:
      if (a.list == b.list) return true;
      if (a.list->size() != b.list->size()) return false;
      for (size_t k = 0; k < a.list->size(); ++k)
        if (!EqualImpl((*a.list)[k], (*b.list)[k], visits)) return false;
      return true;
    case Kind::kDict:
      if (a.dict == b.dict) return true;
      if (a.dict->items.size() != b.dict->items.size()) return false;
      for (const auto &kv : a.dict->items) {
        const Value *o = nullptr;
        for (const auto &okv : b.dict->items) {
          if (EqualImpl(kv.first, okv.first, visits)) {
            o = &okv.second;
            break;
          }
        }
        if (o == nullptr || !EqualImpl(kv.second, *o, visits)) return false;
      }
      return true;
    case Kind::kNamespace:
      return a.dict == b.dict;
    case Kind::kCallable:
      return a.fn == b.fn;
    default:
      return false;
  }
}

}  // namespace

bool Equal(const Value &a, const Value &b) {
  uint64_t visits = 0;
  return EqualImpl(a, b, &visits);
}

std::string FloatRepr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
  char buf[64];
  int p = 0;
  for (; p < 17; ++p) {
    std::snprintf(buf, sizeof buf, "%.*e", p, d);
    if (std::strtod(buf, nullptr) == d) break;
  }
  // buf: [-]d[.ddd]e[+-]XX
  std::string s(buf);
  std::string sign;
  if (s[0] == '-') {
    sign = "-";
    s.erase(0, 1);
  }
  const size_t epos = s.find('e');
  const int exp = std::atoi(s.c_str() + epos + 1);
  std::string digits;
  for (size_t k = 0; k < epos; ++k)
    if (s[k] != '.') digits += s[k];
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  std::string out = sign;
  if (exp >= -4 && exp < 16) {
    if (exp >= 0) {
      std::string int_part = digits.substr(0, std::min(digits.size(), static_cast<size_t>(exp) + 1));
      while (int_part.size() < static_cast<size_t>(exp) + 1) int_part += '0';
      std::string frac = digits.size() > static_cast<size_t>(exp) + 1 ? digits.substr(exp + 1) : "0";
      out += int_part + "." + frac;
    } else {
      out += "0." + std::string(-exp - 1, '0') + digits;
    }
  } else {
    out += digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char e[16];
    std::snprintf(e, sizeof e, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    out += e;
  }
  return out;
}

namespace {

// Python's str.isprintable() for one code point (what repr() leaves unescaped).
bool Printable(uint32_t cp) {
  if (cp == ' ') return true;
  const Gc g = Category(cp);
  return !(g == Gc::kCc || g == Gc::kCf || g == Gc::kCs || g == Gc::kCo || g == Gc::kCn || g == Gc::kZl ||
           g == Gc::kZp || g == Gc::kZs);
}

void AppendStrRepr(std::string_view s, std::string *out) {
  const bool has_single = s.find('\'') != std::string_view::npos;
  const bool has_double = s.find('"') != std::string_view::npos;
  const char q = has_single && !has_double ? '"' : '\'';
  out->push_back(q);
  for (size_t k = 0; k < s.size();) {
    size_t len;
    const uint32_t cp = DecodeUtf8(s, k, &len);
    const char c = s[k];
    if (c == q || c == '\\') {
      out->push_back('\\');
      out->push_back(c);
    } else if (c == '\n') {
      out->append("\\n");
    } else if (c == '\r') {
      out->append("\\r");
    } else if (c == '\t') {
      out->append("\\t");
    } else if (cp == 0xFFFD && len == 1 && static_cast<unsigned char>(c) >= 0x80) {
      // An invalid byte (Python would have refused to decode it): shown as its escape.
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", static_cast<unsigned char>(c));
      out->append(buf);
    } else if (!Printable(cp)) {
      char buf[16];
      if (cp < 0x100)
        std::snprintf(buf, sizeof buf, "\\x%02x", cp);
      else if (cp < 0x10000)
        std::snprintf(buf, sizeof buf, "\\u%04x", cp);
      else
        std::snprintf(buf, sizeof buf, "\\U%08x", cp);
      out->append(buf);
    } else {
      out->append(s.substr(k, len));
    }
    k += len;
  }
  out->push_back(q);
}

}  // namespace

namespace {

// repr() with Python's guard against a container that holds itself (only a namespace can): it
// prints as {...} (a namespace's attributes) or [...] where it recurs.
void Repr(const Value &v, std::string *out, int level, size_t limit, std::vector<const void *> *open) {
  if (out->size() > limit) return;  // the caller sees the size and refuses
  work::Charge(1);
  if (level > kMaxReprDepth) {
    out->append("...");
    return;
  }
  auto recurs = [&](const void *p) { return std::find(open->begin(), open->end(), p) != open->end(); };
  switch (v.kind) {
    case Kind::kString:
      AppendStrRepr(v.str, out);
      return;
    case Kind::kList:
    case Kind::kTuple: {
      const bool tuple = v.kind == Kind::kTuple;
      if (!tuple && recurs(v.list.get())) {
        out->append("[...]");
        return;
      }
      open->push_back(v.list.get());
      out->push_back(tuple ? '(' : '[');
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k) out->append(", ");
        Repr((*v.list)[k], out, level + 1, limit, open);
      }
      if (tuple && v.list->size() == 1) out->push_back(',');
      out->push_back(tuple ? ')' : ']');
      open->pop_back();
      return;
    }
    case Kind::kDict:
    case Kind::kNamespace: {
      const bool ns = v.kind == Kind::kNamespace;
      if (ns) out->append("<Namespace ");
      if (recurs(v.dict.get())) {
        out->append("{...}");
      } else {
        open->push_back(v.dict.get());
        out->push_back('{');
        bool first = true;
        for (const auto &kv : v.dict->items) {
          if (!first) out->append(", ");
          first = false;
          Repr(kv.first, out, level + 1, limit, open);
          out->append(": ");
          Repr(kv.second, out, level + 1, limit, open);
        }
        out->push_back('}');
        open->pop_back();
      }
      if (ns) out->push_back('>');
      return;
    }
    case Kind::kUndefined:
      return;  // repr of Undefined is "Undefined"; str() of it, what containers rarely hold, is ""
    default:
      AppendStr(v, out, nullptr);
  }
}

}  // namespace

void AppendRepr(const Value &v, std::string *out, int level, size_t limit) {
  std::vector<const void *> open;
  Repr(v, out, level, limit, &open);
}

void AppendStr(const Value &v, std::string *out, std::vector<Span> *out_spans, size_t limit) {
  switch (v.kind) {
    case Kind::kUndefined:
      return;
    case Kind::kNone:
      out->append("None");
      return;
    case Kind::kBool:
      out->append(v.i ? "True" : "False");
      return;
    case Kind::kInt:
      out->append(std::to_string(v.i));
      return;
    case Kind::kFloat:
      out->append(FloatRepr(v.f));
      return;
    case Kind::kString:
      AppendTainted(out, out_spans, v.str, v.spans);
      return;
    case Kind::kCallable:
      out->append("<function " + v.str + ">");
      return;
    default: {
      const size_t at = out->size();
      AppendRepr(v, out, 0, limit);
      if (out_spans != nullptr && out->size() > at && v.tainted()) {
        AppendTainted(out, out_spans, "", {});
        if (!out_spans->empty() && out_spans->back().end >= at) {
          out_spans->back().end = out->size();
        } else {
          out_spans->push_back({at, out->size()});
        }
      }
    }
  }
}

std::string ToStr(const Value &v) {
  std::string s;
  AppendStr(v, &s, nullptr);
  return s;
}

Value ToStrValue(const Value &v) {
  if (v.kind == Kind::kString) return v;
  Value r = Value::Str("");
  AppendStr(v, &r.str, &r.spans);
  return r;
}

namespace {

void AppendJsonString(std::string_view s, bool ensure_ascii, std::string *out) {
  out->push_back('"');
  for (size_t k = 0; k < s.size(); ++k) {
    const char c = s[k];
    if (ensure_ascii && static_cast<unsigned char>(c) >= 0x80) {
      size_t len;
      uint32_t cp = DecodeUtf8(s, k, &len);
      char buf[16];
      if (cp >= 0x10000) {
        cp -= 0x10000;
        std::snprintf(buf, sizeof buf, "\\u%04x\\u%04x", 0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF));
      } else {
        std::snprintf(buf, sizeof buf, "\\u%04x", cp);
      }
      out->append(buf);
      k += len - 1;
      continue;
    }
    switch (c) {
      case '"':
        out->append("\\\"");
        break;
      case '\\':
        out->append("\\\\");
        break;
      case '\n':
        out->append("\\n");
        break;
      case '\r':
        out->append("\\r");
        break;
      case '\t':
        out->append("\\t");
        break;
      case '\b':
        out->append("\\b");
        break;
      case '\f':
        out->append("\\f");
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned char>(c));
          out->append(buf);
        } else {
          out->push_back(c);
        }
    }
  }
  out->push_back('"');
}

void AppendJsonFloat(double d, std::string *out) {
  if (std::isnan(d))
    out->append("NaN");
  else if (std::isinf(d))
    out->append(d < 0 ? "-Infinity" : "Infinity");
  else
    out->append(FloatRepr(d));
}

}  // namespace

absl::Status AppendJson(const Value &v, const JsonStyle &style, int depth, std::string *out) {
  const int indent = style.indent;
  const std::string &item_sep = style.item_sep, &key_sep = style.key_sep;
  const bool sort_keys = style.sort_keys;
  if (depth > 64) return MakeError(MOE_ERR_INVALID_ARGUMENT, "tojson: the value nests deeper than 64 levels");
  if (out->size() > style.max_bytes) {
    return MakeError(MOE_ERR_LIMIT, "tojson: the text would pass " + std::to_string(style.max_bytes) + " bytes");
  }
  auto newline = [&](int level) {
    if (indent < 0) return;
    out->push_back('\n');
    out->append(static_cast<size_t>(indent) * level, ' ');
  };
  switch (v.kind) {
    case Kind::kNone:
      out->append("null");
      return absl::OkStatus();
    case Kind::kBool:
      out->append(v.i ? "true" : "false");
      return absl::OkStatus();
    case Kind::kInt:
      out->append(std::to_string(v.i));
      return absl::OkStatus();
    case Kind::kFloat:
      AppendJsonFloat(v.f, out);
      return absl::OkStatus();
    case Kind::kString:
      AppendJsonString(v.str, style.ensure_ascii, out);
      return absl::OkStatus();
    case Kind::kList:
    case Kind::kTuple: {
      if (v.list->empty()) {
        out->append("[]");
        return absl::OkStatus();
      }
      out->push_back('[');
      newline(depth + 1);
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k) {
          out->append(item_sep);
          newline(depth + 1);
        }
        STRATA_RETURN_IF_ERROR(AppendJson((*v.list)[k], style, depth + 1, out));
      }
      newline(depth);
      out->push_back(']');
      return absl::OkStatus();
    }
    case Kind::kDict: {
      if (v.dict->items.empty()) {
        out->append("{}");
        return absl::OkStatus();
      }
      std::vector<std::pair<std::string, const Value *>> items;
      for (const auto &kv : v.dict->items) {
        std::string key;
        const Value &k = kv.first;
        if (k.kind == Kind::kString)
          key = k.str;
        else if (k.kind == Kind::kNone)
          key = "null";
        else if (k.kind == Kind::kBool)
          key = k.i ? "true" : "false";
        else if (k.kind == Kind::kInt)
          key = std::to_string(k.i);
        else if (k.kind == Kind::kFloat)
          AppendJsonFloat(k.f, &key);
        else
          return MakeError(MOE_ERR_INVALID_ARGUMENT,
                           "tojson: keys must be str, int, float, bool or None, not " + TypeName(k));
        items.emplace_back(std::move(key), &kv.second);
      }
      if (sort_keys) {
        std::stable_sort(items.begin(), items.end(), [](const auto &a, const auto &b) { return a.first < b.first; });
      }
      out->push_back('{');
      newline(depth + 1);
      for (size_t k = 0; k < items.size(); ++k) {
        if (k) {
          out->append(item_sep);
          newline(depth + 1);
        }
        AppendJsonString(items[k].first, style.ensure_ascii, out);
        out->append(key_sep);
        STRATA_RETURN_IF_ERROR(AppendJson(*items[k].second, style, depth + 1, out));
      }
      newline(depth);
      out->push_back('}');
      return absl::OkStatus();
    }
    default:
      return MakeError(MOE_ERR_INVALID_ARGUMENT, "tojson: Object of type " +
                                                     std::string(v.is_undefined() ? "Undefined" : TypeName(v)) +
                                                     " is not JSON serializable");
  }
}

std::string TypeName(const Value &v) {
  switch (v.kind) {
    case Kind::kUndefined:
      return "Undefined";
    case Kind::kNone:
      return "NoneType object";
    case Kind::kBool:
      return "bool object";
    case Kind::kInt:
      return "int object";
    case Kind::kFloat:
      return "float object";
    case Kind::kString:
      return "str object";
    case Kind::kList:
      return "list object";
    case Kind::kTuple:
      return "tuple object";
    case Kind::kDict:
      return "dict object";
    case Kind::kNamespace:
      return "Namespace object";
    case Kind::kCallable:
      return "function object";
  }
  return "object";
}

std::vector<std::string_view> CodePoints(std::string_view s) {
  std::vector<std::string_view> cps;
  for (size_t k = 0; k < s.size();) {
    size_t len;
    DecodeUtf8(s, k, &len);
    cps.push_back(s.substr(k, len));
    k += len;
  }
  return cps;
}

bool PySpaceAt(std::string_view s, size_t i, size_t *len) {
  const uint32_t cp = DecodeUtf8(s, i, len);
  if (cp == 0xFFFD && *len == 1 && static_cast<unsigned char>(s[i]) >= 0x80) return false;
  return IsWhitespace(cp) || (cp >= 0x1c && cp <= 0x1f);
}

std::string_view PyStrip(std::string_view s, bool left, bool right) {
  size_t b = 0, e = s.size();
  if (left) {
    size_t len;
    while (b < e && PySpaceAt(s, b, &len)) b += len;
  }
  if (right) {
    while (e > b) {
      size_t start = e - 1;
      while (start > b && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80 && e - start < 4) --start;
      size_t len;
      if (!PySpaceAt(s, start, &len) || start + len != e) break;
      e = start;
    }
  }
  return s.substr(b, e - b);
}

std::string_view PyStripChars(std::string_view s, std::string_view chars, bool left, bool right) {
  const std::vector<std::string_view> set = CodePoints(chars);
  const std::vector<std::string_view> cps = CodePoints(s);
  auto in_set = [&](std::string_view cp) { return std::find(set.begin(), set.end(), cp) != set.end(); };
  size_t b = 0, e = cps.size();
  if (left)
    while (b < e && in_set(cps[b])) ++b;
  if (right)
    while (e > b && in_set(cps[e - 1])) --e;
  if (b == e) return s.substr(0, 0);
  const size_t from = cps[b].data() - s.data();
  const size_t to = cps[e - 1].data() + cps[e - 1].size() - s.data();
  return s.substr(from, to - from);
}

}  // namespace strata::text::jinja
