#!/usr/bin/env python3
"""bench_tokenizer_hf.py — the HF `tokenizers` side of bench/bench_tokenizer.c.

Encodes every question and answer of GSM8K train (or the JSONL given as
argv[1]) single-threaded with Qwen2.5 and stories260K (add_special_tokens=False,
so the token totals must equal colt's), one text at a time and with
encode_batch under RAYON_NUM_THREADS=1. Best of several passes. Prints a
markdown table with the command and the CPU.

    python3 bench/bench_tokenizer_hf.py [train.jsonl] [passes]
"""
import os

os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["RAYON_RS_NUM_CPUS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"

import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import tokenizers  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "..", "shared", "data")


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(DATA, "gsm8k/train.jsonl")
    passes = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    texts = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                row = json.loads(line)
                texts += [row["question"], row["answer"]]
    nbytes = sum(len(t.encode("utf-8")) for t in texts)
    print(f"command: python3 {' '.join(sys.argv)}")
    print(f"machine: {cpu_model()} (RAYON_NUM_THREADS=1, tokenizers {tokenizers.__version__})")
    print(f"input: {len(texts)} texts, {nbytes / 1e6:.2f} MB\n")
    print("| tokenizer | implementation | MB/s | tokens/s | tokens |")
    print("|---|---|---:|---:|---:|")
    for name, rel in [("qwen2.5", "qwen2.5-tokenizer"), ("stories260K", "models/stories260K/hf")]:
        tok = Tokenizer.from_file(os.path.join(DATA, rel, "tokenizer.json"))
        for label in ["HF encode (one text at a time)", "HF encode_batch (1 thread)"]:
            best, tokens = 1e30, 0
            for _ in range(passes):
                t0 = time.perf_counter()
                if "batch" in label:
                    encs = tok.encode_batch(texts, add_special_tokens=False)
                else:
                    encs = [tok.encode(t, add_special_tokens=False) for t in texts]
                dt = time.perf_counter() - t0
                best = min(best, dt)
                tokens = sum(len(e.ids) for e in encs)
            print(f"| {name} | {label} | {nbytes / 1e6 / best:.2f} | {tokens / best:.0f} | {tokens} |")


if __name__ == "__main__":
    main()
