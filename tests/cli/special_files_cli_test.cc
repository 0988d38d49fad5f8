// The CLI's own file reads (a prompts file) and the paths it hands the library refuse a FIFO or a
// device at once, with one `strata: error:` line naming the path. Every run is under `timeout`, so a
// blocking open() or an endless read of /dev/zero fails the test instead of hanging it.
#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <random>
#include <sstream>
#include <string>

#include "tests/format/format_test_util.h"

namespace {

using strata::format::testing::TempDir;

const std::string kModel = std::string(STRATA_SOURCE_DIR) + "/examples/models/austen-moe-q4_k.gguf";

struct Out {
  int code = -1;
  std::string err;
};

Out Cli(const std::string &args) {
  TempDir tmp;
  // The memory cap keeps a read without bound from taking the machine with it.
  const std::string cmd = "ulimit -v 4000000; timeout -s KILL 5 " + std::string(STRATA_CLI_PATH) + " " + args +
                          " >/dev/null 2>" + tmp.File("err");
  int rc = std::system(cmd.c_str());
  Out r;
  r.code = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  std::ifstream f(tmp.File("err"));
  std::stringstream ss;
  ss << f.rdbuf();
  r.err = ss.str();
  return r;
}

void ExpectRefused(const Out &r, const std::string &path, const std::string &what) {
  INFO("exit " << r.code << ", stderr: " << r.err);
  CHECK(r.code == 1);
  CHECK(r.err.rfind("strata: error: ", 0) == 0);
  CHECK(r.err.find(path) != std::string::npos);
  CHECK(r.err.find(what) != std::string::npos);
}

TEST_CASE("cli: a prompts file that is a FIFO or a device is refused", "[cli][special]") {
  TempDir t;
  const std::string fifo = t.File("prompts.fifo");
  REQUIRE(mkfifo(fifo.c_str(), 0600) == 0);
  ExpectRefused(Cli("profile --model " + kModel + " --prompts " + fifo + " --out " + t.File("hot.txt")), fifo,
                "FIFO");
  std::mt19937 rng(std::random_device{}());
  // /dev/null (empty) or /dev/zero (endless); a sandbox's plain-file /dev/null is replaced by /dev/full.
  struct stat st;
  const bool null_is_device = stat("/dev/null", &st) == 0 && S_ISCHR(st.st_mode);
  const std::string dev = rng() % 2 ? "/dev/zero" : null_is_device ? "/dev/null" : "/dev/full";
  ExpectRefused(Cli("profile --model " + kModel + " --prompts " + dev + " --out " + t.File("hot.txt")), dev,
                "character device");
  CHECK(access(t.File("hot.txt").c_str(), F_OK) != 0);
}

TEST_CASE("cli: a model, hotlist or session that is a FIFO is refused", "[cli][special]") {
  TempDir t;
  const std::string fifo = t.File("x.fifo");
  REQUIRE(mkfifo(fifo.c_str(), 0600) == 0);
  ExpectRefused(Cli("run --model " + fifo + " --tokens 1,2 -n 1"), fifo, "FIFO");
  ExpectRefused(Cli("run --model " + kModel + " --hotlist " + fifo + " --tokens 1,2 -n 1"), fifo, "FIFO");
  ExpectRefused(Cli("run --model " + kModel + " --load-session " + fifo + " -n 1"), fifo, "FIFO");
}

TEST_CASE("cli: an output whose temporary file name is taken by a FIFO is refused, not waited on", "[cli][special]") {
  TempDir t;
  const std::string out = t.File("logits.f32");
  // `exec` keeps the shell's pid, so the FIFO sits at the CLI's temporary name, out.tmp.<pid>.
  const std::string cmd = "ulimit -v 4000000; timeout -s KILL 5 sh -c 'mkfifo \"$1.tmp.$$\" && exec \"$2\" logits "
                          "--model \"$3\" --tokens 1,2 --out \"$1\"' sh " + out + " " + STRATA_CLI_PATH + " " +
                          kModel + " >/dev/null 2>" + t.File("err");
  const int rc = std::system(cmd.c_str());
  Out r;
  r.code = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  std::ifstream f(t.File("err"));
  std::stringstream ss;
  ss << f.rdbuf();
  r.err = ss.str();
  ExpectRefused(r, out + ".tmp.", "FIFO");
  CHECK(access(out.c_str(), F_OK) != 0);  // nothing written in its place
}

}  // namespace
