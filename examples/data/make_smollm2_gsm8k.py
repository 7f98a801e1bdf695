"""Writes the SmolLM2 GSM8K example's prompt sets (examples/smollm2_gsm8k.yaml) from GSM8K.

Run: python3 examples/data/make_smollm2_gsm8k.py [GSM8K_DIR]   (no dependencies)
GSM8K_DIR defaults to ../shared/data/gsm8k (train.jsonl / test.jsonl, each line {"question", "answer"},
answers ending "#### N"). GSM8K is by OpenAI (github.com/openai/grade-school-math), MIT license.

Picks the shortest questions (a 135M model has a chance on them, and prompts stay short on the CPU):
256 from train.jsonl for training, 16 from test.jsonl held out. Each row is a chat prompt asking for
a final line "The answer is N." and the number N (the text after "####", commas removed) in "answer",
which colt's math reward compares against. Not a benchmark split: only a small, easy-first sample.
"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "..", "..", "..", "shared", "data", "gsm8k")
INSTRUCTION = 'Answer briefly, then end with "The answer is N." where N is the final number.'


def load(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def to_row(item):
    number = item["answer"].split("####")[-1].strip().replace(",", "")
    return {"prompt": [{"role": "user", "content": item["question"].strip() + "\n" + INSTRUCTION}],
            "answer": number}


def shortest(items, count):
    # Stable order: by question length, then by position in the file.
    ranked = sorted(range(len(items)), key=lambda i: (len(items[i]["question"]), i))
    return [to_row(items[i]) for i in ranked[:count]]


def write(path, rows):
    with open(path + ".tmp", "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    os.replace(path + ".tmp", path)


train = shortest(load(os.path.join(SOURCE, "train.jsonl")), 256)
evals = shortest(load(os.path.join(SOURCE, "test.jsonl")), 16)
write(os.path.join(HERE, "smollm2_gsm8k_train.jsonl"), train)
write(os.path.join(HERE, "smollm2_gsm8k_eval.jsonl"), evals)
print(len(train), "train prompts,", len(evals), "eval prompts")
