#!/usr/bin/env python3
# Oracle for tests/text/jinja_test.cc: renders chat templates with PyPI jinja2 in exactly the
# environment transformers' apply_chat_template builds (ImmutableSandboxedEnvironment with
# trim_blocks, lstrip_blocks and loopcontrols; tojson = json.dumps(ensure_ascii=False, ...);
# raise_exception; strftime_now), over a fixed set of conversations, and records the text (or
# that jinja2 refused) in tests/text/fixtures/jinja/expected.json.
#
# Templates: tests/text/fixtures/jinja/templates/*.jinja (published model templates, copied as
# data) and the ten of tests/text/fixtures/templates/expected.json (the families Strata renders in
# C++). strftime_now formats a fixed instant (2024-07-26 09:30:00) so the fixtures do not depend
# on the day; the C++ test passes the same function.
#
# Usage (by hand; CI reads the committed fixtures; needs PyPI jinja2 >= 3.1, e.g. pip install jinja2):
#   python3 tests/text/make_jinja_fixtures.py
import copy
import datetime
import json
import os

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIX = os.path.join(ROOT, "tests", "text", "fixtures")
OUT = os.path.join(FIX, "jinja", "expected.json")
FIXED_NOW = datetime.datetime(2024, 7, 26, 9, 30, 0)


class Generation(jinja2.ext.Extension):
    # transformers' AssistantTracker: {% generation %}...{% endgeneration %} renders its body.
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.Scope(body, lineno=lineno)


def make_env():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return FIXED_NOW.strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[Generation, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "The city, e.g. Paris"},
                "unit": {"type": ["string", "null"], "enum": ["celsius", "fahrenheit"], "description": " Unit "},
                "days": {"type": "array", "items": {"type": "integer"}, "description": "Days ahead"},
            },
            "required": ["city"],
        },
    },
}
TIME_TOOL = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "Current time (no arguments).",
        "parameters": {"type": "object", "properties": {}},
    },
}


def tool_call(args, as_string=False):
    return {
        "id": "call_0123456789",
        "type": "function",
        "function": {"name": "get_weather", "arguments": json.dumps(args) if as_string else args},
    }


# name -> (messages, tools, extra variables)
CONVERSATIONS = {
    "single": ([{"role": "user", "content": "Hello!"}], None, {}),
    "system": ([
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "And 3+3?"},
    ], None, {}),
    "multi": ([
        {"role": "user", "content": "  Hi there  "},
        {"role": "assistant", "content": "Hello! How can I help?\n"},
        {"role": "user", "content": "Tell me a joke."},
        {"role": "assistant", "content": "Why did the chicken cross the road?"},
    ], None, {}),
    "unicode": ([
        {"role": "user", "content": "Ça va? 日本語 \"quotes\" 'single' back\\slash\ttab <|im_end|> {{ not_jinja }}"},
        {"role": "assistant", "content": "Très bien — ✓ 🎉"},
        {"role": "user", "content": "\n\nmore\n"},
    ], None, {}),
    "parts": ([
        {"role": "system", "content": [{"type": "text", "text": "System in parts."}]},
        {"role": "user", "content": [{"type": "text", "text": "Describe "}, {"type": "text", "text": "this."}]},
    ], None, {}),
    "think": ([
        {"role": "user", "content": "Think first."},
        {"role": "assistant", "content": "<think>\nLet me see.\n</think>\n\nThe answer.", "reasoning_content": "Let me see."},
        {"role": "user", "content": "Again?"},
    ], None, {}),
    "tools": ([
        {"role": "system", "content": "Use tools when needed."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [tool_call({"city": "Paris", "days": [1, 2]})]},
        {"role": "tool", "name": "get_weather", "tool_call_id": "call_0123456789", "content": "{\"temp\": 21.5}"},
        {"role": "assistant", "content": "It is 21.5 degrees."},
    ], [WEATHER_TOOL, TIME_TOOL], {}),
    "tools_nosys": ([
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": None, "tool_calls": [tool_call({"city": "Oslo"}, as_string=True)]},
        {"role": "tool", "name": "get_weather", "tool_call_id": "call_0123456789", "content": "cold"},
    ], [WEATHER_TOOL], {}),
    "tools_offered": ([
        {"role": "user", "content": "What time is it?"},
    ], [TIME_TOOL], {"enable_thinking": False}),
    "only_system": ([{"role": "system", "content": "Only a system message."}], None, {}),
    "empty_contents": ([
        {"role": "system", "content": ""},
        {"role": "user", "content": ""},
        {"role": "assistant", "content": ""},
        {"role": "user", "content": " "},
    ], None, {}),
    "bad_order": ([
        {"role": "assistant", "content": "I speak first."},
        {"role": "assistant", "content": "Twice."},
    ], None, {}),
}

