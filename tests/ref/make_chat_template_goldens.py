#!/usr/bin/env python3
"""make_chat_template_goldens.py — renders the chat templates colt supports with
transformers' apply_chat_template (the reference) and writes
tests/data/chat_template_goldens.jsonl for tests/test_chat_template.c.

Templates:
  qwen2.5      — chat_template of $COLT_SHARED_DATA/qwen2.5-tokenizer/tokenizer_config.json
  qwen2_chatml — tests/data/qwen2_chatml_chat_template.jinja (classic Qwen2 ChatML)
  llama3       — tests/data/llama3_chat_template.jinja (Meta-Llama-3-8B-Instruct)
  llama3.1     — tests/data/llama3.1_chat_template.jinja (Llama-3.1-8B-Instruct)
  qwen3        — tests/data/qwen3_chat_template.jinja (Qwen3-0.6B .. Qwen3-8B): byte for byte
                 trl/chat_templates/qwen3.jinja of the PyPI wheel trl 1.16.0, "Original Qwen3 chat
                 template" in TRL's README, which trl.chat_template_utils compares for string
                 equality with a tokenizer's chat_template (its examples load Qwen/Qwen3-0.6B);
                 the updated Qwen3 text (`message.content is string`, `reasoning_content is
                 string`, `enable_thinking`), not QwQ's, Qwen2.5's or Qwen3-2507's

All are rendered through the Qwen2.5 tokenizer's apply_chat_template (chat_template=
overridden for the others), so the Jinja environment (sandbox, trim_blocks,
lstrip_blocks, documents=None, raise_exception, tojson) and the preparation of the
messages are exactly transformers'. bos_token/eos_token are passed explicitly for
the Llama templates; for Qwen they are the tokenizer's own (bos_token undefined,
eos_token '<|im_end|>').

Each row holds what apply_chat_template was given: messages (for Qwen3 and the
Llama 3.1 tool rows also reasoning_content, tool_calls, content None, ...),
add_generation_prompt, the tokens, and where given "tools" (tools=, a list of
JSON-schema function definitions; absent means None) and "chat_template_kwargs"
(the extra keyword arguments, such as enable_thinking, which apply_chat_template
hands to the template as variables).

Usage (offline): HF_HUB_OFFLINE=1 python3 tests/ref/make_chat_template_goldens.py
Needs: transformers 5.24.0, jinja2 >= 3.1.6 (the rows 5.23.0 wrote came out byte-identical).
"""
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from transformers import AutoTokenizer  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHARED = os.environ.get("COLT_SHARED_DATA", os.path.join(ROOT, "..", "shared", "data"))
DATA = os.path.join(ROOT, "tests", "data")


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


CONVERSATIONS = {
    "system_user": [
        {"role": "system", "content": "You are a terse assistant."},
        {"role": "user", "content": "What is 2+2?"},
    ],
    "user_only": [{"role": "user", "content": "Hello!"}],
    "multi_turn_system": [
        {"role": "system", "content": "Answer in French."},
        {"role": "user", "content": "Good morning."},
        {"role": "assistant", "content": "Bonjour."},
        {"role": "user", "content": "And good night?"},
    ],
    "multi_turn_no_system": [
        {"role": "user", "content": "Count to three."},
        {"role": "assistant", "content": "1, 2, 3."},
        {"role": "user", "content": "Now backwards."},
        {"role": "assistant", "content": "3, 2, 1."},
    ],
    "empty_content": [
        {"role": "system", "content": ""},
        {"role": "user", "content": ""},
    ],
    "newlines": [
        {"role": "user", "content": "line one\nline two\n\n  indented line\n"},
        {"role": "assistant", "content": "```python\nprint('hi')\n```"},
    ],
    "unicode": [
        {"role": "system", "content": "Réponds en français — s'il te plaît."},
        {"role": "user", "content": "你好，世界 🌍 ¿qué tal? naïve café"},
    ],
    "surrounding_whitespace": [
        {"role": "system", "content": "\n  You are helpful.\t \n"},
        {"role": "user", "content": "   padded question?   "},
        {"role": "assistant", "content": "\n\nanswer with blank lines\n\n"},
    ],
    "jinja_like_content": [
        {"role": "user", "content": "Render {{ this }} and {% if x %}that{% endif %} {# not a comment #} \"quotes\" 'single' \\ backslash"},
    ],
    "system_only": [{"role": "system", "content": "Only a system prompt."}],
    "tool_messages": [
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": "Let me check."},
        {"role": "tool", "content": "{\"temperature\": 21, \"unit\": \"celsius\"}"},
        {"role": "tool", "content": "sunny\n\"clear\" skies"},
        {"role": "assistant", "content": "It is 21°C and sunny."},
    ],
    "system_in_middle": [
        {"role": "user", "content": "Hi."},
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Explain gravity."},
    ],
}


