// The Jinja engine against PyPI jinja2 in transformers' environment (fixtures from
// tests/text/make_jinja_fixtures.py): every committed template over every conversation renders
// byte-identical, or is refused where jinja2 refused; caller spans cover exactly the caller's text.
#include "lib/text/jinja.h"

#include <catch2/catch.hpp>
#include <ctime>
#include <fstream>
#include <sstream>

#include "nlohmann/json.hpp"

namespace strata::text::jinja {
namespace {

std::string ReadFile(const std::string &path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

const std::string kFixtureDir = std::string(STRATA_SOURCE_DIR) + "/tests/text/fixtures/jinja/";

const nlohmann::ordered_json &Fixtures() {
  static const nlohmann::ordered_json j = nlohmann::ordered_json::parse(ReadFile(kFixtureDir + "expected.json"));
  return j;
}

// strftime_now at the fixtures' fixed instant, 2024-07-26 09:30:00.
Value FixedClock() {
  return Value::Fn("strftime_now", [](Evaluator &, CallArgs &a) -> absl::StatusOr<Value> {
    std::tm tm{};
    tm.tm_year = 124;
    tm.tm_mon = 6;
    tm.tm_mday = 26;
    tm.tm_hour = 9;
    tm.tm_min = 30;
    tm.tm_wday = 5;
    tm.tm_yday = 207;
    char buf[256];
    const std::string fmt = a.pos.empty() ? "" : a.pos[0].str;
    const size_t n = std::strftime(buf, sizeof buf, fmt.c_str(), &tm);
    return Value::Str(std::string(buf, n));
  });
}

std::string TemplateSource(const std::string &name) {
  const auto &t = Fixtures()["templates"][name];
  if (t.contains("file")) return ReadFile(kFixtureDir + "templates/" + t["file"].get<std::string>());
  return t["source"].get<std::string>();
}

Value Context(const nlohmann::ordered_json &conv, const nlohmann::ordered_json &tmpl, bool gen) {
  Value ctx = Value::MakeDict();
  Dict &d = *ctx.dict;
  d.Set(Value::Str("messages"), FromJson(conv["messages"], true));
  d.Set(Value::Str("tools"), FromJson(conv["tools"], true));
  d.Set(Value::Str("documents"), Value::None());
  d.Set(Value::Str("add_generation_prompt"), Value::Bool(gen));
  d.Set(Value::Str("bos_token"), Value::Str(tmpl["bos_token"].get<std::string>()));
  d.Set(Value::Str("eos_token"), Value::Str(tmpl["eos_token"].get<std::string>()));
  for (auto it = conv["extra"].begin(); it != conv["extra"].end(); ++it) {
    d.Set(Value::Str(it.key()), FromJson(it.value(), false));
  }
  d.Set(Value::Str("strftime_now"), FixedClock());
  return ctx;
}

}  // namespace

TEST_CASE("jinja engine renders model templates byte-identical to jinja2", "[jinja]") {
  const auto &fx = Fixtures();
  REQUIRE(fx["templates"].size() >= 20);
  REQUIRE(fx["cases"].size() >= 400);
  size_t rendered = 0, refused = 0;
  std::string last_name;
  absl::StatusOr<Template> tmpl = absl::UnknownError("none");
  for (const auto &c : fx["cases"]) {
    const std::string name = c["template"];
    const std::string conv_name = c["conversation"];
    const bool gen = c["add_generation_prompt"];
    INFO(name << " / " << conv_name << " / add_generation_prompt=" << gen);
    if (name != last_name) {
      tmpl = Template::Parse(TemplateSource(name));
      last_name = name;
    }
    REQUIRE(tmpl.ok());
    const Value ctx = Context(fx["conversations"][conv_name], fx["templates"][name], gen);
    absl::StatusOr<Rendered> r = tmpl->Render(ctx);
    if (c.contains("error")) {
      INFO("jinja2 refused: " << c["error"].get<std::string>());
      CHECK(!r.ok());
      if (!r.ok()) CHECK(r.status().message().find("chat template line ") == 0);
      ++refused;
      continue;
    }
    INFO((r.ok() ? std::string("") : std::string(r.status().message())));
    REQUIRE(r.ok());
    CHECK(r->text == c["text"].get<std::string>());
    size_t prev = 0;
    for (const Span &s : r->caller_spans) {
      CHECK(s.begin >= prev);
      CHECK(s.begin < s.end);
      CHECK(s.end <= r->text.size());
      prev = s.end;
    }
    ++rendered;
  }
  CHECK(rendered >= 350);
  CHECK(refused >= 50);
}

}  // namespace strata::text::jinja

namespace strata::text::jinja {

TEST_CASE("jinja engine matches jinja2 on undefined values, printing, operators and refusals", "[jinja]") {
  const auto &fx = Fixtures();
  REQUIRE(fx["snippets"].size() >= 40);
  const auto &msgs = fx["conversations"]["system"]["messages"];
  for (const auto &c : fx["snippets"]) {
    const std::string src = c["source"];
    INFO(src);
    Value ctx = Value::MakeDict();
    ctx.Set(Value::Str("messages"), FromJson(msgs, true));
    ctx.Set(Value::Str("d"), FromJson(nlohmann::ordered_json::parse(R"({"a": 1, "items": [1, 2]})"), false));
    ctx.Set(Value::Str("s"), Value::Str("Text"));
    ctx.Set(Value::Str("n"), Value::None());
    ctx.Set(Value::Str("bos_token"), Value::Str("<s>"));
    ctx.Set(Value::Str("eos_token"), Value::Str("</s>"));
    ctx.Set(Value::Str("add_generation_prompt"), Value::Bool(false));
    absl::StatusOr<Template> t = Template::Parse(src);
    absl::StatusOr<Rendered> r = t.ok() ? t->Render(ctx) : absl::StatusOr<Rendered>(t.status());
    if (c.contains("error")) {
      INFO("jinja2: " << c["error"].get<std::string>());
      REQUIRE(!r.ok());
      INFO("engine: " << r.status().message());
      CHECK(r.status().message().find("chat template line ") == 0);
      continue;
    }
    INFO((r.ok() ? std::string() : std::string(r.status().message())));
    REQUIRE(r.ok());
    CHECK(r->text == c["text"].get<std::string>());
  }
}

}  // namespace strata::text::jinja
