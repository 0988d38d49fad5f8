// The tuning knobs' table (lib/util/tunables.h): each type parsed, bad values reported by name and
// replaced by the default, the table's rows unique and documented, and no STRATA_* getenv left in
// lib/ or backends/ outside the table (and the context's streaming check, which has its own owner).
#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "lib/util/tunables.h"

namespace tn = strata::tunables;

namespace {

// A fake environment: the names it holds, nothing else.
tn::Lookup From(const std::map<std::string, std::string> &env) {
  return [&env](const char *name) -> const char * {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  };
}

const tn::Row *RowOf(const char *name) {
  for (const tn::Row &r : tn::Table()) {
    if (std::string(r.name) == name) return &r;
  }
  return nullptr;
}

}  // namespace

TEST_CASE("tunables: the table has unique names, each with a type and a doc", "[util]") {
  std::set<std::string> names;
  REQUIRE(tn::Table().size() >= 40);
  for (const tn::Row &r : tn::Table()) {
    INFO(r.name);
    CHECK(names.insert(r.name).second);
    CHECK(std::string(r.name).rfind("STRATA_", 0) == 0);
    CHECK(std::string(r.doc).size() > 10);
    CHECK(std::string(tn::TypeName(r.type)) != "?");
  }
  // The choices moe_params also offers are rows with their semantics' types.
  REQUIRE(RowOf("STRATA_CUDA_GRAPHS") != nullptr);
  CHECK(RowOf("STRATA_CUDA_GRAPHS")->type == tn::Type::kBool);
  CHECK(RowOf("STRATA_CUDA_COLD_COPIES")->type == tn::Type::kInt);
  CHECK(RowOf("STRATA_HUGEPAGES")->type == tn::Type::kBool);
  CHECK(RowOf("STRATA_CUDA_STREAMING")->type == tn::Type::kBool);
  CHECK(RowOf("STRATA_COLD_COPIES_NUMBER")->type == tn::Type::kString);
  CHECK(RowOf("STRATA_CPU_EXPERTS_LINK_US")->type == tn::Type::kDouble);
}

TEST_CASE("tunables: unset keeps every default, silently", "[util]") {
  std::map<std::string, std::string> env;
  std::vector<std::string> complaints;
  const tn::Values v = tn::Read(From(env), &complaints);
  const tn::Values d;
  CHECK(complaints.empty());
  for (const tn::Row &r : tn::Table()) CHECK(r.format(v) == r.format(d));
  // Empty counts as unset, as it did for the getenv sites.
  for (const tn::Row &r : tn::Table()) env[r.name] = "";
  const tn::Values e = tn::Read(From(env), &complaints);
  CHECK(complaints.empty());
  for (const tn::Row &r : tn::Table()) CHECK(r.format(e) == r.format(d));
}