# Qwen3 (tools, tool calls, reasoning). Each is rendered with add_generation_prompt
# false and true, and with enable_thinking absent, true and false.
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. \"Paris\""},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}
CLOCK_TOOL = {
    "type": "function",
    "function": {
        "name": "local_time",
        "description": "Local time — ISO 8601, e.g. 2025-01-31T09:00.",
        "parameters": {"type": "object", "properties": {"tz": {"type": "string"}, "precision": {"type": "integer", "minimum": 0, "default": 1.5}}},
    },
}
TOOLS = [WEATHER_TOOL, CLOCK_TOOL]

WEATHER_CALL = {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}}
CLOCK_CALL = {"type": "function", "function": {"name": "local_time", "arguments": {"tz": "Europe/Paris", "nested": {"a": [1, 2.5, None, True], "é": "ü"}}}}

QWEN3_CONVERSATIONS = {
    # (messages, tools or None)
    "think_in_content_last": ([
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "<think>\nSimple sum.\n</think>\n\nIt is 4."},
    ], None),
    "think_in_content_history": ([
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "<think>\nSimple sum.\n</think>\n\nIt is 4."},
        {"role": "user", "content": "And 3+3?"},
    ], None),
    "think_unbalanced": ([
        {"role": "user", "content": "Go."},
        {"role": "assistant", "content": "no opening tag\n\n</think>\n\n\nanswer</think>tail"},
    ], None),
    "reasoning_content": ([
        {"role": "user", "content": "Capital of France?"},
        {"role": "assistant", "content": "Paris.", "reasoning_content": "\nThe capital of France is Paris.\n\n"},
    ], None),
    "reasoning_content_history": ([
        {"role": "user", "content": "Capital of France?"},
        {"role": "assistant", "content": "Paris.", "reasoning_content": "Well known."},
        {"role": "user", "content": "Of Italy?"},
        {"role": "assistant", "content": "\nRome.", "reasoning_content": ""},
    ], None),
    "reasoning_aliases": ([
        {"role": "user", "content": "Think, then answer."},
        {"role": "assistant", "content": "<think>ignored</think>Done.", "thinking": "old field name"},
        {"role": "user", "content": "Again."},
        {"role": "assistant", "content": "Done again.", "reasoning": "another old name", "reasoning_content": None},
    ], None),
    "tools_system": ([
        {"role": "system", "content": "You are a weather bot."},
        {"role": "user", "content": "Weather in Paris?"},
    ], TOOLS),
    "tools_no_system": ([
        {"role": "user", "content": "What time is it in Paris?"},
    ], [CLOCK_TOOL]),
    "tool_calls": ([
        {"role": "system", "content": "Use tools."},
        {"role": "user", "content": "Weather and time in Paris?"},
        {"role": "assistant", "content": "", "reasoning_content": "Need both tools.", "tool_calls": [WEATHER_CALL, CLOCK_CALL]},
        {"role": "tool", "content": "{\"temperature\": 21}", "name": "get_weather"},
        {"role": "tool", "content": "09:00", "name": "local_time"},
        {"role": "tool", "content": "third result\nwith \"quotes\""},
        {"role": "assistant", "content": "<think>\nCombine.\n</think>\n\nIt is 21°C at 09:00."},
    ], TOOLS),
    "tool_calls_content_and_string_args": ([
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "Checking.", "tool_calls": [
            {"type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}},
            {"name": "local_time", "arguments": {}},
        ]},
        {"role": "tool", "content": "cold"},
        {"role": "user", "content": "Thanks. And tomorrow?"},
        {"role": "assistant", "content": None, "tool_calls": [WEATHER_CALL]},
        {"role": "tool", "content": "warm"},
    ], TOOLS),
    "tool_response_as_user": ([
        {"role": "user", "content": "Start."},
        {"role": "assistant", "content": "<think>plan</think>calling", "tool_calls": [WEATHER_CALL]},
        {"role": "user", "content": "<tool_response>\nsunny\n</tool_response>"},
        {"role": "assistant", "content": "Sunny.", "reasoning_content": "read the result"},
    ], None),
    "tool_first": ([
        {"role": "tool", "content": "orphan result"},
        {"role": "user", "content": "Hi"},
    ], None),
    "only_tool_messages": ([
        {"role": "assistant", "content": "x", "reasoning_content": "r"},
        {"role": "tool", "content": "y"},
    ], None),
    "content_list": ([
        {"role": "user", "content": [{"type": "text", "text": "parts are not strings"}]},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "plain"},
    ], None),
    "empty_tools_list": ([
        {"role": "system", "content": "Sys."},
        {"role": "user", "content": "Hi"},
    ], []),
}

