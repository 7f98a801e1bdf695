"""trl_grpo_bench.py - TRL's GRPOTrainer with HF generate on the same GPU as
bench_grpo.sh, in the issue's reference setting: 16 prompts x 8 completions x
256 tokens per optimizer step as 8 micro-batches of 16, gradient checkpointing,
beta 0, bf16. Prints the seconds of each optimizer step (generation included).

Usage: python3 bench/gpu/trl_grpo_bench.py MODEL_DIR PROMPTS_JSONL [steps] [micro_batch]
(MODEL_DIR: a `colt init` checkpoint with Qwen2.5's tokenizer; PROMPTS_JSONL:
{"prompt": [messages]} rows, as scripts/pack_device.sh writes them.) For
comparison only: colt never imports Python.
"""
import json
import sys
import time

import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
from trl import GRPOConfig, GRPOTrainer

model_dir, prompts_path = sys.argv[1], sys.argv[2]
steps = int(sys.argv[3]) if len(sys.argv) > 3 else 4
micro = int(sys.argv[4]) if len(sys.argv) > 4 else 16
gpu = torch.cuda.is_available()  # without one: a 1-step, 4-token smoke test of the script itself
rows = []
with open(prompts_path) as f:
    for line in f:
        rows.append(json.loads(line))
        if len(rows) >= 16 * (steps + 1):
            break


def has_digit(completions, **kwargs):
    texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
    return [1.0 if any(ch.isdigit() for ch in t) else 0.0 for t in texts]


class StepTimer(TrainerCallback):
    def __init__(self):
        self.times = []

    def on_step_begin(self, args, state, control, **kwargs):
        self.t0 = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        if gpu:
            torch.cuda.synchronize()
        self.times.append(time.perf_counter() - self.t0)


config = GRPOConfig(
    output_dir="/tmp/trl-grpo-bench", per_device_train_batch_size=micro, gradient_accumulation_steps=128 // micro,
    num_generations=8, max_completion_length=256 if gpu else 4, beta=0.0, learning_rate=1e-6, bf16=gpu,
    gradient_checkpointing=True, max_steps=steps, logging_steps=1, save_strategy="no", report_to=[],
    temperature=1.0, use_vllm=False, seed=1)
model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16 if gpu else torch.float32)
tokenizer = AutoTokenizer.from_pretrained(model_dir)
timer = StepTimer()
trainer = GRPOTrainer(model=model, reward_funcs=has_digit, args=config, train_dataset=Dataset.from_list(rows),
                      processing_class=tokenizer, callbacks=[timer])
trainer.train()
later = timer.times[1:] if len(timer.times) > 1 else timer.times
print(json.dumps({"model": model_dir, "micro_batch": micro, "step_seconds": [round(t, 3) for t in timer.times],
                  "mean_after_first": round(sum(later) / len(later), 3),
                  "peak_gb": round(torch.cuda.max_memory_allocated() / 2**30, 1) if gpu else 0}))
