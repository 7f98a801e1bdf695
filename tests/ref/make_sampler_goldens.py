"""Goldens for tests/test_sampler.c: the distribution transformers' generate samples from.

For random logits and several settings, applies transformers' logits processors in generate's order
(repetition penalty, temperature, top-k, top-p, min-p) and records softmax of the result.
Run: python3 tests/ref/make_sampler_goldens.py  -> tests/data/sampler_goldens.json
"""
import json
import os

import torch
from transformers.generation.logits_process import (MinPLogitsWarper, RepetitionPenaltyLogitsProcessor,
                                                    TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
torch.manual_seed(0)
V = 64
settings = [
    dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, repetition_penalty=1.0),
    dict(temperature=0.7, top_k=0, top_p=1.0, min_p=0.0, repetition_penalty=1.0),
    dict(temperature=1.0, top_k=5, top_p=1.0, min_p=0.0, repetition_penalty=1.0),
    dict(temperature=1.0, top_k=0, top_p=0.9, min_p=0.0, repetition_penalty=1.0),
    dict(temperature=1.0, top_k=0, top_p=0.5, min_p=0.0, repetition_penalty=1.0),
    dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.1, repetition_penalty=1.0),
    dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, repetition_penalty=1.3),
    dict(temperature=0.8, top_k=20, top_p=0.8, min_p=0.0, repetition_penalty=1.1),
    dict(temperature=1.3, top_k=10, top_p=0.95, min_p=0.05, repetition_penalty=1.2),
]
cases = []
for k, s in enumerate(settings):
    for trial in range(3):
        logits = (torch.randn(V) * (1 + trial)).float()
        history = torch.randint(0, V, (12,))
        scores = logits.clone()[None]
        ids = history[None]
        if s["repetition_penalty"] != 1.0:
            scores = RepetitionPenaltyLogitsProcessor(s["repetition_penalty"])(ids, scores)
        if s["temperature"] != 1.0:
            scores = TemperatureLogitsWarper(s["temperature"])(ids, scores)
        if s["top_k"] > 0:
            scores = TopKLogitsWarper(s["top_k"])(ids, scores)
        if s["top_p"] < 1.0:
            scores = TopPLogitsWarper(s["top_p"])(ids, scores)
        if s["min_p"] > 0.0:
            scores = MinPLogitsWarper(s["min_p"])(ids, scores)
        probs = torch.softmax(scores, dim=-1)[0]
        cases.append(dict(settings=s, logits=logits.tolist(), history=history.tolist(), probs=probs.tolist()))
path = os.path.join(ROOT, "tests", "data", "sampler_goldens.json")
with open(path + ".tmp", "w") as f:
    json.dump(cases, f)
os.replace(path + ".tmp", path)
print("wrote", path, len(cases), "cases")
