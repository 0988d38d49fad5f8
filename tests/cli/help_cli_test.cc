// The command line's shape (issue 52): every command's --help is its own and lists its options;
// every option it lists is accepted and every option it does not list is refused naming it; an
// unknown option gets the nearest spelling; --version says the library's version.
#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "include/strata/moe.h"
#include "tests/cli/cli_test_util.h"

namespace {

using strata::testing::CliResult;
using strata::testing::ExpectCliError;
using strata::testing::RunCli;

// The commands of DESIGN.md §3.2 and the README, written out here rather than read from the CLI.
const std::vector<std::string> kCommands = {
    "run",  "chat",  "serve",      "logits",  "tokenize",    "inspect", "plan", "bench",
    "profile", "pack", "synth", "perplexity", "imatrix", "sensitivity"};

// The options a command's help lists: each spelling and its value's placeholder ("" for a switch).
// An option line is "  -x, --long VALUE   doc": the left column ends at two spaces or the line's end.
std::map<std::string, std::string> ListedOptions(const std::string &help) {
  std::map<std::string, std::string> out;
  std::istringstream in(help);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("  -", 0) != 0) continue;
    const size_t gap = line.find("  ", 2);
    std::istringstream words(line.substr(2, gap == std::string::npos ? std::string::npos : gap - 2));
    std::vector<std::string> names;
    std::string w, placeholder;
    while (words >> w) {
      if (w[0] != '-') placeholder = w;
      else names.push_back(w.back() == ',' ? w.substr(0, w.size() - 1) : w);
    }
    for (const std::string &n : names) out[n] = placeholder;
  }
  return out;
}

// A value the parser takes for a placeholder: the first choice, a small number, a size or a word.
std::string ValueFor(const std::string &placeholder) {
  if (placeholder.empty()) return "";
  if (placeholder.find('|') != std::string::npos) return placeholder.substr(0, placeholder.find('|'));
  if (placeholder == "SIZE") return "1M";
  if (placeholder.size() == 1 || placeholder == "1,2,3" || placeholder == "4,5,6" || placeholder == "0,1") return "1";
  return "x";
}

TEST_CASE("strata CMD --help is CMD's own: its usage and its options", "[cli]") {
  std::set<std::string> seen;
  for (const std::string &c : kCommands) {
    INFO("command " << c);
    const CliResult r = RunCli(c + " --help");
    CHECK(r.exit_code == 0);
    CHECK(r.err.empty());
    CHECK(r.out.rfind("usage: strata " + c + " ", 0) == 0);
    CHECK(seen.insert(r.out).second);  // no two commands share a help
    CHECK(RunCli(c + " -h").out == r.out);
    CHECK(RunCli("help " + c).out == r.out);
    // --help wins wherever it is, but not as another option's value.
    CHECK(RunCli(c + " --bogus-option --help").out == r.out);
    CHECK(ListedOptions(r.out).count("--help") == 1);
  }
  const CliResult global = RunCli("--help");
  CHECK(global.exit_code == 0);
  CHECK(seen.count(global.out) == 0);
  for (const std::string &c : kCommands) CHECK(global.out.find("\n  " + c + " ") != std::string::npos);
  CHECK(RunCli("-h").out == global.out);
  CHECK(RunCli("help").out == global.out);
  ExpectCliError(RunCli("help frobnicate"), "frobnicate");

  // Options each command must list, and some it must not (DESIGN.md §3.2, README).
  const std::map<std::string, std::pair<std::vector<std::string>, std::vector<std::string>>> expect = {
      {"run", {{"--model", "--prompt", "--tokens", "-n", "--temp", "--seed", "--stop", "--save-session", "--stats",
                "--backend", "--ram-budget", "--vram-budget", "--cache-type-k", "-ctk", "--cache-type-v", "-ctv"},
               {"--text", "--port", "--experts", "--file", "--sessions"}}},
      {"chat", {{"--system", "--template", "-v", "--temp", "--min-p"}, {"--tokens", "--out", "--port"}}},
      {"serve", {{"--host", "--port", "--parallel", "--queue", "--api-key", "--max-body", "--template", "--temp"},
                 {"--prompt", "--tokens", "--out"}}},
      {"logits", {{"--model", "--tokens", "--prefill", "--out", "--stats", "--ram-budget"}, {"--temp", "--prompt"}}},
      {"tokenize", {{"--model", "--text", "--special"}, {"--temp", "--sessions", "--out", "-n", "--stats"}}},
      {"inspect", {{"--model"}, {"--ram-budget", "--temp", "--out", "--backend", "--cache-type-k"}}},
      {"plan", {{"--model", "--ram-budget", "--vram-budget", "--backend", "--json", "--n-ctx", "--kv-budget", "-ctk",
                 "-ctv"},
                {"--temp", "--prompt", "--policy"}}},
      {"bench", {{"--prompt", "--prompt-tokens", "--json", "--sweep", "--sessions", "--warmup", "--decode-tokens",
                  "--policy", "--prefetch", "--io-threads"},
                 {"--temp", "--out", "--text"}}},
      {"profile", {{"--prompts", "--out", "-n"}, {"--temp", "--json"}}},
      {"pack", {{"--experts", "--attention", "--boost", "--boost-layers", "--imatrix", "--tensor-type", "--target-size",
                 "--sensitivity", "--expert-contiguous", "--hotlist"},
                {"--model", "--backend", "--temp", "--ram-budget"}}},
      {"synth", {{"--shape", "--out", "--codec", "--attention", "--layers", "--seed", "--sparse", "--routing"},
                 {"--model", "--backend", "--experts", "--cache-type-v"}}},
      {"perplexity", {{"--file", "-c", "--chunks", "-b", "--json", "--kl-divergence-base", "--kl-divergence",
                       "--cache-type-k"},
                      {"--temp", "--out", "--policy"}}},
      {"imatrix", {{"--file", "--out", "-c", "--chunks"}, {"--temp", "--json", "--kl-divergence"}}},
      {"sensitivity", {{"--file", "--out", "--json", "-c", "--chunks"}, {"--backend", "--temp", "--kl-divergence"}}},
  };
  for (const auto &[c, lists] : expect) {
    const auto listed = ListedOptions(RunCli(c + " --help").out);
    for (const std::string &o : lists.first) {
      INFO(c << " should list " << o);
      CHECK(listed.count(o) == 1);
    }
    for (const std::string &o : lists.second) {
      INFO(c << " should not list " << o);
      CHECK(listed.count(o) == 0);
    }
  }
}