# Llama 3.1 with tools: (messages, tools or None, extra keyword arguments). Each is
# rendered with add_generation_prompt false and true.
LLAMA31_CONVERSATIONS = {
    "tools_in_user_message": ([
        {"role": "system", "content": "You are a weather bot."},
        {"role": "user", "content": "  Weather in Paris?  "},
    ], [WEATHER_TOOL], {}),
    "tools_in_system_dated": ([
        {"role": "user", "content": "Time?"},
    ], TOOLS, {"tools_in_user_message": False, "date_string": "01 Jan 2025"}),
    "tool_call_and_results": ([
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "tool_calls": [WEATHER_CALL]},
        {"role": "tool", "content": {"temperature": 21, "sky": "clear"}},
        {"role": "ipython", "content": "plain text is iterable too"},
        {"role": "tool", "content": 42},
        {"role": "assistant", "content": "21 degrees."},
    ], [WEATHER_TOOL], {}),
    "builtin_tools": ([
        {"role": "user", "content": "Search the news."},
        {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "brave_search", "arguments": {"query": "news", "lang": "en"}}}]},
        {"role": "tool", "content": "headlines"},
    ], None, {"builtin_tools": ["brave_search", "code_interpreter", "wolfram_alpha"]}),
    "custom_tools": ([
        {"role": "user", "content": "Hi"},
    ], None, {"custom_tools": [CLOCK_TOOL]}),
    "two_tool_calls": ([
        {"role": "user", "content": "Both."},
        {"role": "assistant", "tool_calls": [WEATHER_CALL, CLOCK_CALL]},
    ], TOOLS, {}),
}



def render_direct(source, messages, agp, bos, eos):
    """apply_chat_template refuses an empty conversation before rendering; render it
    with transformers' own compiled Jinja environment and its render arguments
    instead, so templates that raise on it (Qwen2.5: messages[0]['role'] of an
    Undefined) are golden errors and the others golden renders."""
    from transformers.utils.chat_template_utils import _compile_jinja_template

    kwargs = {"eos_token": eos} if eos is not None else {}
    if bos is not None:
        kwargs["bos_token"] = bos
    return _compile_jinja_template(source).render(
        messages=messages, tools=None, documents=None, add_generation_prompt=agp, **kwargs
    )


# Small templates exercising one Jinja feature each, rendered by transformers'
# own compiled environment (same sandbox, options and globals as
# apply_chat_template). Where jinja2 raises, the C renderer must fail too.
FEATURE_MESSAGES = [
    {"role": "system", "content": "  Be nice.\n"},
    {"role": "user", "content": "Hi there, Bob"},
    {"role": "assistant", "content": "Hello! How can I help?"},
    {"role": "user", "content": "naïve 🌍 text"},
]

