#!/usr/bin/env python3
"""make_rollout_func_goldens.py — TRL 1.16's own round with a rollout_func, for tests/test_rollout_func.c.

Builds TRL's GRPOTrainer(rollout_func=fixed_game) (tests/data/rollout/fixed_rollouts.py, a teacher-forced two-turn
game with an env_mask and extra fields) on tests/data/models/tiny-tool-f32 and runs its own
_generate_and_score_completions on examples/environments/writer.jsonl's first rows, each repeated num_generations
times as TRL's sampler repeats them: the function gets TRL's prompts and trainer (its processing_class renders and
encodes), its env_mask becomes the tool mask, its extra fields reach the reward (guess_reward, which reads them
beside the dataset column a), and the advantages are TRL's group-normalized ones.

Writes tests/data/rollout/rollout_func_goldens.json: per sample, its prompt ids (padding removed), completion ids,
tool mask, reward and advantage.

Usage: HF_HUB_OFFLINE=1 python3 tests/ref/make_rollout_func_goldens.py     (torch CPU, transformers 5.24, trl 1.16)
"""
import importlib.util
import json
import os
import sys
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

import torch  # noqa: E402
from datasets import Dataset  # noqa: E402
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODEL = os.path.join(ROOT, "tests", "data", "models", "tiny-tool-f32")
DATA = os.path.join(ROOT, "tests", "data", "rollout")
ROWS = os.path.join(ROOT, "examples", "environments", "writer.jsonl")
OUT = os.path.join(DATA, "rollout_func_goldens.json")
G = 3            # num_generations
P = 4            # prompts: the first rows of writer.jsonl
BUDGET = 32      # max_completion_length


def load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def main():
    torch.manual_seed(0)
    rollouts = load(os.path.join(DATA, "fixed_rollouts.py"), "fixed_rollouts")
    rewards = load(os.path.join(DATA, "rollout_rewards.py"), "rollout_rewards")
    with open(ROWS, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f][:P]
    tok = PreTrainedTokenizerFast.from_pretrained(MODEL)  # as make_tool_model.py made it
    model = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32)
    with tempfile.TemporaryDirectory() as tmp:
        args = GRPOConfig(output_dir=tmp, per_device_train_batch_size=P * G, num_generations=G,
                          max_completion_length=BUDGET, use_cpu=True, bf16=False, report_to=[], logging_steps=1,
                          seed=0)
        trainer = GRPOTrainer(model=model, reward_funcs=[rewards.guess_reward], args=args,
                              train_dataset=Dataset.from_list(rows), processing_class=tok,
                              rollout_func=rollouts.fixed_game)
        inputs = [dict(row) for row in rows for _ in range(G)]  # TRL's RepeatSampler: each prompt G times
        out = trainer._generate_and_score_completions(inputs)
    samples = []
    for i in range(len(inputs)):
        prompt = out["prompt_ids"][i][out["prompt_mask"][i].bool()].tolist()
        n = int(out["completion_mask"][i].sum())
        samples.append({"row": i // G, "prompt_ids": prompt, "completion_ids": out["completion_ids"][i][:n].tolist(),
                        "tool_mask": out["tool_mask"][i][:n].tolist(),
                        "reward": trainer._logs["rewards"]["guess_reward"][i],
                        "advantage": float(out["advantages"][i])})
        print(f"sample {i}: {tok.decode(samples[-1]['completion_ids'])!r} mask {samples[-1]['tool_mask']} "
              f"reward {samples[-1]['reward']:.4f} advantage {samples[-1]['advantage']:.4f}")
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump({"num_generations": G, "prompts": P, "max_completion_length": BUDGET, "samples": samples}, f,
                  indent=1)
        f.write("\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
