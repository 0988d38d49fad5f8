// Chat templates: turning a conversation ({role, content} messages) into the prompt text a chat
// model was trained on. A model's Jinja source runs on the Jinja engine (lib/text/jinja.h), which
// renders byte-identical to transformers' apply_chat_template. Ten common families also have exact
// C++ renderers (tests/text/fixtures/templates); a source recognised as one of them by its markers
// takes that renderer only when it agrees with the engine on probe conversations.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/types/span.h"
#include "lib/text/tokenizer.h"
#include "lib/util/status.h"

namespace strata::text {

namespace jinja {
class Template;
}  // namespace jinja

struct ChatMessage {
  std::string_view role;     // "system", "user", "assistant" (gpt-oss also takes "developer")
  std::string_view content;
};

// The special-token texts a template may write (bos_token / eos_token in Jinja); "" when none.
struct ChatSpecialTokens {
  std::string bos;
  std::string eos;
};

// A rendered conversation and the byte ranges of it the template wrote itself (markers, default
// system text, BOS/EOS): everything else came from the caller's messages (contents and roles).
// Only template ranges may hold special tokens (Tokenizer::EncodeSpecialWithin).
struct RenderedChat {
  std::string text;
  std::vector<TextRange> template_ranges;  // sorted, disjoint, not adjacent
};

enum class ChatFamily {
  kChatml,      // generic ChatML, any role, no default system message
  kQwen2,       // ChatML, default system "You are a helpful assistant."
  kQwen25,      // ChatML, default system "You are Qwen, created by Alibaba Cloud. ..."
  kQwen3,       // ChatML, <think> blocks stripped from earlier assistant turns
  kMistralV1,   // Mixtral-8x7B-Instruct-v0.1: "<s> [INST] sys\n\nuser [/INST] reply</s>"
  kMistralV3,   // Mistral-7B-Instruct-v0.3: "<s>[INST] user[/INST] reply</s>", system in the last turn
  kLlama3,      // Llama-3-Instruct (3.0): header ids, trimmed content, <|eot_id|>
  kDeepseekV2,  // DeepSeek-V2-Chat: "User: ...\n\nAssistant: ...<eos>"
  kDeepseekV3,  // DeepSeek-V3 / V2.5: <｜User｜> / <｜Assistant｜>, system prompts first
  kGptOss,      // gpt-oss harmony: fixed system block, developer instructions, final channel
  kJinja,       // the model's own Jinja source, on the engine
};

class ChatTemplate {
 public:
  // By name ("chatml", "qwen2", "qwen2.5", "qwen3", "mistral-v1", "mistral-v3", "llama3",
  // "deepseek-v2", "deepseek-v3", "gpt-oss"); MOE_ERR_UNSUPPORTED listing the names otherwise.
  static absl::StatusOr<ChatTemplate> ByName(std::string_view name);
  // The template of the Jinja source `jinja`: the C++ renderer of the family it is recognised as
  // (by markers) when that agrees with the engine, else the engine on the source.
  // MOE_ERR_UNSUPPORTED (naming the line and the fault) when the engine cannot parse it.
  static absl::StatusOr<ChatTemplate> FromJinja(std::string_view jinja);
  // The engine on `jinja`, never a C++ renderer; errors as FromJinja.
  static absl::StatusOr<ChatTemplate> FromJinjaEngine(std::string_view jinja);
  // The family's usual template when the model carries none (GGUF general.architecture or the HF
  // model_type); MOE_ERR_UNSUPPORTED when the architecture does not settle it.
  static absl::StatusOr<ChatTemplate> ForArchitecture(std::string_view arch);
  // Every name ByName accepts, in a fixed order.
  static std::vector<std::string_view> Names();

  ChatFamily family() const { return family_; }
  const char *name() const;  // static storage; "jinja" for a source on the engine

  // Renders the conversation; with add_generation_prompt the text ends where the assistant's reply
  // begins (templates that have no such prompt, Mistral's, ignore it). Errors: MOE_ERR_INVALID_ARGUMENT
  // for a role the template does not render, or an order it refuses (Mistral: after the optional
  // system message, user and assistant must alternate, starting with user; a Jinja source: its
  // raise_exception message or a runtime fault, with the line); MOE_ERR_LIMIT when a Jinja source
  // passes the engine's limits.
  absl::StatusOr<std::string> Render(absl::Span<const ChatMessage> messages, bool add_generation_prompt,
                                     const ChatSpecialTokens &special) const;
  // The same text, with the ranges the template wrote itself marked.
  absl::StatusOr<RenderedChat> RenderTagged(absl::Span<const ChatMessage> messages, bool add_generation_prompt,
                                            const ChatSpecialTokens &special) const;

 private:
  explicit ChatTemplate(ChatFamily f) : family_(f) {}
  ChatFamily family_;
  std::shared_ptr<const jinja::Template> jinja_;  // kJinja only
};

// Chooses the template: `override_name` when not empty ("jinja": the model's source on the engine),
// else the model's Jinja source when it has one, else its architecture. Errors as ByName /
// FromJinja / ForArchitecture.
absl::StatusOr<ChatTemplate> ResolveChatTemplate(std::string_view override_name, std::string_view jinja,
                                                 std::string_view arch);

}  // namespace strata::text
