// The `strata` CLI contract (DESIGN.md §3.2): logits file format, inspect accepting every valid
// model and refusing malformed ones, plan ledgers, and errors as exit status 1 with exactly one
// `strata: error:` line on stderr and no output file left behind.
#include <catch2/catch.hpp>

#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "tests/format/format_test_util.h"

namespace {

using strata::format::testing::TempDir;

const std::string kGolden = std::string(STRATA_SOURCE_DIR) + "/tests/golden/";

struct Result {
  int exit_code = -1;
  std::string out, err;
};

std::string Slurp(const std::string &path) {
  std::ifstream f(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

// `env`: assignments put before the command (NAME=value ...).
Result Cli(const std::string &args, const std::string &env = "") {
  TempDir tmp;
  const std::string cmd = env + " " + std::string(STRATA_CLI_PATH) + " " + args + " >" + tmp.File("out") + " 2>" + tmp.File("err");
  int rc = std::system(cmd.c_str());
  Result r;
  r.exit_code = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  r.out = Slurp(tmp.File("out"));
  r.err = Slurp(tmp.File("err"));
  return r;
}

size_t Lines(const std::string &s) { return static_cast<size_t>(std::count(s.begin(), s.end(), '\n')); }

void ExpectError(const Result &r, const std::string &mention) {
  INFO("stderr: " << r.err);
  CHECK(r.exit_code == 1);
  CHECK(r.err.rfind("strata: error: ", 0) == 0);
  CHECK(Lines(r.err) == 1);
  CHECK(r.err.find(mention) != std::string::npos);
}

std::string GoldenTokens(const std::string &c) {
  std::string raw = Slurp(kGolden + c + "/tokens.bin");
  std::vector<int32_t> t(raw.size() / 4);
  std::memcpy(t.data(), raw.data(), raw.size());
  std::string s;
  for (size_t i = 0; i < t.size(); ++i) s += (i ? "," : "") + std::to_string(t[i]);
  return s;
}

std::vector<float> Floats(const std::string &bytes) {
  std::vector<float> v(bytes.size() / 4);
  std::memcpy(v.data(), bytes.data(), v.size() * 4);
  return v;
}

}  // namespace

TEST_CASE("strata logits writes [n_tokens][n_vocab] float32 that match transformers", "[cli]") {
  TempDir tmp;
  const std::string out = tmp.File("logits.f32");
  for (int prefill : {20, 12, 0}) {
    std::filesystem::remove(out);
    Result r = Cli("logits --model " + kGolden + "mixtral_f32/hf --tokens " + GoldenTokens("mixtral_f32") +
                   " --prefill " + std::to_string(prefill) + " --out " + out);
    INFO(r.err);
    REQUIRE(r.exit_code == 0);
    const std::string bytes = Slurp(out);
    REQUIRE(bytes.size() == 20u * 256u * 4u);
    auto got = Floats(bytes);
    auto ref = Floats(Slurp(kGolden + "mixtral_f32/logits.bin"));
    double num = 0, den = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      num = std::max(num, std::fabs(double(got[i]) - ref[i]));
      den = std::max(den, std::fabs(double(ref[i])));
    }
    CHECK(num / den <= 1e-4);
  }
}

TEST_CASE("strata logits errors leave nothing behind", "[cli]") {
  TempDir tmp;
  const std::string out = tmp.File("x.f32");
  const std::string model = kGolden + "qwen3moe_f32/model-f32.gguf";
  ExpectError(Cli("logits --model " + model + " --tokens 1,2,999 --out " + out), "999");
  CHECK(!std::filesystem::exists(out));
  ExpectError(Cli("logits --model " + model + " --tokens 1,,2 --out " + out), "--tokens");
  ExpectError(Cli("logits --model " + model + " --tokens 1,2 --prefill 3 --out " + out), "--prefill");
  ExpectError(Cli("logits --tokens 1,2 --out " + out), "--model");
  ExpectError(Cli("logits --model " + model + " --tokens 1,2"), "--out");
  ExpectError(Cli("logits --model " + model + " --tokens 1 --out /nonexistent-dir/x.f32"), "nonexistent-dir");
  ExpectError(Cli("logits --model " + tmp.File("missing.gguf") + " --tokens 1 --out " + out), "missing.gguf");
  CHECK(!std::filesystem::exists(out));
  for (const auto &e : std::filesystem::directory_iterator(tmp.path())) FAIL("left behind: " << e.path());
}

TEST_CASE("strata run --backend cuda without the CUDA plugin says why in one line; auto runs on the CPU",
          "[cli][plugin]") {
  TempDir tmp;
  const std::string nowhere = tmp.File("absent/libstrata-cuda.so");
  const std::string env = "STRATA_CUDA_PLUGIN=" + nowhere;
  const std::string model = kGolden + "qwen3moe_f32/model-q8_0.gguf";
#ifdef STRATA_CUDA_PLUGIN_PATH
  const std::string why =
      "the CUDA backend's plugin was not found: tried " + nowhere + " (the path STRATA_CUDA_PLUGIN names)";
#else
  const std::string why = "the CUDA backend is not available in this build";
#endif
  ExpectError(Cli("run --backend cuda --model " + model + " --tokens 1,2 -n 2", env),
              why + " (MOE_ERR_UNSUPPORTED_BACKEND)");
  const Result cpu = Cli("run --model " + model + " --tokens 1,2 -n 2 --temp 0", env);
  INFO("stderr: " << cpu.err);
  CHECK(cpu.exit_code == 0);
  CHECK(cpu.err.find("libstrata-cuda") == std::string::npos);
  CHECK(cpu.out == Cli("run --backend cpu --model " + model + " --tokens 1,2 -n 2 --temp 0").out);
  // --version gives the same reason.
  const Result v = Cli("--version", env);
  CHECK(v.exit_code == 0);
#ifdef STRATA_CUDA_PLUGIN_PATH
  CHECK(v.out.find("CUDA backend: unavailable: " + why + "\n") != std::string::npos);
#else
  CHECK(v.out.find("CUDA backend: not built in") != std::string::npos);
#endif
}

TEST_CASE("strata argument errors", "[cli]") {
  ExpectError(Cli(""), "no command");
  ExpectError(Cli("frobnicate"), "frobnicate");
  ExpectError(Cli("run --ram-budget 12X"), "--ram-budget");
  ExpectError(Cli("run --vram-budget"), "--vram-budget");
  ExpectError(Cli("run --backend tpu"), "tpu");
  ExpectError(Cli("run --cpu-experts sometimes"), "--cpu-experts");
  ExpectError(Cli("run --cpu-experts"), "--cpu-experts");
  ExpectError(Cli("run --bogus"), "--bogus");
  ExpectError(Cli("run -n -3"), "-n");
  ExpectError(Cli("inspect"), "PATH");
  {  // the path named once, not once by the CLI and again by the library
    const Result missing = Cli("run --model /nonexistent/model.gguf");
    ExpectError(missing, "/nonexistent/model.gguf");
    CHECK(missing.err.find("/nonexistent/model.gguf") == missing.err.rfind("/nonexistent/model.gguf"));
  }
  const std::string no_tok = kGolden + "mixtral_f32/model-f32.gguf";
  ExpectError(Cli("tokenize --model " + no_tok + " --text hello"), "no tokenizer");
  ExpectError(Cli("run --model " + no_tok + " --prompt hello"), "--tokens");
  ExpectError(Cli("run --model " + no_tok + " --prompt hello --tokens 1"), "not both");
}

TEST_CASE("strata --list-tunables prints every knob, its default and the environment's value", "[cli]") {
  const Result r = Cli("--list-tunables", "STRATA_CUDA_GRAPHS=off STRATA_CUDA_COLD_COPIES=5 STRATA_POOL_CHUNKS=x");
  INFO(r.out << r.err);
  CHECK(r.exit_code == 0);
  CHECK(Lines(r.out) >= 41);  // a header and a line a knob
  std::istringstream lines(r.out);
  std::string line;
  std::map<std::string, std::vector<std::string>> rows;
  size_t doc_at = std::string::npos;
  while (std::getline(lines, line)) {
    // The first four fields, and where the fifth (the doc) starts.
    std::vector<std::string> w;
    size_t at = 0;
    for (int i = 0; i < 5; ++i) {
      at = line.find_first_not_of(' ', at);
      REQUIRE(at != std::string::npos);
      if (i == 4) break;
      const size_t end = std::min(line.find(' ', at), line.size());
      w.push_back(line.substr(at, end - at));
      at = end;
    }
    if (doc_at == std::string::npos) doc_at = at;
    CHECK(at == doc_at);  // the columns line up
    rows[w[0]] = w;
  }
  REQUIRE(rows.count("NAME") == 1);
  for (const char *name : {"STRATA_CUDA_GRAPHS", "STRATA_CUDA_COLD_COPIES", "STRATA_HUGEPAGES", "STRATA_CUDA_STREAMING",
                           "STRATA_COLD_COPIES_NUMBER", "STRATA_CPU_ISA", "STRATA_POOL_CHUNKS"}) {
    INFO(name);
    CHECK(rows.count(name) == 1);
  }
  CHECK(rows["STRATA_CUDA_GRAPHS"] == std::vector<std::string>{"STRATA_CUDA_GRAPHS", "bool", "on", "off"});
  CHECK(rows["STRATA_CUDA_COLD_COPIES"] == std::vector<std::string>{"STRATA_CUDA_COLD_COPIES", "int", "-1", "5"});
  CHECK(rows["STRATA_HUGEPAGES"] == std::vector<std::string>{"STRATA_HUGEPAGES", "bool", "on", "on"});
  // The value that does not parse: named on stderr, the default shown.
  CHECK(rows["STRATA_POOL_CHUNKS"][3] == "0");
  CHECK(r.err.find("STRATA_POOL_CHUNKS=x") != std::string::npos);
  ExpectError(Cli("--list-tunables extra"), "--list-tunables");
}

TEST_CASE("strata's tunable flags are checked and leave the numbers alone on the CPU", "[cli]") {
  ExpectError(Cli("run --cuda-graphs maybe"), "--cuda-graphs");
  ExpectError(Cli("run --huge-pages"), "--huge-pages");
  ExpectError(Cli("run --cuda-streaming 1"), "--cuda-streaming");
  ExpectError(Cli("run --cold-copies -1"), "--cold-copies");
  ExpectError(Cli("bench --cold-copies 9999"), "--cold-copies");
  TempDir tmp;
  const std::string model = kGolden + "qwen3moe_f32/model-q8_0.gguf";
  const std::string base = "logits --backend cpu --model " + model + " --tokens " + GoldenTokens("qwen3moe_f32");
  const Result a = Cli(base + " --out " + tmp.File("a.f32"));
  const Result b = Cli(base + " --huge-pages off --cuda-graphs off --cold-copies 0 --cuda-streaming off --out " +
                       tmp.File("b.f32"));
  const Result c = Cli(base + " --huge-pages on --cuda-graphs on --cold-copies 4 --cuda-streaming on --out " +
                       tmp.File("c.f32"));
  INFO(a.err << b.err << c.err);
  REQUIRE((a.exit_code == 0 && b.exit_code == 0 && c.exit_code == 0));
  const std::string want = Slurp(tmp.File("a.f32"));
  CHECK(!want.empty());
  CHECK(Slurp(tmp.File("b.f32")) == want);
  CHECK(Slurp(tmp.File("c.f32")) == want);
}

TEST_CASE("strata inspect accepts every golden model and describes it", "[cli]") {
  for (const char *m : {"qwen3moe_f32/hf", "qwen3moe_f32/model-f32.gguf", "qwen3moe_f32/model-f16.gguf",
                        "qwen3moe_f32/model-q8_0.gguf", "qwen3moe_bf16/hf", "qwen3moe_bf16/model-bf16.gguf",
                        "mixtral_f32/hf", "mixtral_f32/model-f32.gguf", "mixtral_f32/model-f16.gguf",
                        "mixtral_f32/model-q8_0.gguf"}) {
    Result r = Cli("inspect " + kGolden + m);
    INFO(m << ": " << r.err);
    CHECK(r.exit_code == 0);
    CHECK(r.err.empty());
    CHECK(r.out.find(std::string(m).find("mixtral") == 0 ? "architecture: mixtral" : "architecture: qwen3moe") !=
          std::string::npos);
    CHECK(r.out.find("routed experts") != std::string::npos);
  }
  Result r = Cli("inspect " + kGolden + "qwen3moe_f32/model-q8_0.gguf");
  // 3 layers x 8 experts; gate/up/down Q8_0: (32x64 + 32x64 + 64x32) elements at 34 bytes per 32.
  CHECK(r.out.find("Q8_0/Q8_0/Q8_0") != std::string::npos);
  CHECK(r.out.find("24 experts, 6.38 KiB each") != std::string::npos);
}

TEST_CASE("strata inspect refuses malformed files with one error line", "[cli][bad-input]") {
  TempDir tmp;
  const std::string good = Slurp(kGolden + "qwen3moe_f32/model-q8_0.gguf");
  auto write = [&](const std::string &name, const std::string &bytes) {
    std::ofstream(tmp.File(name), std::ios::binary) << bytes;
    return tmp.File(name);
  };
  ExpectError(Cli("inspect " + write("empty.gguf", "")), "empty.gguf");
  ExpectError(Cli("inspect " + write("magic.gguf", "GGUX" + good.substr(4))), "magic");
  ExpectError(Cli("inspect " + write("trunc_header.gguf", good.substr(0, 100))), "trunc_header.gguf");
  ExpectError(Cli("inspect " + write("trunc_data.gguf", good.substr(0, good.size() - 1000))), "trunc_data.gguf");
  std::string v9 = good;
  v9[4] = 9;
  ExpectError(Cli("inspect " + write("version.gguf", v9)), "version");
  ExpectError(Cli("inspect " + tmp.File("absent.gguf")), "absent.gguf");
  ExpectError(Cli("inspect " + tmp.path()), tmp.path());  // a directory without config.json
  // Every parser corpus file that is malformed is refused through the CLI too, without crashing.
  int refused = 0, seen = 0;
  for (const char *sub : {"gguf", "safetensors"}) {
    const std::string dir = std::string(STRATA_SOURCE_DIR) + "/tests/fuzz/corpus/" + sub;
    if (!std::filesystem::exists(dir)) continue;
    for (const auto &e : std::filesystem::directory_iterator(dir)) {
      ++seen;
      Result r = Cli("inspect " + e.path().string());
      INFO(e.path() << ": " << r.err);
      CHECK((r.exit_code == 0 || r.exit_code == 1));
      if (r.exit_code == 1) {
        CHECK(r.err.rfind("strata: error: ", 0) == 0);
        CHECK(Lines(r.err) == 1);
        ++refused;
      }
    }
  }
  if (seen > 0) CHECK(refused > 0);  // the corpus holds malformed seeds
}

TEST_CASE("strata inspect and plan describe the DeepSeek and gpt-oss families", "[cli][families]") {
  for (const char *m : {"deepseek3_f32/hf", "deepseek3_f32/model-f32.gguf"}) {
    Result r = Cli("inspect " + kGolden + m);
    INFO(m << ": " << r.err << r.out);
    REQUIRE(r.exit_code == 0);
    CHECK(r.out.find("architecture: deepseek2") != std::string::npos);
    // MLA: one row of kv_lora_rank 32 + qk_rope 8 floats per token and layer, 3 layers: 480 bytes
    CHECK(r.out.find("kv cache 480 bytes per token") != std::string::npos);
    CHECK(r.out.find("attention: multi-head latent (q_lora_rank 32, kv_lora_rank 32, qk_nope 16, qk_rope 8, "
                     "v_head 16)") != std::string::npos);
    CHECK(r.out.find("shared expert ffn 16 resident, 1 dense layer(s) of ffn 48") != std::string::npos);
    CHECK(r.out.find("routing: sigmoid, groups 4 (top 2 kept), selection bias, routed scale 2.5, 1 shared expert(s)") !=
          std::string::npos);
    CHECK(r.out.find("rope scaling: yarn factor 4 (original context 128)") != std::string::npos);
    // Only the two MoE layers have routed experts.
    CHECK(r.out.find("16 experts") != std::string::npos);
  }
  Result lite = Cli("inspect " + kGolden + "deepseek2lite_f32/model-f32.gguf");
  CHECK(lite.out.find("q_lora_rank 0") != std::string::npos);
  CHECK(lite.out.find("kv cache 320 bytes per token") != std::string::npos);  // 2 layers x 40 floats
  for (const char *m : {"gptoss_f32/hf", "gptoss_f32/model-f32.gguf", "gptoss_f32/model-mxfp4.gguf"}) {
    Result r = Cli("inspect " + kGolden + m);
    INFO(m << ": " << r.err << r.out);
    REQUIRE(r.exit_code == 0);
    CHECK(r.out.find("architecture: gpt-oss") != std::string::npos);
    CHECK(r.out.find("attention: sinks per head, window per layer [4,full]") != std::string::npos);
    CHECK(r.out.find("softmax over the selected") != std::string::npos);
    CHECK(r.out.find("clamped SwiGLU") != std::string::npos);
    CHECK(r.out.find("kv cache 512 bytes per token") != std::string::npos);  // 2 x (2 x 32 floats) x 2 layers
  }
  Result mx = Cli("inspect " + kGolden + "gptoss_f32/model-mxfp4.gguf");
  CHECK(mx.out.find("MXFP4/MXFP4/MXFP4") != std::string::npos);
  // The ledger: shared experts and dense layers are resident; KV bytes per token are the latent's.
  Result plan = Cli("plan --model " + kGolden + "deepseek3_f32/model-f32.gguf --ram-budget 1K --n-ctx 512");
  INFO(plan.out << plan.err);
  REQUIRE(plan.exit_code == 0);
  CHECK(plan.out.find("1 sessions x 4 blocks (n_ctx 512) x 61440 B (128 tokens x 480 B/token, K f32, V f32)") !=
        std::string::npos);
  CHECK(plan.out.find("shared experts + dense MLPs") != std::string::npos);
  CHECK(plan.out.find("routed experts (all)                 196608") != std::string::npos);  // 16 x 3 x 16 x 64 x 4
  CHECK(plan.out.find("= 8 slots") != std::string::npos);
}

TEST_CASE("strata logits matches transformers on the DeepSeek and gpt-oss goldens", "[cli][families]") {
  TempDir tmp;
  const std::string out = tmp.File("l.f32");
  for (const char *m : {"deepseek3_f32/model-f32.gguf", "gptoss_f32/hf"}) {
    const std::string name = std::string(m).substr(0, std::string(m).find('/'));
    const auto ref = Floats(Slurp(kGolden + name + "/logits.bin"));
    Result r = Cli("logits --model " + kGolden + m + " --tokens " + GoldenTokens(name) + " --prefill 5 --out " + out);
    INFO(m << ": " << r.err);
    REQUIRE(r.exit_code == 0);
    const auto got = Floats(Slurp(out));
    REQUIRE(got.size() == ref.size());
    double num = 0, den = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      num = std::max(num, static_cast<double>(std::fabs(got[i] - ref[i])));
      den = std::max(den, static_cast<double>(std::fabs(ref[i])));
    }
    CHECK(num / den <= 1e-4);
  }
}

