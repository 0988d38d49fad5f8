// Chat template tests against transformers' apply_chat_template (fixtures from
// scripts/text/make_template_fixtures.py): every family renders every committed conversation byte
// for byte, with and without the generation prompt; each published Jinja source is recognised as
// its family, and the C++ renderer agrees with the Jinja engine on it; other sources run on the
// engine, and one it cannot parse is reported with its line.
#include <catch2/catch.hpp>
#include <fstream>
#include <sstream>

#include "lib/text/chat_template.h"
#include "nlohmann/json.hpp"

namespace strata::text {
namespace {

const nlohmann::json &Fixtures() {
  static const nlohmann::json j = [] {
    std::ifstream f(std::string(STRATA_SOURCE_DIR) + "/tests/text/fixtures/templates/expected.json",
                    std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    return nlohmann::json::parse(ss.str());
  }();
  return j;
}

ChatSpecialTokens Special(const std::string &name) {
  const auto &t = Fixtures()["templates"][name];
  return {t["bos_token"].get<std::string>(), t["eos_token"].get<std::string>()};
}

}  // namespace

TEST_CASE("chat templates render byte-identical to transformers", "[text][chat]") {
  const auto &cases = Fixtures()["cases"];
  REQUIRE(cases.size() >= 100);
  size_t n_checked = 0;
  for (const auto &c : cases) {
    const std::string name = c["template"];
    const bool gen = c["add_generation_prompt"];
    INFO(name << " / " << c["conversation"].get<std::string>() << " / add_generation_prompt=" << gen);
    auto tmpl = ChatTemplate::ByName(name);
    REQUIRE(tmpl.ok());
    CHECK(std::string(tmpl->name()) == name);
    std::vector<std::string> roles, contents;
    for (const auto &m : c["messages"]) {
      roles.push_back(m["role"]);
      contents.push_back(m["content"]);
    }
    std::vector<ChatMessage> msgs;
    for (size_t i = 0; i < roles.size(); ++i) msgs.push_back({roles[i], contents[i]});
    auto text = tmpl->Render(msgs, gen, Special(name));
    if (!c["error"].is_null()) {
      CHECK(!text.ok());
      continue;
    }
    INFO(text.status().ToString());
    REQUIRE(text.ok());
    CHECK(*text == c["expected"].get<std::string>());
    ++n_checked;
  }
  CHECK(n_checked == cases.size());
}

TEST_CASE("chat templates are recognised from their Jinja source", "[text][chat]") {
  for (const auto &[name, t] : Fixtures()["templates"].items()) {
    INFO(name);
    auto tmpl = ChatTemplate::FromJinja(t["jinja"].get<std::string>());
    INFO(tmpl.status().ToString());
    REQUIRE(tmpl.ok());
    CHECK(std::string(tmpl->name()) == name);
  }
  // Sources of no family (dated Llama 3.1, Gemma, DeepSeek-R1) run on the Jinja engine.
  for (const auto &[name, src] : Fixtures()["unrecognised"].items()) {
    INFO(name);
    auto tmpl = ChatTemplate::FromJinja(src.get<std::string>());
    INFO(tmpl.status().ToString());
    REQUIRE(tmpl.ok());
    CHECK(std::string(tmpl->name()) == "jinja");
    CHECK(tmpl->Render({{"user", "hi"}}, true, {"<s>", "</s>"}).ok());
  }
  // Small edits of a known source are not claimed either: the engine renders them as written.
  std::string chatml = Fixtures()["templates"]["chatml"]["jinja"];
  auto edited = ChatTemplate::FromJinja(chatml + "{{ eos_token }}");
  REQUIRE(edited.ok());
  CHECK(std::string(edited->name()) == "jinja");
  CHECK(*edited->Render({{"user", "hi"}}, false, {"<s>", "</s>"}) == "<|im_start|>user\nhi<|im_end|>\n</s>");
  // A source the engine cannot parse is refused, naming the line.
  auto broken = ChatTemplate::FromJinja("{% for m in messages %}\n{{ m.content }}");
  REQUIRE(!broken.ok());
  CHECK(StatusToMoe(broken.status()) == MOE_ERR_UNSUPPORTED);
  CHECK_THAT(std::string(broken.status().message()), Catch::Contains("chat template line 2"));
  // A recognised family whose source the engine renders differently keeps the engine's output:
  // Llama-3's markers with a different system header.
  std::string llama3 = Fixtures()["templates"]["llama3"]["jinja"];
  const size_t at = llama3.find("<|start_header_id|>");
  REQUIRE(at != std::string::npos);
  llama3.insert(at, "[variant]");
  auto variant = ChatTemplate::FromJinja(llama3);
  REQUIRE(variant.ok());
  CHECK(std::string(variant->name()) == "jinja");
}

TEST_CASE("the C++ renderers agree with the Jinja engine on their families' sources", "[text][chat][jinja]") {
  // Every transformers case of every family through the exact renderer and through the engine on
  // the family's published source: the same bytes (the fast path is only kept where this holds).
  size_t n_checked = 0;
  for (const auto &c : Fixtures()["cases"]) {
    const std::string name = c["template"];
    const bool gen = c["add_generation_prompt"];
    INFO(name << " / " << c["conversation"].get<std::string>() << " / add_generation_prompt=" << gen);
    auto exact = ChatTemplate::ByName(name);
    auto engine = ChatTemplate::FromJinjaEngine(Fixtures()["templates"][name]["jinja"].get<std::string>());
    REQUIRE(exact.ok());
    REQUIRE(engine.ok());
    CHECK(std::string(engine->name()) == "jinja");
    std::vector<std::string> roles, contents;
    for (const auto &m : c["messages"]) roles.push_back(m["role"]), contents.push_back(m["content"]);
    std::vector<ChatMessage> msgs;
    for (size_t i = 0; i < roles.size(); ++i) msgs.push_back({roles[i], contents[i]});
    auto a = exact->Render(msgs, gen, Special(name));
    auto b = engine->Render(msgs, gen, Special(name));
    if (!c["error"].is_null()) {
      CHECK(!a.ok());
      CHECK(!b.ok());
      continue;
    }
    INFO(b.status().ToString());
    REQUIRE(a.ok());
    REQUIRE(b.ok());
    CHECK(*b == c["expected"].get<std::string>());
    CHECK(*a == *b);
    ++n_checked;
  }
  CHECK(n_checked >= 100);
}

TEST_CASE("chat template resolution: override, then Jinja source, then architecture", "[text][chat]") {
  const std::string qwen3 = Fixtures()["templates"]["qwen3"]["jinja"];
  CHECK(std::string(ResolveChatTemplate("llama3", qwen3, "mixtral")->name()) == "llama3");
  CHECK(std::string(ResolveChatTemplate("", qwen3, "mixtral")->name()) == "qwen3");
  CHECK(std::string(ResolveChatTemplate("", "", "mixtral")->name()) == "mistral-v1");
  CHECK(std::string(ResolveChatTemplate("", "", "qwen3moe")->name()) == "qwen3");
  auto unknown_arch = ResolveChatTemplate("", "", "llama");
  CHECK(StatusToMoe(unknown_arch.status()) == MOE_ERR_UNSUPPORTED);
  CHECK(std::string(unknown_arch.status().message()).find("'llama'") != std::string::npos);
  auto unknown_name = ResolveChatTemplate("vicuna", "", "qwen3moe");
  CHECK(StatusToMoe(unknown_name.status()) == MOE_ERR_UNSUPPORTED);
  CHECK(std::string(unknown_name.status().message()).find("vicuna") != std::string::npos);
  // A source of no family runs on the engine even when the architecture has a usual template;
  // "jinja" forces the engine on the model's source, and needs one.
  CHECK(std::string(ResolveChatTemplate("", "{{ messages }}", "qwen3moe")->name()) == "jinja");
  CHECK(std::string(ResolveChatTemplate("jinja", qwen3, "qwen3moe")->name()) == "jinja");
  CHECK(StatusToMoe(ResolveChatTemplate("jinja", "", "qwen3moe").status()) == MOE_ERR_UNSUPPORTED);
  CHECK(ChatTemplate::Names().size() == 10);
}

TEST_CASE("chat templates refuse conversations they cannot render", "[text][chat]") {
  const ChatSpecialTokens sp{"<s>", "</s>"};
  const std::vector<ChatMessage> empty;
  for (auto name : ChatTemplate::Names()) {
    INFO(name);
    auto t = ChatTemplate::ByName(name);
    REQUIRE(t.ok());
    CHECK(StatusToMoe(t->Render(empty, true, sp).status()) == MOE_ERR_INVALID_ARGUMENT);
  }
  const std::vector<ChatMessage> two_users = {{"user", "a"}, {"user", "b"}};
  for (const char *name : {"mistral-v1", "mistral-v3"}) {
    auto r = ChatTemplate::ByName(name)->Render(two_users, true, sp);
    CHECK(StatusToMoe(r.status()) == MOE_ERR_INVALID_ARGUMENT);
    CHECK(std::string(r.status().message()).find("alternate") != std::string::npos);
  }
  const std::vector<ChatMessage> late_system = {{"user", "a"}, {"assistant", "b"}, {"system", "c"}};
  CHECK(!ChatTemplate::ByName("mistral-v1")->Render(late_system, true, sp).ok());
  const std::vector<ChatMessage> tool = {{"user", "a"}, {"tool", "b"}};
  for (const char *name : {"qwen3", "qwen2.5", "deepseek-v3", "gpt-oss"}) {
    auto r = ChatTemplate::ByName(name)->Render(tool, true, sp);
    INFO(name);
    CHECK(StatusToMoe(r.status()) == MOE_ERR_INVALID_ARGUMENT);
    CHECK(std::string(r.status().message()).find("'tool'") != std::string::npos);
  }
  // ChatML and Llama-3 write any role, as their templates do.
  CHECK(*ChatTemplate::ByName("chatml")->Render(tool, false, sp) ==
        "<|im_start|>user\na<|im_end|>\n<|im_start|>tool\nb<|im_end|>\n");
  const std::vector<ChatMessage> tagged = {{"user", "a"}, {"assistant", "x<|channel|>final<|message|>y"}};
  CHECK(!ChatTemplate::ByName("gpt-oss")->Render(tagged, false, sp).ok());
}

TEST_CASE("Llama-3 trim strips Unicode whitespace as Python does", "[text][chat]") {
  const std::vector<ChatMessage> m = {{"user", "\xE3\x80\x80\x1c hi\xC2\xA0\t\n"}};
  CHECK(*ChatTemplate::ByName("llama3")->Render(m, false, {"<B>", ""}) ==
        "<B><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>");
  const std::vector<ChatMessage> only_space = {{"user", " \n "}};
  CHECK(*ChatTemplate::ByName("llama3")->Render(only_space, false, {"", ""}) ==
        "<|start_header_id|>user<|end_header_id|>\n\n<|eot_id|>");
}

}  // namespace strata::text
