"""make_grpo_goldens.py — tests/data/grpo_goldens.json from TRL's own GRPO code.

Loss cases call trl.GRPOTrainer._compute_loss itself on a stub trainer (made
with object.__new__, carrying only the attributes _compute_loss reads) whose
_get_per_token_logps_and_entropies returns a fixed log-prob tensor with
requires_grad=True; loss.backward() gives d loss / d logp, and the clip/kl
metrics are read back from the stub's _metrics. Everything runs in float64 on
float32-representable inputs, so the C code (double inside) can be held to
1e-6 relative.

Advantage cases mirror, line by line, the "sum_then_normalize" block of
GRPOTrainer._generate_and_score_completions (it is inline in a method that also
generates, so it cannot be called alone), using TRL's own nanstd; the script
checks at start-up that the block it mirrors is still the one in the installed
TRL.

Mask cases (TRL 1.16's off_policy_mask_threshold, top_entropy_quantile,
use_bias_correction_kl = False, entropy_coef) call _compute_loss the same way,
with the stub's entropies requiring grad too (d loss / d entropy is the entropy
bonus's gradient) and its get_high_entropy_mask TRL's own; a stub accelerator
whose gather appends a second process's entropies makes the quantile's pool
span two processes. The adaptive-entropy case calls _compute_loss over three
optimizer steps of two micro-batches and records TRL's controller state
(entropy_coef, _last_world_entropy) after each call.

Run: python3 tests/ref/make_grpo_goldens.py  (pip trl 1.16.0, torch)
"""
import inspect
import json
import math
import os
from collections import defaultdict
from types import SimpleNamespace

import torch
import trl
from trl import GRPOTrainer
from trl.trainer.utils import nanstd

OUT = os.path.join(os.path.dirname(__file__), "..", "data", "grpo_goldens.json")
torch.manual_seed(0)
DT = torch.float64


def f32(t):
    """Round to float32-representable values, kept in float64."""
    return t.to(torch.float32).to(DT)


def as_list(t):
    return [float(x) for x in t.reshape(-1).tolist()]


# ---------------------------------------------------------------- loss inputs
B, T = 4, 7
EPS_LOW, EPS_HIGH, DELTA = 0.2, 0.28, 1.5
logp = f32(-torch.rand(B, T, dtype=DT) * 3.0 - 0.05)
# log ratios: random, then the unmasked ones of rows 0-2 set by hand so that every
# clip region is hit at both levels (row 0, A > 0: high-clipped tokens and a
# high-clipped sequence; row 1, A < 0: low-clipped tokens and sequence, and a
# token above delta), all kept away from the boundaries (float rounding cannot
# flip a decision)
log_ratio = (torch.rand(B, T, dtype=DT) - 0.5) * 1.4
log_ratio[0] = torch.tensor([0.45, 0.30, -0.35, 0.30, 0.60, 0.15, 0.40], dtype=DT)
log_ratio[1, :5] = torch.tensor([-0.5, 0.5, -0.4, -0.3, -0.6], dtype=DT)
log_ratio[2, :3] = torch.tensor([0.1, -0.5, 0.35], dtype=DT)
bounds = [math.log(1 - EPS_LOW), math.log(1 + EPS_HIGH), math.log(DELTA)]
for b in bounds:
    log_ratio[(log_ratio - b).abs() < 0.02] += 0.05
    assert (log_ratio - b).abs().min() > 0.01
old_logp = f32(logp - log_ratio)
ref_logp = f32(logp + (torch.rand(B, T, dtype=DT) - 0.5) * 0.6)
mask = torch.ones(B, T, dtype=DT)
mask[1, 5:] = 0  # padding
mask[2, 3:] = 0
mask[3, :] = 0  # a completion dropped by mask_truncated_completions
advantages = f32(torch.tensor([0.9, -1.3, 0.45, -0.7], dtype=DT))
MAX_COMPLETION_LENGTH = 9


def seq_log_w(lr):
    return (lr * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)