FEATURES = [
    # whitespace control, trim_blocks, lstrip_blocks
    "a\n  {% if true %}\n  b\n  {% endif %}\nc",
    "a  {%- if true -%}  b  {%- endif -%}  c",
    "a {{- ' x ' -}} b",
    "  {{ 'var tags are not lstripped' }}\n{% if true %}x{% endif %}\n",
    "a\n{# comment #}\nb\n  {#- c2 -#}\n  d",
    "x {%+ if true %}y{% endif +%}\nz",
    "line\r\nwindows\rmac\n",
    "trailing newline kept?\n\n",
    "{% for m in messages %}\n    {{ m.role }}\n{% endfor %}",
    # literals and operators
    "{{ 1 + 2 * 3 - 4 / 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 2 ** 3 ** 2 }}",
    "{{ 1.5 }} {{ 0.1 + 0.2 }} {{ 1e20 }} {{ 1.0 }} {{ 3 / 4 }} {{ 10 / 5 }} {{ 1e-5 }} {{ 123456789.125 }}",
    "{{ 'a' ~ 1 ~ none ~ true }} {{ 'ab' * 3 }} {{ [1, 2] + [3] }} {{ (1, 'x') }} {{ (1,) }} {{ {'k': 'v', 'n': [1, none, false]} }}",
    "{{ \"it's\" }} {{ ['a\\'b', \"q\\\"\"] }} {{ 'tab\\there' }} {{ '\\u00e9\\x41\\n' }} {{ 'a' 'b' }}",
    "{{ True }} {{ false }} {{ None }} {{ none is none }} {{ 1 == 1.0 }} {{ true == 1 }} {{ [1] == [1] }} {{ 'a' != 'b' }}",
    "{{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ 'a' < 'b' }} {{ [1, 2] < [1, 3] }} {{ 2 >= 2.0 }} {{ 1 <= 0 }}",
    "{{ 'a' in 'cat' }} {{ 'z' not in 'cat' }} {{ 2 in [1, 2] }} {{ 'k' in {'k': 1} }} {{ 'x' in undefined_var }}",
    "{{ not true }} {{ true and 'x' }} {{ '' or 'default' }} {{ 0 and 1 }} {{ none or [] }}",
    "{{ 'yes' if messages else 'no' }} {{ 'y' if false }}|{{ 1 if 0 else 2 if 0 else 3 }}",
    "{{ -3 }} {{ +3 }} {{ -(2 + 3) }} {{ - 1.5 }}",
    # variables, attributes, subscripts, slices
    "{{ messages[0]['role'] }} {{ messages[-1].content }} {{ messages[1].role }} {{ messages|length }}",
    "{{ messages[1:] | length }} {{ messages[:-1][-1].role }} {{ 'abcdef'[1:4] }} {{ 'abcdef'[::-1] }} {{ 'abcdef'[::2] }} {{ [1,2,3,4][-2:] }}",
    "{{ 'naïve'[2] }} {{ 'naïve'[-1] }} {{ 'naïve'|length }} {{ messages[3].content[6] }} {{ messages[10] is defined }}",
    "{{ missing }}|{{ missing is defined }}|{{ missing is undefined }}|{{ messages[0].nokey is defined }}|{{ messages[0].nokey }}",
    "{{ tools is none }} {{ documents is defined }} {{ bos_token }} {{ eos_token }} {{ add_generation_prompt }}",
    "{{ messages[0]['items'] is defined }} {{ messages[0].get('role') }}",
    # for loops
    "{% for m in messages %}{{ loop.index }}/{{ loop.index0 }}/{{ loop.revindex }}/{{ loop.revindex0 }}/{{ loop.length }}/{{ loop.first }}/{{ loop.last }} {% endfor %}",
    "{% for m in messages if m.role == 'user' %}{{ loop.index }}:{{ m.content }}{{ ',' if not loop.last }}{% endfor %}",
    "{% for m in [] %}x{% else %}empty{% endfor %} {% for m in messages %}{% else %}never{% endfor %}",
    "{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }};{% endfor %}{% for k, v in {'c': 3} | items %}{{ k }}{{ v }}{% endfor %}",
    "{% for c in 'héllo' %}[{{ c }}]{% endfor %}{% for k in {'x': 1, 'y': 2} %}{{ k }}{% endfor %}",
    "{% for i in range(5) %}{% if i == 1 %}{% continue %}{% endif %}{% if i == 3 %}{% break %}{% endif %}{{ i }}{% endfor %}",
    "{% for m in messages %}{% if not loop.first %}{{ loop.previtem.role }}>{% endif %}{{ m.role }}{% if not loop.last %}<{{ loop.nextitem.role }}{% endif %} {% endfor %}",
    "{% for i in range(3) %}{% for j in range(2) %}{{ i }}{{ j }}{{ loop.index }} {% endfor %}{{ loop.index }}|{% endfor %}",
    "{% for m in messages %}{{ loop.cycle('odd', 'even') }} {% endfor %}",
    "{{ range(3) | list }} {{ range(1, 10, 3) | list }} {{ range(5, 0, -2) | join(',') }}",
    # scoping, set, namespace
    "{% set x = 1 %}{% for i in [1, 2] %}{{ x }}{% set x = i + 5 %}{{ x }}{% endfor %}{{ x }}",
    "{% set ns = namespace(found=false, count=0) %}{% for m in messages %}{% if m.role == 'user' %}{% set ns.found = true %}{% set ns.count = ns.count + 1 %}{% endif %}{% endfor %}{{ ns.found }} {{ ns.count }}",
    "{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set t = ('x', 'y') %}{{ t[1] }}{% set messages = messages[1:] %}{{ messages | length }}",
    "{% if true %}{% set inner = 'set in if' %}{% endif %}{{ inner }}",
    # filters
    "[{{ '  x y \\n' | trim }}] [{{ 'xxhixx' | trim('x') }}] [{{ messages[0].content | trim }}] [{{ missing | trim }}]",
    "{{ 'Hello' | upper }} {{ 'HeLLo' | lower }} {{ 'hello world' | title }} {{ 'hELLO' | capitalize }} {{ 'ßtraße' | upper }}",
    "{{ 42 | string }} {{ none | string }} {{ [1, 'a'] | string }} {{ missing | string }}|",
    "{{ missing | default('dflt') }} {{ '' | default('e') }} {{ '' | default('e', true) }} {{ none | d('n') }} {{ 0 | default(5, boolean=true) }}",
    "{{ ['a', 'b', 'c'] | join }} {{ ['a', 'b'] | join(', ') }} {{ [1, 2] | join('-') }} {{ messages | join('|', attribute='role') }}",
    "{{ messages | length }} {{ 'héllo' | length }} {{ {'a': 1} | count }} {{ missing | length }}",
    "{{ {'b': 1, 'a': [1, 2.5, 'x\\ny', none, true]} | tojson }} {{ 'é\\\"<>&' | tojson }} {{ [] | tojson }} {{ {} | tojson }}",
    "{{ {'b': {'c': [1, {'d': 2}]}, 'a': []} | tojson(indent=2) }}",
    "{{ {'b': 1, 'a': 2} | tojson(sort_keys=true) }} {{ 'é' | tojson(ensure_ascii=true) }} {{ [1, 2] | tojson(separators=(',', ':')) }}",
    "{{ messages | tojson }}",
    "{{ [3, 1, 2] | first }} {{ [3, 1, 2] | last }} {{ 'abc' | first }} {{ [1, 2] | reverse | list }} {{ 'abc' | reverse }} {{ 'abc' | list }}",
    "{{ 'a-b-c' | replace('-', '+') }} {{ 'aaa' | replace('a', 'b', 2) }} {{ '42' | int + 1 }} {{ '3.9' | int }} {{ 'x' | int }} {{ '2.5' | float }} {{ -3 | abs }}",
    "{{ '<b>&\"\\'' | e }} {{ 'x' | safe }}",
    "{{ 'a\\nb\\n\\nc' | indent }}|{{ 'a\\nb' | indent(2, true) }}|{{ 'a\\n\\nb' | indent(width='> ', blank=true) }}",
    "{{ messages | map(attribute='role') | join(',') }} {{ ['a', 'b'] | map('upper') | list }} {{ messages | selectattr('role', 'equalto', 'user') | list | length }}",
    "{{ [1, 2, 3, 4] | select('odd') | list }} {{ [1, 2, 3, 4] | reject('even') | list }} {{ [0, 1, '', 'a'] | select | list }} {{ messages | rejectattr('role', 'eq', 'user') | map(attribute='role') | list }}",
    # tests
    "{{ 'x' is string }} {{ 1 is string }} {{ {} is mapping }} {{ [] is mapping }} {{ 'x' is iterable }} {{ 1 is iterable }} {{ missing is iterable }}",
    "{{ 1 is number }} {{ 1 is integer }} {{ 1.0 is float }} {{ true is boolean }} {{ 3 is odd }} {{ 4 is even }} {{ 9 is divisibleby 3 }} {{ 9 is divisibleby(2) }}",
    "{{ 'abc' is lower }} {{ 'ABC' is upper }} {{ none is sameas none }} {{ 1 is eq 1 }} {{ 2 is gt 1 }} {{ 'a' is in 'abc' }} {{ raise_exception is callable }} {{ x is not defined }}",
    # methods
    "[{{ '  x  '.strip() }}] [{{ 'xxaxx'.lstrip('x') }}] [{{ '  y  '.rstrip() }}] {{ 'hello'.startswith('he') }} {{ 'hello'.endswith(('lo', 'x')) }}",
    "{{ 'a,b,,c'.split(',') }} {{ '  a  b c '.split() }} {{ 'a b c'.split(' ', 1) }} {{ 'a,b,c'.rsplit(',', 1) }} {{ '  a b  '.split(none, 1) }}",
    "{{ 'Hi'.upper() }} {{ 'Hi'.lower() }} {{ 'hi there'.title() }} {{ 'a.b.c'.replace('.', '/') }} {{ 'hello'.find('l') }} {{ 'hello'.rfind('l') }} {{ 'hello'.count('l') }} {{ '-'.join(['a', 'b']) }}",
    "{{ {'a': 1, 'b': 2}.keys() | list }} {{ {'a': 1}.values() | list }} {{ {'a': 1}.get('a') }} {{ {'a': 1}.get('z', 'dflt') }} {{ {'a': 1}.get('z') }} {{ {'a': 1}['a'] }}",
    # macros
    "{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('Bob') }} {{ greet('Al', '?') }} {{ greet(punct='.', name='Z') }} {{ greet() }}",
    "{% macro render(m) -%}\n<{{ m.role }}>{{ m.content | trim }}\n{%- endmacro %}\n{% for m in messages %}{{ render(m) }}{% endfor %}",
    # generation tag (transformers' AssistantTracker)
    "{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}{{ m.content }}{% endgeneration %}{% else %}{{ m.content }}{% endif %}{% endfor %}",
    # corners found by differential fuzzing against jinja2
    "{% set naïve = 'unicode name' %}{{ naïve }} {{ {(1, 2): 'tuple key'}[1, 2] }} {{ messages[0, 1] is defined }}",
    "{% if false %}{{ x | nosuchfilter }}{% endif %}{{ 'y' if x is defined else 'n' }}{{ x | nosuchfilter if false }}",
    "{{ '\\é' }} {{ 'a-b (c) [d] {e} <f> g' | title }} {{ 'hello world'.title() }}",
    "{% if [] | select %}generators are truthy{% endif %} {% if {}.items() %}{% else %}empty views are not{% endif %}",
    "{{ range(3) | length }} {{ (messages | map(attribute='role') | list)[1] }} {{ 2 ** -1 }} {{ 2 ** 0.5 }}",
    "ends with a bare comment opener {#",
    # errors jinja2 raises at render time
    "{{ missing.attr }}",
    "{{ missing + 1 }}",
    "{{ 1 + 'a' }}",
    "{{ raise_exception('custom failure') }}",
    "{{ 1 < 'a' }}",
    "{% set x = 1 %}{% set x.y = 2 %}",
    "{% for a, b in [1, 2] %}{% endfor %}",
    "{{ messages[0].role.nosuchmethod() }}",
]