TEST_CASE("strata plan prints a ledger and clamps a budget below the minimum", "[cli]") {
  const std::string model = kGolden + "qwen3moe_f32/model-q8_0.gguf";
  Result r = Cli("plan --model " + model + " --ram-budget 8G --n-ctx 512");
  REQUIRE(r.exit_code == 0);
  CHECK(r.out.find("non-routed weights") != std::string::npos);
  CHECK(r.out.find("RAM expert tier") != std::string::npos);
  CHECK(r.out.find("min(24, floor((budget - fixed) / 6528)) = 24 slots") != std::string::npos);
  Result small = Cli("plan --model " + model + " --ram-budget 1K");
  REQUIRE(small.exit_code == 0);
  CHECK(small.err.find("strata: warning: RAM budget raised to the minimum") != std::string::npos);
  CHECK(small.out.find("= 8 slots") != std::string::npos);
}

TEST_CASE("strata run generates from the demo model and from a given model", "[cli]") {
  // The demo model carries a tokenizer: the default prompt "The" and its continuation come out as text.
  Result r = Cli("run -n 24 --seed 7");
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  CHECK(r.out.rfind("The", 0) == 0);
  CHECK(r.out.size() > 20);
  CHECK(r.err.find("tok/s") != std::string::npos);
  Result again = Cli("run -n 24 --seed 7");
  CHECK(again.out == r.out);  // same seed, same text
  // Greedy from the golden prompt reproduces transformers' continuation.
  const std::string toks = GoldenTokens("qwen3moe_f32");
  std::string prompt = toks.substr(0, 0);
  {
    std::stringstream ss(toks);
    std::string item;
    for (int i = 0; i < 12 && std::getline(ss, item, ','); ++i) prompt += (i ? "," : "") + item;
  }
  Result g = Cli("run --model " + kGolden + "qwen3moe_f32/hf --tokens " + prompt + " -n 8 --temp 0");
  REQUIRE(g.exit_code == 0);
  std::string expect = "generated:";
  {
    std::stringstream ss(toks);
    std::string item;
    for (int i = 0; std::getline(ss, item, ','); ++i)
      if (i >= 12) expect += " " + item;
  }
  CHECK(g.out.find(expect + "\n") != std::string::npos);
}

