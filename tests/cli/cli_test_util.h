// Running the built `strata` from a test: its exit status, stdout and stderr, and the check that a
// refusal is one line `strata: error: ...` naming what is wrong.
#pragma once

#include <catch2/catch.hpp>

#include <sys/wait.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>

#include "tests/format/format_test_util.h"

namespace strata::testing {

struct CliResult {
  int exit_code = -1;
  std::string out, err;
};

inline std::string Slurp(const std::string &path) {
  std::ifstream f(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

// Runs `strata ARGS` with `input` on stdin.
inline CliResult RunCli(const std::string &args, const std::string &input = "") {
  format::testing::TempDir tmp;
  {
    std::ofstream in(tmp.File("in"), std::ios::binary);
    in << input;
  }
  const std::string cmd = std::string(STRATA_CLI_PATH) + " " + args + " <" + tmp.File("in") + " >" + tmp.File("out") +
                          " 2>" + tmp.File("err");
  const int rc = std::system(cmd.c_str());
  CliResult r;
  r.exit_code = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  r.out = Slurp(tmp.File("out"));
  r.err = Slurp(tmp.File("err"));
  return r;
}

inline void ExpectCliError(const CliResult &r, const std::string &mention) {
  INFO("stderr: " << r.err);
  CHECK(r.exit_code == 1);
  CHECK(r.err.rfind("strata: error: ", 0) == 0);
  CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
  CHECK(r.err.find(mention) != std::string::npos);
}

}  // namespace strata::testing