# keep the sequence-level ratios away from the boundaries as well
for b in bounds:
    assert (seq_log_w(logp - old_logp) - b).abs().min() > 1e-3, "sequence ratio too close to a clip boundary"


class Accel:
    def __init__(self, num_processes):
        self.num_processes = num_processes
        self.sync_gradients = True

    def reduce(self, x, reduction="sum"):
        return x

    def gather(self, x):
        return x

    def gather_for_metrics(self, x):
        return x


# The newer losses' own settings (TRL's defaults but sapo's, moved so that both signs matter) and
# cispo's epsilon_high: cispo clamps coef_1 itself at epsilon_high, so a value near 1 splits the
# tokens into clamped and free ones (at TRL's 0.28 every one would be clamped).
SAPO = dict(sapo_temperature_neg=1.05, sapo_temperature_pos=0.7)
VESPO = dict(vespo_k_pos=2.0, vespo_lambda_pos=3.0, vespo_k_neg=3.0, vespo_lambda_neg=2.0)
CISPO_EPS_HIGH = 1.1
# a sampling-correction weight per token (1 on padding, as TRL's importance_sampling_ratio is there),
# one entry 0 (token_mask's drop) and one above 1
gen = torch.Generator().manual_seed(1)  # its own stream: the cases made before it keep their inputs
is_ratio = f32(torch.exp((torch.rand(B, T, dtype=DT, generator=gen) - 0.5) * 0.3)) * mask + (1 - mask)
is_ratio[0, 2] = 0.0
is_ratio[2, 1] = 1.7


def run_trl(loss_type, level, beta, with_old, gas, delta, num_processes=1, steps_per_generation=None,
            with_is=False):
    if steps_per_generation is None:
        steps_per_generation = gas  # TRL's default: steps_per_generation = gradient_accumulation_steps
    tr = object.__new__(GRPOTrainer)
    tr.args = SimpleNamespace(delta=delta, use_bias_correction_kl=True, steps_per_generation=steps_per_generation,
                              **SAPO, **VESPO)
    tr.beta = beta
    tr.epsilon_low = EPS_LOW
    tr.epsilon_high = CISPO_EPS_HIGH if loss_type == "cispo" else EPS_HIGH
    tr.loss_type = loss_type
    tr.importance_sampling_level = level
    tr.max_completion_length = MAX_COMPLETION_LENGTH
    tr.current_gradient_accumulation_steps = gas
    tr.accelerator = Accel(num_processes)
    tr._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
    tr.model = SimpleNamespace(training=True)
    tr.top_entropy_quantile = 1.0
    tr.off_policy_mask_threshold = None
    tr.use_vllm = with_is
    tr.vllm_importance_sampling_correction = with_is
    tr.aux_loss_enabled = False
    tr._entropy_bonus_enabled = False

    lp = logp.clone().requires_grad_(True)

    def fake_logps(model, input_ids, attention_mask, logits_to_keep, **kw):
        return lp, torch.ones(B, T, dtype=DT), None

    tr._get_per_token_logps_and_entropies = fake_logps
    num_items = mask.sum() * num_processes  # gathered over processes (each holding a batch like this one)
    inputs = {
        "prompt_ids": torch.zeros(B, 2, dtype=torch.long),
        "prompt_mask": torch.ones(B, 2, dtype=torch.long),
        "completion_ids": torch.zeros(B, T, dtype=torch.long),
        "completion_mask": mask.clone(),
        "advantages": advantages.clone(),
        "num_items_in_batch": num_items,
    }
    if with_old:
        inputs["old_per_token_logps"] = old_logp.clone()
    if beta != 0.0:
        inputs["ref_per_token_logps"] = ref_logp.clone()
    if with_is:
        inputs["importance_sampling_ratio"] = is_ratio.clone()
    loss = GRPOTrainer._compute_loss(tr, None, inputs)
    loss.backward()
    m = tr._metrics["train"]
    # what colt's caller passes as num_items_in_batch: TRL's whole dapo normaliser
    dapo_norm = float(num_items.clamp(min=1.0) / num_processes * gas / steps_per_generation)
    return {
        "name": f"{loss_type}/{level}/beta={beta:g}/{'old' if with_old else 'noold'}/gas={gas}"
        + (f"/delta={delta:g}" if delta is not None else "")
        + (f"/nproc={num_processes}/spg={steps_per_generation}" if num_processes != 1 else "")
        + ("/is" if with_is else ""),
        "loss_type": loss_type,
        "level": level,
        "beta": beta,
        "with_old": with_old,
        "gas": gas,
        "delta": delta if delta is not None else 0.0,
        "num_items_in_batch": dapo_norm,
        "loss": float(loss.detach()),
        "dlogp": as_list(lp.grad),
        "with_is": with_is,
        "epsilon_high": tr.epsilon_high,
        "clip_ratio_low": m["clip_ratio/low_mean"][0] if "clip_ratio/low_mean" in m else 0.0,
        "clip_ratio_high": m["clip_ratio/high_mean"][0] if "clip_ratio/high_mean" in m else 0.0,
        "clip_ratio_region": m["clip_ratio/region_mean"][0] if "clip_ratio/region_mean" in m else 0.0,
        "clip_ratio_low_min": m["clip_ratio/low_min"][0] if "clip_ratio/low_min" in m else None,
        "clip_ratio_high_max": m["clip_ratio/high_max"][0] if "clip_ratio/high_max" in m else None,
        "cispo_clip_ratio": m["cispo_clip_ratio"][0] if "cispo_clip_ratio" in m else 0.0,
        "vespo_phi_seq_mean": m["vespo/phi_seq_mean"][0] if "vespo/phi_seq_mean" in m else 0.0,
        "kl": m["kl"][0] if beta != 0.0 else 0.0,
    }