TEST_CASE("strata run --save-session then --load-session continues the same generation", "[cli][snapshot]") {
  TempDir tmp;
  const std::string model = "--model " + kGolden + "qwen3moe_f32/model-q8_0.gguf";
  const std::string sampling = " --temp 0.9 --seed 7 --repeat-penalty 1.2";
  const Result whole = Cli("run " + model + " --tokens 5,6,7 -n 12" + sampling);
  REQUIRE(whole.exit_code == 0);
  const std::string snap = tmp.File("s.snap");
  const Result first = Cli("run " + model + " --tokens 5,6,7 -n 5" + sampling + " --save-session " + snap);
  REQUIRE(first.exit_code == 0);
  const Result rest = Cli("run " + model + " -n 7 --load-session " + snap);
  INFO(whole.out << first.out << rest.out << rest.err);
  REQUIRE(rest.exit_code == 0);
  // "prompt: 5 6 7\ngenerated: a b c d e" + " f g ..." from the loaded session.
  const std::string head = first.out.substr(0, first.out.size() - 1);
  const std::string tail = rest.out.substr(std::string("generated:").size());
  CHECK(head + tail == whole.out);
  ExpectError(Cli("run " + model + " --load-session " + tmp.File("missing.snap")), "missing.snap");
}

TEST_CASE("strata refuses empty paths and tells when it clamps n_ctx or stops at it", "[cli][bad-input]") {
  const std::string model = kGolden + "qwen3moe_f32/model-q8_0.gguf";
  // An empty path is not the demo model, nor the current directory.
  ExpectError(Cli("run --model '' --tokens 1,2 -n 1"), "--model");
  ExpectError(Cli("run --model " + model + " --tokens 1,2 -n 1 --save-session ''"), "--save-session");
  ExpectError(Cli("run --model " + model + " --tokens 1,2 -n 1 --load-session ''"), "--load-session");
  ExpectError(Cli("logits --model " + model + " --tokens 1,2 --out ''"), "--out");
  // An --n-ctx beyond the model's context length is said to be lowered.
  Result big = Cli("run --model " + model + " --tokens 1,2 -n 1 --n-ctx 16777216");
  INFO(big.err);
  CHECK(big.exit_code == 0);
  CHECK(big.err.find("--n-ctx") != std::string::npos);
  // A generation cut by the context length says so.
  Result cut = Cli("run --model " + model + " --tokens 1,2,3 -n 40 --n-ctx 8 --temp 0");
  INFO(cut.err);
  CHECK(cut.exit_code == 0);
  CHECK(cut.err.find("context length") != std::string::npos);
  Result fits = Cli("run --model " + model + " --tokens 1,2,3 -n 4 --n-ctx 16 --temp 0");
  CHECK(fits.exit_code == 0);
  CHECK(fits.err.find("context length") == std::string::npos);
  CHECK(fits.err.find("warning") == std::string::npos);
}

