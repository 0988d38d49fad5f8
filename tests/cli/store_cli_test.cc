// CLI of the expert tiers: --stats prints one JSON line last on stderr, bench reports streaming
// figures (and --json), profile writes a hotlist that --hotlist preloads, --lock-memory pins RAM.
#include <catch2/catch.hpp>

#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>

#include "nlohmann/json.hpp"
#include "tests/format/format_test_util.h"

namespace {

using strata::format::testing::TempDir;

const std::string kModel = std::string(STRATA_SOURCE_DIR) + "/tests/golden/qwen3moe_mixed/model-mixed.gguf";

struct Out {
  int code = -1;
  std::string out, err;
};

std::string Slurp(const std::string &p) {
  std::ifstream f(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

Out Cli(const std::string &args) {
  TempDir t;
  const std::string cmd = std::string(STRATA_CLI_PATH) + " " + args + " >" + t.File("o") + " 2>" + t.File("e");
  const int rc = std::system(cmd.c_str());
  return Out{WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, Slurp(t.File("o")), Slurp(t.File("e"))};
}

nlohmann::json LastLineJson(const std::string &text) {
  std::string s = text;
  while (!s.empty() && s.back() == '\n') s.pop_back();
  const auto nl = s.rfind('\n');
  auto j = nlohmann::json::parse(nl == std::string::npos ? s : s.substr(nl + 1), nullptr, false);
  REQUIRE(!j.is_discarded());
  return j;
}

}  // namespace

TEST_CASE("the --stats flag prints the expert-tier counters as the last line of stderr", "[cli][store]") {
  Out r = Cli("run --model " + kModel + " --tokens 1,2,3 -n 4 --ram-budget 1 --stats");
  INFO(r.err);
  REQUIRE(r.code == 0);
  auto j = LastLineJson(r.err);
  for (const char *k : {"expert_hits", "expert_misses", "bytes_read", "io_wait_s"}) CHECK(j.contains(k));
  CHECK(j["streaming"] == 1);
  CHECK(j["expert_misses"].get<uint64_t>() > 0);
  CHECK(j["bytes_read"].get<uint64_t>() > 0);
  Out full = Cli("logits --model " + kModel + " --tokens 1,2,3 --out /dev/null --stats");
  REQUIRE(full.code == 0);
  auto f = LastLineJson(full.err);
  CHECK(f["streaming"] == 0);
  CHECK(f["expert_misses"] == 0);
  // One use per distinct expert per layer per batch: between top-2 and 3 tokens x top-2, 2 layers.
  CHECK(f["expert_hits"].get<uint64_t>() >= 2u * 2u);
  CHECK(f["expert_hits"].get<uint64_t>() <= 2u * 3u * 2u);
}

TEST_CASE("bench reports decode speed, hit rate and bytes per token", "[cli][store]") {
  Out r = Cli("bench --model " + kModel + " --ram-budget 1 --prompt-tokens 8 -n 8 --json");
  INFO(r.err);
  REQUIRE(r.code == 0);
  auto j = LastLineJson(r.out);
  CHECK(j["decode_tokens"] == 8);
  CHECK(j["decode_tok_s"].get<double>() > 0);
  // One time a step, summarized by its median, 90th percentile and maximum.
  const auto steps = j["decode_step_ms"].get<std::vector<double>>();
  REQUIRE(steps.size() == 8);
  std::vector<double> sorted = steps;
  std::sort(sorted.begin(), sorted.end());
  CHECK(sorted.front() > 0);
  CHECK(j["decode_step_ms_max"].get<double>() == Approx(sorted.back()).margin(2e-3));
  CHECK(j["decode_step_ms_p50"].get<double>() == Approx(0.5 * (sorted[3] + sorted[4])).margin(2e-3));
  CHECK(j["decode_step_ms_p90"].get<double>() == Approx(sorted[7]).margin(2e-3));
  CHECK(j["decode_steady_tok_s"].get<double>() == Approx(1e3 / j["decode_step_ms_p50"].get<double>()).epsilon(1e-2));
  // The steps are the decode: their sum is its wall time, within the feeding between steps.
  double sum = 0;
  for (double ms : steps) sum += ms;
  CHECK(8e3 / sum >= j["decode_tok_s"].get<double>() * 0.99);
  CHECK(j["ram_expert_slots"].get<uint32_t>() < j["routed_experts"].get<uint32_t>());
  CHECK(j["decode_hit_rate"].get<double>() >= 0.0);
  CHECK(j["decode_hit_rate"].get<double>() <= 1.0);
  Out t = Cli("bench --model " + kModel + " --prompt-tokens 8 -n 4");
  REQUIRE(t.code == 0);
  CHECK(t.out.find("expert hit rate") != std::string::npos);
  Out bad = Cli("bench --model " + kModel + " --policy fifo");
  CHECK(bad.code == 1);
  CHECK(bad.err.find("--policy") != std::string::npos);
}

TEST_CASE("bench feeds given prompt and decode ids", "[cli][store]") {
  // Without prefetch the cache's choices depend only on the token ids, so two runs over the same
  // ids count the same hits and misses, and decode runs exactly the given ids.
  const std::string ids = " --tokens 3,141,59,26 --decode-tokens 53,58,97,93,238 --prefetch 0 --json";
  Out a = Cli("bench --model " + kModel + " --ram-budget 1" + ids);
  Out b = Cli("bench --model " + kModel + " --ram-budget 1" + ids);
  INFO(a.err);
  REQUIRE(a.code == 0);
  REQUIRE(b.code == 0);
  auto ja = LastLineJson(a.out), jb = LastLineJson(b.out);
  CHECK(ja["prefill_tokens"] == 4);
  CHECK(ja["decode_tokens"] == 5);
  CHECK(ja["stats"]["expert_hits"] == jb["stats"]["expert_hits"]);
  CHECK(ja["stats"]["expert_misses"] == jb["stats"]["expert_misses"]);
  CHECK(ja["stats"]["prefetch_issued"] == 0);
  Out bad = Cli("bench --model " + kModel + " --decode-tokens 1,99999");
  CHECK(bad.code == 1);
  CHECK(bad.err.find("outside the vocabulary") != std::string::npos);
  Out junk = Cli("bench --model " + kModel + " --decode-tokens 1,x");
  CHECK(junk.code == 1);
  CHECK(junk.err.find("--decode-tokens") != std::string::npos);
}

TEST_CASE("bench --warmup times a second round in fresh sessions", "[cli][store]") {
  // The warm-up round (other prompts, its own decode steps) stays out of the figures: the timed
  // round counts as many expert uses, over the same ids, as a run without it.
  const std::string ids = " --tokens 3,141,59,26 --decode-tokens 53,58,97,93,238 --json";
  Out cold = Cli("bench --model " + kModel + ids);
  Out warm = Cli("bench --model " + kModel + ids + " --warmup 3");
  INFO(warm.err);
  REQUIRE(cold.code == 0);
  REQUIRE(warm.code == 0);
  auto jc = LastLineJson(cold.out), jw = LastLineJson(warm.out);
  CHECK(jc["warmup_steps"] == 0);
  CHECK(jw["warmup_steps"] == 3);
  CHECK(jw["prefill_tokens"] == 4);
  CHECK(jw["decode_tokens"] == 5);
  CHECK(jw["decode_step_ms"].size() == 5);
  const auto uses = [](const nlohmann::json &j) {
    return j["stats"]["expert_hits"].get<uint64_t>() + j["stats"]["expert_misses"].get<uint64_t>();
  };
  CHECK(uses(jw) == uses(jc));
  CHECK(uses(jw) > 0);
  // A warm-up longer than the context: its round ends when the sessions fill; the timed one runs.
  Out full = Cli("bench --model " + kModel + ids + " --n-ctx 12 --warmup 50");
  INFO(full.err);
  REQUIRE(full.code == 0);
  CHECK(LastLineJson(full.out)["decode_tokens"] == 5);
  Out bad = Cli("bench --model " + kModel + " --warmup -1");
  CHECK(bad.code == 1);
  CHECK(bad.err.find("--warmup") != std::string::npos);
}

TEST_CASE("profile writes a hotlist that preloading reads", "[cli][store]") {
  TempDir t;
  std::ofstream(t.File("prompts.txt")) << "1,2,3,4,5,6\n200,100,50,25\n";
  Out r = Cli("profile --model " + kModel + " --prompts " + t.File("prompts.txt") + " --out " + t.File("hot.txt") +
              " -n 3");
  INFO(r.err);
  REQUIRE(r.code == 0);
  std::ifstream in(t.File("hot.txt"));
  std::string line;
  std::getline(in, line);
  CHECK(line.rfind("#", 0) == 0);
  uint64_t total = 0, prev = UINT64_MAX;
  int layer, expert;
  uint64_t count;
  while (in >> layer >> expert >> count) {
    CHECK(layer >= 0);
    CHECK(layer < 2);
    CHECK(expert >= 0);
    CHECK(expert < 8);
    CHECK(count <= prev);  // hottest first
    prev = count;
    total += count;
  }
  // Every selection counts: (6 + 3) and (4 + 3) tokens through 2 layers at top-2.
  CHECK(total == 2u * 2u * (6 + 3 + 4 + 3));
  Out pre = Cli("bench --model " + kModel + " --ram-budget 1 --hotlist " + t.File("hot.txt") +
                " --prompt-tokens 4 -n 2 --json");
  REQUIRE(pre.code == 0);
  Out missing = Cli("profile --model " + kModel + " --prompts " + t.File("absent.txt") + " --out " + t.File("x"));
  CHECK(missing.code == 1);
  CHECK(!std::ifstream(t.File("x")).good());
}

TEST_CASE("the --lock-memory flag pins RAM before the run", "[cli][store]") {
  Out r = Cli("run --model " + kModel + " --tokens 1,2 -n 2 --lock-memory 64M");
  INFO(r.err);
  REQUIRE(r.code == 0);
  CHECK(r.err.find("locked 67108864 bytes") != std::string::npos);
  Out bad = Cli("run --model " + kModel + " --lock-memory lots");
  CHECK(bad.code == 1);
}

TEST_CASE("bench --sweep runs every cache configuration and names the fastest", "[cli][store]") {
  Out r = Cli("bench --model " + kModel + " --ram-budget 1 --prompt-tokens 4 -n 3 --sweep");
  INFO(r.err);
  REQUIRE(r.code == 0);
  size_t rows = 0;
  for (size_t pos = 0; (pos = r.out.find('\n', pos)) != std::string::npos; ++pos) ++rows;
  CHECK(rows == 1 + 27 + 1);  // header, 3 policies x 3 distances x 3 thread counts, the verdict
  CHECK(r.out.find("fastest: --policy ") != std::string::npos);
  for (const char *p : {"lru", "lfu", "hot"}) CHECK(r.out.find(std::string("\n") + p) != std::string::npos);
}