loss_cases = []
for li, loss_type in enumerate(["grpo", "bnpo", "dr_grpo", "dapo"]):
    for vi, level in enumerate(["token", "sequence"]):
        for bi, beta in enumerate([0.0, 0.04]):
            for oi, with_old in enumerate([False, True]):
                for gi, gas in enumerate([1, 2]):
                    delta = DELTA if (vi + bi + gi) % 2 == 0 else None
                    loss_cases.append(run_trl(loss_type, level, beta, with_old, gas, delta))
# dapo's normaliser with several processes and steps_per_generation != gradient_accumulation_steps
loss_cases.append(run_trl("dapo", "token", 0.04, True, 2, DELTA, num_processes=2, steps_per_generation=4))
loss_cases.append(run_trl("dapo", "sequence", 0.0, True, 2, None, num_processes=2, steps_per_generation=4))

# TRL 1.16's newer losses, each level, beta and old/no old; and with the sampling correction
# (which vespo folds into its gamma weight instead of multiplying the loss by it)
for li, loss_type in enumerate(["cispo", "sapo", "luspo", "vespo"]):
    for vi, level in enumerate(["token", "sequence"]):
        for bi, beta in enumerate([0.0, 0.04]):
            for oi, with_old in enumerate([False, True]):
                gas = 1 + (li + vi + bi + oi) % 2
                delta = DELTA if loss_type == "luspo" and (vi + bi) % 2 == 0 else None
                loss_cases.append(run_trl(loss_type, level, beta, with_old, gas, delta))
    loss_cases.append(run_trl(loss_type, "token", 0.04, True, 2, None, with_is=True))
loss_cases.append(run_trl("grpo", "token", 0.0, True, 1, None, with_is=True))
# the new losses' own metrics must see both outcomes
assert 0 < max(c["cispo_clip_ratio"] for c in loss_cases if c["loss_type"] == "cispo") < 1
assert len({round(c["vespo_phi_seq_mean"], 6) for c in loss_cases if c["loss_type"] == "vespo"}) > 2