TEST_CASE("strata's error messages escape control bytes and invalid UTF-8 they echo", "[cli][bad-input]") {
  // \377 (never UTF-8), ESC (a terminal control sequence), a newline: each shown escaped.
  const Result r = Cli("run --backend \"$(printf 'x\\377\\033[31my\\nz')\"");
  ExpectError(r, "--backend");
  CHECK(r.err.find('\x1b') == std::string::npos);
  CHECK(r.err.find('\xff') == std::string::npos);
  CHECK(r.err.find("\\xff") != std::string::npos);
  CHECK(r.err.find("\\x1b") != std::string::npos);
}

TEST_CASE("strata --cache-type-k/-ctk and --cache-type-v/-ctv: llama.cpp's names, bad names refused", "[cli][kv]") {
  ExpectError(Cli("run --cache-type-k q3"), "--cache-type-k must be f32, f16 or q8_0");
  ExpectError(Cli("run -ctv bogus"), "-ctv");
  ExpectError(Cli("run --cache-type-v"), "--cache-type-v");
  ExpectError(Cli("plan -ctk q4_0"), "q4_0");
  const std::string model = kGolden + "qwen3moe_f32/model-f32.gguf";
  // logits: q8_0 keys and values stay within the 3e-2 of transformers' float32 logits, and
  // differ from the float32 cache's; both spellings of the flags give the same bytes.
  TempDir tmp;
  auto logits = [&](const std::string &flags) {
    const std::string out = tmp.File("l.f32");
    std::filesystem::remove(out);
    Result r = Cli("logits --model " + model + " --tokens " + GoldenTokens("qwen3moe_f32") + " --prefill 12 " +
                   flags + " --out " + out);
    INFO(r.err);
    REQUIRE(r.exit_code == 0);
    return Slurp(out);
  };
  const std::string f32 = logits(""), q8 = logits("-ctk q8_0 -ctv q8_0");
  CHECK(logits("--cache-type-k Q8_0 --cache-type-v q8_0") == q8);
  CHECK(q8 != f32);
  const auto got = Floats(q8), ref = Floats(Slurp(kGolden + "qwen3moe_f32/logits.bin"));
  REQUIRE(got.size() == ref.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    num = std::max(num, std::fabs(double(got[i]) - ref[i]));
    den = std::max(den, std::fabs(double(ref[i])));
  }
  CHECK(num / den <= 3e-2);
  // plan: bytes per token of the chosen types (2 KV heads of 16: a 32-float row is 128 B in f32,
  // 64 B in f16, one 34-byte q8_0 block).
  Result f = Cli("plan --json --model " + model);
  Result q = Cli("plan --json --model " + model + " -ctk q8_0 -ctv f16");
  REQUIRE(f.exit_code == 0);
  REQUIRE(q.exit_code == 0);
  const size_t at = f.out.find("\"n_layers\":");
  REQUIRE(at != std::string::npos);
  const int n_layers = std::stoi(f.out.substr(at + 11));
  CHECK(f.out.find("\"kv_bytes_per_token\":" + std::to_string(n_layers * 256) + ",") != std::string::npos);
  CHECK(q.out.find("\"kv_bytes_per_token\":" + std::to_string(n_layers * (34 + 64)) + ",") != std::string::npos);
  CHECK(q.out.find("\"kv_type_k\":\"q8_0\",\"kv_type_v\":\"f16\"") != std::string::npos);
  Result ledger = Cli("plan --model " + model + " --cache-type-k q8_0 --cache-type-v q8_0");
  REQUIRE(ledger.exit_code == 0);
  CHECK(ledger.out.find("K q8_0, V q8_0") != std::string::npos);
}

