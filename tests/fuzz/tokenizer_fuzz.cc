// libFuzzer target for the Hugging Face tokenizer loader: the input is tokenizer.json, then after a
// NUL tokenizer_config.json, then after another NUL a text to encode. Any bytes must load or fail
// with a status naming the problem; a tokenizer that loads must encode every text (the fuzzed one
// and fixed probes: special spellings, invalid UTF-8, long runs) into ids inside its vocabulary
// (bytes its vocabulary cannot spell, with no unknown token, are dropped, as Hugging Face's are),
// decode them, and stream them back as valid UTF-8.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "lib/text/tokenizer.h"
#include "lib/text/unicode.h"
#include "tests/fuzz/fuzz_util.h"

using strata::fuzz::Require;
using strata::fuzz::RequireRefusal;
using strata::text::Tokenizer;

namespace {

void Check(const Tokenizer &tok, std::string_view text) {
  for (bool special : {false, true}) {
    const std::vector<int32_t> ids = tok.Encode(text, special);
    for (int32_t id : ids) Require(id >= 0 && id < tok.vocab_size());
    Require(tok.Decode(ids).ok());
    strata::text::StreamDetokenizer stream(tok);
    std::string streamed;
    for (int32_t id : ids) streamed += stream.Push(id);
    streamed += stream.Finish();
    Require(strata::text::ValidUtf8Prefix(streamed) == streamed.size());
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const std::vector<std::string_view> f = strata::fuzz::SplitFields(data, size, 3);
  const std::string_view json = f[0];
  const std::string_view config = f.size() > 1 ? f[1] : std::string_view();
  absl::StatusOr<std::unique_ptr<Tokenizer>> t = Tokenizer::FromHfJson(json, config);
  if (!t.ok()) {
    RequireRefusal(t.status(), {MOE_ERR_FORMAT, MOE_ERR_UNSUPPORTED});
    return 0;
  }
  const Tokenizer &tok = **t;
  Require(tok.vocab_size() > 0);
  Require(tok.bos() >= -1 && tok.bos() < tok.vocab_size() && tok.eos() >= -1 && tok.eos() < tok.vocab_size());
  if (f.size() > 2) Check(tok, f[2].substr(0, 512));
  static const char *const kProbes[] = {
      "Hello, world! It's 2024.\n\tcafé ĉu 你好 🙂",
      "<|im_start|>user\n<|im_end|><|endoftext|><s></s><unk>",
      "\xff\xfe\xc3 broken \xe2\x82 utf-8 \xf0\x9f",
      "                                                        ",
      "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
  };
  for (const char *p : kProbes) Check(tok, p);
  for (int32_t id = 0; id < tok.vocab_size() && id < 64; ++id) (void)tok.TokenToPiece(id);
  return 0;
}