# Every clip region must be exercised somewhere, or the metric checks are vacuous.
assert any(c["clip_ratio_low"] > 0 for c in loss_cases)
assert any(c["clip_ratio_high"] > 0 for c in loss_cases)
assert any(c["clip_ratio_low"] > 0 for c in loss_cases if c["level"] == "sequence")
assert any(c["clip_ratio_high"] > 0 for c in loss_cases if c["level"] == "sequence")


# ---------------------------------------------------------------- masks and the entropy bonus
# Inputs of their own (a generator of their own: the cases above keep theirs). Advantages with two
# negative counted rows, so that the off-policy mask drops one (row 1: mean KL 0.26 from the old
# log-probs, 0.3 from the engine's) and keeps the other (row 2: 0.017 / 0.05, one token unscored = NaN).
gen_m = torch.Generator().manual_seed(2)
m_adv = f32(torch.tensor([0.9, -1.3, -0.45, -0.7], dtype=DT))
entropies = f32(torch.rand(B, T, dtype=DT, generator=gen_m) * 2.5 + 0.01)
sampling_logp = f32(logp + (torch.rand(B, T, dtype=DT, generator=gen_m) - 0.5) * 0.02)
sampling_logp[0] = f32(logp[0] + 0.8)  # A > 0: kept whatever its KL
sampling_logp[1, :5] = f32(logp[1, :5] + 0.3)
sampling_logp[2, :3] = f32(logp[2, :3] + 0.05)
sampling_logp[2, 1] = float("nan")
OFF_POLICY_THRESHOLD = 0.1
# a second process's counted entropies: the quantile's pool spans both processes
other_entropies = f32(torch.rand(11, dtype=DT, generator=gen_m) * 2.5 + 0.01)
m_is_ratio = f32(torch.exp((torch.rand(B, T, dtype=DT, generator=gen_m) - 0.5) * 0.3)) * mask + (1 - mask)


class PoolAccel(Accel):
    """gather() of the padded entropies (and only of them) appends the other process's, padded with
    TRL's sentinel; everything else is this process's alone."""

    def __init__(self, num_processes, other):
        super().__init__(num_processes)
        self.other = other
        self.padded = None

    def pad_across_processes(self, x, dim=0, pad_index=0):
        n = max(x.numel(), 0 if self.other is None else self.other.numel())
        self.padded = torch.cat([x, torch.full((n - x.numel(),), float(pad_index), dtype=x.dtype)])
        return self.padded

    def gather(self, x):
        if x is self.padded and self.other is not None:
            o = self.other.to(x.dtype)
            n = x.numel()
            o = torch.cat([o, torch.full((n - o.numel(),), -1e9, dtype=x.dtype)]) if o.numel() < n else o
            return torch.cat([x, o])
        return x


def make_mask_trainer(loss_type, level, beta, gas, *, off_policy=None, top_q=1.0, bias_kl=True, coef=0.0,
                      adaptive=None, with_is=False, other=None):
    tr = object.__new__(GRPOTrainer)
    ad = adaptive or {}
    tr.args = SimpleNamespace(delta=None, use_bias_correction_kl=bias_kl, steps_per_generation=gas,
                              entropy_target=ad.get("target", 0.2), entropy_coef_delta=ad.get("delta", 0.005),
                              entropy_coef_min=ad.get("min", 0.0), entropy_coef_max=ad.get("max", 1.0),
                              **SAPO, **VESPO)
    tr.beta = beta
    tr.epsilon_low = EPS_LOW
    tr.epsilon_high = CISPO_EPS_HIGH if loss_type == "cispo" else EPS_HIGH
    tr.loss_type = loss_type
    tr.importance_sampling_level = level
    tr.max_completion_length = MAX_COMPLETION_LENGTH
    tr.current_gradient_accumulation_steps = gas
    tr.accelerator = PoolAccel(1, other)
    tr._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
    tr.model = SimpleNamespace(training=True)
    tr.top_entropy_quantile = top_q
    tr.off_policy_mask_threshold = off_policy
    tr.use_vllm = with_is
    tr.vllm_importance_sampling_correction = with_is
    tr.aux_loss_enabled = False
    tr.entropy_coef = coef
    tr.use_adaptive_entropy = adaptive is not None
    tr._entropy_bonus_enabled = coef != 0.0 or adaptive is not None
    tr._last_world_entropy = float("inf")
    tr._entropy_window_stats = None
    return tr