# Small templates rendered through apply_chat_template itself (not only its Jinja
# environment), showing what it does to its inputs before rendering: message keys
# whose value is None dropped, reasoning copied under reasoning_content and
# thinking, tools and extra keyword arguments (which override bos_token).
# (template, messages, tools, kwargs)
APPLY_FEATURES = [
    ("{{ messages | tojson }}", [
        {"role": "user", "content": "hi", "name": None},
        {"role": "assistant", "content": None, "reasoning": "r1", "tool_calls": [{"name": "f", "arguments": {"b": 1, "a": [2.5, None]}}]},
        {"role": "assistant", "content": "x", "thinking": "t2", "reasoning_content": "rc2"},
        {"role": "assistant", "content": "y", "reasoning_content": None, "thinking": None},
    ], None, {}),
    ("{{ tools | tojson }}|{{ enable_thinking }}|{{ custom.a[1] }}|{{ custom | tojson }}|{{ bos_token }}|{{ eos_token }}|{{ n }}",
     [{"role": "user", "content": "hi"}],
     [{"type": "function", "function": {"name": "f", "parameters": {"x": 1e100, "y": -0.0, "z": 12345678901234, "w": 0.1}}}],
     {"enable_thinking": True, "custom": {"a": [1, 2.5], "s": "é\n\"q\""}, "bos_token": "<B>", "n": None}),
    ("{{ tools is none }} {{ tools | length }} {{ enable_thinking is defined }}", [{"role": "user", "content": "hi"}], [], {}),
    ("{{ messages | length }}", [{"role": "user", "content": "hi"}], None, {"messages": []}),
]


