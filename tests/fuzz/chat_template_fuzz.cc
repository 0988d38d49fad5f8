// libFuzzer target for chat templates with hostile sources and messages. The input is a selector
// byte, then NUL-separated fields: a Jinja source (run by FromJinja: the Jinja engine, or a C++
// family renderer where it agrees; an empty or refused source falls back to the family the selector
// names), then role / content pairs. Parsing must give a template or MOE_ERR_UNSUPPORTED; rendering
// must give text or refuse the conversation (MOE_ERR_INVALID_ARGUMENT, or MOE_ERR_LIMIT when the
// engine's bounds stop a template) with a message; rendered text must equal its tagged form, whose template ranges are
// sorted, disjoint and inside the text; and tokenizing it the safe way (as moe_chat_tokenize does,
// with the Qwen2 fixture tokenizer) must turn only the template's own spans into control tokens: a
// special-token spelling inside a message stays ordinary text.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "lib/text/chat_template.h"
#include "lib/text/tokenizer.h"
#include "tests/fuzz/fuzz_util.h"

using strata::fuzz::Require;
using strata::fuzz::RequireRefusal;
using namespace strata::text;

namespace {

const Tokenizer &FixtureTokenizer() {
  static const Tokenizer *tok = [] {
    auto t = Tokenizer::FromHfFile(std::string(STRATA_SOURCE_DIR) + "/tests/text/fixtures/qwen2/tokenizer.json");
    Require(t.ok());
    return t->release();
  }();
  return *tok;
}

// Every control token's bytes [begin, end) lie inside one template range. The fixture's pieces are
// raw bytes (byte-level BPE, no normalizer), so the ids' pieces laid end to end are the text.
void CheckControlTokensFromTemplate(const Tokenizer &tok, const RenderedChat &r, const std::vector<int32_t> &ids) {
  size_t at = 0;
  for (int32_t id : ids) {
    Require(id >= 0 && id < tok.vocab_size());
    const std::string piece = tok.TokenToPiece(id);
    Require(r.text.compare(at, piece.size(), piece) == 0);
    if (tok.IsSpecial(id)) {
      bool inside = false;
      for (const TextRange &t : r.template_ranges) inside = inside || (t.begin <= at && at + piece.size() <= t.end);
      Require(inside);
    }
    at += piece.size();
  }
  Require(at == r.text.size());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  const uint8_t selector = data[0];
  const std::vector<std::string_view> f = strata::fuzz::SplitFields(data + 1, size - 1, 33);
  absl::StatusOr<ChatTemplate> t = f[0].empty() ? absl::StatusOr<ChatTemplate>(strata::MakeError(MOE_ERR_UNSUPPORTED, "empty"))
                                                : ChatTemplate::FromJinja(f[0]);
  if (!t.ok()) {
    RequireRefusal(t.status(), {MOE_ERR_UNSUPPORTED});
    const std::vector<std::string_view> names = ChatTemplate::Names();
    t = ChatTemplate::ByName(names[(selector & 0x7f) % names.size()]);
    Require(t.ok());
  }
  std::vector<ChatMessage> messages;
  for (size_t i = 1; i + 1 < f.size(); i += 2) messages.push_back({f[i], f[i + 1]});
  const bool add_generation_prompt = (selector & 0x80) != 0;
  const Tokenizer &tok = FixtureTokenizer();
  ChatSpecialTokens special;
  if (tok.bos() >= 0) special.bos = tok.token_text(tok.bos());
  if (tok.eos() >= 0) special.eos = tok.token_text(tok.eos());

  absl::StatusOr<std::string> text = t->Render(messages, add_generation_prompt, special);
  absl::StatusOr<RenderedChat> tagged = t->RenderTagged(messages, add_generation_prompt, special);
  Require(text.ok() == tagged.ok());
  if (!text.ok()) {
    RequireRefusal(text.status(), {MOE_ERR_INVALID_ARGUMENT, MOE_ERR_LIMIT});
    return 0;
  }
  Require(*text == tagged->text);
  size_t prev_end = 0;
  for (size_t k = 0; k < tagged->template_ranges.size(); ++k) {
    const TextRange &r = tagged->template_ranges[k];
    Require(r.begin < r.end && r.end <= tagged->text.size());
    Require(k == 0 || r.begin > prev_end);  // sorted, disjoint, not adjacent
    prev_end = r.end;
  }
  const std::vector<int32_t> ids = tok.EncodeSpecialWithin(tagged->text, tagged->template_ranges);
  CheckControlTokensFromTemplate(tok, *tagged, ids);
  return 0;
}