TEST_CASE("strata CMD takes the options its help lists and refuses the others, naming them", "[cli]") {
  std::map<std::string, std::map<std::string, std::string>> listed;
  std::map<std::string, std::string> taken_by;  // every option, and one command that lists it
  for (const std::string &c : kCommands) {
    listed[c] = ListedOptions(RunCli(c + " --help").out);
    for (const auto &[o, placeholder] : listed[c]) taken_by.emplace(o, c);
  }
  REQUIRE(taken_by.size() > 80);
  // Taken: parsing goes on past it (and its value) to the unknown option after it, which is what
  // it refuses; a row of the table the parser did not handle would be refused instead.
  auto expect_taken = [&](const std::string &c, const std::string &o) {
    INFO(c << " " << o);
    const std::string v = ValueFor(listed[c].at(o));
    ExpectCliError(RunCli(c + " " + o + (v.empty() ? "" : " " + v) + " --zz-not-an-option"),
                   "unknown option '--zz-not-an-option'");
  };
  for (const auto &[o, c] : taken_by)
    if (o != "--help" && o != "-h") expect_taken(c, o);
  // Each command (a fresh sample each run: the whole matrix is some 1,300 runs): options it lists
  // are taken, options only others list are refused naming the command and the spelling given.
  std::random_device rd;
  const unsigned seed = rd();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  for (const std::string &c : kCommands) {
    std::vector<std::string> own, foreign;
    for (const auto &[o, c2] : taken_by) {
      if (o == "--help" || o == "-h") continue;
      (listed[c].count(o) == 1 ? own : foreign).push_back(o);
    }
    std::shuffle(own.begin(), own.end(), rng);
    std::shuffle(foreign.begin(), foreign.end(), rng);
    for (size_t i = 0; i < std::min<size_t>(own.size(), 3); ++i) expect_taken(c, own[i]);
    for (size_t i = 0; i < std::min<size_t>(foreign.size(), 6); ++i) {
      INFO(c << " " << foreign[i]);
      ExpectCliError(RunCli(c + " " + foreign[i] + " 1"), c + " does not take " + foreign[i]);
    }
  }
}