TOKENS = {"bos_token": "<s>", "eos_token": "</s>"}

# Small templates for behaviours the model templates rarely reach: jinja2's Undefined, printing,
# operators, whitespace control, and refusals. Rendered with messages = CONVERSATIONS["system"],
# d = {"a": 1, "items": [1, 2]}, s = "Text", n = None.
SNIPPETS = [
    "{{ foo }}|{{ foo is defined }}|{{ foo is undefined }}|{{ foo | default('d') }}|{{ foo ~ 'a' }}|{{ foo | length }}",
    "{% for i in foo %}x{% else %}empty{% endfor %}|{% if foo %}T{% else %}F{% endif %}|{{ not foo }}|{{ foo == none }}",
    "{{ foo | upper }}|{{ foo | trim }}|{{ foo | list }}|{{ foo | join(',') }}|{{ foo | items | list }}",
    "{{ foo.bar }}",
    "{{ foo['bar'] }}",
    "{{ foo() }}",
    "{{ foo + 1 }}",
    "{{ foo | tojson }}",
    "{{ d.missing }}|{{ d.missing is defined }}|{{ d['missing'] }}|{{ d.get('missing') }}|{{ d.get('missing', 0) }}",
    "{{ d.missing.deeper }}",
    "{{ n.attr }}|{{ n is none }}|{{ s.nosuch }}|{{ [1][5] }}|{{ 'ab'[9] }}|{{ [] | first }}|{{ [] | last }}",
    "{{ d['items'] }}|{{ d.a }}|{{ d['a'] }}|{{ messages[0].role }}|{{ messages[-1]['content'] }}|{{ messages | length }}",
    "{{ True }}|{{ none }}|{{ 1.0 }}|{{ 1e20 }}|{{ 1.5e-7 }}|{{ 123456789012345678 }}|{{ -0.0 }}|{{ 2**62 }}|{{ 1/3 }}",
    "{{ [1, 'a', none, true, 2.5, ('t',), {'k': [none]}] }}|{{ ('a', 'b') }}|{{ {'q': \"it's\"} }}|{{ ['\\n', '\\x01', 'é'] }}",
    "{{ 'a' + 1 }}",
    "{{ 1 + 'a' }}",
    "{{ 1 / 0 }}",
    "{{ [1, 2].append(3) }}",
    "{{ d.update({'b': 2}) }}",
    "{{ raise_exception('the template says no') }}",
    "{{ 'x' is nosuchtest }}",
    "{{ 'x' | nosuchfilter }}",
    "{% if true %}never closed",
    "{% for x in [1] %}{% endif %}",
    "{% endfor %}",
    "{{ 1 + }}",
    "{{ 'unterminated }}",
    "{# comment",
    "{{ x",
    "{% break %}",
    "{% include 'other.jinja' %}",
    "{% set ns = namespace(a=1) %}{% set ns.b = 2 %}{{ ns.a }}{{ ns.b }}{{ ns.c }}|{% set t = 5 %}{% set t.x = 1 %}",
    "{% macro m(a, b=2) %}{{ a }}-{{ b }}-{{ varargs }}-{{ kwargs }}{% endmacro %}{{ m(1) }}|{{ m(1, 3) }}|{{ m(b=4, a=0) }}|{{ m(1, 2, 3) }}|{{ m(1, z=9) }}",
    "{% macro m(a) %}{{ a }}{% endmacro %}{{ m(1) }}{{ m(1, 2) }}",
    "{% macro m(a) %}{{ a }}{% endmacro %}{{ m(a=1) }}{{ m(1, b=2) }}",
    "{% macro m(a) %}{{ a }}{% endmacro %}{{ m() }}|{% macro k() %}{{ kwargs }}{% endmacro %}{{ k(z=1) }}",
    "{% set ns = namespace(a=1) %}{{ ns }}|{% set ns.me = ns %}{% set ns.l = [ns] %}{{ ns }}|{{ [ns, {'k': ns}] }}",
    "{% macro wrap() %}<{{ caller() }}>{% endmacro %}{% call wrap() %}inner {{ s }}{% endcall %}",
    "{% set x = 1 %}{% for i in [1, 2] %}{% set x = x + i %}{{ x }}{% endfor %}{{ x }}|{% if true %}{% set y = 3 %}{% endif %}{{ y }}",
    "{% for a, b in [[1, 2], [3, 4]] %}{{ a }}{{ b }}{% endfor %}|{% for k in {'z': 1, 'a': 2} %}{{ k }}{% endfor %}|{% for c in 'héllo' %}{{ c }}.{% endfor %}",
    "{% for a, b in [[1, 2, 3]] %}{{ a }}{% endfor %}",
    "{% for i in range(3) %}{{ loop.cycle('a', 'b') }}{{ loop.index0 }}{{ loop.revindex0 }}{{ loop.depth }}{% for j in [0] %}{{ loop.depth }}{% endfor %}{% endfor %}",
    "  {%- if true -%}  \n  a  \n  {%- endif -%}  \n  b\n{{- ' c ' -}}\n  d  {#- x -#}  e\n  {% raw -%}  {{ raw }}  {%- endraw %}  f",
    "line\n    {% if true %}\n    kept\n    {% endif %}\n\tx {% if true %}y{% endif %}\n{%+ if true %}z{% endif %}\n",
    "a\r\nb\rc\n",
    "{{ '\\u00e9\\x41\\101\\t\\'\\\"\\q' }}|{{ \"adj\" 'acent' }}",
    "{{ 'ABC' | lower | capitalize }}|{{ 'a  b' | wordcount }}|{{ 'x' * 3 }}|{{ 3 * [0] }}|{{ 'abc' | reverse }}|{{ [3, 1] | reverse | list }}",
    "{{ {'b': 1, 'A': 2, 'a': 3} | dictsort }}|{{ {'b': 1, 'A': 2} | dictsort(true) }}|{{ {'x': 2, 'y': 1} | dictsort(by='value') }}|{{ ['b', 'a', 'B'] | unique | list }}",
    "{{ ' \\t x \\n' | trim }}|{{ 'aXbXc'.split('X', 1) }}|{{ 'a b'.rsplit(' ', 1) }}|{{ 'abc'.find('c') }}|{{ 'a.b.c'.count('.') }}|{{ 'x\\ny'.splitlines() }}|{{ '12'.isdigit() }}",
    "{{ 5 | string ~ 'x' }}|{{ [1, 2] | string }}|{{ none | string }}|{{ 7 | round }}|{{ 7.45 | round(1) }}|{{ 7.5 | round(0, 'floor') }}|{{ -2.5 | round }}|{{ '3.7' | float }}|{{ '3.7' | int }}",
    "{{ [{'n': 'b', 'v': 2}, {'n': 'a', 'v': 1}] | sort(attribute='n') | map(attribute='v') | list }}|{{ [{'a': {'b': 5}}] | map(attribute='a.b') | list }}|{{ [1, 2, 3] | sum(start=10) }}",
    "{{ s is string and s is not number }}|{{ 1 is integer }}|{{ 1.0 is float }}|{{ true is boolean }}|{{ none is none }}|{{ d is mapping }}|{{ 3 is gt 2 }}|{{ 'a' is in 'cat' }}|{{ 'AB' is upper }}|{{ raise_exception is callable }}",
    "{{ 'tojson' is filter }}|{{ 'even' is test }}|{{ messages | selectattr('role', 'in', ['user', 'system']) | map(attribute='role') | join(',') }}|{{ messages | map(attribute='nope', default='dflt') | list }}",
    "{{ 'a\\nb' | indent(2, first=true) }}|{{ 'a\\n\\nb' | indent('> ', blank=true) }}|{{ '%s-%s' | format('x', 2) }}|{{ '<&>' | e }}|{{ 'x' | safe }}",
    "{% set s2 %}  block {{ s }}  {% endset %}[{{ s2 }}]|{% filter trim | upper %}  filtered  {% endfilter %}|{% generation %}gen{% endgeneration %}",
    "{{ x if false }}|{{ 'a' if true else 'b' }}|{{ (1, 2)[1] }}|{{ [1, 2, 3][::-1] }}|{{ [1, 2, 3][-2:] }}|{{ 'abcdef'[1:5:2] }}|{{ (range(5) | list)[1:3] }}",
    "{{ 'Élan ÇA Ÿ ß İ ΟΔΟΣ Σ ΣΑ ΆΈ ПРИВЕТ Ёж ĲŁŹ' | lower }}|{{ 'élan ça ÿ straße ı ſ µ οδος ς άέ привет ёж ĳłź ŉ' | upper }}",
    "{{ 'éLAN çA-ÿo (ß x1y' | title }}|{{ 'éLAN ÇA' | capitalize }}|{{ 'hello wORLD élan ĳs 1a' .title() }}|{{ 'ÉA'.lower() }}|{{ 'é' is lower }}|{{ 'É' is upper }}|{{ 'ÉA'.capitalize() }}",
    "{{ {'a': 'ü', 'b': [1, 2.0, true, none]} | tojson(indent=2) }}|{{ {'z': 1, 'a': 2} | tojson(sort_keys=true) }}|{{ 'é' | tojson(true) }}|{{ [1, 2] | tojson(separators=(',', ':')) }}",
]