def call_trl(tr, ent, *, with_old=True, with_sampling=True, with_is=False, adv=None):
    lp = logp.clone().requires_grad_(True)
    en = ent.clone().requires_grad_(True)
    tr._get_per_token_logps_and_entropies = lambda *a, **kw: (lp, en, None)
    inputs = {
        "prompt_ids": torch.zeros(B, 2, dtype=torch.long),
        "prompt_mask": torch.ones(B, 2, dtype=torch.long),
        "completion_ids": torch.zeros(B, T, dtype=torch.long),
        "completion_mask": mask.clone(),
        "advantages": (m_adv if adv is None else adv).clone(),
        "num_items_in_batch": mask.sum(),
    }
    if with_old:
        inputs["old_per_token_logps"] = old_logp.clone()
    if with_sampling:
        inputs["sampling_per_token_logps"] = sampling_logp.clone()
    if tr.beta != 0.0:
        inputs["ref_per_token_logps"] = ref_logp.clone()
    if with_is:
        inputs["importance_sampling_ratio"] = m_is_ratio.clone()
    loss = GRPOTrainer._compute_loss(tr, None, inputs)
    loss.backward()
    m = tr._metrics["train"]
    ent_mask = None
    if tr.top_entropy_quantile < 1.0:
        ent_mask = GRPOTrainer.get_high_entropy_mask(tr, ent, mask, 1 - tr.top_entropy_quantile).to(DT)

    def last(key):
        return m[key][-1] if key in m else None

    return {
        "loss": float(loss.detach()),
        "dlogp": as_list(lp.grad),
        "dentropy": as_list(en.grad) if en.grad is not None else [0.0] * (B * T),
        "entropy_mask": as_list(ent_mask) if ent_mask is not None else None,
        "clip_ratio_low": last("clip_ratio/low_mean") or 0.0,
        "clip_ratio_high": last("clip_ratio/high_mean") or 0.0,
        "clip_ratio_region": last("clip_ratio/region_mean") or 0.0,
        "cispo_clip_ratio": last("cispo_clip_ratio") or 0.0,
        "vespo_phi_seq_mean": last("vespo/phi_seq_mean") or 0.0,
        "kl": last("kl") or 0.0,
        "entropy": last("entropy"),
        "policy_loss": last("policy_loss"),
        "entropy_coef": last("entropy_coef"),
    }


mask_cases = []


def mask_case(name, loss_type, level, beta, gas, *, with_old=True, with_sampling=True, with_is=False, other=None,
              **kw):
    tr = make_mask_trainer(loss_type, level, beta, gas, with_is=with_is, other=other, **kw)
    r = call_trl(tr, entropies, with_old=with_old, with_sampling=with_sampling, with_is=with_is)
    num_items = float(mask.sum().clamp(min=1.0))  # one process, steps_per_generation = gas
    r.update({"name": name, "loss_type": loss_type, "level": level, "beta": beta, "gas": gas,
              "with_old": with_old, "with_sampling": with_sampling, "with_is": with_is,
              "with_other": other is not None, "epsilon_high": tr.epsilon_high, "num_items_in_batch": num_items,
              "off_policy": kw.get("off_policy"), "top_entropy_quantile": kw.get("top_q", 1.0),
              "bias_kl": kw.get("bias_kl", True), "entropy_coef": kw.get("coef", 0.0)})
    mask_cases.append(r)


ALL_LOSSES = ["grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo"]
for li, lt in enumerate(ALL_LOSSES):
    for level in ["token", "sequence"]:
        mask_case(f"off_policy/{lt}/{level}", lt, level, 0.04, 1 + li % 2, off_policy=OFF_POLICY_THRESHOLD)
