// The tuning knobs' table and parser (tunables.h). The only place in lib/ and backends/ that reads
// a STRATA_* environment variable, save the context's CUDA-streaming check; tests/util/tunables_test.cc
// fails the build's tests when a getenv of one appears elsewhere.
#include "lib/util/tunables.h"

#include "lib/util/log.h"

#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <type_traits>

namespace strata::tunables {

namespace {

template <class T>
constexpr Type TypeOf() {
  if constexpr (std::is_same_v<T, bool>) return Type::kBool;
  else if constexpr (std::is_same_v<T, int64_t>) return Type::kInt;
  else if constexpr (std::is_same_v<T, double>) return Type::kDouble;
  else return Type::kString;
}

bool Equals(std::string_view a, const char *b) {
  const size_t n = std::strlen(b);
  if (a.size() != n) return false;
  for (size_t i = 0; i < n; ++i) {
    const char c = a[i] >= 'A' && a[i] <= 'Z' ? static_cast<char>(a[i] - 'A' + 'a') : a[i];
    if (c != b[i]) return false;
  }
  return true;
}

// Each parser leaves `out` alone and returns false when `s` is not a value of the type.
bool Parse(const char *s, bool *out) {
  const std::string_view v(s);
  for (const char *t : {"1", "true", "on", "yes"}) {
    if (Equals(v, t)) return *out = true, true;
  }
  for (const char *f : {"0", "false", "off", "no"}) {
    if (Equals(v, f)) return *out = false, true;
  }
  return false;
}

bool Parse(const char *s, int64_t *out) {
  char *end = nullptr;
  errno = 0;
  const long long v = std::strtoll(s, &end, 10);
  if (end == s || *end != '\0' || errno == ERANGE) return false;
  *out = v;
  return true;
}

bool Parse(const char *s, double *out) {
  char *end = nullptr;
  errno = 0;
  const double v = std::strtod(s, &end);
  if (end == s || *end != '\0' || errno == ERANGE || !std::isfinite(v)) return false;
  *out = v;
  return true;
}

bool Parse(const char *s, std::string *out) {
  *out = s;
  return true;
}

std::string Format(bool v) { return v ? "on" : "off"; }
std::string Format(int64_t v) { return std::to_string(v); }
std::string Format(const std::string &v) { return v.empty() ? "\"\"" : v; }
std::string Format(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

template <class T>
void ReadOne(const Lookup &lookup, const char *name, T *field, std::vector<std::string> *complaints) {
  const char *s = lookup(name);
  if (s == nullptr || *s == '\0') return;
  if (!Parse(s, field) && complaints != nullptr) {
    complaints->push_back(std::string(name) + "=" + s + " is not a " + TypeName(TypeOf<T>()) + "; using " +
                          Format(*field));
  }
}

}  // namespace

const char *TypeName(Type t) {
  switch (t) {
    case Type::kBool: return "bool";
    case Type::kInt: return "int";
    case Type::kDouble: return "double";
    case Type::kString: return "string";
  }
  return "?";
}

const std::vector<Row> &Table() {
  static const std::vector<Row> rows = {
#define STRATA_TUNABLE_ROW(type, field, name, def, doc) \
  Row{name, TypeOf<type>(), doc, [](const Values &v) { return Format(v.field); }},
      STRATA_TUNABLES(STRATA_TUNABLE_ROW)
#undef STRATA_TUNABLE_ROW
  };
  return rows;
}

Values Read(const Lookup &lookup, std::vector<std::string> *complaints) {
  Values v;
#define STRATA_TUNABLE_READ(type, field, name, def, doc) ReadOne(lookup, name, &v.field, complaints);
  STRATA_TUNABLES(STRATA_TUNABLE_READ)
#undef STRATA_TUNABLE_READ
  return v;
}

namespace {
std::atomic<const Values *> g_scoped{nullptr};
std::atomic<const Values &(*)()> g_library_get{nullptr};  // a plugin's: the library's Get
}  // namespace

void ReadFrom(const Values &(*library_get)()) { g_library_get.store(library_get, std::memory_order_release); }

const Values &Get() {
  if (auto *library_get = g_library_get.load(std::memory_order_acquire); library_get != nullptr) return library_get();
  if (const Values *s = g_scoped.load(std::memory_order_acquire); s != nullptr) return *s;
  static const Values values = [] {
    std::vector<std::string> complaints;
    Values v = Read([](const char *name) { return std::getenv(name); }, &complaints);
    for (const std::string &c : complaints) LogLine(LogLevel::kWarn, "strata: " + c);
    return v;
  }();
  return values;
}

ScopedValues::ScopedValues(const Values &v) : values_(v), before_(g_scoped.exchange(&values_)) {}
ScopedValues::~ScopedValues() { g_scoped.store(before_); }

}  // namespace strata::tunables
