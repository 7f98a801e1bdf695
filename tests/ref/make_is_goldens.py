"""make_is_goldens.py — tests/data/is_goldens.json: TRL's vLLM importance-sampling
correction (sampler log-probs vs the trainer's old log-probs), from TRL's own code.

The IS ratio and the sampling/* metrics are computed inline in
GRPOTrainer._generate_and_score_completions (a method that also generates, so it
cannot be called alone). This script cuts the two blocks out of the installed
TRL's source text with inspect and runs them verbatim (exec, in the module's own
globals, on a stub `self`): block 1 turns (old, sampling, mask) into
vllm_importance_sampling_ratio; block 2 logs the metrics. Several processes are
played by running block 2 once per rank with a stub accelerator whose gather
returns what every rank passed (a first pass records, a second replays).

The loss cases then call GRPOTrainer._compute_loss itself (stub trainer as in
make_grpo_goldens.py) with use_vllm and the correction on, the ratio from block 1
in inputs["importance_sampling_ratio"]; loss.backward() gives d loss / d logp.
Every mode x loss_type x beta x clip_min x importance level, float64 on
float32-representable inputs, with padded tokens, a fully masked row, and NaN
sampling log-probs (vLLM's "could not score this token") on counted and padded
tokens.

Run: python3 tests/ref/make_is_goldens.py  (pip trl 1.16.0, torch)
"""
import inspect
import json
import math
import os
import textwrap
from collections import defaultdict
from types import SimpleNamespace

import torch
import trl
import trl.trainer.grpo_trainer as grpo_module
from trl import GRPOTrainer

OUT = os.path.join(os.path.dirname(__file__), "..", "data", "is_goldens.json")
torch.manual_seed(1)
DT = torch.float64
MODES = ["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"]
CLIP_MAX, CLIP_MIN = 3.0, 0.5  # TRL's default clip_max; clip_min as a user would set it


def f32(t):
    """Round to float32-representable values, kept in float64."""
    return t.to(torch.float32).to(DT)


def as_list(t):
    return [None if math.isnan(x) else float(x) for x in t.reshape(-1).tolist()]


# ---------------------------------------------------------------- TRL's blocks, verbatim
SRC = textwrap.dedent(inspect.getsource(GRPOTrainer._generate_and_score_completions))


def cut(start, end, anchor=None):
    """The source lines from the one holding start (the last before anchor, if given) to the one holding end."""
    i = SRC.rindex(start, 0, SRC.index(anchor)) if anchor else SRC.index(start)
    j = SRC.index(end, i)
    i = SRC.rfind("\n", 0, i) + 1
    j = SRC.rfind("\n", 0, j) + 1
    return textwrap.dedent(SRC[i:j])


RATIO_BLOCK = cut("# Compute the importance sampling ratio when using vLLM",
                  "# Compute the per-token log probabilities for the reference model")
METRIC_BLOCK = cut("if self.use_vllm and self.vllm_importance_sampling_correction:", "output = {",
                   anchor="delta = torch.abs(old_per_token_logps - sampling_per_token_logps)")
for needle in ["per_token_logps_diff = (old_per_token_logps - sampling_per_token_logps) * mask",
               "torch.nan_to_num(per_token_logps_diff, nan=0.0)", "vllm_importance_sampling_ratio = torch.exp(logps_diff)"]:
    assert needle in RATIO_BLOCK, f"TRL's IS ratio code changed: {needle!r}"
for needle in ["sampling/sampling_logp_difference/mean", "sampling/importance_sampling_ratio/max"]:
    assert needle in METRIC_BLOCK, f"TRL's IS metric code changed: {needle!r}"
RATIO_CODE = compile(RATIO_BLOCK, "grpo_trainer.py:importance_sampling_ratio", "exec")
METRIC_CODE = compile(METRIC_BLOCK, "grpo_trainer.py:sampling_metrics", "exec")


class GatherAccel:
    """Plays every rank: pass 1 records what each rank gathers, pass 2 returns them stacked."""

    def __init__(self, num_processes):
        self.num_processes = num_processes
        self.recorded = []  # recorded[rank][call]
        self.replay = False
        self.call = 0

    def start(self, rank):
        self.rank, self.call = rank, 0
        if not self.replay:
            self.recorded.append([])

    def gather(self, x):
        if not self.replay:
            self.recorded[self.rank].append(x.reshape(1))
            return x.reshape(1)
        out = torch.cat([self.recorded[r][self.call] for r in range(self.num_processes)])
        self.call += 1
        return out


