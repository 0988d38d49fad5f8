// Deeply nested JSON in every file Strata reads as JSON (config.json, tokenizer.json,
// tokenizer_config.json, a safetensors header) gets a status and a message naming the file, never a
// stack overflow; messages that quote a JSON value stay short whatever the value. Each case runs in a
// forked child, so a crash is a failed check, not a dead test binary.
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <fstream>
#include <random>
#include <sstream>
#include <string>

#include "include/strata/moe.h"
#include "lib/format/file.h"
#include "lib/format/json.h"
#include "lib/format/safetensors.h"
#include "lib/text/tokenizer.h"
#include "lib/util/status.h"
#include "nlohmann/json.hpp"
#include "tests/format/format_test_util.h"
#include "tests/util/child_process_util.h"

namespace strata::format {
namespace {

using strata::testing::ChildOutcome;
using strata::testing::RunInChild;
using testing::TempDir;
using testing::WriteFile;

// Deep enough to overflow an 8 MiB stack in any recursive walk, copy or dump of the value.
constexpr int kDeep = 100000;

const std::string kHf = std::string(STRATA_SOURCE_DIR) + "/tests/golden/qwen3moe_f32/hf";
const std::string kTok = std::string(STRATA_SOURCE_DIR) + "/tests/text/fixtures/qwen2";

std::string Slurp(const std::string &path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// `[[[...1...]]]` or `{"a":{"a":...1...}}`, `depth` levels.
std::string Nested(int depth, bool objects) {
  std::string s;
  s.reserve(static_cast<size_t>(depth) * 6 + 1);
  for (int i = 0; i < depth; ++i) s += objects ? "{\"a\":" : "[";
  s += "1";
  for (int i = 0; i < depth; ++i) s += objects ? "}" : "]";
  return s;
}

// The golden checkpoint's config.json with `key` set to `value_text` (raw JSON).
std::string ConfigWith(const std::string &key, const std::string &value_text) {
  nlohmann::json c = nlohmann::json::parse(Slurp(kHf + "/config.json"));
  c[key] = "@@";
  std::string text = c.dump();
  const size_t at = text.find("\"@@\"");
  return text.replace(at, 4, value_text);
}

// A checkpoint directory: the golden weights (a symlink) and the given config.json.
void MakeCheckpoint(const TempDir &dir, const std::string &config) {
  REQUIRE(symlink((kHf + "/model.safetensors").c_str(), dir.File("model.safetensors").c_str()) == 0);
  WriteFile(dir.File("config.json"), config);
}

int32_t PlanStatus(const std::string &path, std::string *message) {
  moe_params p;
  moe_params_init(&p);
  p.model_path = path.c_str();
  moe_cache_plan plan;
  moe_cache_plan_init(&plan);
  moe_status st = moe_plan(&p, &plan);
  *message = st == MOE_OK ? "" : moe_last_error();
  return st;
}

void ExpectRefused(const ChildOutcome &r, moe_status code, const std::string &file) {
  INFO(r.Describe());
  REQUIRE(r.finished);
  CHECK(r.code == code);
  CHECK(r.message.find(file) != std::string::npos);
  CHECK(r.message.find("deep") != std::string::npos);
  CHECK(r.message.size() < 1000);
}

TEST_CASE("json: a config.json nested 100,000 deep is refused, naming the file", "[format][json]") {
  std::mt19937 rng(std::random_device{}());
  const bool objects = rng() % 2 == 0;
  SECTION("in a field the model reads") {
    TempDir dir;
    MakeCheckpoint(dir, ConfigWith("hidden_act", Nested(kDeep, objects)));
    ExpectRefused(RunInChild([&](std::string *m) { return PlanStatus(dir.path(), m); }), MOE_ERR_FORMAT_CONFIG,
                  "config.json");
  }
  SECTION("in a field nobody reads") {
    TempDir dir;
    MakeCheckpoint(dir, ConfigWith("x_extra_" + std::to_string(rng() % 1000), Nested(kDeep, objects)));
    ExpectRefused(RunInChild([&](std::string *m) { return PlanStatus(dir.path(), m); }), MOE_ERR_FORMAT_CONFIG,
                  "config.json");
  }
}

// Loads the qwen2 tokenizer fixture from a copy whose tokenizer.json / tokenizer_config.json are given.
int32_t TokenizerStatus(const TempDir &dir, const std::string &tok, const std::string &cfg, std::string *m) {
  WriteFile(dir.File("tokenizer.json"), tok);
  WriteFile(dir.File("tokenizer_config.json"), cfg);
  auto t = text::Tokenizer::FromHfFile(dir.File("tokenizer.json"));
  *m = t.ok() ? "" : std::string(t.status().message());
  return StatusToMoe(t.status());
}

TEST_CASE("json: a tokenizer.json nested 100,000 deep is refused, naming the file", "[format][json]") {
  const std::string good = Slurp(kTok + "/tokenizer.json");
  const std::string cfg = Slurp(kTok + "/tokenizer_config.json");
  nlohmann::json j = nlohmann::json::parse(good);
  j["normalizer"] = "@@";
  std::string tmpl = j.dump();
  const size_t at = tmpl.find("\"@@\"");
  SECTION("a normalizer Sequence inside a Sequence, 100,000 times") {
    std::string deep;
    for (int i = 0; i < kDeep; ++i) deep += R"({"type":"Sequence","normalizers":[)";
    deep += R"({"type":"NFC"})";
    for (int i = 0; i < kDeep; ++i) deep += "]}";
    TempDir dir;
    std::string tok = tmpl;
    tok.replace(at, 4, deep);
    ExpectRefused(RunInChild([&](std::string *m) { return TokenizerStatus(dir, tok, cfg, m); }),
                  MOE_ERR_FORMAT_METADATA, "tokenizer.json");
  }
  SECTION("a nested array as the normalizer") {
    TempDir dir;
    std::string tok = tmpl;
    tok.replace(at, 4, Nested(kDeep, false));
    ExpectRefused(RunInChild([&](std::string *m) { return TokenizerStatus(dir, tok, cfg, m); }),
                  MOE_ERR_FORMAT_METADATA, "tokenizer.json");
  }
}

TEST_CASE("json: a tokenizer_config.json nested 100,000 deep is refused, naming the file", "[format][json]") {
  const std::string good = Slurp(kTok + "/tokenizer.json");
  std::mt19937 rng(std::random_device{}());
  const std::string key = rng() % 2 ? "bos_token" : "chat_template";
  const std::string cfg = "{\"" + key + "\": " + Nested(kDeep, rng() % 2 == 0) + "}";
  TempDir dir;
  ExpectRefused(RunInChild([&](std::string *m) { return TokenizerStatus(dir, good, cfg, m); }),
                MOE_ERR_FORMAT_METADATA, "tokenizer_config.json");
}

TEST_CASE("json: a tokenizer_config.json read for its chat template is bounded too", "[format][json]") {
  // No tokenizer.json: the context reads tokenizer_config.json only for the chat template.
  TempDir dir;
  MakeCheckpoint(dir, Slurp(kHf + "/config.json"));
  WriteFile(dir.File("tokenizer_config.json"), "{\"chat_template\": " + Nested(kDeep, true) + "}");
  ChildOutcome r = RunInChild([&](std::string *m) -> int32_t {
    moe_params p;
    moe_params_init(&p);
    p.model_path = dir.path().c_str();
    moe_ctx *ctx = nullptr;
    moe_status st = moe_ctx_open(&p, &ctx);
    *m = st == MOE_OK ? "" : moe_last_error();
    moe_ctx_close(ctx);
    return st;
  });
  ExpectRefused(r, MOE_ERR_FORMAT_METADATA, "tokenizer_config.json");
}

TEST_CASE("json: a safetensors header nested 100,000 deep is refused", "[format][json]") {
  const std::string header = "{\"t\": " + Nested(kDeep, true) + "}";
  testing::Bytes b;
  b.U64(header.size()).Raw(header);
  TempDir dir;
  WriteFile(dir.File("deep.safetensors"), b.b);
  ChildOutcome r = RunInChild([&](std::string *m) -> int32_t {
    auto f = File::Open(dir.File("deep.safetensors"));
    if (!f.ok()) return -1;
    auto t = ParseSafetensors(**f);
    *m = t.ok() ? "" : std::string(t.status().message());
    return StatusToMoe(t.status());
  });
  ExpectRefused(r, MOE_ERR_FORMAT_METADATA, "deep.safetensors");
}

TEST_CASE("json: a message that quotes a JSON value stays short", "[format][json]") {
  // hidden_act as a wide array of random numbers: the refusal quotes it, clipped.
  std::mt19937 rng(std::random_device{}());
  std::string wide = "[";
  for (int i = 0; i < 200000; ++i) wide += (i ? "," : "") + std::to_string(rng() % 100000);
  wide += "]";
  TempDir dir;
  MakeCheckpoint(dir, ConfigWith("hidden_act", wide));
  ChildOutcome r = RunInChild([&](std::string *m) { return PlanStatus(dir.path(), m); });
  INFO(r.Describe().substr(0, 300));
  REQUIRE(r.finished);
  CHECK(r.code == MOE_ERR_UNSUPPORTED);
  CHECK(r.message.find("hidden_act") != std::string::npos);
  CHECK(r.message.find(wide.substr(0, 20)) != std::string::npos);
  CHECK(r.message.size() < 1000);
}

TEST_CASE("json: the reader takes nesting up to its limit and refuses one more", "[format][json]") {
  std::mt19937 rng(std::random_device{}());
  JsonOptions o;
  o.max_depth = 2 + static_cast<int>(rng() % 60);
  const bool objects = rng() % 2 == 0;
  auto at = ParseJson(Nested(o.max_depth, objects), MOE_ERR_FORMAT_CONFIG, "x.json", o);
  REQUIRE(at.ok());
  CHECK(at->is_structured());
  auto past = ParseJson(Nested(o.max_depth + 1, objects), MOE_ERR_FORMAT_CONFIG, "x.json", o);
  REQUIRE_FALSE(past.ok());
  CHECK(StatusToMoe(past.status()) == MOE_ERR_FORMAT_CONFIG);
  CHECK(std::string(past.status().message()).find("x.json") == 0);
  CHECK(std::string(past.status().message()).find(std::to_string(o.max_depth)) != std::string::npos);
  // Brackets inside strings are not nesting; the default limit stands for real files.
  const std::string brackets(1000 + rng() % 1000, objects ? '{' : '[');
  auto in_string = ParseJson("{\"s\": \"" + brackets + "\"}", MOE_ERR_FORMAT_CONFIG, "x.json");
  REQUIRE(in_string.ok());
  CHECK((*in_string)["s"] == brackets);
  CHECK(ParseJson(Nested(kJsonMaxDepth, objects), MOE_ERR_FORMAT_CONFIG, "x.json").ok());
  CHECK_FALSE(ParseJson(Nested(kJsonMaxDepth + 1, objects), MOE_ERR_FORMAT_CONFIG, "x.json").ok());
  // Syntax errors and duplicates name the document too.
  auto bad = ParseJson("{\"a\": [1, 2,]}", MOE_ERR_FORMAT_METADATA, "y.json");
  REQUIRE_FALSE(bad.ok());
  CHECK(StatusToMoe(bad.status()) == MOE_ERR_FORMAT_METADATA);
  CHECK(std::string(bad.status().message()).find("y.json: not valid JSON at byte") == 0);
  JsonOptions strict;
  strict.reject_duplicates = true;
  CHECK(ParseJson("{\"a\": 1, \"a\": 2}", MOE_ERR_FORMAT_METADATA, "y.json").value()["a"] == 2);
  CHECK_FALSE(ParseJson("{\"a\": 1, \"a\": 2}", MOE_ERR_FORMAT_METADATA, "y.json", strict).ok());
}

TEST_CASE("json: an excerpt is the value's text, cut to its bound", "[format][json]") {
  std::mt19937 rng(std::random_device{}());
  auto word = [&] {
    std::string w(1 + rng() % 40, 'a');
    for (char &c : w) c = static_cast<char>('a' + rng() % 26);
    return w;
  };
  nlohmann::json v = nlohmann::json::object();
  const int n = 1 + static_cast<int>(rng() % 300);
  for (int i = 0; i < n; ++i) {
    switch (rng() % 3) {
      case 0: v[word()] = word(); break;
      case 1: v[word()] = static_cast<int64_t>(rng() % 1000000); break;
      default: v[word()] = nlohmann::json::array({word(), rng() % 100, {{word(), word()}}}); break;
    }
  }
  const std::string full = v.dump();
  const size_t max = 10 + rng() % 200;
  const std::string e = JsonExcerpt(v, max);
  if (full.size() <= max) {
    CHECK(e == full);
  } else {
    REQUIRE(e.size() == max + 3);
    CHECK(e.substr(max) == "...");
    CHECK(e.substr(0, max) == full.substr(0, max));
  }
  // A huge string or a deep value costs no more than the bound.
  CHECK(JsonExcerpt(nlohmann::json(std::string(1 << 24, 'q')), max).size() == max + 3);
  auto deep = ParseJson(Nested(kJsonMaxDepth, true), MOE_ERR_FORMAT_CONFIG, "x.json");
  REQUIRE(deep.ok());
  CHECK(JsonExcerpt(*deep, max).size() <= max + 3);
}

}  // namespace
}  // namespace strata::format
