#!/usr/bin/env python3
"""make_rope_goldens.py — RoPE frequency tables (inv_freq) from transformers, for tests/test_rope.c.

For each case, a Llama config in transformers 5's form (rope_parameters) and in 4.x's form (top-level rope_theta +
rope_scaling, with "rope_type" or the older "type"), and the inv_freq[head_dim / 2] (fp32) that transformers'
ROPE_INIT_FUNCTIONS (modeling_rope_utils.py) compute from it: default, linear and llama3 with the public
Llama 3.1 / 3.2 settings and small ones whose smooth band falls inside a tiny head. Both forms are loaded by
LlamaConfig and must give the same table. Writes tests/data/rope_goldens.json.

Usage: python3 tests/ref/make_rope_goldens.py
"""
import json
import os

import torch
import transformers
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "tests", "data", "rope_goldens.json")

# name, head_dim, max_position_embeddings, rope_theta, scaling (None for default)
CASES = [
    ("default Dh=64 theta=1e6", 64, 32768, 1000000.0, None),
    ("default Dh=16 theta=5e4", 16, 128, 50000.0, None),
    ("linear Dh=64 factor=4", 64, 8192, 10000.0, {"rope_type": "linear", "factor": 4.0}),
    ("llama3.1-8b", 128, 131072, 500000.0,
     {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
      "original_max_position_embeddings": 8192}),
    ("llama3.2-1b", 64, 131072, 500000.0,
     {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
      "original_max_position_embeddings": 8192}),
    ("llama3.2-3b", 128, 131072, 500000.0,
     {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
      "original_max_position_embeddings": 8192}),
    # A tiny head whose 8 frequencies fall in all three bands (kept, smoothed, divided by factor).
    ("llama3 Dh=16 orig=64", 16, 256, 10000.0,
     {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 8.0,
      "original_max_position_embeddings": 64}),
    # original_max_position_embeddings left out: transformers takes max_position_embeddings.
    ("llama3 Dh=32 orig from max_pos", 32, 512, 10000.0,
     {"rope_type": "llama3", "factor": 2.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}),
]


def config_forms(head_dim, max_pos, theta, scaling):
    """The same RoPE in transformers 5's form and in 4.x's form (None for a default RoPE's 4.x form)."""
    base = dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=head_dim * 4,
                intermediate_size=64, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=4,
                head_dim=head_dim, vocab_size=256, max_position_embeddings=max_pos)
    v5 = dict(base, rope_parameters=dict(scaling or {"rope_type": "default"}, rope_theta=theta))
    v4 = dict(base, rope_theta=theta, rope_scaling=None)
    if scaling:
        legacy = dict(scaling)
        # Older checkpoints name the type "type"; use that form for the linear case.
        if legacy["rope_type"] == "linear":
            legacy["type"] = legacy.pop("rope_type")
        v4["rope_scaling"] = legacy
    return v5, v4


def inv_freq_of(cfg_dict):
    cfg = LlamaConfig(**{k: v for k, v in cfg_dict.items() if k not in ("architectures", "model_type")})
    rope_type = cfg.rope_parameters.get("rope_type", "default")
    if rope_type == "default":
        head_dim = cfg.head_dim
        base = cfg.rope_parameters["rope_theta"]
        inv = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.int64).to(dtype=torch.float) / head_dim))
    else:
        inv, attention_factor = ROPE_INIT_FUNCTIONS[rope_type](cfg, "cpu")
        assert attention_factor == 1.0, attention_factor
    assert inv.dtype == torch.float32
    return inv.tolist()


def main():
    cases = []
    for name, head_dim, max_pos, theta, scaling in CASES:
        v5, v4 = config_forms(head_dim, max_pos, theta, scaling)
        inv5, inv4 = inv_freq_of(v5), inv_freq_of(v4)
        assert inv5 == inv4, name
        cases.append({"name": name, "config_v5": v5, "config_v4": v4, "inv_freq": inv5})
        print(f"{name}: inv_freq[0] {inv5[0]:.6g} ... [{len(inv5) - 1}] {inv5[-1]:.6g}")
    with open(OUT, "w") as f:
        json.dump({"transformers_version": transformers.__version__, "torch_version": torch.__version__,
                   "cases": cases}, f, indent=1)
        f.write("\n")
    print("wrote", OUT)


if __name__ == "__main__":
    main()