def stub(mode, clip_min, clip_max, accel):
    s = SimpleNamespace(use_vllm=True, vllm_importance_sampling_correction=True,
                        vllm_importance_sampling_mode=mode, vllm_importance_sampling_clip_min=clip_min,
                        vllm_importance_sampling_clip_max=clip_max, accelerator=accel,
                        _metrics={"train": defaultdict(list), "eval": defaultdict(list)})
    return s


def trl_ratio(self, old, sampling, mask):
    ns = dict(vars(grpo_module))
    ns.update(self=self, old_per_token_logps=old, sampling_per_token_logps=sampling, completion_mask=mask,
              tool_mask=None)
    exec(RATIO_CODE, ns)
    return ns["vllm_importance_sampling_ratio"], ns["sequence_level_is"], ns


def trl_metrics(mode, clip_min, clip_max, ranks):
    """ranks: [(old, sampling, mask)] per process. Returns TRL's logged values and each rank's ratio."""
    accel = GatherAccel(len(ranks))
    for replay in [False, True]:
        accel.replay = replay
        for r, (old, sampling, mask) in enumerate(ranks):
            accel.start(r)
            self = stub(mode, clip_min, clip_max, accel)
            ratio, _, ns = trl_ratio(self, old, sampling, mask)
            ns.update(mode="train", device="cpu")
            exec(METRIC_CODE, ns)
    m = self._metrics["train"]
    keys = ["sampling/sampling_logp_difference/mean", "sampling/sampling_logp_difference/max",
            "sampling/importance_sampling_ratio/min", "sampling/importance_sampling_ratio/mean",
            "sampling/importance_sampling_ratio/max"]
    return {k: m[k][0] for k in keys}


# ---------------------------------------------------------------- inputs
B, T = 6, 7
EPS_LOW, EPS_HIGH, DELTA = 0.2, 0.28, 1.5
MAX_COMPLETION_LENGTH = 9
logp = f32(-torch.rand(B, T, dtype=DT) * 3.0 - 0.05)
mask = torch.ones(B, T, dtype=DT)
mask[1, 5:] = 0
mask[2, 3:] = 0
mask[3, :] = 0  # a completion dropped by mask_truncated_completions
mask[5, 6:] = 0
advantages = f32(torch.tensor([0.9, -1.3, 0.45, -0.7, 1.1, -0.4], dtype=DT))

# policy log ratio (logp - old): random, nudged off the clip boundaries at both levels
log_ratio = (torch.rand(B, T, dtype=DT) - 0.5) * 1.4
bounds = [math.log(1 - EPS_LOW), math.log(1 + EPS_HIGH), math.log(DELTA)]
for b in bounds:
    log_ratio[(log_ratio - b).abs() < 0.02] += 0.05
