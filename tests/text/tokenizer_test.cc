// Tokenizer tests against Hugging Face `tokenizers` (fixtures from scripts/text/make_tokenizer_fixtures.py):
// for every fixture tokenizer, loaded from tokenizer.json and from GGUF, the ids of every corpus
// string equal HF's with and without special-token parsing; decode inverts encode; the streaming
// detokenizer reassembles the text without ever returning invalid UTF-8; bad metadata is named.
#include <catch2/catch.hpp>
#include <fstream>
#include <sstream>

#include "lib/format/file.h"
#include "lib/format/gguf.h"
#include "lib/format/gguf_writer.h"
#include "lib/text/pretokenizer.h"
#include "lib/text/tokenizer.h"
#include "lib/text/unicode.h"
#include "nlohmann/json.hpp"

namespace strata::text {
namespace {

const char *const kVariants[] = {"gpt2", "llama3", "qwen2", "deepseek_v3", "gpt4o", "spm"};

std::string FixtureDir(const std::string &name) {
  return std::string(STRATA_SOURCE_DIR) + "/tests/text/fixtures/" + name;
}

nlohmann::json ReadJson(const std::string &path) {
  std::ifstream f(path, std::ios::binary);
  REQUIRE(f.good());
  std::stringstream ss;
  ss << f.rdbuf();
  return nlohmann::json::parse(ss.str());
}

std::unique_ptr<Tokenizer> LoadGguf(const std::string &path) {
  auto file = format::File::Open(path);
  REQUIRE(file.ok());
  auto gguf = format::ParseGguf(**file);
  REQUIRE(gguf.ok());
  auto tok = Tokenizer::FromGguf(*gguf);
  INFO(tok.status().ToString());
  REQUIRE(tok.ok());
  return std::move(*tok);
}

std::unique_ptr<Tokenizer> LoadJson(const std::string &path) {
  auto tok = Tokenizer::FromHfFile(path);
  INFO(tok.status().ToString());
  REQUIRE(tok.ok());
  return std::move(*tok);
}

std::string Escaped(const std::string &s) { return nlohmann::json(s).dump(); }

void CheckStream(const Tokenizer &tok, const std::vector<int32_t> &ids, const std::string &text) {
  StreamDetokenizer stream(tok);
  std::string all;
  for (int32_t id : ids) {
    std::string chunk = stream.Push(id);
    CHECK(ValidUtf8Prefix(chunk) == chunk.size());
    all += chunk;
  }
  all += stream.Finish();
  CHECK(all == text);
}

void CheckFixture(const Tokenizer &tok, const nlohmann::json &exp) {
  CHECK(tok.vocab_size() == exp["vocab_size"].get<int>());
  CHECK(tok.bos() == exp["bos"].get<int>());
  CHECK(tok.eos() == exp["eos"].get<int>());
  CHECK(tok.add_bos() == exp["add_bos"].get<bool>());
  const bool spm = tok.model() == TokenizerModel::kSentencePieceBpe;
  for (const auto &c : exp["cases"]) {
    std::string text = c["text"].get<std::string>();
    INFO("text " << Escaped(text));
    std::vector<int32_t> special = tok.Encode(text, true);
    std::vector<int32_t> plain = tok.Encode(text, false);
    CHECK(special == c["ids_special"].get<std::vector<int32_t>>());
    CHECK(plain == c["ids_plain"].get<std::vector<int32_t>>());
    auto back = tok.Decode(plain);
    REQUIRE(back.ok());
    CHECK(*back == text);
    CheckStream(tok, plain, text);
    if (!spm) {  // SentencePiece re-prepends a space after each special token
      auto back_special = tok.Decode(special);
      REQUIRE(back_special.ok());
      CHECK(*back_special == text);
      CheckStream(tok, special, text);
    }
  }
}

TEST_CASE("tokenizers match Hugging Face on the corpus, from tokenizer.json and from GGUF", "[text]") {
  for (const char *name : kVariants) {
    SECTION(name) {
      nlohmann::json exp = ReadJson(FixtureDir(name) + "/expected.json");
      {
        INFO("tokenizer.json");
        CheckFixture(*LoadJson(FixtureDir(name) + "/tokenizer.json"), exp);
      }
      {
        INFO("GGUF");
        CheckFixture(*LoadGguf(FixtureDir(name) + "/tokenizer.gguf"), exp);
      }
    }
  }
}

TEST_CASE("SentencePiece GGUF without merges merges by score", "[text]") {
  auto file = format::File::Open(FixtureDir("spm") + "/tokenizer.gguf");
  REQUIRE(file.ok());
  auto gguf = format::ParseGguf(**file);
  REQUIRE(gguf.ok());
  REQUIRE(gguf->kv_index.erase("tokenizer.ggml.merges") == 1);
  auto tok = Tokenizer::FromGguf(*gguf);
  REQUIRE(tok.ok());
  nlohmann::json exp = ReadJson(FixtureDir("spm") + "/expected.json");
  int mismatches = 0, n = 0;
  for (const auto &c : exp["cases"]) {
    std::string text = c["text"].get<std::string>();
    std::vector<int32_t> plain = (*tok)->Encode(text, false);
    mismatches += plain != c["ids_plain"].get<std::vector<int32_t>>();
    ++n;
    auto back = (*tok)->Decode(plain);
    REQUIRE(back.ok());
    CHECK(*back == text);
  }
  // Scores (-rank of the merge that made each piece) only approximate an HF-trained BPE: a piece
  // reachable by two different pairs can merge where HF's rank list does not.
  INFO(mismatches << " of " << n);
  CHECK(mismatches * 20 <= n);
}

TEST_CASE("tokenizer: the model and pre-tokenizer are recognised", "[text]") {
  const std::pair<const char *, PreTokenizer> want[] = {
      {"gpt2", PreTokenizer::kGpt2}, {"llama3", PreTokenizer::kLlama3}, {"qwen2", PreTokenizer::kQwen2},
      {"deepseek_v3", PreTokenizer::kDeepseekV3}, {"gpt4o", PreTokenizer::kO200k}, {"spm", PreTokenizer::kNone}};
  for (auto [name, pre] : want) {
    INFO(name);
    CHECK(LoadJson(FixtureDir(name) + "/tokenizer.json")->pre_tokenizer() == pre);
    CHECK(LoadGguf(FixtureDir(name) + "/tokenizer.gguf")->pre_tokenizer() == pre);
  }
}

TEST_CASE("tokenizer: invalid UTF-8 input round-trips through the byte-level models", "[text]") {
  const std::string text = "ok \xFF\xFE bad \xE4\xB8 cut \xC0\xAF overlong \xF0\x9F\x98";
  for (const char *name : {"gpt2", "llama3", "qwen2", "deepseek_v3", "gpt4o"}) {
    INFO(name);
    auto tok = LoadGguf(FixtureDir(name) + "/tokenizer.gguf");
    auto back = tok->Decode(tok->Encode(text, true));
    REQUIRE(back.ok());
    CHECK(*back == text);
  }
  auto spm = LoadGguf(FixtureDir("spm") + "/tokenizer.gguf");
  auto back = spm->Decode(spm->Encode(text, false));
  REQUIRE(back.ok());
  CHECK(*back == text);
}

TEST_CASE("stream detokenizer holds back split characters and replaces impossible bytes", "[text]") {
  auto tok = LoadGguf(FixtureDir("gpt2") + "/tokenizer.gguf");
  // The GPT-2 byte alphabet gives one token per byte: feed "世" (E4 B8 96) a byte at a time.
  std::vector<int32_t> bytes;
  for (unsigned char b : std::string("\xE4\xB8\x96!")) {
    std::vector<int32_t> ids = tok->Encode(std::string(1, static_cast<char>(b)), false);
    REQUIRE(ids.size() == 1);
    bytes.push_back(ids[0]);
  }
  StreamDetokenizer s(*tok);
  CHECK(s.Push(bytes[0]).empty());
  CHECK(s.Push(bytes[1]).empty());
  CHECK(s.Push(bytes[2]) == "\xE4\xB8\x96");
  CHECK(s.Push(bytes[3]) == "!");
  CHECK(s.Finish().empty());
  // An unfinished character at the end becomes U+FFFD; a byte that cannot start one does too.
  CHECK(s.Push(bytes[0]).empty());
  CHECK(s.Finish() == "\xEF\xBF\xBD");
  CHECK(s.Push(bytes[1]) == "\xEF\xBF\xBD");
  CHECK(s.Push(bytes[0]).empty());
  CHECK(s.Push(bytes[3]) == "\xEF\xBF\xBD!");
  CHECK(s.Push(-5).empty());
  CHECK(tok->TokenToPiece(-1).empty());
  CHECK(tok->TokenToPiece(tok->vocab_size()).empty());
  auto bad = tok->Decode({0, tok->vocab_size()});
  CHECK(StatusToMoe(bad.status()) == MOE_ERR_INVALID_ARGUMENT);
}

TEST_CASE("pre-tokenizers: hand-checked splits", "[text]") {
  auto pieces = [](PreTokenizer p, const std::string &s) {
    std::vector<std::string> out;
    for (auto [b, e] : PreTokenize(p, s)) out.push_back(s.substr(b, e - b));
    return out;
  };
  using V = std::vector<std::string>;
  CHECK(pieces(PreTokenizer::kGpt2, "I'LL don't  x\n") == V{"I", "'", "LL", " don", "'t", " ", " x", "\n"});
  CHECK(pieces(PreTokenizer::kLlama3, "I'LL 1234567\r\n\r\nx") ==
        V{"I", "'LL", " ", "123", "456", "7", "\r\n\r\n", "x"});
  CHECK(pieces(PreTokenizer::kQwen2, "ab 123") == V{"ab", " ", "1", "2", "3"});
  CHECK(pieces(PreTokenizer::kO200k, "HelloWorld XMLHttp a/b//\n") ==
        V{"Hello", "World", " XMLHttp", " a", "/b", "//\n"});
  CHECK(pieces(PreTokenizer::kDeepseekV3, "12345中文abc.Def") ==
        V{"123", "45", "中文", "abc", ".Def"});
  CHECK(PreTokenize(PreTokenizer::kGpt2, "").empty());
}

// A minimal valid GGUF tokenizer in memory, to break one field at a time.
format::GgufFile SmallGguf() {
  format::GgufFile g;
  auto put = [&](const std::string &key, format::GgufValue v) {
    g.kv_index[key] = g.kv.size();
    g.kv.emplace_back(key, std::move(v));
  };
  format::GgufValue model;
  model.type = format::GgufType::kString;
  model.s = "gpt2";
  put("tokenizer.ggml.model", model);
  format::GgufValue toks;
  toks.type = format::GgufType::kArray;
  toks.elem_type = format::GgufType::kString;
  toks.arr_str = {"a", "b", "ab", "<|x|>"};
  toks.arr_len = 4;
  put("tokenizer.ggml.tokens", toks);
  put("tokenizer.ggml.token_type", format::GgufIntArray(format::GgufType::kInt32, {1, 1, 1, 3}));
  format::GgufValue merges;
  merges.type = format::GgufType::kArray;
  merges.elem_type = format::GgufType::kString;
  merges.arr_str = {"a b"};
  merges.arr_len = 1;
  put("tokenizer.ggml.merges", merges);
  return g;
}

void ExpectMetaError(const format::GgufFile &g, const std::string &key, const std::string &word = "") {
  auto tok = Tokenizer::FromGguf(g);
  REQUIRE_FALSE(tok.ok());
  INFO(tok.status().ToString());
  CHECK(StatusToMoe(tok.status()) == MOE_ERR_FORMAT_METADATA);
  CHECK(std::string(tok.status().message()).find(key) != std::string::npos);
  CHECK(std::string(tok.status().message()).find(word) != std::string::npos);
}

format::GgufValue *Mut(format::GgufFile &g, const std::string &key) {
  return &g.kv[g.kv_index.at(key)].second;
}

TEST_CASE("tokenizer: malformed GGUF metadata is MOE_ERR_FORMAT_METADATA naming the key", "[text]") {
  {
    auto ok = Tokenizer::FromGguf(SmallGguf());
    REQUIRE(ok.ok());
    CHECK((*ok)->Encode("ab<|x|>a", true) == std::vector<int32_t>{2, 3, 0});
  }
  {
    format::GgufFile g = SmallGguf();
    Mut(g, "tokenizer.ggml.merges")->arr_str = {"a c"};
    ExpectMetaError(g, "tokenizer.ggml.merges", "'c'");
  }
  {
    format::GgufFile g = SmallGguf();
    Mut(g, "tokenizer.ggml.merges")->arr_str = {"b a"};  // "ba" is not a token
    ExpectMetaError(g, "tokenizer.ggml.merges", "'ba'");
  }
  {
    format::GgufFile g = SmallGguf();
    *Mut(g, "tokenizer.ggml.token_type") = format::GgufIntArray(format::GgufType::kInt32, {1, 1, 1});
    ExpectMetaError(g, "tokenizer.ggml.token_type", "3");
  }
  {
    format::GgufFile g = SmallGguf();
    *Mut(g, "tokenizer.ggml.token_type") = format::GgufIntArray(format::GgufType::kInt32, {1, 1, 1, 9});
    ExpectMetaError(g, "tokenizer.ggml.token_type[3]");
  }
  {
    format::GgufFile g = SmallGguf();
    g.kv_index.erase("tokenizer.ggml.tokens");
    ExpectMetaError(g, "tokenizer.ggml.tokens", "missing");
  }
  {
    format::GgufFile g = SmallGguf();
    g.kv_index.erase("tokenizer.ggml.merges");
    ExpectMetaError(g, "tokenizer.ggml.merges", "missing");
  }
  {
    format::GgufFile g = SmallGguf();
    Mut(g, "tokenizer.ggml.model")->s = "llama";  // needs scores
    ExpectMetaError(g, "tokenizer.ggml.scores", "missing");
  }
  {
    format::GgufFile g = SmallGguf();
    Mut(g, "tokenizer.ggml.model")->s = "wordpiece";
    auto tok = Tokenizer::FromGguf(g);
    CHECK(StatusToMoe(tok.status()) == MOE_ERR_UNSUPPORTED);
    CHECK(std::string(tok.status().message()).find("tokenizer.ggml.model") != std::string::npos);
  }
}

TEST_CASE("tokenizer: malformed tokenizer.json is MOE_ERR_FORMAT_METADATA naming the field", "[text]") {
  const std::string good =
      R"({"model":{"type":"BPE","vocab":{"a":0,"b":1,"ab":2},"merges":["a b"]},)"
      R"("pre_tokenizer":{"type":"ByteLevel","add_prefix_space":false,"use_regex":true}})";
  REQUIRE(Tokenizer::FromHfJson(good, "").ok());
  auto expect = [](const std::string &json, const std::string &word) {
    auto tok = Tokenizer::FromHfJson(json, "");
    REQUIRE_FALSE(tok.ok());
    INFO(tok.status().ToString());
    CHECK(StatusToMoe(tok.status()) == MOE_ERR_FORMAT_METADATA);
    CHECK(std::string(tok.status().message()).find(word) != std::string::npos);
  };
  std::string bad = good;
  expect(bad.replace(bad.find("\"a b\""), 5, "\"a z\""), "model.merges[0]");
  bad = good;
  expect(bad.replace(bad.find("\"a b\""), 5, "[\"a\",\"q\"]"), "'q'");
  bad = good;
  expect(bad.replace(bad.find("\"vocab\""), 7, "\"vocabx\""), "model.vocab");
  const std::string byte_level = R"("pre_tokenizer":{"type":"ByteLevel","use_regex":true})";
  expect(R"({"model":{"type":"BPE","vocab":{"a":"zero"}},)" + byte_level + "}", "model.vocab['a']");
  expect("{not json", "tokenizer.json");
  expect(R"({"model":{"type":"BPE","vocab":{"a":0},"byte_fallback":null},)" + byte_level + "}", "tokenizer.json");
  auto cfg = Tokenizer::FromHfJson(good, R"({"bos_token":"<nope>"})");
  CHECK(StatusToMoe(cfg.status()) == MOE_ERR_FORMAT_METADATA);
  CHECK(std::string(cfg.status().message()).find("bos_token") != std::string::npos);
  auto unsup = Tokenizer::FromHfJson(R"({"model":{"type":"WordPiece","vocab":{"a":0}}})", "");
  CHECK(StatusToMoe(unsup.status()) == MOE_ERR_UNSUPPORTED);
}

}  // namespace
}  // namespace strata::text
