// The library's layering: nothing under lib/ includes a backend header. Backends are chosen and
// made through backends/registry.h alone, which the library reaches only through lib/model's
// neutral request and the registry's functions, so lib/ builds the same with or without CUDA. And
// no Abseil hash table is used under lib/ or backends/ (lib/util/hash_containers.h says why).
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <unistd.h>

namespace {

namespace fs = std::filesystem;

// Every `#include "backends/...` line of the C++ and CUDA sources under `root`, as "path:line".
std::vector<std::string> BackendIncludes(const fs::path &root) {
  std::vector<std::string> found;
  for (const fs::directory_entry &e : fs::recursive_directory_iterator(root)) {
    if (!e.is_regular_file()) continue;
    const std::string ext = e.path().extension().string();
    if (ext != ".h" && ext != ".cc" && ext != ".cu" && ext != ".cuh") continue;
    std::ifstream f(e.path());
    std::string line;
    for (int n = 1; std::getline(f, line); ++n) {
      const size_t i = line.find_first_not_of(" \t");
      if (i == std::string::npos || line[i] != '#') continue;
      const size_t inc = line.find("include", i);
      if (inc == std::string::npos) continue;
      const size_t q = line.find_first_not_of(" \t", inc + 7);
      if (q != std::string::npos && line.compare(q, 10, "\"backends/") == 0) {
        found.push_back(fs::relative(e.path(), root).string() + ":" + std::to_string(n));
      }
    }
  }
  return found;
}

// Every include of an Abseil hash or B-tree container under `root`, as "path:line".
std::vector<std::string> AbseilTableIncludes(const fs::path &root) {
  std::vector<std::string> found;
  for (const fs::directory_entry &e : fs::recursive_directory_iterator(root)) {
    if (!e.is_regular_file()) continue;
    const std::string ext = e.path().extension().string();
    if (ext != ".h" && ext != ".cc" && ext != ".cu" && ext != ".cuh") continue;
    std::ifstream f(e.path());
    std::string line;
    for (int n = 1; std::getline(f, line); ++n) {
      for (const char *bad : {"absl/container/flat_hash_", "absl/container/node_hash_", "absl/container/btree_"}) {
        if (line.find("#include") != std::string::npos && line.find(bad) != std::string::npos) {
          found.push_back(fs::relative(e.path(), root).string() + ":" + std::to_string(n));
        }
      }
    }
  }
  return found;
}

}  // namespace

TEST_CASE("no Abseil hash table in the library: an allocation failure must unwind cleanly", "[runtime][layering]") {
  for (const char *dir : {"lib", "backends"}) {
    const fs::path root = fs::path(STRATA_SOURCE_DIR) / dir;
    REQUIRE(fs::is_directory(root));
    const std::vector<std::string> found = AbseilTableIncludes(root);
    std::string list;
    for (const std::string &f : found) list += " " + f;
    INFO("Abseil tables under " << dir << "/ (use strata::HashMap / HashSet, lib/util/hash_containers.h):" << list);
    CHECK(found.empty());
  }
  // The check sees one.
  const fs::path tmp = fs::temp_directory_path() / ("strata_tables_" + std::to_string(::getpid()));
  fs::create_directories(tmp);
  std::ofstream(tmp / "x.h") << "#pragma once\n#include \"absl/container/flat_hash_map.h\"\n";
  const std::vector<std::string> seen = AbseilTableIncludes(tmp);
  fs::remove_all(tmp);
  REQUIRE(seen.size() == 1);
  CHECK(seen[0] == "x.h:2");
}

TEST_CASE("the library formats through strata::StrFormat, whose allocation failures unwind", "[runtime][layering]") {
  // absl::StrFormat flushes from a destructor: a std::bad_alloc there terminates (lib/util/str_format.h).
  for (const char *dir : {"lib", "backends"}) {
    std::vector<std::string> found;
    for (const fs::directory_entry &e : fs::recursive_directory_iterator(fs::path(STRATA_SOURCE_DIR) / dir)) {
      if (!e.is_regular_file() || e.path().filename() == "str_format.h") continue;
      const std::string ext = e.path().extension().string();
      if (ext != ".h" && ext != ".cc" && ext != ".cu" && ext != ".cuh") continue;
      std::ifstream f(e.path());
      std::string line;
      for (int n = 1; std::getline(f, line); ++n) {
        for (const char *bad : {"absl::StrFormat(", "absl::StrAppendFormat(", "absl::Format("}) {
          if (line.find(bad) != std::string::npos) found.push_back(e.path().string() + ":" + std::to_string(n));
        }
      }
    }
    std::string list;
    for (const std::string &f : found) list += " " + f;
    INFO("absl formatting under " << dir << "/ (use strata::StrFormat):" << list);
    CHECK(found.empty());
  }
}

TEST_CASE("nothing in lib/ includes a backend header", "[runtime][layering]") {
  const fs::path lib = fs::path(STRATA_SOURCE_DIR) / "lib";
  REQUIRE(fs::is_directory(lib / "runtime"));
  const std::vector<std::string> found = BackendIncludes(lib);
  std::string list;
  for (const std::string &f : found) list += " " + f;
  INFO("includes of backends/ under lib/ (choose backends through backends/registry.h):" << list);
  CHECK(found.empty());
}

TEST_CASE("the layering check sees an include of a backend header", "[runtime][layering]") {
  // A fresh tree with one offending file among clean ones, so the check above can fail.
  const fs::path root = fs::temp_directory_path() / ("strata_layering_" + std::to_string(::getpid()));
  fs::remove_all(root);
  fs::create_directories(root / "runtime");
  fs::create_directories(root / "model");
  std::ofstream(root / "model" / "clean.h") << "#pragma once\n#include \"lib/model/backend.h\"\n";
  std::ofstream(root / "runtime" / "bad.cc") << "// x\n#include <vector>\n  #  include \"backends/cpu/cpu_backend.h\"\n";
  std::ofstream(root / "runtime" / "note.txt") << "#include \"backends/cuda/device.h\"\n";  // not a source
  const std::vector<std::string> found = BackendIncludes(root);
  fs::remove_all(root);
  REQUIRE(found.size() == 1);
  CHECK(found[0] == "runtime/bad.cc:3");
}