# the old log-probs as TRL's fallback (no engine log-probs), and none at all (every row kept)
mask_case("off_policy/grpo/token/old", "grpo", "token", 0.0, 1, with_sampling=False, off_policy=OFF_POLICY_THRESHOLD)
mask_case("off_policy/grpo/token/noold", "grpo", "token", 0.0, 1, with_old=False, with_sampling=False,
          off_policy=OFF_POLICY_THRESHOLD)
mask_case("off_policy/dapo/token/is", "dapo", "token", 0.04, 2, with_is=True, off_policy=OFF_POLICY_THRESHOLD)
for q in [0.0, 0.2, 0.5]:
    for lt in ["grpo", "dapo", "cispo"]:
        mask_case(f"entropy_mask/q={q:g}/{lt}", lt, "token", 0.04, 2, top_q=q)
    mask_case(f"entropy_mask/q={q:g}/grpo/sequence/2proc", "grpo", "sequence", 0.0, 1, top_q=q,
              other=other_entropies)
mask_case("entropy_mask/q=0.3/luspo/is/off_policy", "luspo", "token", 0.04, 1, top_q=0.3, with_is=True,
          off_policy=OFF_POLICY_THRESHOLD)
for level in ["token", "sequence"]:
    for lt in ["grpo", "dapo", "cispo"]:
        for with_old in [False, True]:
            mask_case(f"kl_no_bias_correction/{lt}/{level}/{'old' if with_old else 'noold'}", lt, level, 0.04,
                      2, with_old=with_old, bias_kl=False)
for lt in ["grpo", "bnpo", "dapo", "vespo"]:
    mask_case(f"entropy_bonus/{lt}", lt, "token", 0.04, 2, coef=0.03)
mask_case("entropy_bonus/grpo/entropy_mask/2proc", "grpo", "token", 0.0, 2, coef=0.03, top_q=0.4,
          other=other_entropies)
assert any(c["entropy_mask"] and 0 < sum(c["entropy_mask"]) < float(mask.sum()) for c in mask_cases)
# the off-policy mask must drop something (row 1) and keep a negative row (row 2)
ref_grpo = run_trl("grpo", "token", 0.04, True, 1, None)
assert mask_cases[0]["loss"] != ref_grpo["loss"]

# The adaptive controller over five optimizer steps of two micro-batches: the entropies scaled per call
# so that the window's world entropy crosses the target both ways.
ADAPTIVE = dict(target=1.0, delta=0.015, min=0.01, max=0.05)
adaptive_scales = [0.5, 0.6, 0.5, 0.6, 1.2, 1.1, 1.2, 1.3, 0.4, 0.3]
tr = make_mask_trainer("grpo", "token", 0.0, 2, coef=0.03, adaptive=ADAPTIVE)
adaptive_calls = []
for k, sc in enumerate(adaptive_scales):
    tr.accelerator.sync_gradients = k % 2 == 1
    r = call_trl(tr, f32(entropies * sc))
    r.update({"scale": sc, "sync": k % 2 == 1, "coef_after": tr.entropy_coef,
              # JSON has no infinity: null = TRL's initial inf
              "last_world_entropy_after": None if math.isinf(tr._last_world_entropy) else tr._last_world_entropy})
    adaptive_calls.append(r)
assert len({round(c["coef_after"], 9) for c in adaptive_calls}) >= 4  # moved both ways, and hit the cap