def apply_feature_rows(tok):
    rows = []
    for source, messages, tools, kwargs in APPLY_FEATURES:
        row = {
            "template": "feature",
            "template_source": source,
            "messages": messages,
            "add_generation_prompt": False,
            "bos_token": tok.special_tokens_map.get("bos_token"),
            "eos_token": tok.special_tokens_map.get("eos_token"),
        }
        if tools is not None:
            row["tools"] = tools
        if kwargs:
            row["chat_template_kwargs"] = kwargs
        try:
            row["expected"] = tok.apply_chat_template(messages, tools=tools, tokenize=False, chat_template=source, **kwargs)
        except Exception as e:
            row["expected"] = None
            row["error"] = f"{type(e).__name__}: {e}"
        rows.append(row)
    return rows


def feature_rows():
    from transformers.utils.chat_template_utils import _compile_jinja_template

    rows = []
    for source in FEATURES:
        row = {
            "template": "feature",
            "template_source": source,
            "messages": FEATURE_MESSAGES,
            "add_generation_prompt": True,
            "bos_token": "<s>",
            "eos_token": "</s>",
        }
        try:
            row["expected"] = _compile_jinja_template(source).render(
                messages=FEATURE_MESSAGES, tools=None, documents=None, add_generation_prompt=True,
                bos_token="<s>", eos_token="</s>",
            )
        except Exception as e:
            row["expected"] = None
            row["error"] = f"{type(e).__name__}: {e}"
        rows.append(row)
    return rows


