#!/usr/bin/env python3
"""make_tool_goldens.py — what TRL 1.16 / transformers 5.24 do with tool calls,
written to tests/data/tool_goldens.json for tests/test_tool_calls.c.

Four sections, each computed by the reference library itself:
  parse   — trl.chat_template_utils.parse_response (GRPOTrainer's decoding of a
            completion: tokenizer.parse_response with the response template that
            trl's add_response_schema sets, tools= the callables, and TRL's
            fallback to plain text) on completion texts: well-formed, several
            calls, malformed JSON, text around calls, no arguments, truncated,
            Qwen3 with <think>, Llama 3.1 JSON calls.
  suffix  — GRPOTrainer._get_tool_suffix_ids (called unbound on a stand-in for
            the trainer) for tool messages, over Qwen2.5's template, Qwen3's
            (TRL swaps in its training variant, qwen3_training.jinja, because
            the original is not prefix-preserving) and Llama 3.1's.
  prompt  — the prompt ids GRPOTrainer._tokenize_prompts renders with
            tools=[callables] (apply_chat_template turns them into JSON schemas
            with transformers.utils.get_json_schema).
  worker  — the schemas of tests/data/agent/tools.py's functions and of
            envs.py:MathEnv's public methods, reset(**row)'s observation, and
            the text the model gets for each call: TRL's _tool_call_loop block
            (try: tool(**arguments) except Exception as e: {"error": str(e)};
            then str(result)) copied below, since it is inline in the loop.

Tokenizers: the Qwen2.5 tokenizer of $COLT_SHARED_DATA (../shared/data) serves
the Qwen2.5 and Qwen3 templates (Qwen3's <think> tokens are then plain text,
the same on both sides). For Llama 3.1 the same vocabulary gets Llama 3's
special tokens added (recorded under "llama_added_tokens", which the C test
adds the same way), so eos is <|eot_id|> as in Llama-3.1-Instruct.

Usage (offline): HF_HUB_OFFLINE=1 python3 tests/ref/make_tool_goldens.py
Needs: transformers 5.24.0, trl 1.16.0.
"""
import asyncio
import importlib.util
import inspect
import json
import os
import sys
import types

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from transformers import AutoTokenizer  # noqa: E402
from transformers.utils import get_json_schema  # noqa: E402
from trl.chat_template_utils import add_response_schema, parse_response  # noqa: E402
from trl.trainer.grpo_trainer import GRPOTrainer  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHARED = os.environ.get("COLT_SHARED_DATA", os.path.join(ROOT, "..", "shared", "data"))
DATA = os.path.join(ROOT, "tests", "data")
AGENT = os.path.join(DATA, "agent")

