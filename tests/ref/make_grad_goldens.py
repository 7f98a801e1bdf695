#!/usr/bin/env python3
"""make_grad_goldens.py — gradient goldens for the training forward/backward, from PyTorch autograd.

For each checkpoint (tests/data/models/tiny-qwen2-f32: q/k/v bias, GQA, tied; tiny-llama-f32: untied, with
o_proj bias; tiny-llama3-f32: llama3 RoPE scaling, sharded; tiny-qwen3-f32: q_norm / k_norm, head_dim 24;
the pretrained stories260K when shared data has it) and a batch of three sequences of lengths
7, 12, 5 (random ids, fixed seed), the last k = 4, 6, 3 tokens of each sequence are the "completion": for
each position p whose next token is a completion token, logp_p = log_softmax(logits_p / T)[ids[p+1]] with
T = 0.7 (log-softmax in float64 on the fp32 logits), entropy_p likewise. loss = sum_p w_p * logp_p with fixed
random weights w_p (so d loss / d logp = w), then loss.backward().

Writes tests/data/grad_goldens.json: per model the sequences, targets (-1 where none), weights, log-probs,
entropies, loss, and per parameter (HF name) its gradient: in full when it has <= 128 entries, else 64
entries at fixed random indices; always its L2 norm and max |g|. Not a test by itself: tests/test_grad.c
compares.

Usage: python3 tests/ref/make_grad_goldens.py [--only NAME ...]
  --only: regenerate only these models' entries (e.g. tiny-qwen3-f32), keeping the others as they are.
"""
import json
import os
import sys

import torch
from transformers import AutoModelForCausalLM

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHARED = os.environ.get("COLT_SHARED_DATA", os.path.join(ROOT, "..", "shared", "data"))
OUT = os.path.join(ROOT, "tests", "data", "grad_goldens.json")
TEMPERATURE = 0.7
LENGTHS = [7, 12, 5]
COMPLETION = [4, 6, 3]
FULL_MAX = 128
N_SAMPLE = 64


def golden_for(name, path, rel_dir, seed):
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager")
    model.train(False)  # no dropout; autograd stays on
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(seed)
    seqs, targets, weights = [], [], []
    for T, k in zip(LENGTHS, COMPLETION):
        ids = torch.randint(3, vocab, (T,), generator=g).tolist()
        tgt = [-1] * T
        for p in range(T - k - 1, T - 1):
            tgt[p] = ids[p + 1]
        w = [round(float(x), 6) if t >= 0 else 0.0 for x, t in zip(torch.randn(T, generator=g).tolist(), tgt)]
        seqs.append(ids), targets.append(tgt), weights.append(w)

    model.zero_grad()
    loss = torch.zeros((), dtype=torch.float64)
    all_lp, all_ent = [], []
    for ids, tgt, w in zip(seqs, targets, weights):
        logits = model(torch.tensor([ids])).logits[0]
        z = logits.double() / TEMPERATURE
        lsm = torch.log_softmax(z, dim=-1)
        lp, ent = [], []
        for p, t in enumerate(tgt):
            if t < 0:
                lp.append(0.0), ent.append(0.0)
                continue
            loss = loss + w[p] * lsm[p, t]
            lp.append(lsm[p, t].item())
            ent.append(-(lsm[p].exp() * lsm[p]).sum().item())
        all_lp.append(lp), all_ent.append(ent)
    loss.backward()

    grads = {}
    gs = torch.Generator().manual_seed(seed + 100)
    for pname, p in model.named_parameters():
        gr = p.grad.detach().flatten().double()
        entry = {"numel": gr.numel(), "norm": gr.norm().item(), "max_abs": gr.abs().max().item()}
        if gr.numel() <= FULL_MAX:
            entry["full"] = gr.tolist()
        else:
            idx = torch.randperm(gr.numel(), generator=gs)[:N_SAMPLE].sort().values
            entry["idx"] = idx.tolist()
            entry["val"] = gr[idx].tolist()
        grads[pname] = entry
    print(f"{name}: loss {loss.item():.6f}, {len(grads)} parameter tensors")
    return {"name": name, "dir": rel_dir, "sequences": seqs, "targets": targets, "weights": weights,
            "logprobs": all_lp, "entropies": all_ent, "loss": loss.item(), "grads": grads}


def main(only=None):
    torch.manual_seed(0)
    kept = {}
    if only:
        with open(OUT) as f:
            kept = {m["name"]: m for m in json.load(f)["models"]}
    models = []
    for i, name in enumerate(["tiny-qwen2-f32", "tiny-llama-f32", "tiny-llama3-f32", "tiny-qwen3-f32"]):
        if only and name not in only:
            models.append(kept[name])
            continue
        rel = os.path.join("tests", "data", "models", name)
        models.append(golden_for(name, os.path.join(ROOT, rel), rel, 1000 + i))
    stories = os.path.join(SHARED, "models", "stories260K", "hf")
    if only and "stories260K" in kept:
        models.append(kept["stories260K"])
    elif os.path.isdir(stories):
        models.append(golden_for("stories260K", stories, "SHARED/models/stories260K/hf", 1010))
    with open(OUT, "w") as f:
        json.dump({"temperature": TEMPERATURE, "models": models}, f, indent=None, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {OUT} ({os.path.getsize(OUT)} bytes)")


if __name__ == "__main__":
    main(only=sys.argv[2:] if len(sys.argv) >= 3 and sys.argv[1] == "--only" else None)