TEST_CASE("strata refuses an option its command does not take, naming both", "[cli]") {
  ExpectCliError(RunCli("tokenize --temp 9 --sessions 3"), "tokenize does not take --temp");
  ExpectCliError(RunCli("tokenize --model x --text hi --sessions 3"), "tokenize does not take --sessions");
  ExpectCliError(RunCli("tokenize -n 3"), "tokenize does not take -n");  // the spelling given
  ExpectCliError(RunCli("inspect model.gguf --ram-budget 1G"), "inspect does not take --ram-budget");
  ExpectCliError(RunCli("synth --shape tiny --backend cpu"), "synth does not take --backend");
  ExpectCliError(RunCli("pack a b --prompt hi"), "pack does not take --prompt");
  ExpectCliError(RunCli("serve --tokens 1,2"), "serve does not take --tokens");
  ExpectCliError(RunCli("plan --model m --temp 0"), "plan does not take --temp");
  ExpectCliError(RunCli("sensitivity --backend cuda"), "sensitivity does not take --backend");
  ExpectCliError(RunCli("synth --shape tiny -ctk q8_0"), "synth does not take -ctk");
  // Arguments that are not options, to a command that takes none.
  ExpectCliError(RunCli("run hello"), "'hello'");
  ExpectCliError(RunCli("tokenize --model m extra"), "'extra'");
}

TEST_CASE("strata suggests the nearest spelling of an unknown option or command", "[cli]") {
  ExpectCliError(RunCli("run --tmep 0"), "unknown option '--tmep' (did you mean --temp?)");
  ExpectCliError(RunCli("bench --prompt-tokns 8"), "did you mean --prompt-tokens?");
  ExpectCliError(RunCli("serve --prot 8080"), "did you mean --port?");
  ExpectCliError(RunCli("run --ram-budgt 1G"), "did you mean --ram-budget?");
  ExpectCliError(RunCli("rnu --model m"), "did you mean run?");
  ExpectCliError(RunCli("tokenise --text x"), "did you mean tokenize?");
  {  // nothing near: no suggestion
    const CliResult r = RunCli("run --zzzzzzzzzz 1");
    ExpectCliError(r, "unknown option '--zzzzzzzzzz'");
    CHECK(r.err.find("did you mean") == std::string::npos);
  }
  // Fresh typos of the listed options: one adjacent swap or one changed letter in a long spelling
  // suggests a spelling the command takes (the original, or another as near).
  std::random_device rd;
  const unsigned seed = rd();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  for (const std::string &c : {std::string("run"), std::string("bench"), std::string("pack")}) {
    const auto listed = ListedOptions(RunCli(c + " --help").out);
    std::set<std::string> longs;
    for (const auto &[o, placeholder] : listed)
      if (o.size() >= 8) longs.insert(o);
    std::vector<std::string> pool(longs.begin(), longs.end());
    for (int k = 0; k < 6; ++k) {
      const std::string o = pool[rng() % pool.size()];
      std::string t = o;
      const size_t i = 2 + rng() % (o.size() - 3);  // past the dashes
      if (rng() % 2 == 0 && t[i] != t[i + 1]) std::swap(t[i], t[i + 1]);
      else t[i] = t[i] == 'q' ? 'x' : 'q';
      if (listed.count(t) == 1) continue;
      INFO(c << " " << o << " typed as " << t);
      const CliResult r = RunCli(c + " " + t + " 1");
      ExpectCliError(r, "did you mean --");
      const size_t at = r.err.find("did you mean ") + 13;
      const std::string suggested = r.err.substr(at, r.err.find('?', at) - at);
      CHECK(listed.count(suggested) == 1);
    }
  }
}

TEST_CASE("strata --version prints the library's version and the build's backends", "[cli]") {
  const CliResult r = RunCli("--version");
  CHECK(r.exit_code == 0);
  CHECK(r.err.empty());
  const std::string v = std::to_string(MOE_VERSION_MAJOR) + "." + std::to_string(MOE_VERSION_MINOR) + "." +
                        std::to_string(MOE_VERSION_PATCH);
  CHECK(r.out.rfind("strata " + v, 0) == 0);
  CHECK(r.out.find("CUDA backend: ") != std::string::npos);
  CHECK(RunCli("version").out == r.out);
  ExpectCliError(RunCli("--version extra"), "no arguments");
}

}  // namespace
