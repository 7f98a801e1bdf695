#!/usr/bin/env python3
"""make_fewshot_prompts.py — the prompts of bench_fewshot.sh: every GSM8K test
question after the same 8 worked examples, as a multi-turn chat (the layout of
lm-eval's gsm8k_cot with --apply_chat_template --fewshot_as_multiturn
--num_fewshot 8): user "Q: <question>\\nA:", assistant "<reasoning> The answer is N.".
The examples are the first 8 of GSM8K's train split, calculator notes (<<...>>)
removed. Every prompt starts with the same ~1000 tokens, which is what prefix
caching is for. Standard library only.
Usage: python3 make_fewshot_prompts.py GSM8K_DIR > prompts.jsonl"""
import json
import re
import sys


def turn(question):
    return {"role": "user", "content": f"Q: {question}\nA:"}


def worked(answer):
    reasoning, final = answer.split("####")
    reasoning = re.sub(r"<<[^>]*>>", "", reasoning).strip().replace("\n", " ")
    return {"role": "assistant", "content": f"{reasoning} The answer is {final.strip()}."}


def main():
    folder = sys.argv[1]
    with open(f"{folder}/train.jsonl") as f:
        shots = [json.loads(line) for _, line in zip(range(8), f)]
    examples = []
    for s in shots:
        examples += [turn(s["question"]), worked(s["answer"])]
    with open(f"{folder}/test.jsonl") as f:
        for line in f:
            q = json.loads(line)["question"]
            print(json.dumps({"messages": examples + [turn(q)]}))


if __name__ == "__main__":
    main()