TEST_CASE("tunables: each type parses its values", "[util]") {
  std::mt19937_64 rng(std::random_device{}());
  for (int round = 0; round < 20; ++round) {
    std::map<std::string, std::string> env, want;
    for (const tn::Row &r : tn::Table()) {
      std::string s, shown;
      switch (r.type) {
        case tn::Type::kBool: {
          const char *on[] = {"1", "on", "TRUE", "yes"}, *off[] = {"0", "off", "False", "NO"};
          const bool b = rng() % 2 == 0;
          s = (b ? on : off)[rng() % 4];
          shown = b ? "on" : "off";
          break;
        }
        case tn::Type::kInt: {
          const int64_t i = static_cast<int64_t>(rng() % 2000001) - 1000000;
          s = shown = std::to_string(i);
          break;
        }
        case tn::Type::kDouble: {
          const double x = static_cast<double>(static_cast<int64_t>(rng() % 4001) - 2000) / 8;  // exact in %g
          char buf[32];
          std::snprintf(buf, sizeof buf, "%g", x);
          s = shown = buf;
          break;
        }
        case tn::Type::kString:
          s = shown = "v" + std::to_string(rng() % 100000);
          break;
      }
      env[r.name] = s;
      want[r.name] = shown;
    }
    std::vector<std::string> complaints;
    const tn::Values v = tn::Read(From(env), &complaints);
    CHECK(complaints.empty());
    for (const tn::Row &r : tn::Table()) {
      INFO(r.name << "=" << env[r.name]);
      CHECK(r.format(v) == want[r.name]);
    }
  }
  // The typed fields themselves, for one knob of each type.
  std::map<std::string, std::string> env = {{"STRATA_CUDA_GRAPHS", "off"},
                                            {"STRATA_CUDA_COLD_COPIES", "0"},
                                            {"STRATA_CPU_EXPERTS_LINK_US", "37.5"},
                                            {"STRATA_COLD_COPIES_NUMBER", "copy"}};
  const tn::Values v = tn::Read(From(env), nullptr);
  CHECK(!v.cuda_graphs);
  CHECK(v.cuda_cold_copies == 0);
  CHECK(v.cpu_experts_link_us == 37.5);
  CHECK(v.cold_copies_number == "copy");
}

TEST_CASE("tunables: a value that does not parse keeps the default and is reported by name", "[util]") {
  std::mt19937_64 rng(std::random_device{}());
  const tn::Values d;
  for (const tn::Row &r : tn::Table()) {
    if (r.type == tn::Type::kString) continue;  // every string parses
    const std::string junk = (rng() % 2 ? "12x" : "maybe") + std::to_string(rng() % 1000);
    std::map<std::string, std::string> env = {{r.name, junk}};
    std::vector<std::string> complaints;
    const tn::Values v = tn::Read(From(env), &complaints);
    INFO(r.name << "=" << junk);
    CHECK(r.format(v) == r.format(d));
    REQUIRE(complaints.size() == 1);
    CHECK(complaints[0].find(r.name) != std::string::npos);
    CHECK(complaints[0].find(junk) != std::string::npos);
  }
  // Out of the type's range, and doubles that are not finite.
  std::vector<std::string> complaints;
  tn::Read(From({{"STRATA_CUDA_COLD_COPIES", "99999999999999999999"}, {"STRATA_CPU_EXPERTS_LINK_US", "nan"},
                 {"STRATA_CUDA_COPIES_MIN_COLD", "1e999"}}),
           &complaints);
  CHECK(complaints.size() == 3);
}

TEST_CASE("tunables: the process's snapshot is read once", "[util]") {
  const tn::Values *a = &tn::Get();
  CHECK(a == &tn::Get());
}

TEST_CASE("tunables: no STRATA_* getenv outside the table", "[util]") {
  namespace fs = std::filesystem;
  const fs::path root(STRATA_SOURCE_DIR);
  const std::set<std::string> allowed = {"lib/util/tunables.cc", "lib/runtime/context.cc"};
  const std::set<std::string> exts = {".cc", ".h", ".cu", ".cuh", ".c"};
  std::vector<std::string> found;
  size_t scanned = 0;
  for (const char *dir : {"lib", "backends", "examples"}) {
    for (const auto &e : fs::recursive_directory_iterator(root / dir)) {
      if (!e.is_regular_file() || exts.count(e.path().extension().string()) == 0) continue;
      const std::string rel = fs::relative(e.path(), root).generic_string();
      ++scanned;
      if (allowed.count(rel) != 0) continue;
      std::ifstream f(e.path());
      const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
      for (const char *pat : {"getenv(\"STRATA_", "getenv (\"STRATA_"}) {
        if (text.find(pat) != std::string::npos) found.push_back(rel);
      }
    }
  }
  CHECK(scanned > 50);
  std::string list;
  for (const std::string &f : found) list += " " + f;
  INFO("read these through lib/util/tunables.h instead:" << list);
  CHECK(found.empty());
}
