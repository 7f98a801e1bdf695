"""trl_grpo.py - the learning race's TRL side (bench/gpu/learning_race.sh): TRL's GRPOTrainer on the same
model, data, rewards (bench/learning/rewards.py) and hyperparameters (the shared YAML, the one colt's config
is read from) as the colt runs, logging per optimizer step what colt's metrics.jsonl logs: step, seconds
since training started, mean reward and each reward function's.

Usage: python3 trl_grpo.py --hp race.yaml --model DIR --dataset TRAIN.jsonl --output_dir DIR --seed N
                           [--generation generate|cb] [--max_steps N] [--cpu]
Writes OUTPUT_DIR/metrics.jsonl (one line per step: step, wall_s, step_time, reward, reward_std,
rewards/<f>/mean, completions/mean_length, loss, ...; TRL's names as its logs carry them) and the final
model (save_model: a Hugging Face folder colt eval loads).

Wall clock: step_time is each optimizer step's own seconds (on_step_begin -> on_step_end, the GPU
synchronised first), generation included, as colt's step_time is; bench/learning/summarize.py takes the
running sum of step_time as the seconds since training started on both sides, so model loading, the trainer's
set-up and the logging between steps are left out alike. wall_s (on_train_begin -> the step's end) is kept
as a check.

Generation: --generation generate (default) is plain HF generate; the model is loaded in fp32 and bf16 runs
under autocast, so AdamW updates fp32 master weights, as colt's do. --generation cb turns on TRL 1.16's
use_transformers_continuous_batching (transformers' paged continuous batching; `use_transformers_paged` is its
deprecated alias); TRL then casts the policy to bf16 in place before each generation when bf16 is set, so the
run trains pure-bf16 weights from the first step on: faster generation, other numerics.
"""
import argparse
import json
import math
import os
import sys
import time

import torch
import yaml
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
from trl import GRPOConfig, GRPOTrainer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rewards  # noqa: E402

# Keys of the shared YAML that are colt's only (GRPOConfig lacks them); the rest go to GRPOConfig unchanged.
COLT_ONLY = {"deterministic", "log_completions_count", "max_rounds_without_reward"}


class RaceLog(TrainerCallback):
    """One metrics.jsonl line per optimizer step, with the wall clock since on_train_begin."""

    def __init__(self, path, gpu):
        self.path, self.gpu, self.pending = path, gpu, {}
        self.fp = open(path, "w")

    def _now(self):
        if self.gpu:
            torch.cuda.synchronize()
        return time.perf_counter()

    def on_train_begin(self, args, state, control, **kwargs):
        self.t0 = self._now()

    def on_step_begin(self, args, state, control, **kwargs):
        self.step_start = self._now()

    def on_step_end(self, args, state, control, **kwargs):
        now = self._now()
        self.pending = {"step": state.global_step, "wall_s": now - self.t0, "step_time": now - self.step_start}

    def on_log(self, args, state, control, logs=None, **kwargs):
        # logging_steps 1: transformers logs each step's metrics after on_step_end of that step
        if not self.pending or logs is None or "reward" not in logs:
            return
        line = {}
        for k, v in logs.items():
            if isinstance(v, (int, float)) and math.isfinite(v):
                line["trl/step_time" if k == "step_time" else k] = v  # TRL 1.16 logs its own step_time
        line.update(self.pending)
        self.fp.write(json.dumps(line) + "\n")
        self.fp.flush()
        self.pending = {}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hp", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--dataset", required=True)
    ap.add_argument("--output_dir", required=True)
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--generation", choices=["generate", "cb"], default="generate")
    ap.add_argument("--max_steps", type=int)
    ap.add_argument("--cpu", action="store_true", help="use_cpu, fp32 (the CPU smoke test)")
    a = ap.parse_args()

    with open(a.hp) as f:
        hp = yaml.safe_load(f)
    kw = {k: v for k, v in hp.items() if k not in COLT_ONLY}
    kw.update(output_dir=a.output_dir, seed=a.seed, logging_steps=1, save_strategy="no", report_to=[],
              use_vllm=False, use_transformers_continuous_batching=a.generation == "cb")
    if a.max_steps:
        kw["max_steps"] = a.max_steps
    gpu = torch.cuda.is_available() and not a.cpu
    if not gpu:
        kw.update(use_cpu=True, bf16=False)
    config = GRPOConfig(**kw)
    rows = [json.loads(l) for l in open(a.dataset) if l.strip()]
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(a.model)
    os.makedirs(a.output_dir, exist_ok=True)
    log = RaceLog(os.path.join(a.output_dir, "metrics.jsonl"), gpu)
    trainer = GRPOTrainer(model=model, reward_funcs=[rewards.correct, rewards.answer_format], args=config,
                          train_dataset=Dataset.from_list(rows), processing_class=tokenizer, callbacks=[log])
    t = time.perf_counter()
    trainer.train()
    train_s = time.perf_counter() - t
    trainer.save_model(a.output_dir)
    tokenizer.save_pretrained(a.output_dir)
    with open(os.path.join(a.output_dir, "race_run.json"), "w") as f:
        json.dump({"system": "trl", "generation": "continuous batching" if a.generation == "cb" else "HF generate",
                   "trl": __import__("trl").__version__, "transformers": __import__("transformers").__version__,
                   "torch": torch.__version__, "train_seconds": train_s, "seed": a.seed}, f)
    print(f"trl_grpo: {config.max_steps} steps in {train_s:.1f} s; model and metrics.jsonl in {a.output_dir}")


if __name__ == "__main__":
    main()
