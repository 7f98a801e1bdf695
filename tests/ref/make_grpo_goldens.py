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


adv_cases = []
N_GEN, N_GROUPS, N_FUNCS = 4, 3, 2
per_func = f32(torch.randn(N_GEN * N_GROUPS, N_FUNCS, dtype=DT))
per_func[1, 1] = float("nan")  # one function did not score this completion
per_func[5, :] = float("nan")  # unscorable: every function returned None
per_func[8:12, 0] = 0.5  # a group whose rewards tie on function 0 ...
per_func[8:12, 1] = float("nan")  # ... and are NaN on function 1: zero std
weights_sets = {"w=1,1": [1.0, 1.0], "w=0.5,2": [0.5, 2.0]}
for wname, w in weights_sets.items():
    for scale in ["group", "batch", "none"]:
        for n_gen in [N_GEN, 2]:
            rewards, adv, std, frac_zero = trl_advantages(per_func.clone(), torch.tensor(w, dtype=DT), n_gen, scale)
            adv_cases.append({
                "name": f"{scale}/{wname}/G={n_gen}",
                "scale_rewards": scale,
                "num_generations": n_gen,
                "weights": w,
                "n": N_GEN * N_GROUPS,
                "n_funcs": N_FUNCS,
                "per_func": [None if math.isnan(x) else x for x in as_list(per_func)],
                "rewards": [None if math.isnan(x) else x for x in as_list(rewards)],
                "advantages": as_list(adv),
                "std": [None if math.isnan(x) else x for x in as_list(std)],
                "frac_reward_zero_std": float(frac_zero),
            })

out = {
    "trl_version": trl.__version__,
    "B": B, "T": T, "epsilon_low": EPS_LOW, "epsilon_high": EPS_HIGH,
    "max_completion_length": MAX_COMPLETION_LENGTH,
    "logp": as_list(logp), "old_logp": as_list(old_logp), "ref_logp": as_list(ref_logp),
    "mask": as_list(mask), "advantages": as_list(advantages), "is_ratio": as_list(is_ratio),
    **SAPO, **VESPO,
    "loss_cases": loss_cases,
    "advantage_cases": adv_cases,
}
with open(OUT, "w") as f:
    json.dump(out, f, separators=(",", ":"))
    f.write("\n")
print(f"wrote {len(loss_cases)} loss cases and {len(adv_cases)} advantage cases to {OUT}")