old_logp = f32(logp - log_ratio)
for b in bounds:
    lr = logp - old_logp
    assert (lr - b).abs().min() > 0.01
    seq = (lr * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
    assert (seq - b).abs().min() > 1e-3, "sequence ratio too close to a clip boundary"

# sampler mismatch old - sampling: per token some above log(clip_max), some below
# log(clip_min); per row sums above, below and between the bounds
is_diff = (torch.rand(B, T, dtype=DT) - 0.5) * 0.5
is_diff[0] = torch.tensor([1.4, -0.9, 0.2, 0.3, -0.1, 0.25, 0.35], dtype=DT)  # row sum 1.5 > log 3
is_diff[1, :5] = torch.tensor([-0.3, -0.8, 0.1, -0.2, 0.05], dtype=DT)  # row sum -1.15 < log 0.5
is_diff[2, :3] = torch.tensor([0.1, 0.3, -0.1], dtype=DT)
is_diff[4] = torch.tensor([0.1, -0.2, 0.05, -0.15, 0.1, 0.05, -0.1], dtype=DT)
is_diff[5, :6] = torch.tensor([0.4, 0.1, 1.2, -0.3, 0.2, -0.1], dtype=DT)
sampling_logp = f32(old_logp - is_diff)
sampling_logp[1, 2] = float("nan")  # the engine could not score a counted token
sampling_logp[1, 6] = float("nan")  # ... and a padded one
sampling_logp[2, 5] = 0.0  # TRL pads sampling log-probs with 0
ref_logp = f32(logp + (torch.rand(B, T, dtype=DT) - 0.5) * 0.6)
for b in [math.log(CLIP_MAX), math.log(CLIP_MIN)]:
    d = (old_logp - sampling_logp) * mask
    d = torch.nan_to_num(d, nan=0.0)
    assert (d - b).abs().min() > 0.02 and (d.sum(-1) - b).abs().min() > 0.02, "IS ratio too close to a bound"

all_masked = torch.zeros(B, T, dtype=DT)


# ---------------------------------------------------------------- loss cases
class Accel1:
    num_processes = 1
    sync_gradients = True

    def reduce(self, x, reduction="sum"):
        return x

    def gather(self, x):
        return x

    def gather_for_metrics(self, x):
        return x


def run_loss(loss_type, level, beta, gas, delta, ratio):
    tr = object.__new__(GRPOTrainer)
    tr.args = SimpleNamespace(delta=delta, use_bias_correction_kl=True, steps_per_generation=gas)
    tr.beta = beta
    tr.epsilon_low, tr.epsilon_high = EPS_LOW, EPS_HIGH
    tr.loss_type = loss_type
    tr.importance_sampling_level = level
    tr.max_completion_length = MAX_COMPLETION_LENGTH
    tr.current_gradient_accumulation_steps = gas
    tr.accelerator = Accel1()
    tr._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
    tr.model = SimpleNamespace(training=True)
    tr.top_entropy_quantile = 1.0
    tr.off_policy_mask_threshold = None
    tr.use_vllm = True
    tr.vllm_importance_sampling_correction = True
    tr.aux_loss_enabled = False
    tr._entropy_bonus_enabled = False
    lp = logp.clone().requires_grad_(True)
    tr._get_per_token_logps_and_entropies = lambda *a, **k: (lp, torch.ones(B, T, dtype=DT), None)
    inputs = {
        "prompt_ids": torch.zeros(B, 2, dtype=torch.long),
        "prompt_mask": torch.ones(B, 2, dtype=torch.long),
        "completion_ids": torch.zeros(B, T, dtype=torch.long),
        "completion_mask": mask.clone(),
        "advantages": advantages.clone(),
        "num_items_in_batch": mask.sum(),
        "old_per_token_logps": old_logp.clone(),
        "importance_sampling_ratio": ratio.clone(),
        "sampling_per_token_logps": sampling_logp.clone(),
    }
    if beta != 0.0:
        inputs["ref_per_token_logps"] = ref_logp.clone()
    loss = GRPOTrainer._compute_loss(tr, None, inputs)
    loss.backward()
    m = tr._metrics["train"]
    return float(loss.detach()), as_list(lp.grad), m


def metric_fields(m):
    return {
        "logp_difference_mean": m["sampling/sampling_logp_difference/mean"],
        "logp_difference_max": m["sampling/sampling_logp_difference/max"],
        "is_ratio_min": m["sampling/importance_sampling_ratio/min"],
        "is_ratio_mean": m["sampling/importance_sampling_ratio/mean"],
        "is_ratio_max": m["sampling/importance_sampling_ratio/max"],
    }


clip_settings = [(None, CLIP_MAX), (CLIP_MIN, CLIP_MAX), (CLIP_MIN, None)]
cases = []
n = 0
for mode in MODES:
    for clip_min, clip_max in clip_settings:
        self = stub(mode, clip_min, clip_max, Accel1())
        ratio, _, _ = trl_ratio(self, old_logp.clone(), sampling_logp.clone(), mask.clone())
        weight = ratio.expand(B, T)  # sequence modes: one value per row, broadcast over its tokens
        metrics = metric_fields(trl_metrics(mode, clip_min, clip_max, [(old_logp, sampling_logp, mask)]))
        # the all-counted rows set the loss's coverage; every loss setting for the first clip setting pair,
        # and a rotating subset for clip_max = None (which TRL allows for *_mask, and for *_truncate with clip_min)
        for loss_type in ["grpo", "bnpo", "dr_grpo", "dapo"]:
            for level in ["token", "sequence"]:
                for beta in [0.0, 0.04]:
                    if clip_max is None and (n % 3) != 0:
                        n += 1
                        continue
                    gas = 1 + n % 2
                    delta = DELTA if n % 4 == 1 else None
                    loss, dlogp, lm = run_loss(loss_type, level, beta, gas, delta, ratio)
                    n += 1
                    name = (f"{mode}/min={clip_min}/max={clip_max}/{loss_type}/{level}/beta={beta:g}/gas={gas}"
                            + (f"/delta={delta:g}" if delta else ""))
                    cases.append({
                        "name": name, "mode": mode, "clip_min": clip_min, "clip_max": clip_max,
                        "loss_type": loss_type, "level": level, "beta": beta, "gas": gas,
                        "delta": delta if delta else 0.0,
                        "num_items_in_batch": float(mask.sum().clamp(min=1.0)),
                        "is_weight": as_list(weight), **metrics,
                        "loss": loss, "dlogp": dlogp,
                        "clip_ratio_low": lm["clip_ratio/low_mean"][0],
                        "clip_ratio_high": lm["clip_ratio/high_mean"][0],
                        "clip_ratio_region": lm["clip_ratio/region_mean"][0],
                        "kl": lm["kl"][0] if beta != 0.0 else 0.0,
                    })

# The weights must actually truncate and mask, or the checks are vacuous.
for mode in MODES:
    ws = [c for c in cases if c["mode"] == mode]
    assert any(w != 1.0 for c in ws for w in c["is_weight"])
assert any(w == 0.0 for c in cases if c["mode"] == "token_mask" for w in c["is_weight"])
assert any(w == 0.0 for c in cases if c["mode"] == "sequence_mask" for w in c["is_weight"])
assert any(w == CLIP_MAX for c in cases if c["mode"] == "token_truncate" for w in c["is_weight"])
assert any(w == CLIP_MIN for c in cases if c["mode"] == "sequence_truncate" for w in c["is_weight"])
assert any(c["clip_ratio_high"] > 0 for c in cases) and any(c["clip_ratio_low"] > 0 for c in cases)

# ---------------------------------------------------------------- metric-only cases
# A process whose whole batch is masked (token modes log 0), and three processes
# (the batch, the all-masked batch, rows 0..2 of the batch) reduced as TRL gathers.
rank_inputs = [(old_logp, sampling_logp, mask), (old_logp, sampling_logp, all_masked),
               (old_logp[:3], sampling_logp[:3], mask[:3])]
metric_cases = []
for mode in MODES:
    for clip_min, clip_max in clip_settings:
        metric_cases.append({"name": f"{mode}/min={clip_min}/max={clip_max}/all_masked", "mode": mode,
                             "clip_min": clip_min, "clip_max": clip_max, "ranks": [1],
                             **metric_fields(trl_metrics(mode, clip_min, clip_max, [rank_inputs[1]]))})
        metric_cases.append({"name": f"{mode}/min={clip_min}/max={clip_max}/3_ranks", "mode": mode,
                             "clip_min": clip_min, "clip_max": clip_max, "ranks": [0, 1, 2],
                             **metric_fields(trl_metrics(mode, clip_min, clip_max, rank_inputs))})

out = {
    "trl_version": trl.__version__,
    "B": B, "T": T, "epsilon_low": EPS_LOW, "epsilon_high": EPS_HIGH,
    "max_completion_length": MAX_COMPLETION_LENGTH,
    "logp": as_list(logp), "old_logp": as_list(old_logp), "sampling_logp": as_list(sampling_logp),
    "ref_logp": as_list(ref_logp), "mask": as_list(mask), "advantages": as_list(advantages),
    "rank_inputs": [{"rows": int(m.shape[0]), "all_masked": bool(m.sum() == 0)}
                    for (_, _, m) in rank_inputs],
    "cases": cases,
    "metric_cases": metric_cases,
}
with open(OUT, "w") as f:
    json.dump(out, f, separators=(",", ":"))
    f.write("\n")
print(f"wrote {len(cases)} loss cases and {len(metric_cases)} metric cases to {OUT}")
