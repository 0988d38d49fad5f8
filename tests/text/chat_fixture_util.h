// Chat models for tests: the golden Qwen3-MoE weights paired with the tiny 256-token tokenizer of
// tests/text/fixtures/templates (scripts/text/make_template_fixtures.py), either as a checkpoint
// directory (tokenizer_config.json with Qwen3's chat template) or as one GGUF (Llama-3's template in
// tokenizer.chat_template). The replies are noise; the text plumbing around them is real.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "lib/format/file.h"
#include "lib/format/gguf.h"
#include "lib/format/gguf_writer.h"

namespace strata::testing {

inline std::string ChatFixture(const std::string &name) {
  return std::string(STRATA_SOURCE_DIR) + "/tests/text/fixtures/templates/" + name;
}

// Fills `dir` with links to the golden checkpoint and copies of the tokenizer files.
inline void MakeChatCheckpoint(const std::string &dir) {
  namespace fs = std::filesystem;
  const std::string golden = std::string(STRATA_SOURCE_DIR) + "/tests/golden/qwen3moe_f32/hf/";
  for (const char *f : {"config.json", "model.safetensors"}) fs::create_symlink(golden + f, dir + "/" + f);
  for (const char *f : {"tokenizer.json", "tokenizer_config.json"}) fs::copy_file(ChatFixture(f), dir + "/" + f);
}

// Writes `path`: the golden Q8_0 GGUF with the tokenizer GGUF's tokenizer.* keys added, and
// `chat_template` as tokenizer.chat_template when not empty (else the fixture's Llama-3 template).
inline void MakeChatGguf(const std::string &path, const std::string &chat_template = "") {
  auto model_file = format::File::Open(std::string(STRATA_SOURCE_DIR) + "/tests/golden/qwen3moe_f32/model-q8_0.gguf");
  auto tok_file = format::File::Open(ChatFixture("tokenizer.gguf"));
  REQUIRE((model_file.ok() && tok_file.ok()));
  auto model = format::ParseGguf(**model_file);
  auto tok = format::ParseGguf(**tok_file);
  REQUIRE((model.ok() && tok.ok()));
  format::GgufWriter w(path, static_cast<uint32_t>(model->alignment));
  for (const auto &[k, v] : model->kv)
    if (k != "general.alignment") w.SetValue(k, v);
  for (const auto &[k, v] : tok->kv)
    if (k.rfind("tokenizer.", 0) == 0) w.SetValue(k, v);
  if (!chat_template.empty()) {
    format::GgufValue t;
    t.type = format::GgufType::kString;
    t.s = chat_template;
    w.SetValue("tokenizer.chat_template", t);
  }
  for (const auto &t : model->tensors) REQUIRE(w.AddTensor(t.name, t.type, t.n_dims, t.ne).ok());
  REQUIRE(w.Begin().ok());
  for (const auto &t : model->tensors) {
    std::vector<char> bytes(t.nbytes);
    REQUIRE((*model_file)->ReadAt(t.offset, bytes.data(), bytes.size()).ok());
    REQUIRE(w.Write(bytes.data(), bytes.size()).ok());
  }
  REQUIRE(w.Finish().ok());
}

}  // namespace strata::testing
