// bindings/csharp/Strata.Native.cs against include/strata/moe.h, without a C# compiler: both files are
// parsed and every exported function, callback typedef, struct and constant of moe.h must appear in
// the C# declarations with the same name, the same number of arguments (fields) in the same order,
// argument names, and a C# type that marshals as the C type does (the table in CsTypesFor). A C#
// declaration moe.h does not have fails too. Constants are compared by value.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "include/strata/moe.h"

namespace {

std::string ReadText(const std::string &path) {
  std::ifstream f(path);
  REQUIRE(f.good());
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string Squeeze(const std::string &s) {  // runs of white space -> one space, trimmed
  std::string out;
  for (char c : s) {
    if (std::isspace(static_cast<unsigned char>(c))) {
      if (!out.empty() && out.back() != ' ') out += ' ';
    } else {
      out += c;
    }
  }
  while (!out.empty() && out.back() == ' ') out.pop_back();
  return out;
}

std::string StripComments(std::string s, bool cs) {
  s = std::regex_replace(s, std::regex(R"(/\*[\s\S]*?\*/)"), " ");
  s = std::regex_replace(s, std::regex(R"(//[^\n]*)"), " ");
  (void)cs;
  return s;
}

std::vector<std::string> SplitTopLevel(const std::string &s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  int depth = 0;
  for (char c : s) {
    if (c == '(' || c == '[' || c == '<') ++depth;
    if (c == ')' || c == ']' || c == '>') --depth;
    if (c == sep && depth == 0) {
      out.push_back(Squeeze(cur));
      cur.clear();
    } else {
      cur += c;
    }
  }
  if (!Squeeze(cur).empty()) out.push_back(Squeeze(cur));
  return out;
}

// One declared name with its type: "const char *" / "path"; array length for fields ("[3]").
struct Decl {
  std::string type, name;
  int array = 0;
};

// A C type with its stars written one way: "moe_ctx **", "const char *", "const char *const*".
std::string StarType(const std::string &t) {
  std::string s = std::regex_replace(Squeeze(t), std::regex(R"(\s*\*\s*)"), "*");
  const size_t star = s.find('*');
  if (star != std::string::npos) s.insert(star, " ");
  return Squeeze(s);
}

// A C declaration "const moe_params *p" -> {"const moe_params *", "p"}.
Decl ParseC(const std::string &d) {
  std::smatch m;
  const std::string s = Squeeze(d);
  REQUIRE(std::regex_match(s, m, std::regex(R"(^(.*?)\s*(\w+)\s*(?:\[(\d+)\])?$)")));
  return Decl{StarType(m[1]), m[2], m[3].matched ? std::stoi(m[3]) : 0};
}

// A C# declaration "[MarshalAs(...)] ref moe_params p" -> {"ref moe_params", "p"}; SizeConst -> array.
Decl ParseCs(const std::string &d) {
  Decl out;
  std::smatch m;
  if (std::regex_search(d, m, std::regex(R"(SizeConst\s*=\s*(\d+))"))) out.array = std::stoi(m[1]);
  // Attributes ([MarshalAs(...)]) go; array brackets ("uint[]") stay.
  const std::string s = Squeeze(std::regex_replace(d, std::regex(R"(\[[A-Za-z][^\]]*\])"), " "));
  REQUIRE(std::regex_match(s, m, std::regex(R"(^(?:public\s+)?(.*?)\s*@?(\w+)$)")));
  out.type = Squeeze(m[1]);
  out.name = m[2];
  return out;
}

// The matches of `re` in `s`, in order.
std::vector<std::smatch> Matches(const std::string &s, const std::regex &re) {
  return {std::sregex_iterator(s.begin(), s.end(), re), std::sregex_iterator()};
}

struct Api {
  std::map<std::string, std::pair<std::string, std::vector<Decl>>> functions;  // name -> (return, args)
  std::map<std::string, std::pair<std::string, std::vector<Decl>>> callbacks;
  std::map<std::string, std::vector<Decl>> structs;
  std::map<std::string, std::string> constants;  // name -> expression
};

Api ParseHeader(const std::string &text) {
  const std::string s = StripComments(text, false);
  Api api;
  std::smatch m;
  const std::regex re_1(R"(MOE_API\s+([^;(]*?)\s*(\w+)\s*\(([^)]*)\)\s*;)");
  for (const std::smatch &it : Matches(s, re_1)) {
    std::vector<Decl> args;
    if (Squeeze(it[3]) != "void") {
      for (const std::string &a : SplitTopLevel(it[3], ',')) args.push_back(ParseC(a));
    }
    api.functions[it[2]] = {StarType(it[1]), args};
  }
  const std::regex re_2(R"(typedef\s+([^;(]*?)\s*\(\*(\w+)\)\(([^)]*)\);)");
  for (const std::smatch &it : Matches(s, re_2)) {
    std::vector<Decl> args;
    for (const std::string &a : SplitTopLevel(it[3], ',')) args.push_back(ParseC(a));
    api.callbacks[it[2]] = {Squeeze(it[1]), args};
  }
  const std::regex re_3(R"(typedef struct (\w+) \{([^}]*)\} \w+;)");
  for (const std::smatch &it : Matches(s, re_3)) {
    std::vector<Decl> fields;
    for (const std::string &f : SplitTopLevel(it[2], ';')) fields.push_back(ParseC(f));
    api.structs[it[1]] = fields;
  }
  const std::regex re_4(R"(#define (MOE_\w+)[ \t]+([^\n]+))");
  for (const std::smatch &it : Matches(s, re_4)) {
    const std::string name = it[1];
    if (name == "MOE_API") continue;
    api.constants[name] = Squeeze(it[2]);
  }
  const std::regex re_5(R"(typedef enum \w+ \{([^}]*)\})");
  for (const std::smatch &it : Matches(s, re_5)) {
    for (const std::string &item : SplitTopLevel(it[1], ',')) {
      REQUIRE(std::regex_match(item, m, std::regex(R"((\w+)\s*=\s*(.+))")));
      api.constants[m[1]] = Squeeze(m[2]);
    }
  }
  return api;
}

Api ParseCsharp(const std::string &text) {
  const std::string s = StripComments(text, true);
  Api api;
  const std::regex re_6(R"(\[DllImport\([^\]]*\)\]\s*public static extern\s+([\w\[\]]+)\s+(\w+)\s*\(((?:[^()]|\([^()]*\))*)\)\s*;)");
  for (const std::smatch &it : Matches(s, re_6)) {
    std::vector<Decl> args;
    for (const std::string &a : SplitTopLevel(it[3], ',')) args.push_back(ParseCs(a));
    api.functions[it[2]] = {it[1], args};
  }
  const std::regex re_7(R"(public delegate\s+(\w+)\s+(\w+)\s*\(((?:[^()]|\([^()]*\))*)\)\s*;)");
  for (const std::smatch &it : Matches(s, re_7)) {
    std::vector<Decl> args;
    for (const std::string &a : SplitTopLevel(it[3], ',')) args.push_back(ParseCs(a));
    api.callbacks[it[2]] = {it[1], args};
  }
  const std::regex re_8(R"(\[StructLayout\(LayoutKind\.Sequential\)\]\s*public struct (\w+)\s*\{([^}]*)\})");
  for (const std::smatch &it : Matches(s, re_8)) {
    std::vector<Decl> fields;
    for (const std::string &f : SplitTopLevel(it[2], ';')) fields.push_back(ParseCs(f));
    api.structs[it[1]] = fields;
  }
  const std::regex re_9(R"(public const int (MOE_\w+) = ([^;]+);)");
  for (const std::smatch &it : Matches(s, re_9)) {
    api.constants[it[1]] = Squeeze(it[2]);
  }
  return api;
}

// Evaluates a constant: integers (with a u suffix), names of other constants, ( ) | << * +.
class Eval {
 public:
  explicit Eval(const std::map<std::string, std::string> &defs) : defs_(defs) {}
  int64_t Value(const std::string &name, int depth = 0) {
    INFO("constant " << name);
    REQUIRE(depth < 16);
    REQUIRE(defs_.count(name) == 1);
    const std::string &e = defs_.at(name);
    size_t i = 0;
    const int64_t v = Or(e, i, depth);
    REQUIRE(i == e.size());
    return v;
  }

 private:
  void Skip(const std::string &e, size_t &i) {
    while (i < e.size() && e[i] == ' ') ++i;
  }
  int64_t Atom(const std::string &e, size_t &i, int depth) {
    Skip(e, i);
    REQUIRE(i < e.size());
    if (e[i] == '(') {
      ++i;
      const int64_t v = Or(e, i, depth);
      Skip(e, i);
      REQUIRE((i < e.size() && e[i] == ')'));
      ++i;
      return v;
    }
    size_t j = i;
    while (j < e.size() && (std::isalnum(static_cast<unsigned char>(e[j])) || e[j] == '_')) ++j;
    std::string tok = e.substr(i, j - i);
    i = j;
    REQUIRE(!tok.empty());
    if (std::isdigit(static_cast<unsigned char>(tok[0]))) {
      if (tok.back() == 'u' || tok.back() == 'U') tok.pop_back();
      return std::stoll(tok, nullptr, 0);
    }
    return Value(tok, depth + 1);
  }
  int64_t Mul(const std::string &e, size_t &i, int depth) {
    int64_t v = Atom(e, i, depth);
    for (Skip(e, i); i < e.size() && e[i] == '*'; Skip(e, i)) v *= Atom(e, ++i, depth);
    return v;
  }
  int64_t Add(const std::string &e, size_t &i, int depth) {
    int64_t v = Mul(e, i, depth);
    for (Skip(e, i); i < e.size() && e[i] == '+'; Skip(e, i)) v += Mul(e, ++i, depth);
    return v;
  }
  int64_t Shift(const std::string &e, size_t &i, int depth) {
    int64_t v = Add(e, i, depth);
    for (Skip(e, i); i + 1 < e.size() && e.compare(i, 2, "<<") == 0; Skip(e, i)) {
      i += 2;
      v <<= Add(e, i, depth);
    }
    return v;
  }
  int64_t Or(const std::string &e, size_t &i, int depth) {
    int64_t v = Shift(e, i, depth);
    for (Skip(e, i); i < e.size() && e[i] == '|'; Skip(e, i)) v |= Shift(e, ++i, depth);
    return v;
  }
  const std::map<std::string, std::string> &defs_;
};

// The C# types that marshal as C type `c` does; `where` is "arg", "return" or "field".
std::set<std::string> CsTypesFor(const std::string &c, const std::string &where, const Api &header) {
  static const std::map<std::string, std::set<std::string>> kScalars = {
      {"void", {"void"}},         {"int32_t", {"int"}},     {"moe_status", {"int"}},
      {"uint32_t", {"uint"}},     {"uint64_t", {"ulong"}},  {"size_t", {"UIntPtr", "nuint"}},
      {"float", {"float"}},       {"double", {"double"}}};
  if (auto it = kScalars.find(c); it != kScalars.end()) return it->second;
  if (header.callbacks.count(c) != 0) return where == "field" ? std::set<std::string>{"IntPtr", c} : std::set<std::string>{c, "IntPtr"};
  if (c.find('*') == std::string::npos) return {};
  std::set<std::string> ok = {"IntPtr"};  // any pointer may travel raw
  if (where == "return") return ok;
  if (where == "field") {
    if (c == "const char *") ok.insert("string");  // with MarshalAs(LPUTF8Str)
    return ok;
  }
  const std::string base = Squeeze(std::regex_replace(c, std::regex(R"(\bconst\b)"), ""));
  if (c.size() >= 2 && c.compare(c.size() - 2, 2, "**") == 0) return {"out IntPtr", "ref IntPtr", "IntPtr"};
  if (c == "const char *") ok.insert("string");
  if (c == "char *") ok.insert({"byte[]", "StringBuilder"});
  if (base == "void *") ok.insert("byte[]");
  if (c == "const int32_t *") ok.insert("int[]");
  if (c == "int32_t *") ok.insert({"int[]", "out int", "ref int"});
  if (c == "uint32_t *") ok.insert({"out uint", "ref uint", "uint[]"});
  if (c == "uint64_t *") ok.insert({"out ulong", "ref ulong", "ulong[]"});
  if (c == "size_t *") ok.insert({"out UIntPtr", "ref UIntPtr", "out nuint", "ref nuint"});
  const std::string pointee = Squeeze(base.substr(0, base.size() - 1));
  if (header.structs.count(pointee) != 0) {
    ok.insert({"ref " + pointee, "in " + pointee, "out " + pointee, pointee + "[]"});
  }
  return ok;
}

std::string Join(const std::set<std::string> &s) {
  std::string out;
  for (const std::string &x : s) out += (out.empty() ? "" : " | ") + x;
  return out;
}

// Every C declaration of `c` has a C# counterpart in `cs`, same count, names, marshalling types.
void CompareDecls(const std::string &what, const std::vector<Decl> &c, const std::vector<Decl> &cs,
                  const std::string &where, const Api &header) {
  INFO(what);
  REQUIRE(cs.size() == c.size());
  for (size_t i = 0; i < c.size(); ++i) {
    INFO("#" << i << " " << c[i].type << " " << c[i].name << " vs " << cs[i].type << " " << cs[i].name);
    CHECK(cs[i].name == c[i].name);
    CHECK(cs[i].array == c[i].array);
    std::string cs_type = cs[i].type;
    if (c[i].array > 0) {
      REQUIRE(cs_type.size() > 2);
      CHECK(cs_type.compare(cs_type.size() - 2, 2, "[]") == 0);
      cs_type = cs_type.substr(0, cs_type.size() - 2);
    }
    const std::set<std::string> ok = CsTypesFor(c[i].type, where, header);
    INFO("accepted: " << Join(ok));
    CHECK(ok.count(cs_type) == 1);
  }
}

void CompareApis(const Api &h, const Api &cs) {
  for (const auto &[name, fn] : h.functions) {
    INFO("function " << name);
    REQUIRE(cs.functions.count(name) == 1);
    const auto &[cs_ret, cs_args] = cs.functions.at(name);
    INFO("returns " << fn.first << " vs " << cs_ret);
    CHECK(CsTypesFor(fn.first, "return", h).count(cs_ret) == 1);
    CompareDecls(name, fn.second, cs_args, "arg", h);
  }
  for (const auto &[name, fn] : cs.functions) {
    INFO("C# declares " << name << ", which moe.h does not export");
    CHECK(h.functions.count(name) == 1);
  }
  for (const auto &[name, fn] : h.callbacks) {
    INFO("callback " << name);
    REQUIRE(cs.callbacks.count(name) == 1);
    CHECK(CsTypesFor(fn.first, "return", h).count(cs.callbacks.at(name).first) == 1);
    CompareDecls(name, fn.second, cs.callbacks.at(name).second, "arg", h);
  }
  for (const auto &[name, fields] : h.structs) {
    INFO("struct " << name);
    REQUIRE(cs.structs.count(name) == 1);
    CompareDecls(name, fields, cs.structs.at(name), "field", h);
  }
  for (const auto &[name, fields] : cs.structs) {
    INFO("C# struct " << name << ", which moe.h does not have");
    CHECK(h.structs.count(name) == 1);
  }
  Eval hv(h.constants), csv(cs.constants);
  for (const auto &[name, expr] : h.constants) {
    if (name.find('(') != std::string::npos || expr.find("((st)") != std::string::npos) continue;  // macros
    if (expr.empty() || expr.rfind("__attribute__", 0) == 0) continue;
    INFO("constant " << name << " = " << expr);
    REQUIRE(cs.constants.count(name) == 1);
    CHECK(csv.Value(name) == hv.Value(name));
  }
}

const std::string kHeader = std::string(STRATA_SOURCE_DIR) + "/include/strata/moe.h";
const std::string kCsharp = std::string(STRATA_SOURCE_DIR) + "/bindings/csharp/Strata.Native.cs";

}  // namespace

TEST_CASE("pinvoke: Strata.Native.cs declares moe.h's functions, callbacks, structs and constants", "[capi][pinvoke]") {
  const Api h = ParseHeader(ReadText(kHeader));
  const Api cs = ParseCsharp(ReadText(kCsharp));
  // The parsers see what moe.h holds (so an empty parse cannot pass).
  CHECK(h.functions.size() >= 53);
  CHECK(h.functions.count("moe_session_fork") == 1);
  CHECK(h.functions.at("moe_session_load_buffer").second.size() == 5);
  CHECK(h.structs.at("moe_params").size() >= 29);
  CHECK(h.callbacks.count("moe_log_fn") == 1);
  Eval hv(h.constants);
  CHECK(hv.Value("MOE_ERR_ABORTED") == MOE_ERR_ABORTED);
  CHECK(hv.Value("MOE_VERSION_NUMBER") == MOE_VERSION_NUMBER);
  CHECK(hv.Value("MOE_TOKENIZE_ADD_BOS") == MOE_TOKENIZE_ADD_BOS);
  CHECK(hv.Value("MOE_CACHE_HOTNESS") == MOE_CACHE_HOTNESS);
  CompareApis(h, cs);
}

TEST_CASE("pinvoke: the comparison catches a renamed function, a lost argument, a wrong type or value",
          "[capi][pinvoke]") {
  const Api h = ParseHeader(ReadText(kHeader));
  const std::string text = ReadText(kCsharp);
  auto fails = [&](const std::string &from, const std::string &to) {
    const size_t at = text.find(from);
    REQUIRE(at != std::string::npos);
    std::string bad = text;
    bad.replace(at, from.size(), to);
    const Api cs = ParseCsharp(bad);
    // Run the comparison in a section that is expected to fail: count failures by hand instead.
    size_t problems = 0;
    for (const auto &[name, fn] : h.functions) {
      if (cs.functions.count(name) == 0) {
        ++problems;
        continue;
      }
      const auto &args = cs.functions.at(name).second;
      if (args.size() != fn.second.size()) {
        ++problems;
        continue;
      }
      for (size_t i = 0; i < args.size(); ++i) {
        if (args[i].name != fn.second[i].name || CsTypesFor(fn.second[i].type, "arg", h).count(args[i].type) == 0) {
          ++problems;
        }
      }
    }
    for (const auto &[name, fields] : h.structs) {
      const auto &f = cs.structs.at(name);
      if (f.size() != fields.size()) ++problems;
      for (size_t i = 0; i < std::min(f.size(), fields.size()); ++i) {
        if (CsTypesFor(fields[i].type, "field", h).count(f[i].type.substr(0, f[i].type.find('['))) == 0) ++problems;
      }
    }
    Eval hv(h.constants), csv(cs.constants);
    for (const char *c : {"MOE_ERR_ABORTED", "MOE_LOG_DEBUG"}) problems += csv.Value(c) != hv.Value(c);
    return problems;
  };
  CHECK(fails("moe_session_rewind(", "moe_session_rewind(") == 0);  // the file itself is clean
  CHECK(fails("moe_session_fork(IntPtr s, out IntPtr @out)", "moe_session_forks(IntPtr s, out IntPtr @out)") > 0);
  CHECK(fails("moe_session_rewind(IntPtr s, int n_tokens)", "moe_session_rewind(IntPtr s)") > 0);
  CHECK(fails("moe_ctx_step_for(IntPtr ctx, ulong budget_us", "moe_ctx_step_for(IntPtr ctx, uint budget_us") > 0);
  CHECK(fails("public ulong kv_budget_bytes;", "public uint kv_budget_bytes;") > 0);
  CHECK(fails("MOE_ERR_ABORTED = (MOE_ERR_CANCELLED | (1 << 8))", "MOE_ERR_ABORTED = (MOE_ERR_CANCELLED | (2 << 8))") > 0);
}