# ---------------------------------------------------------------- advantages
# The mirrored block, checked against the installed source.
src = inspect.getsource(GRPOTrainer._generate_and_score_completions)
for line in [
    "unscorable_mask = torch.isnan(rewards_per_func).all(dim=1)",
    "rewards = (rewards_per_func * self.reward_weights.to(device).unsqueeze(0)).nansum(dim=1)",
    "rewards[unscorable_mask] = torch.nan",
    "mean_grouped_rewards = torch.nanmean(rewards.view(-1, num_generations), dim=1)",
    "std_rewards = nanstd(rewards.view(-1, num_generations), dim=1)",
    "std_rewards = nanstd(rewards).expand_as(rewards)",
    "advantages = advantages / (std_rewards + 1e-4)",
    "advantages = torch.nan_to_num(advantages, nan=0.0)",
]:
    assert line in src, f"TRL's advantage code changed: {line!r} not found"


def trl_advantages(rewards_per_func, reward_weights, num_generations, scale_rewards):
    """Line by line GRPOTrainer._generate_and_score_completions, sum_then_normalize."""
    unscorable_mask = torch.isnan(rewards_per_func).all(dim=1)
    rewards = (rewards_per_func * reward_weights.unsqueeze(0)).nansum(dim=1)
    rewards[unscorable_mask] = torch.nan
    mean_grouped_rewards = torch.nanmean(rewards.view(-1, num_generations), dim=1)
    mean_grouped_rewards = mean_grouped_rewards.repeat_interleave(num_generations, dim=0)
    if scale_rewards in ["group", "none"]:
        if num_generations > 1:
            std_rewards = nanstd(rewards.view(-1, num_generations), dim=1)
            std_rewards = std_rewards.repeat_interleave(num_generations, dim=0)
        else:
            std_rewards = torch.zeros_like(rewards)
    elif scale_rewards == "batch":
        if rewards.numel() > 1:
            std_rewards = nanstd(rewards).expand_as(rewards)
        else:
            std_rewards = torch.zeros_like(rewards)
    advantages = rewards - mean_grouped_rewards
    if scale_rewards != "none":
        advantages = advantages / (std_rewards + 1e-4)
    is_std_zero = torch.isclose(std_rewards, torch.zeros_like(std_rewards))
    advantages = torch.nan_to_num(advantages, nan=0.0)
    return rewards, advantages, std_rewards[::num_generations], is_std_zero.float().mean()


for line in [
    "grouped = rewards_per_func.view(-1, num_generations, len(self.reward_funcs))",
    "mean_k = torch.nanmean(grouped, dim=1, keepdim=True)",
    "std_k = nanstd(grouped, dim=1, keepdim=True) if num_generations > 1 else torch.zeros_like(mean_k)",
    "reward_k = (grouped - mean_k) / (std_k + 1e-4)",
    "rewards = (reward_k * self.reward_weights.to(device).unsqueeze(0)).nansum(dim=1)",
    "std_rewards = nanstd(rewards).expand_as(rewards) if rewards.numel() > 1 else torch.zeros_like(rewards)",
    "advantages = (rewards - torch.nanmean(rewards)) / (std_rewards + 1e-4)",
]:
    assert line in src, f"TRL's normalize_then_sum code changed: {line!r} not found"


def trl_advantages_normalize_then_sum(rewards_per_func, reward_weights, num_generations):
    """Line by line GRPOTrainer._generate_and_score_completions, normalize_then_sum (GDPO). Returns the
    logged reward (the weighted sum of the raw rewards, as TRL logs it in both modes), the advantages, the
    batch std once per group (what frac_reward_zero_std reads) and frac_reward_zero_std."""
    n_funcs = rewards_per_func.shape[1]
    unscorable_mask = torch.isnan(rewards_per_func).all(dim=1)
    grouped = rewards_per_func.view(-1, num_generations, n_funcs)
    mean_k = torch.nanmean(grouped, dim=1, keepdim=True)
    std_k = nanstd(grouped, dim=1, keepdim=True) if num_generations > 1 else torch.zeros_like(mean_k)
    reward_k = (grouped - mean_k) / (std_k + 1e-4)
    reward_k = reward_k.view(-1, n_funcs)
    rewards = (reward_k * reward_weights.unsqueeze(0)).nansum(dim=1)
    rewards[unscorable_mask] = torch.nan
    std_rewards = nanstd(rewards).expand_as(rewards) if rewards.numel() > 1 else torch.zeros_like(rewards)
    advantages = (rewards - torch.nanmean(rewards)) / (std_rewards + 1e-4)
    is_std_zero = torch.isclose(std_rewards, torch.zeros_like(std_rewards))
    advantages = torch.nan_to_num(advantages, nan=0.0)
    logged = (rewards_per_func * reward_weights.unsqueeze(0)).nansum(dim=1)
    logged[unscorable_mask] = torch.nan
    return logged, advantages, std_rewards[::num_generations], is_std_zero.float().mean()