def tool_row(tok, name, source, conv_name, messages, tools, kwargs, agp, tokens):
    """One conversation rendered by apply_chat_template with tools= and extra
    keyword arguments (recorded as "tools" and "chat_template_kwargs")."""
    row = {
        "template": name,
        "conversation": conv_name,
        "messages": messages,
        "add_generation_prompt": agp,
        "bos_token": tokens.get("bos_token", tok.special_tokens_map.get("bos_token")),
        "eos_token": tokens.get("eos_token", tok.special_tokens_map.get("eos_token")),
    }
    if tools is not None:
        row["tools"] = tools
    if kwargs:
        row["chat_template_kwargs"] = kwargs
    try:
        row["expected"] = tok.apply_chat_template(
            messages, tools=tools, tokenize=False, add_generation_prompt=agp, chat_template=source, **tokens, **kwargs
        )
    except Exception as e:
        row["expected"] = None
        row["error"] = f"{type(e).__name__}: {e}"
    return row


def tool_rows(tok):
    """The Qwen3 conversations with enable_thinking absent, true and false, and
    the Llama 3.1 tool conversations; each with and without a generation prompt."""
    rows = []
    qwen3 = read(os.path.join(DATA, "qwen3_chat_template.jinja"))
    for conv_name, (messages, tools) in QWEN3_CONVERSATIONS.items():
        for thinking in (None, True, False):
            kwargs = {} if thinking is None else {"enable_thinking": thinking}
            for agp in (False, True):
                rows.append(tool_row(tok, "qwen3", qwen3, conv_name, messages, tools, kwargs, agp, {}))
    llama31 = read(os.path.join(DATA, "llama3.1_chat_template.jinja"))
    tokens = {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}
    for conv_name, (messages, tools, kwargs) in LLAMA31_CONVERSATIONS.items():
        for agp in (False, True):
            rows.append(tool_row(tok, "llama3.1", llama31, conv_name, messages, tools, kwargs, agp, tokens))
    return rows