def load_templates():
    templates = {}
    with open(os.path.join(FIX, "templates", "expected.json")) as f:
        known = json.load(f)["templates"]
    for name, t in known.items():
        templates[name] = {"source": t["jinja"], "bos_token": t["bos_token"], "eos_token": t["eos_token"],
                           "file": None}
    tdir = os.path.join(FIX, "jinja", "templates")
    for fn in sorted(os.listdir(tdir)):
        if fn.endswith(".jinja"):
            with open(os.path.join(tdir, fn), encoding="utf-8", newline="") as f:
                templates[fn[:-6]] = {"source": f.read(), "file": fn, **TOKENS}
    return templates


def main():
    env = make_env()
    templates = load_templates()
    cases = []
    for name, t in templates.items():
        compiled = env.from_string(t["source"])
        for conv, (messages, tools, extra) in CONVERSATIONS.items():
            for gen in (False, True):
                kwargs = dict(messages=copy.deepcopy(messages), tools=copy.deepcopy(tools), documents=None,
                              add_generation_prompt=gen, bos_token=t["bos_token"], eos_token=t["eos_token"], **extra)
                case = {"template": name, "conversation": conv, "add_generation_prompt": gen}
                try:
                    case["text"] = compiled.render(**kwargs)
                except Exception as e:  # jinja2 refuses: the engine must refuse too
                    case["error"] = f"{type(e).__name__}: {e}"
                cases.append(case)
    snippets = []
    svars = dict(messages=CONVERSATIONS["system"][0], d={"a": 1, "items": [1, 2]}, s="Text", n=None,
                 bos_token="<s>", eos_token="</s>", add_generation_prompt=False)
    for src in SNIPPETS:
        case = {"source": src}
        try:
            case["text"] = env.from_string(src).render(**copy.deepcopy(svars))
        except Exception as e:
            case["error"] = f"{type(e).__name__}: {e}"
        snippets.append(case)
    out = {
        "generator": "tests/text/make_jinja_fixtures.py",
        "jinja2": jinja2.__version__,
        "templates": {n: ({"file": t["file"]} if t["file"] else {"source": t["source"]}) |
                      {"bos_token": t["bos_token"], "eos_token": t["eos_token"]} for n, t in templates.items()},
        "conversations": {n: {"messages": m, "tools": tl, "extra": ex} for n, (m, tl, ex) in CONVERSATIONS.items()},
        "cases": cases,
        "snippets": snippets,
    }
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")
    ok = sum(1 for c in cases if "text" in c)
    print(f"{len(templates)} templates, {len(cases)} cases ({ok} rendered, {len(cases) - ok} refused) -> {OUT}")


if __name__ == "__main__":
    main()