adv_cases = []
N_GEN, N_GROUPS, N_FUNCS = 4, 3, 2
per_func = f32(torch.randn(N_GEN * N_GROUPS, N_FUNCS, dtype=DT))
per_func[1, 1] = float("nan")  # one function did not score this completion
per_func[5, :] = float("nan")  # unscorable: every function returned None
per_func[8:12, 0] = 0.5  # a group whose rewards tie on function 0 ...
per_func[8:12, 1] = float("nan")  # ... and are NaN on function 1: zero std
weights_sets = {"w=1,1": [1.0, 1.0], "w=0.5,2": [0.5, 2.0]}


def no_nan(t):
    return [None if math.isnan(x) else x for x in as_list(t)]


def adv_case(name, scale, n_gen, w, result, **extra):
    rewards, adv, std, frac_zero = result
    return {"name": name, **extra, "scale_rewards": scale, "num_generations": n_gen, "weights": w,
            "n": N_GEN * N_GROUPS, "n_funcs": N_FUNCS, "per_func": no_nan(per_func), "rewards": no_nan(rewards),
            "advantages": as_list(adv), "std": no_nan(std), "frac_reward_zero_std": float(frac_zero)}


for wname, w in weights_sets.items():
    weights = torch.tensor(w, dtype=DT)
    for scale in ["group", "batch", "none"]:
        for n_gen in [N_GEN, 2]:
            adv_cases.append(adv_case(f"{scale}/{wname}/G={n_gen}", scale, n_gen, w,
                                      trl_advantages(per_func.clone(), weights, n_gen, scale)))
    for n_gen in [N_GEN, 2, 1]:  # scale_rewards does not apply to normalize_then_sum
        adv_cases.append(adv_case(f"normalize_then_sum/{wname}/G={n_gen}", "group", n_gen, w,
                                  trl_advantages_normalize_then_sum(per_func.clone(), weights, n_gen),
                                  aggregation="normalize_then_sum"))

out = {
    "trl_version": trl.__version__,
    "B": B, "T": T, "epsilon_low": EPS_LOW, "epsilon_high": EPS_HIGH,
    "max_completion_length": MAX_COMPLETION_LENGTH,
    "logp": as_list(logp), "old_logp": as_list(old_logp), "ref_logp": as_list(ref_logp),
    "mask": as_list(mask), "advantages": as_list(advantages), "is_ratio": as_list(is_ratio),
    **SAPO, **VESPO,
    "loss_cases": loss_cases,
    "mask_advantages": as_list(m_adv), "entropies": as_list(entropies),
    "sampling_logp": [None if math.isnan(x) else x for x in as_list(sampling_logp)],
    "other_entropies": as_list(other_entropies), "mask_is_ratio": as_list(m_is_ratio),
    "off_policy_mask_threshold": OFF_POLICY_THRESHOLD,
    "mask_cases": mask_cases,
    "adaptive": {**ADAPTIVE, "entropy_coef": 0.03, "gas": 2, "calls": adaptive_calls},
    "advantage_cases": adv_cases,
}
with open(OUT, "w") as f:
    json.dump(out, f, separators=(",", ":"))
    f.write("\n")
print(f"wrote {len(loss_cases)} loss cases, {len(mask_cases)} mask cases, {len(adaptive_calls)} adaptive calls and "
      f"{len(adv_cases)} advantage cases to {OUT}")