TEST_CASE("strata run --context-shift --keep N: generation goes on past n_ctx", "[cli][ctx_shift]") {
  const std::string model = "--model " + kGolden + "qwen3moe_f32/model-f32.gguf";
  std::string ten;  // the golden prompt's first ten ids
  {
    std::stringstream ss(GoldenTokens("qwen3moe_f32"));
    std::string item;
    for (int i = 0; i < 10 && std::getline(ss, item, ','); ++i) ten += (i ? "," : "") + item;
  }
  const std::string prompt = " --tokens " + ten;
  auto generated = [](const std::string &out) {
    const size_t at = out.find("generated:");
    REQUIRE(at != std::string::npos);
    std::stringstream ss(out.substr(at + 10));
    int n = 0;
    for (std::string t; ss >> t;) ++n;
    return n;
  };
  // Off (the default): the text stops at the context, with the warning naming the way on.
  const Result off = Cli("run " + model + prompt + " -c 128 -n 300 --temp 0");
  INFO(off.err);
  REQUIRE(off.exit_code == 0);
  CHECK(off.err.find("stopped at the context length (128 positions)") != std::string::npos);
  CHECK(off.err.find("--context-shift") != std::string::npos);
  CHECK(generated(off.out) < 128);
  // On: all 300 tokens, twice the same (greedy), whatever --keep spells the prompt with.
  const Result on = Cli("run " + model + prompt + " -c 128 -n 300 --temp 0 --context-shift --keep 4");
  INFO(on.err);
  REQUIRE(on.exit_code == 0);
  CHECK(generated(on.out) == 300);
  CHECK(on.err.find("warning") == std::string::npos);
  CHECK(Cli("run " + model + prompt + " -c 128 -n 300 --temp 0 --context-shift --keep 4").out == on.out);
  // The text before the first shift is the unshifted one's.
  CHECK(on.out.substr(0, 200) == off.out.substr(0, 200));
  const Result all = Cli("run " + model + prompt + " -c 128 -n 300 --temp 0 --context-shift --keep -1");
  REQUIRE(all.exit_code == 0);
  CHECK(generated(all.out) == 300);
  ExpectError(Cli("run " + model + prompt + " --keep 3"), "--keep sets what a context shift keeps");
  ExpectError(Cli("run " + model + " --context-shift --keep -2"), "--keep needs an integer in [-1,");
  // A prompt longer than the context kept whole leaves nothing to drop: the library says so.
  ExpectError(Cli("run " + model + prompt + " -c 9 --context-shift --keep -1"), "below the session's n_ctx 9");
}
