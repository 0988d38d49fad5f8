// Scratch directories for the KV spill tests: a fresh one under /tmp, and how many entries it
// holds (a spill that leaves nothing behind leaves it empty).
#pragma once

#include <catch2/catch.hpp>

#include <dirent.h>
#include <stdlib.h>

#include <cstring>
#include <string>

namespace strata::testing {

inline std::string MakeTempDir(const char *tmpl_in = "/tmp/strata-kv-test-XXXXXX") {
  std::string tmpl = tmpl_in;
  REQUIRE(mkdtemp(tmpl.data()) != nullptr);
  return tmpl;
}

// Entries in dir other than . and ..; -1 when it cannot be read.
inline int CountEntries(const std::string &dir) {
  int n = 0;
  DIR *d = opendir(dir.c_str());
  if (d == nullptr) return -1;
  while (dirent *e = readdir(d)) {
    if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) ++n;
  }
  closedir(d);
  return n;
}

}  // namespace strata::testing
