#!/usr/bin/env python3
"""make_dataset_goldens.py — the prompt texts test_dataset expects for the
conversational fixtures, rendered by transformers' apply_chat_template with the
Qwen2.5 tokenizer, as TRL's maybe_apply_chat_template does it: add_generation_prompt
when the last message is not the assistant's, continue_final_message when it is.

Usage (from the repository root):
    HF_HUB_OFFLINE=1 python3 tests/ref/make_dataset_goldens.py   ($COLT_SHARED_DATA, default ../shared/data)
Needs: transformers 5.23.0. Writes tests/data/datasets/goldens.json: {fixture file: [prompt text per row]}.
"""
import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from transformers import AutoTokenizer  # noqa: E402

root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
shared = os.environ.get("COLT_SHARED_DATA", os.path.join(root, "..", "shared", "data"))
tok = AutoTokenizer.from_pretrained(os.path.join(shared, "qwen2.5-tokenizer"))
fixtures = os.path.join(root, "tests", "data", "datasets")


def prompt_text(prompt):
    if isinstance(prompt, str):
        return prompt
    last_is_assistant = prompt[-1]["role"] == "assistant"
    return tok.apply_chat_template(prompt, tokenize=False, add_generation_prompt=not last_is_assistant,
                                   continue_final_message=last_is_assistant)


def rows(name):
    path = os.path.join(fixtures, name)
    if name.endswith(".json"):
        return json.load(open(path, encoding="utf-8"))
    return [json.loads(line) for line in open(path, encoding="utf-8") if line.strip()]


goldens = {name: [prompt_text(r["prompt"]) for r in rows(name)]
           for name in ["standard.jsonl", "conversational.jsonl", "array.json"]}
with open(os.path.join(fixtures, "goldens.json"), "w", encoding="utf-8") as f:
    json.dump(goldens, f, indent=1, ensure_ascii=False)
    f.write("\n")
print("wrote", sum(len(v) for v in goldens.values()), "prompts to tests/data/datasets/goldens.json")
