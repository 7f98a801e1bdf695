"""cpu_trl_grpo.py - TRL's GRPOTrainer on the CPU with the settings of a colt config (the demo's by
default), for bench/cpu_vs_trl.sh: same model, prompts, reward (a regex), hyperparameters, fp32,
use_cpu, no gradient checkpointing. Prints one JSON line: the seconds of every optimizer step and
their split (generation, the reference model's log-probs, the rest: training and optimizer).

Usage: python3 bench/cpu_trl_grpo.py MODEL_DIR DATASET_JSONL STEPS COMPLETIONS TOKENS PROMPTS_PER_STEP SEED
The reward is the demo's: 1 when the completion mentions "park" (case-insensitive), else 0.
For comparison only: colt never imports Python.
"""
import json
import re
import sys
import time

import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
from trl import GRPOConfig, GRPOTrainer

model_dir, data_path = sys.argv[1], sys.argv[2]
steps, completions, tokens, prompts_per_step, seed = (int(a) for a in sys.argv[3:8])
rows = [json.loads(line) for line in open(data_path)]
PARK = re.compile(r"\bpark\b", re.IGNORECASE)


def park(completions, **kwargs):
    texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
    return [1.0 if PARK.search(t) else 0.0 for t in texts]


class TimedGRPOTrainer(GRPOTrainer):
    """Adds up where each step goes: HF generate, and log-prob passes without gradients (the reference)."""

    phase = {"generation": 0.0, "logprobs": 0.0}

    def _generate_single_turn(self, *args, **kwargs):
        t0 = time.perf_counter()
        out = super()._generate_single_turn(*args, **kwargs)
        self.phase["generation"] += time.perf_counter() - t0
        return out

    def _get_per_token_logps_and_entropies(self, *args, **kwargs):
        if torch.is_grad_enabled():
            return super()._get_per_token_logps_and_entropies(*args, **kwargs)
        t0 = time.perf_counter()
        out = super()._get_per_token_logps_and_entropies(*args, **kwargs)
        self.phase["logprobs"] += time.perf_counter() - t0
        return out


class StepTimer(TrainerCallback):
    def __init__(self):
        self.steps = []

    def on_step_begin(self, args, state, control, **kwargs):
        TimedGRPOTrainer.phase.update(generation=0.0, logprobs=0.0)
        self.t0 = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        total = time.perf_counter() - self.t0
        p = TimedGRPOTrainer.phase
        self.steps.append({"step": total, "generation": p["generation"], "logprobs": p["logprobs"],
                           "training": total - p["generation"] - p["logprobs"]})


# The demo's settings (examples/demo.yaml), in TRL's names.
config = GRPOConfig(
    output_dir="/tmp/colt-bench-trl", use_cpu=True, bf16=False, fp16=False, gradient_checkpointing=False,
    num_generations=completions, per_device_train_batch_size=prompts_per_step * completions,
    gradient_accumulation_steps=1, max_completion_length=tokens, temperature=1.0, learning_rate=5e-4,
    lr_scheduler_type="constant_with_warmup", warmup_steps=5, max_grad_norm=1.0, loss_type="dapo", beta=0.1,
    epsilon=0.2, max_steps=steps, logging_steps=1, save_strategy="no", report_to=[], seed=seed,
    dataloader_num_workers=0)
model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
tokenizer = AutoTokenizer.from_pretrained(model_dir)
if tokenizer.pad_token is None:
    tokenizer.pad_token = tokenizer.eos_token
timer = StepTimer()
trainer = TimedGRPOTrainer(model=model, reward_funcs=park, args=config, train_dataset=Dataset.from_list(rows),
                           processing_class=tokenizer, callbacks=[timer])
t0 = time.perf_counter()
trainer.train()
rewards = [h["reward"] for h in trainer.state.log_history if "reward" in h]
print(json.dumps({"seconds": round(time.perf_counter() - t0, 2), "threads": torch.get_num_threads(),
                  "steps": [{k: round(v, 4) for k, v in s.items()} for s in timer.steps], "reward": rewards}))
