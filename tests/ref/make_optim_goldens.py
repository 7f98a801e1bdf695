"""make_optim_goldens.py — tests/data/optim_goldens.json from torch.optim.AdamW,
torch.nn.utils.clip_grad_norm_ and transformers.get_scheduler.

The parameters are those of the tiny Llama that tests/test_optim.c builds with
model_create_random (names and sizes listed below, in model_param order); the
test uploads these initial values over the random ones, then runs the same
steps. Each step, as HF Trainer does: set the gradients, clip_grad_norm_(1.0),
optimizer.step() with the scheduler's current lr, scheduler.step(). Recorded:
the gradient norm before clipping, the lr used, every parameter after the step.

Run: python3 tests/ref/make_optim_goldens.py  (torch, transformers)
"""
import json
import math
import os
import re

import torch
import transformers
from transformers import get_scheduler

OUT = os.path.join(os.path.dirname(__file__), "..", "data", "optim_goldens.json")

PARAMS = [  # the tiny model of test_optim.c: D=4, F=4, 1 layer, 1 head of 4, vocab 8, tied embeddings
    ("model.embed_tokens.weight", 32),
    ("model.layers.0.input_layernorm.weight", 4),
    ("model.layers.0.self_attn.q_proj.weight", 16),
    ("model.layers.0.self_attn.k_proj.weight", 16),
    ("model.layers.0.self_attn.v_proj.weight", 16),
    ("model.layers.0.self_attn.o_proj.weight", 16),
    ("model.layers.0.post_attention_layernorm.weight", 4),
    ("model.layers.0.mlp.gate_proj.weight", 16),
    ("model.layers.0.mlp.up_proj.weight", 16),
    ("model.layers.0.mlp.down_proj.weight", 16),
    ("model.norm.weight", 4),
]
STEPS = 6
BASE_LR = 0.01
WEIGHT_DECAY = 0.1
MAX_GRAD_NORM = 1.0

g = torch.Generator().manual_seed(0)
init = [torch.randn(n, generator=g) * 0.5 for _, n in PARAMS]
# gradient scale per step: the total norm is above 1 on some steps (clipped) and below on others
scales = [0.5, 0.02, 0.3, 0.01, 0.2, 0.015]
grads = [[torch.randn(n, generator=g) * scales[s] for _, n in PARAMS] for s in range(STEPS)]
# one parameter gets no gradient on step 3: only weight decay moves it
for s in [3]:
    grads[s][1].zero_()

SCHEDULES = [  # (name, warmup_steps, warmup_ratio): warmup as TrainingArguments.get_warmup_steps gives it
    ("constant", 0, 0.0),
    ("constant_with_warmup", 2, 0.0),
    ("linear", 0, 0.1),  # ceil(6 * 0.1) = 1
    ("linear", 0, 0.0),
    ("cosine", 2, 0.0),
    ("cosine", 0, 0.5),  # ceil(6 * 0.5) = 3
]


def f32(values):
    """float32 values written with the 9 significant digits that read back exactly."""
    return [float(f"{x:.9g}") for x in values]


def warmup(total, warmup_steps, ratio):
    return warmup_steps if warmup_steps > 0 else math.ceil(total * ratio)


# transformers' Trainer.create_optimizer: no weight decay for parameters whose names match these
# (trainer.py, get_decay_parameter_names).
NO_DECAY = [r"bias", r"layernorm", r"rmsnorm", r"(?:^|\.)norm(?:$|\.)", r"_norm(?:$|\.)"]


def decays(name):
    return not any(re.search(p, name) for p in NO_DECAY)


def run(name, warmup_steps, ratio):
    params = [torch.nn.Parameter(t.clone()) for t in init]
    groups = [
        {"params": [p for p, (n, _) in zip(params, PARAMS) if decays(n)], "weight_decay": WEIGHT_DECAY},
        {"params": [p for p, (n, _) in zip(params, PARAMS) if not decays(n)], "weight_decay": 0.0},
    ]
    opt = torch.optim.AdamW(groups, lr=BASE_LR, foreach=False)
    n_warm = warmup(STEPS, warmup_steps, ratio)
    sched = get_scheduler(name, opt, num_warmup_steps=n_warm, num_training_steps=STEPS)
    lrs, norms, after = [], [], []
    for s in range(STEPS):
        for p, gr in zip(params, grads[s]):
            p.grad = gr.clone()
        norms.append(float(torch.nn.utils.clip_grad_norm_(params, MAX_GRAD_NORM)))
        lrs.append(sched.get_last_lr()[0])
        opt.step()
        sched.step()
        after.append(f32([x for p in params for x in p.detach().tolist()]))
    return {"scheduler": name, "warmup_steps": warmup_steps, "warmup_ratio": ratio, "num_warmup": n_warm,
            "lr": lrs, "grad_norm": norms, "params": after}


cases = [run(*s) for s in SCHEDULES]
assert any(n > MAX_GRAD_NORM for n in cases[0]["grad_norm"]) and any(n < MAX_GRAD_NORM for n in cases[0]["grad_norm"])

# lr lambdas over a longer horizon (past the end, too), for every type
lr_table = []
for name, total, warm in [("constant", 10, 3), ("constant_with_warmup", 10, 3), ("linear", 10, 3),
                          ("cosine", 10, 3), ("linear", 7, 0), ("cosine", 9, 4), ("constant_with_warmup", 5, 0)]:
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=3e-4)
    sched = get_scheduler(name, opt, num_warmup_steps=warm, num_training_steps=total)
    values = []
    for _ in range(total + 2):
        values.append(sched.get_last_lr()[0])
        opt.step()
        sched.step()
    lr_table.append({"scheduler": name, "total": total, "warmup": warm, "base_lr": 3e-4, "lr": values})

# get_warmup_steps: warmup_steps if >= 1 else ceil(total * ratio) (transformers 5 folds the ratio into warmup_steps)
warmups = []
for total, ratio, steps in [(10, 0.1, 0), (10, 0.3, 0), (7, 0.05, 0), (100, 0.03, 0), (10, 0.1, 4), (1000, 0.0, 0)]:
    args = transformers.TrainingArguments(output_dir="/tmp/optim_goldens_unused", warmup_steps=steps if steps else ratio,
                                          report_to=[])
    warmups.append({"total": total, "ratio": ratio, "steps": steps, "want": args.get_warmup_steps(total)})

out = {
    "torch_version": torch.__version__, "transformers_version": transformers.__version__,
    "steps": STEPS, "base_lr": BASE_LR, "weight_decay": WEIGHT_DECAY, "max_grad_norm": MAX_GRAD_NORM,
    "param_names": [n for n, _ in PARAMS], "param_numel": [k for _, k in PARAMS],
    "init": f32([x for t in init for x in t.tolist()]),
    "grads": [f32([x for t in gs for x in t.tolist()]) for gs in grads],
    "cases": cases, "lr_table": lr_table, "warmup_steps": warmups,
}
with open(OUT, "w") as f:
    json.dump(out, f, separators=(",", ":"))
    f.write("\n")
print(f"wrote {len(cases)} optimizer runs, {len(lr_table)} lr tables, {len(warmups)} warmup cases to {OUT}")
