// The Jinja engine's own promises beyond jinja2's output (tests/text/jinja_test.cc has those):
// errors name the line and the fault, hostile templates hit a limit instead of the stack or the
// heap, and caller spans mark exactly the bytes that came from the caller's values.
#include <catch2/catch.hpp>
#include <random>
#include <string>

#include "lib/text/jinja.h"
#include "lib/text/jinja_eval.h"

namespace strata::text::jinja {
namespace {

absl::StatusOr<Rendered> RenderWith(const std::string &src, const Value &ctx, const RenderLimits &limits = {}) {
  absl::StatusOr<Template> t = Template::Parse(src);
  if (!t.ok()) return t.status();
  return t->Render(ctx, limits);
}

absl::StatusOr<Rendered> RenderSrc(const std::string &src, const RenderLimits &limits = {}) {
  return RenderWith(src, Value::MakeDict(), limits);
}

std::string Message(const absl::Status &st) { return std::string(st.message()); }

std::string Repeat(const std::string &s, int n) {
  std::string out;
  for (int k = 0; k < n; ++k) out += s;
  return out;
}

}  // namespace

TEST_CASE("jinja errors name the line and the fault", "[jinja]") {
  struct Case {
    std::string src;
    std::string line;  // "chat template line N"
    std::string what;
  };
  const Case cases[] = {
      {"a\nb\n{% if x %}\nnever closed", "line 4", "'elif' or 'else' or 'endif'"},
      {"{% for m in messages %}\n{% endif %}", "line 2", "'{% endif %}' closes no open block"},
      {"\n\n{{ x | no_such_filter }}", "line 3", "unknown filter 'no_such_filter'"},
      {"{% if x is no_such_test %}{% endif %}", "line 1", "unknown test 'no_such_test'"},
      {"\n{{ 1 + }}", "line 2", "expected an expression, got '}}'"},
      {"{{ 'open }}", "line 1", "a string is never closed"},
      {"x\n{# open", "line 2", "a comment ({#) is never closed"},
      {"{{ x", "line 1", "is never closed"},
      {"{% break %}", "line 1", "'break' outside a for loop"},
      {"{% include 'x' %}", "line 1", "'{% include %}' is not supported"},
      {"{% frobnicate %}", "line 1", "unknown tag 'frobnicate'"},
      {"{{ (1 ] }}", "line 1", "unexpected ']'"},
      {"{{ a ? b }}", "line 1", "unexpected character '?'"},
      {"{% for x in [1] recursive %}{% endfor %}", "line 1", "recursive for loops are not supported"},
      {"{% raw %}never ended", "line 1", "{% endraw %}"},
  };
  for (const Case &c : cases) {
    INFO(c.src);
    absl::StatusOr<Template> t = Template::Parse(c.src);
    REQUIRE(!t.ok());
    CHECK(StatusToMoe(t.status()) == MOE_ERR_INVALID_ARGUMENT);
    CHECK_THAT(Message(t.status()), Catch::Contains("chat template " + c.line + ": "));
    CHECK_THAT(Message(t.status()), Catch::Contains(c.what));
  }
}

TEST_CASE("jinja runtime errors name the line; raise_exception carries its message", "[jinja]") {
  auto r = RenderSrc("ok\n\n{{ raise_exception('Conversation roles must alternate') }}");
  REQUIRE(!r.ok());
  CHECK(StatusToMoe(r.status()) == MOE_ERR_INVALID_ARGUMENT);
  CHECK(Message(r.status()) ==
        "chat template line 3: the template refused the conversation: Conversation roles must alternate");
  r = RenderSrc("{% for i in [1] %}\n  {{ foo.bar }}\n{% endfor %}");
  REQUIRE(!r.ok());
  CHECK(Message(r.status()) == "chat template line 2: 'foo' is undefined");
  r = RenderSrc("{{ 'a' + 1 }}");
  REQUIRE(!r.ok());
  CHECK_THAT(Message(r.status()), Catch::Contains("can only concatenate str"));
  r = RenderSrc("{% set x = [1] %}{{ x.append(2) }}");
  REQUIRE(!r.ok());
  CHECK_THAT(Message(r.status()), Catch::Contains("'append' of 'list' object is unsafe"));
  r = RenderSrc("{% set t = 1 %}{% set t.x = 2 %}");
  REQUIRE(!r.ok());
  CHECK_THAT(Message(r.status()), Catch::Contains("only on a namespace()"));
}

TEST_CASE("jinja limits stop hostile templates with MOE_ERR_LIMIT", "[jinja]") {
  RenderLimits small;
  small.max_output = 1 << 16;
  small.max_items = 1 << 12;
  small.max_steps = 100'000;
  small.max_work = 10'000'000;
  const std::string hostile[] = {
      "{% for i in range(1000000000) %}{% endfor %}",                                                      // items
      "{{ [0] * 100000000 }}",                                                                             // items
      "{{ 'x' * 100000000 }}",                                                                             // bytes
      "{% for i in range(4000) %}{% for j in range(4000) %}{% endfor %}{% endfor %}",                      // steps
      "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",                                            // depth
      "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",  // bytes
      "{% set ns = namespace(x=[]) %}{% for i in range(1000) %}{% set ns.x = [ns.x] %}{% endfor %}",       // nesting
      "{% set ns = namespace(s='aaaa') %}{% for i in range(40) %}{% set ns.s = ns.s.replace('a', 'aa') %}{% endfor %}",
      "{% for i in range(4000) %}{{ 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx' }}{% endfor %}",  // output
      "{{ ('a\\n' * 4000) | indent(200) }}",
      // Cheap in steps, expensive inside each operation: the work budget ends them.
      "{% set s = 'x' * 60000 %}"
      "{% for i in range(200) %}{% for j in range(100) %}{% if 'y' in s %}{% endif %}{% endfor %}{% endfor %}",
      "{% set s = 'x' * 60000 %}"
      "{% for i in range(200) %}{% for j in range(100) %}{% set t = s.replace('y', 'z') %}{% endfor %}{% endfor %}",
      "{% set s = 'x' * 60000 %}"
      "{% for i in range(200) %}{% for j in range(100) %}{% set t = s | length %}{% endfor %}{% endfor %}",
      "{% set ns = namespace(x=[1], y=[1]) %}{% for i in range(40) %}{% set ns.x = [ns.x, ns.x] %}"
      "{% set ns.y = [ns.y, ns.y] %}{% endfor %}"
      "{% for i in range(200) %}{% for j in range(100) %}{% if ns.x == ns.y %}{% endif %}{% endfor %}{% endfor %}",
  };
  for (const std::string &src : hostile) {
    INFO(src);
    auto r = RenderSrc(src, small);
    REQUIRE(!r.ok());
    CHECK(StatusToMoe(r.status()) == MOE_ERR_LIMIT);
    if (src.find("range(100)") != std::string::npos) CHECK_THAT(Message(r.status()), Catch::Contains("units of work"));
  }
  // With the default limits too, deep recursion ends in a status, not a crashed stack.
  auto r = RenderSrc("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}");
  REQUIRE(!r.ok());
  CHECK(StatusToMoe(r.status()) == MOE_ERR_LIMIT);
}

TEST_CASE("jinja values shared into exponential trees stay bounded", "[jinja]") {
  // A list of itself twice, 60 times over, has 2^60 leaves: printing, JSON, comparison and the
  // caller-taint check all stop at their budgets instead of walking it.
  const std::string grow =
      "{% set ns = namespace(x=[s], y=[s]) %}{% for i in range(60) %}"
      "{% set ns.x = [ns.x, ns.x] %}{% set ns.y = [ns.y, ns.y] %}{% endfor %}";
  Value ctx = Value::MakeDict();
  ctx.Set(Value::Str("s"), Value::CallerStr("caller text"));
  for (const std::string &use :
       {"{{ ns.x }}", "{{ ns.x | tojson }}", "{{ ns.x | string | length }}", "{{ ns.x ~ '' }}"}) {
    INFO(use);
    auto r = RenderWith(grow + use, ctx);
    REQUIRE(!r.ok());
    CHECK(StatusToMoe(r.status()) == MOE_ERR_LIMIT);
  }
  auto r = RenderWith(grow + "{{ ns.x == ns.x }}|{{ ns.x | length }}|{{ [ns.x] | unique | list | length }}", ctx);
  REQUIRE(r.ok());
  CHECK(r->text == "True|2|1");
  r = RenderWith(grow + "{{ ns.x == ns.y }}", ctx);  // distinct trees: the comparison's budget ends it
  CHECK(r.ok());
}

TEST_CASE("jinja parser bounds nesting and chains", "[jinja]") {
  const std::string deep[] = {
      "{{ " + Repeat("(", 5000) + "1" + Repeat(")", 5000) + " }}",
      "{{ " + Repeat("[", 5000) + Repeat("]", 5000) + " }}",
      Repeat("{% if true %}", 5000),
      "{{ " + Repeat("not ", 5000) + "1 }}",
      "{{ " + Repeat("-", 5000) + "1 }}",
      "{{ 1" + Repeat(" + 1", 100000) + " }}",
      "{{ x" + Repeat("|trim", 100000) + " }}",
      "{{ x" + Repeat(".a", 100000) + " }}",
      "{{ x" + Repeat("()", 100000) + " }}",
      "{{ 1" + Repeat(" if 1 else 1", 100000) + " }}",
  };
  for (const std::string &src : deep) {
    INFO(src.substr(0, 40));
    absl::StatusOr<Template> t = Template::Parse(src);
    REQUIRE(!t.ok());
    CHECK_THAT(Message(t.status()), Catch::Contains("chat template line 1: "));
  }
}

TEST_CASE("jinja namespaces that hold themselves print and free", "[jinja]") {
  auto r = RenderSrc(
      "{% set ns = namespace(a=1) %}{% set ns.me = ns %}{{ ns.me.me.a }}{% set ns.l = [ns] %}{{ ns.l | length }}");
  REQUIRE(r.ok());
  CHECK(r->text == "11");
  r = RenderSrc("{% set ns = namespace() %}{% set ns.me = ns %}{{ ns }}");
  REQUIRE(r.ok());
  CHECK(r->text == "<Namespace {'me': <Namespace {...}>}>");
}

TEST_CASE("jinja caller spans cover exactly the caller's bytes", "[jinja]") {
  // Random contents (with special-token spellings) through concatenation, filters, joins and
  // macros: every caller byte is inside a span and every template byte outside.
  std::mt19937 rng(std::random_device{}());
  const std::string alphabet = "ab<|>_ \n\t{}%#é";
  auto random_text = [&]() {
    std::string s;
    const int n = static_cast<int>(rng() % 12) + 1;
    for (int k = 0; k < n; ++k) s += alphabet[rng() % alphabet.size()];
    return s;
  };
  const std::string src =
      "{% macro turn(m) %}<|start|>{{ m.role }}<|sep|>{{ m.content }}<|end|>{% endmacro %}"
      "{% for m in messages %}{{ turn(m) }}{{ '[' + m.role + ']' }}{{ [m.content, 'T'] | join('<|j|>') }}{% endfor %}"
      "{{ messages | map(attribute='role') | join(',') }}{{ 'tail' ~ messages[0].content }}";
  auto t = Template::Parse(src);
  REQUIRE(t.ok());
  for (int iter = 0; iter < 50; ++iter) {
    std::vector<std::pair<std::string, std::string>> msgs;
    Value list = Value::MakeList({});
    List items;
    for (int k = 0; k < 3; ++k) {
      msgs.emplace_back("R" + std::to_string(k) + random_text(), random_text());
      Value m = Value::MakeDict();
      m.Set(Value::Str("role"), Value::CallerStr(msgs.back().first));
      m.Set(Value::Str("content"), Value::CallerStr(msgs.back().second));
      items.push_back(m);
    }
    Value ctx = Value::MakeDict();
    ctx.Set(Value::Str("messages"), Value::MakeList(items));
    auto r = t->Render(ctx);
    REQUIRE(r.ok());
    // Rebuild the expected caller mask by rendering the same structure piecewise.
    std::string text;
    std::vector<bool> caller;
    auto add = [&](const std::string &s, bool from_caller) {
      text += s;
      caller.insert(caller.end(), s.size(), from_caller);
    };
    for (auto &m : msgs) {
      add("<|start|>", false), add(m.first, true), add("<|sep|>", false), add(m.second, true), add("<|end|>", false);
      add("[", false), add(m.first, true), add("]", false);
      add(m.second, true), add("<|j|>", false), add("T", false);
    }
    for (size_t k = 0; k < msgs.size(); ++k) add(msgs[k].first, true), add(k + 1 < msgs.size() ? "," : "", false);
    add("tail", false), add(msgs[0].second, true);
    REQUIRE(r->text == text);
    std::vector<bool> got(text.size(), false);
    for (const Span &s : r->caller_spans) {
      REQUIRE(s.end <= text.size());
      for (size_t k = s.begin; k < s.end; ++k) got[k] = true;
    }
    CHECK(got == caller);
  }
}

}  // namespace strata::text::jinja