LLAMA_SPECIAL = {
    "bos_token": "<|begin_of_text|>",
    "eos_token": "<|eot_id|>",
    "additional_special_tokens": ["<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>", "<|python_tag|>"],
}


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def load(name):
    """A test module under the name colt's worker gives it (its file's stem)."""
    spec = importlib.util.spec_from_file_location(name, os.path.join(AGENT, name + ".py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def tokenizers():
    qwen = AutoTokenizer.from_pretrained(os.path.join(SHARED, "qwen2.5-tokenizer"))
    qwen3 = AutoTokenizer.from_pretrained(os.path.join(SHARED, "qwen2.5-tokenizer"))
    qwen3.chat_template = read(os.path.join(DATA, "qwen3_chat_template.jinja"))
    llama = AutoTokenizer.from_pretrained(os.path.join(SHARED, "qwen2.5-tokenizer"))
    llama.add_special_tokens(LLAMA_SPECIAL)
    llama.chat_template = read(os.path.join(DATA, "llama3.1_chat_template.jinja"))
    for t in (qwen, qwen3, llama):
        add_response_schema(t)  # what GRPOTrainer does when tools are given
    return qwen, qwen3, llama


CALL = '<tool_call>\n{"name": "calculator", "arguments": {"a": 3, "b": 4, "op": "*"}}\n</tool_call>'
CALL2 = '<tool_call>\n{"name": "weather", "arguments": {"city": "Paris"}}\n</tool_call>'

QWEN_COMPLETIONS = {
    "single": CALL + "<|im_end|>",
    "two_calls": CALL + "\n" + CALL2 + "<|im_end|>",
    "text_before": "Let me compute that.\n" + CALL + "<|im_end|>",
    "text_after": CALL + "\nDone, waiting for the result." + "<|im_end|>",
    "text_between": "First.\n" + CALL + "\nthen\n" + CALL2 + "<|im_end|>",
    "malformed_json": '<tool_call>\n{"name": "calculator", "arguments": {"a": 3,}}\n</tool_call><|im_end|>',
    "no_arguments": '<tool_call>\n{"name": "no_args"}\n</tool_call><|im_end|>',
    "null_arguments": '<tool_call>\n{"name": "no_args", "arguments": null}\n</tool_call><|im_end|>',
    "arguments_string": '<tool_call>\n{"name": "calculator", "arguments": "{\\"a\\": 1}"}\n</tool_call><|im_end|>',
    "coerced_arguments": '<tool_call>\n{"name": "calculator", "arguments": {"a": "3", "b": "2.5", "op": "-"}}\n'
    '</tool_call><|im_end|>',
    "coerced_list": '<tool_call>\n{"name": "lookup", "arguments": {"keys": "[\\"cat\\"]", "upper": "true"}}\n'
    "</tool_call><|im_end|>",
    "unknown_tool": '<tool_call>\n{"name": "teleport", "arguments": {"to": "Mars"}}\n</tool_call><|im_end|>',
    "not_an_object": "<tool_call>\n[1, 2]\n</tool_call><|im_end|>",
    "name_not_string": '<tool_call>\n{"name": 5, "arguments": {}}\n</tool_call><|im_end|>',
    "unclosed": '<tool_call>\n{"name": "calculator", "arguments": {"a": 1',
    "unclosed_valid_json": '<tool_call>\n{"name": "no_args", "arguments": {}}',
    "plain": "The answer is 12.<|im_end|>",
    "plain_truncated": "The answer is",
    "after_end": "Answer: 12.<|im_end|>trailing words",
    "unicode": '<tool_call>\n{"name": "weather", "arguments": {"city": "Zürich \\u00e9 東京"}}\n</tool_call><|im_end|>',
    "nested_arguments": '<tool_call>\n{"name": "lookup", "arguments": {"keys": ["cat", "dog"], "upper": false, '
    '"extra": {"x": [1, 2.5, null]}}}\n</tool_call><|im_end|>',
    "whitespace": "  \n<tool_call>   {\"name\": \"no_args\", \"arguments\": {}}   </tool_call>\n\n<|im_end|>",
    "think_then_call": "<think>\nI should multiply.\n</think>\n\n" + CALL + "<|im_end|>",
    "think_then_text": "<think>\nEasy.\n</think>\n\nTwelve.<|im_end|>",
    "think_empty": "<think>\n\n</think>\n\n" + CALL + "<|im_end|>",
    "think_unclosed": "<think>\nStill thinking about",
}

LLAMA_COMPLETIONS = {
    "single": '{"name": "calculator", "parameters": {"a": 3, "b": 4, "op": "*"}}<|eot_id|>',
    "no_space": '{"name":"weather","parameters":{"city":"Paris"}}<|eot_id|>',
    "text_before": 'Sure. {"name": "calculator", "parameters": {"a": 1, "b": 2}}<|eot_id|>',
    "empty_parameters": '{"name": "no_args", "parameters": {}}<|eot_id|>',
    "malformed": '{"name": "calculator", "parameters": {"a": 1,}}<|eot_id|>',
    "truncated": '{"name": "calculator", "parameters": {"a": 1, "b": 2}}',
    "two_calls": '{"name": "no_args", "parameters": {}}; {"name": "no_args", "parameters": {}}<|eot_id|>',
    "plain": "The answer is 3.<|eot_id|>",
    "plain_truncated": "The answer",
    "coerced": '{"name": "calculator", "parameters": {"a": "7", "b": 1}}<|eot_id|>',
}


def parse_rows(qwen, qwen3, llama, tools):
    user = [{"role": "user", "content": "What is 3 times 4?"}]
    setups = [
        ("qwen2.5", qwen, {}, QWEN_COMPLETIONS),
        ("qwen3", qwen3, {}, QWEN_COMPLETIONS),
        ("qwen3_no_thinking", qwen3, {"enable_thinking": False}, QWEN_COMPLETIONS),
        ("llama3.1", llama, {}, LLAMA_COMPLETIONS),
    ]
    rows, prefixes = [], {}
    for name, tok, kwargs, completions in setups:
        prefix_ids = tok.apply_chat_template(user, tools=tools, add_generation_prompt=True, tokenize=True,
                                             return_dict=False, **kwargs)
        prefix = tok.decode(prefix_ids)
        prefixes[name] = prefix
        for case, text in completions.items():
            ids = tok(text, add_special_tokens=False)["input_ids"]
            assert tok.decode(ids) == text, (name, case)
            rows.append({
                "setup": name, "case": case, "text": text, "ids": ids,
                "text_skip_special": tok.decode(ids, skip_special_tokens=True),
                "expected": parse_response(tok, ids, prefix=prefix_ids, tools=tools),
            })
    return rows, prefixes


def suffix_rows(qwen, qwen3, llama):
    """TRL's own _get_tool_suffix_ids, on a stand-in that has what it reads."""
    setups = [
        ("qwen2.5", qwen, None),
        ("qwen3", qwen3, read(os.path.join(DATA, "qwen3_training_chat_template.jinja"))),
        ("llama3.1", llama, None),
    ]
    cases = {
        "one": [{"role": "tool", "name": "calculator", "content": "12"}],
        "two": [{"role": "tool", "name": "calculator", "content": "12"},
                {"role": "tool", "name": "weather", "content": "Sunny in Paris, 21 degrees"}],
        "error": [{"role": "tool", "name": "teleport", "content": "{'error': 'Tool teleport not found.'}"}],
        "multiline": [{"role": "tool", "name": "lookup", "content": "line 1\nline 2 — é\n"}],
        "empty": [{"role": "tool", "name": "no_args", "content": ""}],
    }
    rows = []
    for name, tok, chat_template in setups:
        fake = types.SimpleNamespace(processing_class=tok, _tokenizer=tok, chat_template=chat_template,
                                     chat_template_kwargs={}, _is_vlm=False)
        for case, messages in cases.items():
            ids = GRPOTrainer._get_tool_suffix_ids(fake, [dict(m) for m in messages])
            rows.append({"setup": name, "case": case, "tool_messages": messages, "expected": ids,
                         "expected_text": tok.decode(ids)})
    return rows


def prompt_rows(qwen, qwen3, llama, tools, env_tools):
    """GRPOTrainer._tokenize_prompts: apply_chat_template(tools=self.tools or None, add_generation_prompt=True)."""
    conversation = [{"role": "system", "content": "Use the tools."}, {"role": "user", "content": "3 times 4?"}]
    setups = [
        ("qwen2.5", qwen, None, tools),
        ("qwen3", qwen3, read(os.path.join(DATA, "qwen3_training_chat_template.jinja")), tools),
        ("llama3.1", llama, None, tools),
        ("qwen2.5_env", qwen, None, env_tools),
    ]
    rows = []
    for name, tok, chat_template, tool_list in setups:
        ids = tok.apply_chat_template([conversation], tools=tool_list or None, chat_template=chat_template,
                                      add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"][0]
        rows.append({"setup": name, "messages": conversation, "expected": ids, "expected_text": tok.decode(ids)})
    return rows


def run_tool_call(sync_tools, async_tools, tool_call):
    """TRL 1.16 GRPOTrainer._tool_call_loop's handling of one tool call (the
    async tools gathered with return_exceptions=True), and its str(result)."""
    if tool_call["type"] == "function":
        function = tool_call["function"]
        name = function["name"]
        try:
            if name in sync_tools:
                result = sync_tools[name](**function["arguments"])
            elif name in async_tools:
                coroutine = async_tools[name](**function["arguments"])

                async def gather():
                    return await asyncio.gather(coroutine, return_exceptions=True)

                result = asyncio.run(gather())[0]
                if isinstance(result, Exception):
                    result = {"error": str(result)}
            else:
                raise ValueError(f"Tool {name} not found.")
        except Exception as e:
            result = {"error": str(e)}
    else:
        name = tool_call.get("name", "unknown")
        result = {"error": f"Unsupported tool call type: {tool_call['type']}"}
    return name, result if isinstance(result, list) else str(result)


def tool_dicts(callables):
    """TRL's split into sync and async tools, keyed by __name__."""
    sync_tools, async_tools = {}, {}
    for tool in callables:
        (async_tools if inspect.iscoroutinefunction(tool) else sync_tools)[tool.__name__] = tool
    return sync_tools, async_tools


def call(name, arguments):
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


def worker_section(tools_module, envs_module, tools):
    sync_tools, async_tools = tool_dicts(tools)
    calls = [
        call("calculator", {"a": 3, "b": 4, "op": "*"}),
        call("calculator", {"a": 1, "b": 0, "op": "/"}),
        call("calculator", {"a": 1, "b": 2, "op": "%"}),
        call("calculator", {"a": 1, "c": 2}),
        call("calculator", {"a": 1.5, "b": 2}),
        call("lookup", {"keys": ["cat", "emu"], "upper": True}),
        call("weather", {"city": "Zürich"}),
        call("weather", {}),
        call("weather", {"city": " "}),
        call("calculator", '{"a": 1, "b": 2}'),
        call("lookup", {"keys": ["dog"], "upper": False, "extra": 1}),
        call("no_args", {}),
        call("teleport", {"to": "Mars"}),
        call("sleepy", {"seconds": 0}),
    ]
    results = []
    for c in calls:
        name, content = run_tool_call(sync_tools, async_tools, c)
        results.append({"call": c, "name": name, "content": content})

    # environment_factory=MathEnv: TRL's rules (one instance per rollout, reset(**row), public methods but
    # reset and get_reward as tools, found on the class with inspect.getmembers(..., inspect.isfunction)).
    env = envs_module.MathEnv()
    methods = [getattr(env, n) for n, _ in inspect.getmembers(type(env), predicate=inspect.isfunction)
               if n not in ("reset", "get_reward") and not n.startswith("_")]
    row = {"prompt": [{"role": "user", "content": "Reach the target."}], "start": 2, "target": 7}
    observation = env.reset(**row)
    env_sync, env_async = tool_dicts(tools + methods)
    env_calls = [call("add", {"n": 5}), call("total_so_far", {}), call("add", {"n": "x"}), call("calculator", {"a": 1, "b": 1})]
    env_results = []
    for c in env_calls:
        name, content = run_tool_call(env_sync, env_async, c)
        env_results.append({"call": c, "name": name, "content": content})
    return {
        "schemas": [get_json_schema(t) for t in tools],
        "environment": {
            "class": "MathEnv",
            "method_names": [m.__name__ for m in methods],
            "schemas": [get_json_schema(m) for m in methods],
            "row": row,
            "observation": observation,
            "calls": env_results,
            "reward": env.get_reward(),
        },
        "calls": results,
    }


def main():
    qwen, qwen3, llama = tokenizers()
    tools_module, envs_module = load("tools"), load("envs")
    tools = [tools_module.calculator, tools_module.lookup, tools_module.weather, tools_module.sleepy,
             tools_module.no_args]
    env = envs_module.MathEnv()
    env_methods = [getattr(env, n) for n, _ in inspect.getmembers(type(env), predicate=inspect.isfunction)
                   if n not in ("reset", "get_reward") and not n.startswith("_")]
    goldens = {
        "tools": ["tools.py:" + t.__name__ for t in tools],
        "llama_added_tokens": [{"id": llama.convert_tokens_to_ids(t), "content": t} for t in
                               [LLAMA_SPECIAL["bos_token"], LLAMA_SPECIAL["eos_token"]] +
                               LLAMA_SPECIAL["additional_special_tokens"]],
        "parse_prefixes": None,  # {setup: the prompt text each completion follows}
        "parse": None,
        "suffix": suffix_rows(qwen, qwen3, llama),
        "prompt": prompt_rows(qwen, qwen3, llama, tools, tools + env_methods),
        "worker": worker_section(tools_module, envs_module, tools),
    }
    goldens["parse"], goldens["parse_prefixes"] = parse_rows(qwen, qwen3, llama, tools)
    out = os.path.join(DATA, "tool_goldens.json")
    with open(out, "w", encoding="utf-8") as f:
        json.dump(goldens, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {len(goldens['parse'])} parse, {len(goldens['suffix'])} suffix, {len(goldens['prompt'])} prompt "
          f"goldens and the worker's to {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
