// Cache plans at real sizes: Qwen3-30B-A3B- and Mixtral-8x7B-shaped Q4_K files (written sparse by
// `strata synth --sparse`: real headers, no data) planned at 8 and 16 GiB by `strata plan`, whose
// ledger lines are recomputed here from the expert table and the hyper-parameters.
#include <catch2/catch.hpp>

#include <sys/wait.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <regex>
#include <string>

#include "lib/model/forward.h"
#include "lib/runtime/context.h"
#include "lib/store/expert_table.h"
#include "tests/format/format_test_util.h"

#ifdef STRATA_CLI_PATH  // runs the `strata` binary (built with the examples)
namespace {

using strata::format::testing::TempDir;

std::string RunCli(const std::string &args, int *code) {
  TempDir t;
  const std::string cmd = std::string(STRATA_CLI_PATH) + " " + args + " >" + t.File("o") + " 2>" + t.File("e");
  const int rc = std::system(cmd.c_str());
  *code = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  std::ifstream f(t.File("o"));
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

// The byte count of the ledger line that starts with `item`.
uint64_t LedgerBytes(const std::string &ledger, const std::string &item) {
  std::smatch m;
  std::regex re("\n" + item + " +([0-9]+) ");
  REQUIRE(std::regex_search(ledger, m, re));
  return std::stoull(m[1]);
}

}  // namespace

TEST_CASE("plan ledgers of real-size shapes match the expert table", "[store][plan]") {
  TempDir tmp;
  for (const char *shape : {"qwen3-30b-a3b", "mixtral-8x7b"}) {
    const std::string file = tmp.File(std::string(shape) + ".gguf");
    int code = -1;
    RunCli(std::string("synth --shape ") + shape + " --codec q4_k --sparse --out " + file, &code);
    REQUIRE(code == 0);
    auto d = strata::runtime::Context::Describe(file);
    REQUIRE(d.ok());
    const strata::store::ExpertTable table(d->weights);
    uint64_t routed = 0, largest = 0;
    for (int l = 0; l < table.n_layers(); ++l) {
      for (int e = 0; e < table.n_experts(); ++e) {
        routed += table.entry(l, e).bytes;
        largest = std::max(largest, table.entry(l, e).weights->nbytes());
      }
    }
    const uint64_t n_experts = static_cast<uint64_t>(table.n_layers()) * table.n_experts();
    for (uint64_t gib : {8, 16}) {
      const std::string ledger =
          RunCli("plan --model " + file + " --ram-budget " + std::to_string(gib) + "G --n-ctx 4096", &code);
      INFO(shape << " at " << gib << " GiB:\n" << ledger);
      REQUIRE(code == 0);
      CHECK(LedgerBytes(ledger, "routed experts \\(all\\)") == routed);
      const uint64_t non_routed = LedgerBytes(ledger, "non-routed weights");
      CHECK(non_routed == strata::model::NonRoutedBytes(d->weights));
      const uint64_t kv = LedgerBytes(ledger, "KV cache");
      CHECK(kv == strata::model::KvCache::BytesFor(d->hp, 1) * 4096);
      const uint64_t workspace = LedgerBytes(ledger, "workspace");
      const uint64_t fixed = LedgerBytes(ledger, "fixed");
      CHECK(fixed == non_routed + kv + workspace);
      const uint64_t budget = gib << 30;
      CHECK(LedgerBytes(ledger, "RAM budget") == budget);
      const uint64_t slots = std::min<uint64_t>(n_experts, (budget - fixed) / largest);
      CHECK(LedgerBytes(ledger, "RAM expert tier") == slots * largest);
      CHECK(ledger.find("= " + std::to_string(slots) + " slots") != std::string::npos);
      CHECK(LedgerBytes(ledger, "streamed from file") == routed - slots * largest);
      CHECK(slots < n_experts);  // neither shape fits at these budgets: experts stream
    }
    // The KV line: whole 128-token blocks per session, times the sessions; or the requested budget.
    const uint64_t block = strata::model::KvCache::BytesFor(d->hp, 128);
    const std::string three = RunCli("plan --model " + file + " --ram-budget 16G --n-ctx 4000 --max-sessions 3", &code);
    REQUIRE(code == 0);
    CHECK(LedgerBytes(three, "KV cache") == 3 * 32 * block);  // ceil(4000 / 128) = 32 blocks each
    CHECK(three.find("3 sessions x 32 blocks (n_ctx 4000)") != std::string::npos);
    CHECK(LedgerBytes(three, "fixed") == LedgerBytes(three, "non-routed weights") + 3 * 32 * block +
                                             LedgerBytes(three, "workspace"));
    const std::string req = RunCli("plan --model " + file + " --ram-budget 16G --kv-budget 1G", &code);
    REQUIRE(code == 0);
    CHECK(LedgerBytes(req, "KV cache") == (1ull << 30));
    CHECK(req.find("requested budget: " + std::to_string((1ull << 30) / block) + " blocks") != std::string::npos);
  }
}
#endif  // STRATA_CLI_PATH
