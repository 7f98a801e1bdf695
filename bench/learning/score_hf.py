"""score_hf.py - scores a checkpoint on the learning race's held-out split with transformers alone (greedy
generate, the prompt rendered by the tokenizer's chat template with the generation prompt, the answer checked
by bench/learning/rewards.py's is_correct: colt's math rule). Shows that what colt saved loads in transformers
unchanged and scores what `colt eval` scored; with --colt_eval it counts the problems on which the two agree.

Usage: python3 score_hf.py --model DIR --dataset HELDOUT.jsonl [--limit 100] [--max_new_tokens 96]
                           [--colt_eval EVAL.json] [--output OUT.json] [--batch 50]
The last line printed: "pass@1 P (N problems); colt eval P2, same verdict on K of N" when --colt_eval is given.
Greedy decoding in the checkpoint's dtype on a GPU (fp32 on the CPU): near-ties may break differently from
colt's kernels, so a few problems can differ; the agreement count says how many.
"""
import argparse
import json
import os
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rewards import is_correct  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--dataset", required=True)
    ap.add_argument("--limit", type=int, default=100)
    ap.add_argument("--max_new_tokens", type=int, default=96)
    ap.add_argument("--colt_eval")
    ap.add_argument("--output")
    ap.add_argument("--batch", type=int, default=50)
    a = ap.parse_args()
    gpu = torch.cuda.is_available()
    device = "cuda" if gpu else "cpu"
    rows = [json.loads(l) for l in open(a.dataset) if l.strip()][: a.limit]
    tok = AutoTokenizer.from_pretrained(a.model)
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype="auto" if gpu else torch.float32).to(device).eval()
    results = []
    for i in range(0, len(rows), a.batch):
        chunk = rows[i:i + a.batch]
        texts = [tok.apply_chat_template(r["prompt"], tokenize=False, add_generation_prompt=True) for r in chunk]
        enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(device)
        with torch.no_grad():
            out = model.generate(**enc, do_sample=False, max_new_tokens=a.max_new_tokens, pad_token_id=tok.pad_token_id)
        for r, seq in zip(chunk, out[:, enc["input_ids"].shape[1]:]):
            text = tok.decode(seq, skip_special_tokens=True)
            results.append({"completion": text, "answer": r["answer"], "correct": is_correct(text, r["answer"])})
    n = len(results)
    p = sum(x["correct"] for x in results) / n
    summary = {"model": a.model, "dataset": a.dataset, "problems": n, "pass@1": p, "dtype": str(model.dtype),
               "device": device, "max_new_tokens": a.max_new_tokens, "results": results}
    line = f"pass@1 {p:.4f} ({n} problems)"
    if a.colt_eval:
        ce = json.load(open(a.colt_eval))
        colt_ok = [bool(x["correct"]) for x in ce["results"]][:n]
        same = sum(c == x["correct"] for c, x in zip(colt_ok, results))
        same_text = None
        comp_path = os.path.splitext(a.colt_eval)[0] + ".completions.jsonl"
        if os.path.exists(comp_path):  # the completions colt eval wrote beside its summary
            colt_text = {}
            for l in open(comp_path):
                c = json.loads(l)
                colt_text[c["problem"]] = c["completion"]
            same_text = sum(colt_text.get(j) == x["completion"] for j, x in enumerate(results))
        summary.update(colt_eval_pass1=ce["pass@1"], same_verdict=same, same_completion=same_text)
        line += f"; colt eval {ce['pass@1']:.4f}, same verdict on {same} of {n}"
        if same_text is not None:
            line += f", identical completion on {same_text} of {n}"
    if a.output:
        with open(a.output, "w") as f:
            json.dump(summary, f, indent=1)
    print(line)


if __name__ == "__main__":
    main()
