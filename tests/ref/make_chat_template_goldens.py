#!/usr/bin/env python3
"""make_chat_template_goldens.py — renders the chat templates colt supports with
transformers' apply_chat_template (the reference) and writes
tests/data/chat_template_goldens.jsonl for tests/test_chat_template.c.

Templates:
  qwen2.5      — chat_template of $COLT_SHARED_DATA/qwen2.5-tokenizer/tokenizer_config.json
  qwen2_chatml — tests/data/qwen2_chatml_chat_template.jinja (classic Qwen2 ChatML)
  llama3       — tests/data/llama3_chat_template.jinja (Meta-Llama-3-8B-Instruct)
  llama3.1     — tests/data/llama3.1_chat_template.jinja (Llama-3.1-8B-Instruct)

All are rendered through the Qwen2.5 tokenizer's apply_chat_template (chat_template=
overridden for the others), so the Jinja environment (sandbox, trim_blocks,
lstrip_blocks, tools=None, documents=None, raise_exception, tojson) is exactly
transformers'. bos_token/eos_token are passed explicitly for the Llama templates;
for Qwen they are the tokenizer's own (bos_token undefined, eos_token '<|im_end|>').

Usage (offline): HF_HUB_OFFLINE=1 python3 tests/ref/make_chat_template_goldens.py
Needs: transformers 5.23.0, jinja2 >= 3.1.6.
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