def main():
    tok = AutoTokenizer.from_pretrained(os.path.join(SHARED, "qwen2.5-tokenizer"))
    qwen25 = json.loads(read(os.path.join(SHARED, "qwen2.5-tokenizer", "tokenizer_config.json")))["chat_template"]
    templates = {
        "qwen2.5": (qwen25, {}),
        "qwen2_chatml": (read(os.path.join(DATA, "qwen2_chatml_chat_template.jinja")), {}),
        "llama3": (
            read(os.path.join(DATA, "llama3_chat_template.jinja")),
            {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
        ),
        "llama3.1": (
            read(os.path.join(DATA, "llama3.1_chat_template.jinja")),
            {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
        ),
        "qwen3": (read(os.path.join(DATA, "qwen3_chat_template.jinja")), {}),
    }
    rows = []
    for name, (source, tokens) in templates.items():
        bos = tokens.get("bos_token", tok.special_tokens_map.get("bos_token"))
        eos = tokens.get("eos_token", tok.special_tokens_map.get("eos_token"))
        convs = list(CONVERSATIONS.items()) + [("empty_conversation", [])]
        for conv_name, messages in convs:
            for agp in (False, True):
                row = {
                    "template": name,
                    "conversation": conv_name,
                    "messages": messages,
                    "add_generation_prompt": agp,
                    "bos_token": bos,
                    "eos_token": eos,
                }
                try:
                    if messages:
                        row["expected"] = tok.apply_chat_template(
                            messages, tokenize=False, add_generation_prompt=agp, chat_template=source, **tokens
                        )
                    else:
                        row["expected"] = render_direct(source, messages, agp, bos, eos)
                except Exception as e:  # the template raised: C must fail too
                    row["expected"] = None
                    row["error"] = f"{type(e).__name__}: {e}"
                rows.append(row)
    rows += tool_rows(tok)
    rows += feature_rows()
    rows += apply_feature_rows(tok)
    out = os.path.join(DATA, "chat_template_goldens.jsonl")
    with open(out, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    counts = {}
    for r in rows:
        counts.setdefault(r["template"], [0, 0])[0 if r["expected"] is not None else 1] += 1
    for k, (ok, err) in counts.items():
        print(f"{k}: {ok} renders, {err} errors", file=sys.stderr)
    print(f"wrote {len(rows)} goldens to {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
