// Chat templates rendered in C++, and the model's own source on the Jinja engine. Each Render*
// below follows its family's published Jinja source line by line (kept in
// scripts/text/make_template_fixtures.py, which also records transformers' output for the tests);
// Jinja's `trim` is Python's str.strip(), so it strips Unicode whitespace.
#include "lib/text/chat_template.h"

#include <algorithm>
#include <array>

#include <initializer_list>

#include "lib/text/jinja.h"
#include "lib/text/unicode.h"

namespace strata::text {
namespace {

// String helpers over std::string_view (this absl's string_view is its own type).
void Append(std::string *out, std::initializer_list<std::string_view> parts) {
  for (auto p : parts) out->append(p.data(), p.size());
}
std::string Cat(std::initializer_list<std::string_view> parts) {
  std::string out;
  Append(&out, parts);
  return out;
}
bool Has(std::string_view s, std::string_view marker) { return s.find(marker) != std::string_view::npos; }
bool StartsWith(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }
bool EndsWith(std::string_view s, std::string_view p) {
  return s.size() >= p.size() && s.substr(s.size() - p.size()) == p;
}
template <typename C>
std::string Join(const C &parts, std::string_view sep) {
  std::string out;
  for (auto p : parts) Append(&out, {out.empty() ? "" : sep, p});
  return out;
}

struct FamilyName {
  ChatFamily family;
  const char *name;
};
constexpr std::array<FamilyName, 10> kFamilies = {{
    {ChatFamily::kChatml, "chatml"},
    {ChatFamily::kQwen2, "qwen2"},
    {ChatFamily::kQwen25, "qwen2.5"},
    {ChatFamily::kQwen3, "qwen3"},
    {ChatFamily::kMistralV1, "mistral-v1"},
    {ChatFamily::kMistralV3, "mistral-v3"},
    {ChatFamily::kLlama3, "llama3"},
    {ChatFamily::kDeepseekV2, "deepseek-v2"},
    {ChatFamily::kDeepseekV3, "deepseek-v3"},
    {ChatFamily::kGptOss, "gpt-oss"},
}};

absl::Status BadArg(std::string msg) { return MakeError(MOE_ERR_INVALID_ARGUMENT, std::move(msg)); }

// Python's str.isspace(): Unicode White_Space plus the information separators U+001C..U+001F.
bool PySpace(uint32_t cp) { return IsWhitespace(cp) || (cp >= 0x1c && cp <= 0x1f); }

// Jinja's `trim` (Python str.strip() without arguments).
std::string_view Trim(std::string_view s) {
  size_t b = 0;
  while (b < s.size()) {
    size_t len;
    if (!PySpace(DecodeUtf8(s, b, &len))) break;
    b += len;
  }
  size_t e = s.size();
  while (e > b) {
    size_t start = e - 1;
    while (start > b && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80 && e - start < 4) --start;
    size_t len;
    uint32_t cp = DecodeUtf8(s, start, &len);
    if (start + len != e || !PySpace(cp)) break;  // an invalid tail byte is not whitespace
    e = start;
  }
  return s.substr(b, e - b);
}

std::string_view LStripNl(std::string_view s) {
  while (!s.empty() && s.front() == '\n') s.remove_prefix(1);
  return s;
}
std::string_view RStripNl(std::string_view s) {
  while (!s.empty() && s.back() == '\n') s.remove_suffix(1);
  return s;
}

absl::Status OnlyRoles(absl::Span<const ChatMessage> msgs, std::initializer_list<std::string_view> roles,
                       const char *tmpl) {
  for (size_t i = 0; i < msgs.size(); ++i) {
    bool ok = false;
    for (auto r : roles) ok = ok || msgs[i].role == r;
    if (!ok) {
      return BadArg(Cat({"chat template ", tmpl, ": message ", std::to_string(i), " has role '", msgs[i].role,
                         "', which it does not render (roles: ", Join(roles, ", "), ")"}));
    }
  }
  return absl::OkStatus();
}

// A piece of rendered text: the template's own unless made with Msg() (from the caller's messages).
struct Piece {
  Piece(const char *s) : text(s) {}            // NOLINT: literals are the template's own text
  Piece(std::string_view s) : text(s) {}       // NOLINT
  Piece(const std::string &s) : text(s) {}     // NOLINT
  std::string_view text;
  bool caller = false;
};
Piece Msg(std::string_view s) {
  Piece p(s);
  p.caller = true;
  return p;
}

// Appends the pieces, extending the template ranges with the template's own.
void Emit(RenderedChat *out, std::initializer_list<Piece> parts) {
  for (const Piece &p : parts) {
    if (p.text.empty()) continue;
    const size_t at = out->text.size();
    out->text.append(p.text.data(), p.text.size());
    if (p.caller) continue;
    auto &r = out->template_ranges;
    if (!r.empty() && r.back().end == at) {
      r.back().end = out->text.size();
    } else {
      r.push_back({at, out->text.size()});
    }
  }
}

void ImTurn(RenderedChat *out, Piece role, Piece content) {
  Emit(out, {"<|im_start|>", role, "\n", content, "<|im_end|>\n"});
}

// chatml, qwen2, qwen2.5 differ only in the default system message.
RenderedChat RenderChatml(absl::Span<const ChatMessage> m, bool gen, std::string_view default_system) {
  RenderedChat out;
  if (!default_system.empty() && m[0].role != "system") ImTurn(&out, "system", default_system);
  for (const auto &msg : m) ImTurn(&out, Msg(msg.role), Msg(msg.content));
  if (gen) Emit(&out, {"<|im_start|>assistant\n"});
  return out;
}

RenderedChat RenderQwen3(absl::Span<const ChatMessage> m, bool gen) {
  RenderedChat out;
  if (m[0].role == "system") ImTurn(&out, "system", Msg(m[0].content));
  // The last user turn that is not a wrapped tool response; assistant turns after it keep <think>.
  size_t last_query = m.size() - 1;
  for (size_t k = m.size(); k-- > 0;) {
    const auto &c = m[k].content;
    if (m[k].role == "user" &&
        !(StartsWith(c, "<tool_response>") && EndsWith(c, "</tool_response>"))) {
      last_query = k;
      break;
    }
  }
  for (size_t i = 0; i < m.size(); ++i) {
    const ChatMessage &msg = m[i];
    if (msg.role == "user" || (msg.role == "system" && i != 0)) {
      ImTurn(&out, Msg(msg.role), Msg(msg.content));
    } else if (msg.role == "assistant") {
      std::string_view content = msg.content, reasoning;
      const size_t first_close = content.find("</think>");
      if (first_close != std::string_view::npos) {
        std::string_view before = RStripNl(content.substr(0, first_close));
        const size_t open = before.rfind("<think>");
        reasoning = LStripNl(open == std::string_view::npos ? before : before.substr(open + 7));
        content = LStripNl(content.substr(content.rfind("</think>") + 8));
      }
      Emit(&out, {"<|im_start|>assistant\n"});
      if (i > last_query && (i + 1 == m.size() || !reasoning.empty())) {
        Emit(&out, {"<think>\n", Msg(RStripNl(LStripNl(reasoning))), "\n</think>\n\n", Msg(LStripNl(content))});
      } else {
        Emit(&out, {Msg(content)});
      }
      Emit(&out, {"<|im_end|>\n"});
    }
  }
  if (gen) Emit(&out, {"<|im_start|>assistant\n"});
  return out;
}

// Mistral: after an optional first system message, user and assistant alternate from user.
absl::Status MistralAlternation(absl::Span<const ChatMessage> loop, const char *tmpl) {
  for (size_t i = 0; i < loop.size(); ++i) {
    if ((loop[i].role == "user") != (i % 2 == 0)) {
      return BadArg(Cat({"chat template ", tmpl,
                         ": after the optional system message, conversation roles must alternate "
                         "user/assistant/user/assistant/... (message ",
                         std::to_string(i), " is '", loop[i].role, "')"}));
    }
    if (loop[i].role != "user" && loop[i].role != "assistant") {
      return BadArg(Cat({"chat template ", tmpl,
                         ": only user and assistant roles are supported, with the exception of an initial "
                         "optional system message (got '",
                         loop[i].role, "')"}));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<RenderedChat> RenderMistral(absl::Span<const ChatMessage> m, const ChatSpecialTokens &sp, bool v3) {
  const bool has_system = m[0].role == "system";
  absl::Span<const ChatMessage> loop = has_system ? m.subspan(1) : m;
  STRATA_RETURN_IF_ERROR(MistralAlternation(loop, v3 ? "mistral-v3" : "mistral-v1"));
  RenderedChat out;
  Emit(&out, {sp.bos});
  for (size_t i = 0; i < loop.size(); ++i) {
    const ChatMessage &msg = loop[i];
    if (v3) {
      if (msg.role == "user") {
        if (i + 1 == loop.size() && has_system) {
          Emit(&out, {"[INST] ", Msg(m[0].content), "\n\n", Msg(msg.content), "[/INST]"});
        } else {
          Emit(&out, {"[INST] ", Msg(msg.content), "[/INST]"});
        }
      } else {
        Emit(&out, {" ", Msg(Trim(msg.content)), sp.eos});
      }
    } else {
      if (msg.role == "user") {
        if (i == 0 && has_system) {
          Emit(&out, {" [INST] ", Msg(m[0].content), "\n\n", Msg(msg.content), " [/INST]"});
        } else {
          Emit(&out, {" [INST] ", Msg(msg.content), " [/INST]"});
        }
      } else {
        Emit(&out, {" ", Msg(msg.content), sp.eos});
      }
    }
  }
  return out;
}

RenderedChat RenderLlama3(absl::Span<const ChatMessage> m, bool gen, const ChatSpecialTokens &sp) {
  RenderedChat out;
  Emit(&out, {sp.bos});
  for (const auto &msg : m) {
    Emit(&out, {"<|start_header_id|>", Msg(msg.role), "<|end_header_id|>\n\n", Msg(Trim(msg.content)), "<|eot_id|>"});
  }
  if (gen) Emit(&out, {"<|start_header_id|>assistant<|end_header_id|>\n\n"});
  return out;
}

RenderedChat RenderDeepseekV2(absl::Span<const ChatMessage> m, bool gen, const ChatSpecialTokens &sp) {
  RenderedChat out;
  Emit(&out, {sp.bos});
  for (const auto &msg : m) {
    if (msg.role == "user") Emit(&out, {"User: ", Msg(msg.content), "\n\n"});
    else if (msg.role == "assistant") Emit(&out, {"Assistant: ", Msg(msg.content), sp.eos});
    else Emit(&out, {Msg(msg.content), "\n\n"});  // system
  }
  if (gen) Emit(&out, {"Assistant:"});
  return out;
}

RenderedChat RenderDeepseekV3(absl::Span<const ChatMessage> m, bool gen, const ChatSpecialTokens &sp) {
  RenderedChat out;
  Emit(&out, {sp.bos});
  bool first_system = true;
  for (const auto &msg : m) {
    if (msg.role != "system") continue;
    Emit(&out, {first_system ? "" : "\n\n", Msg(msg.content)});
    first_system = false;
  }
  for (const auto &msg : m) {
    if (msg.role == "user") Emit(&out, {"<｜User｜>", Msg(msg.content)});
    else if (msg.role == "assistant")
      Emit(&out, {"<｜Assistant｜>", Msg(msg.content), "<｜end▁of▁sentence｜>"});
  }
  if (gen) Emit(&out, {"<｜Assistant｜>"});
  return out;
}

absl::StatusOr<RenderedChat> RenderGptOss(absl::Span<const ChatMessage> m, bool gen) {
  RenderedChat out;
  Emit(&out, {"<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"
              "Knowledge cutoff: 2024-06\n\nReasoning: medium\n\n"
              "# Valid channels: analysis, commentary, final. Channel must be included for every message.<|end|>"});
  const bool has_dev = m[0].role == "developer" || m[0].role == "system";
  absl::Span<const ChatMessage> loop = has_dev ? m.subspan(1) : m;
  if (has_dev && !m[0].content.empty()) {
    Emit(&out, {"<|start|>developer<|message|># Instructions\n\n", Msg(m[0].content), "\n\n<|end|>"});
  }
  STRATA_RETURN_IF_ERROR(OnlyRoles(loop, {"user", "assistant"}, "gpt-oss (after the first system/developer message)"));
  for (size_t i = 0; i < loop.size(); ++i) {
    const ChatMessage &msg = loop[i];
    if (msg.role == "user") {
      Emit(&out, {"<|start|>user<|message|>", Msg(msg.content), "<|end|>"});
      continue;
    }
    if (Has(msg.content, "<|channel|>analysis<|message|>") ||
        Has(msg.content, "<|channel|>final<|message|>")) {
      return BadArg("chat template gpt-oss: an assistant message contains <|channel|> tags; pass only the final "
                    "text as its content");
    }
    const bool final_turn = i + 1 == loop.size() && !gen;
    Emit(&out, {"<|start|>assistant<|channel|>final<|message|>", Msg(msg.content),
                final_turn ? "<|return|>" : "<|end|>"});
  }
  if (gen) Emit(&out, {"<|start|>assistant"});
  return out;
}

// The conversation on the engine, as transformers passes it: messages (role and content, both the
// caller's), tools and documents None, add_generation_prompt, bos_token and eos_token. The
// template ranges are the bytes outside the caller's spans.
absl::StatusOr<RenderedChat> RenderJinja(const jinja::Template &t, absl::Span<const ChatMessage> m, bool gen,
                                         const ChatSpecialTokens &sp) {
  using jinja::Value;
  jinja::List msgs;
  for (const ChatMessage &msg : m) {
    Value d = Value::MakeDict();
    d.Set(Value::Str("role"), Value::CallerStr(std::string(msg.role)));
    d.Set(Value::Str("content"), Value::CallerStr(std::string(msg.content)));
    msgs.push_back(std::move(d));
  }
  Value ctx = Value::MakeDict();
  ctx.Set(Value::Str("messages"), Value::MakeList(std::move(msgs)));
  ctx.Set(Value::Str("tools"), Value::None());
  ctx.Set(Value::Str("documents"), Value::None());
  ctx.Set(Value::Str("add_generation_prompt"), Value::Bool(gen));
  ctx.Set(Value::Str("bos_token"), Value::Str(sp.bos));
  ctx.Set(Value::Str("eos_token"), Value::Str(sp.eos));
  STRATA_ASSIGN_OR_RETURN(jinja::Rendered r, t.Render(ctx));
  RenderedChat out;
  out.text = std::move(r.text);
  size_t at = 0;
  for (const jinja::Span &c : r.caller_spans) {
    if (c.begin > at) out.template_ranges.push_back({at, c.begin});
    at = std::max(at, c.end);
  }
  if (at < out.text.size()) out.template_ranges.push_back({at, out.text.size()});
  return out;
}

// The source with runs of whitespace removed and double quotes made single: equal for two
// spellings of the same simple template.
std::string Squash(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r') continue;
    out += c == '"' ? '\'' : c;
  }
  return out;
}

bool HasEither(std::string_view s, std::string_view single_quoted) {
  std::string dq(single_quoted);
  for (char &c : dq) c = c == '\'' ? '"' : c;
  return Has(s, single_quoted) || Has(s, dq);
}

constexpr char kQwen2Source[] =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ "
    "'<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' + "
    "message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt "
    "%}{{ '<|im_start|>assistant\\n' }}{% endif %}";
constexpr char kChatmlSource[] =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

}  // namespace

std::vector<std::string_view> ChatTemplate::Names() {
  std::vector<std::string_view> v;
  for (const auto &f : kFamilies) v.push_back(f.name);
  return v;
}

const char *ChatTemplate::name() const {
  if (family_ == ChatFamily::kJinja) return "jinja";
  for (const auto &f : kFamilies)
    if (f.family == family_) return f.name;
  return "?";
}

absl::StatusOr<ChatTemplate> ChatTemplate::ByName(std::string_view name) {
  for (const auto &f : kFamilies)
    if (name == f.name) return ChatTemplate(f.family);
  if (name == "jinja") {
    return MakeError(MOE_ERR_UNSUPPORTED, "chat template 'jinja' renders the model's own Jinja source, and the model "
                                          "carries none");
  }
  return MakeError(MOE_ERR_UNSUPPORTED, Cat({"unknown chat template '", name, "' (known: ", Join(Names(), ", "),
                                             ", or jinja for the model's own)"}));
}

absl::StatusOr<ChatTemplate> ChatTemplate::FromJinjaEngine(std::string_view source) {
  absl::StatusOr<jinja::Template> t = jinja::Template::Parse(source);
  if (!t.ok()) {
    return MakeError(MOE_ERR_UNSUPPORTED, "the model's chat template cannot be rendered: " + std::string(t.status().message()));
  }
  ChatTemplate ct(ChatFamily::kJinja);
  ct.jinja_ = std::make_shared<const jinja::Template>(std::move(*t));
  return ct;
}

namespace {

// Whether two templates render the probe conversations alike (text and refusals). Their template
// ranges may differ on role names: the engine marks a role the template spells as a literal
// ('system') as the template's, a C++ renderer may mark it as the caller's; either keeps every
// caller byte out of special-token parsing.
bool AgreeOnProbes(const ChatTemplate &a, const ChatTemplate &b) {
  const ChatSpecialTokens sp{"<s>", "</s>"};
  const std::vector<ChatMessage> probes[] = {
      {{"system", "Be brief."}, {"user", " Hi there \n"}, {"assistant", "Hello."}, {"user", "Bye"}},
      {{"user", "hi"}},
      {{"user", "hi"}, {"assistant", "<think>\nhm\n</think>\n\nyes"}},
  };
  for (const auto &m : probes) {
    for (bool gen : {false, true}) {
      absl::StatusOr<RenderedChat> x = a.RenderTagged(m, gen, sp), y = b.RenderTagged(m, gen, sp);
      if (x.ok() != y.ok()) return false;
      if (!x.ok()) continue;
      if (x->text != y->text) return false;
    }
  }
  return true;
}

// The family a published source is, by its markers; kJinja when none.
ChatFamily Recognise(std::string_view s);

}  // namespace

namespace {

ChatFamily Recognise(std::string_view s) {
  auto is = [](ChatFamily f) { return f; };
  // Markers of template versions whose output Strata does not reproduce: dated system blocks
  // (Llama 3.1+), reasoning prompts (DeepSeek-R1), anything that reads the clock.
  const bool dated = Has(s, "strftime_now") || Has(s, "Cutting Knowledge Date") || Has(s, "date_string");
  if (!dated) {
    if (Has(s, "<|start|>") && Has(s, "<|channel|>") && Has(s, "<|message|>") && Has(s, "Knowledge cutoff")) {
      return is(ChatFamily::kGptOss);
    }
    if (Has(s, "<|start_header_id|>") && Has(s, "<|end_header_id|>") && Has(s, "<|eot_id|>") &&
        !Has(s, "<|python_tag|>") && !Has(s, "ipython")) {
      return is(ChatFamily::kLlama3);
    }
    if (Has(s, "<｜User｜>") && Has(s, "<｜Assistant｜>") && !Has(s, "think>")) return is(ChatFamily::kDeepseekV3);
    if (HasEither(s, "'User: '") && HasEither(s, "'Assistant: '") && HasEither(s, "'Assistant:'")) {
      return is(ChatFamily::kDeepseekV2);
    }
    if (HasEither(s, "' [INST] '") && HasEither(s, "' [/INST]'") && Has(s, "loop.first and system_message")) {
      return is(ChatFamily::kMistralV1);
    }
    if (HasEither(s, "'[INST] '") && HasEither(s, "'[/INST]'") && Has(s, "loop.last and system_message")) {
      return is(ChatFamily::kMistralV3);
    }
    if (Has(s, "<|im_start|>")) {
      if (Has(s, "<think>") && Has(s, "reasoning_content") && Has(s, "last_query_index")) {
        return is(ChatFamily::kQwen3);
      }
      if (Has(s, "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.")) {
        return is(ChatFamily::kQwen25);
      }
      // The two simple ones must match in full: a variant of them is not claimed.
      if (Squash(s) == Squash(kQwen2Source)) return is(ChatFamily::kQwen2);
      if (Squash(s) == Squash(kChatmlSource)) return is(ChatFamily::kChatml);
    }
  }
  return ChatFamily::kJinja;
}

}  // namespace

absl::StatusOr<ChatTemplate> ChatTemplate::FromJinja(std::string_view s) {
  absl::StatusOr<ChatTemplate> engine = FromJinjaEngine(s);
  const ChatFamily family = Recognise(s);
  if (family == ChatFamily::kJinja) return engine;
  // A recognised family keeps its C++ renderer only where the engine renders the source alike
  // (or cannot parse it at all).
  if (!engine.ok() || AgreeOnProbes(ChatTemplate(family), *engine)) return ChatTemplate(family);
  return engine;
}

absl::StatusOr<ChatTemplate> ChatTemplate::ForArchitecture(std::string_view arch) {
  struct ArchFamily {
    const char *arch;
    ChatFamily family;
  };
  // Only architectures whose instruct models all share one template.
  static constexpr ArchFamily kArch[] = {
      {"qwen3moe", ChatFamily::kQwen3}, {"qwen3_moe", ChatFamily::kQwen3}, {"qwen3", ChatFamily::kQwen3},
      {"mixtral", ChatFamily::kMistralV1}, {"gpt-oss", ChatFamily::kGptOss}, {"gpt_oss", ChatFamily::kGptOss},
      {"deepseek_v3", ChatFamily::kDeepseekV3},
  };
  for (const auto &a : kArch)
    if (arch == a.arch) return ChatTemplate(a.family);
  return MakeError(MOE_ERR_UNSUPPORTED,
                   Cat({"the model carries no chat template and its architecture '", arch,
                                "' does not settle one; choose one by name: ", Join(Names(), ", ")}));
}

absl::StatusOr<RenderedChat> ChatTemplate::RenderTagged(absl::Span<const ChatMessage> m, bool gen,
                                                 const ChatSpecialTokens &sp) const {
  if (m.empty()) return BadArg(Cat({"chat template ", name(), ": the conversation has no messages"}));
  switch (family_) {
    case ChatFamily::kJinja:
      return RenderJinja(*jinja_, m, gen, sp);
    case ChatFamily::kChatml:
      return RenderChatml(m, gen, "");
    case ChatFamily::kQwen2:
      return RenderChatml(m, gen, "You are a helpful assistant.");
    case ChatFamily::kQwen25:
      STRATA_RETURN_IF_ERROR(OnlyRoles(m, {"system", "user", "assistant"}, name()));
      return RenderChatml(m, gen, "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.");
    case ChatFamily::kQwen3:
      STRATA_RETURN_IF_ERROR(OnlyRoles(m, {"system", "user", "assistant"}, name()));
      return RenderQwen3(m, gen);
    case ChatFamily::kMistralV1:
      return RenderMistral(m, sp, false);
    case ChatFamily::kMistralV3:
      return RenderMistral(m, sp, true);
    case ChatFamily::kLlama3:
      return RenderLlama3(m, gen, sp);
    case ChatFamily::kDeepseekV2:
      STRATA_RETURN_IF_ERROR(OnlyRoles(m, {"system", "user", "assistant"}, name()));
      return RenderDeepseekV2(m, gen, sp);
    case ChatFamily::kDeepseekV3:
      STRATA_RETURN_IF_ERROR(OnlyRoles(m, {"system", "user", "assistant"}, name()));
      return RenderDeepseekV3(m, gen, sp);
    case ChatFamily::kGptOss:
      return RenderGptOss(m, gen);
  }
  return MakeError(MOE_ERR_INTERNAL, "unknown chat family");
}

absl::StatusOr<std::string> ChatTemplate::Render(absl::Span<const ChatMessage> m, bool gen,
                                                 const ChatSpecialTokens &sp) const {
  STRATA_ASSIGN_OR_RETURN(RenderedChat r, RenderTagged(m, gen, sp));
  return std::move(r.text);
}

absl::StatusOr<ChatTemplate> ResolveChatTemplate(std::string_view override_name, std::string_view jinja,
                                                 std::string_view arch) {
  if (override_name == "jinja" && !jinja.empty()) return ChatTemplate::FromJinjaEngine(jinja);
  if (!override_name.empty()) return ChatTemplate::ByName(override_name);
  if (!jinja.empty()) return ChatTemplate::FromJinja(jinja);
  return ChatTemplate::ForArchitecture(arch);
}

}  // namespace strata::text
