#!/usr/bin/env python3
"""make_trl_configs.py — tests/data/trl_configs/: TRL users' configs, made by
the installed trl itself, that test_trl_configs loads unchanged and trains on.

- grpo_config_use_cpu.json / .yaml: GRPOConfig(output_dir=..., use_cpu=True).to_dict()
  (every key TRL writes, its own defaults resolved by __post_init__), as JSON
  and as yaml.safe_dump writes it;
- grpo_config_bf16_false.json: the same with bf16=False, the other CPU form
  TRL accepts on a machine without a GPU;
- grpo_config_dapo.json, grpo_config_dr_grpo.json, grpo_config_gspo.json:
  the recipes GRPOConfig's own help recommends for DAPO (epsilon_high 0.28)
  and Dr. GRPO (loss dr_grpo, scale_rewards none), and GSPO's sequence-level
  ratios with epsilon 3e-4 / 4e-4 as TRL's paper index writes it (use_cpu=True
  added), dumped the same way;
- trl_grpo.yaml: a `trl grpo --config` file in the form of TRL's CLI docs
  (model_name_or_path, datasets, reward_funcs short names, output_dir) with the
  keys TRL users copy from recipes (logging_first_step, cosine_with_min_lr with
  min_lr_rate, save_strategy "no", null defaults). It is checked here by
  `trl grpo`'s own parser (TrlParser over GRPOScriptArguments, GRPOConfig,
  ModelConfig, DatasetMixtureConfig; unknown keys fail), so it is a file TRL runs;
- schedules.json: transformers' cosine_with_min_lr learning rates
  (get_scheduler with scheduler_specific_kwargs), per step, as TRL logs them;
- think_format.json: trl.rewards.think_format_reward on completions that probe
  its pattern (start anchor, a second <think>, newlines, case), which colt's
  think_format_reward (a regex reward) must give alike.

Run (from the repository root): python3 tests/ref/make_trl_configs.py
Needs: pip install trl transformers torch. Reference data only.
"""
import json
import os
import sys
import tempfile

import torch
import transformers
import trl
import yaml
from transformers import get_scheduler
from trl import DatasetMixtureConfig, GRPOConfig, ModelConfig, TrlParser
from trl.rewards import think_format_reward
from trl.scripts.grpo import GRPOScriptArguments

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "data", "trl_configs")

TRL_GRPO_YAML = """\
# A `trl grpo --config trl_grpo.yaml` file (trl %s, checked by trl grpo's parser in
# tests/ref/make_trl_configs.py). The dataset is local (datasets: json), as colt reads files.
model_name_or_path: Qwen/Qwen2-0.5B-Instruct
datasets:
  - path: json
    data_files: tests/data/trl_configs/prompts.jsonl
reward_funcs:
  - think_format_reward
  - accuracy_reward
output_dir: Qwen2-0.5B-GRPO
use_cpu: true
bf16: false
num_generations: 4
per_device_train_batch_size: 8
gradient_accumulation_steps: 1
max_completion_length: 16
learning_rate: 1.0e-4
lr_scheduler_type: cosine_with_min_lr
lr_scheduler_kwargs:
  min_lr_rate: 0.1
warmup_steps: 0
max_steps: 2
logging_strategy: steps
logging_steps: 10
logging_first_step: true
save_strategy: "no"
eval_strategy: "no"
eval_steps: null
min_p: null
ddp_bucket_cap_mb: null
gradient_checkpointing: true
gradient_checkpointing_kwargs:
  use_reentrant: false
generation_kwargs:
  top_k: 50
shuffle_dataset: false
report_to: none
seed: 42
"""


def check_trl_grpo_file(path):
    """Parses path as `trl grpo --config path` does; raises on any key TRL does not know."""
    parser = TrlParser((GRPOScriptArguments, GRPOConfig, ModelConfig, DatasetMixtureConfig))
    script, training, model, data = parser.parse_args_and_config(["--config", path], fail_with_unknown_args=True)
    assert script.reward_funcs == ["think_format_reward", "accuracy_reward"], script.reward_funcs
    assert training.lr_scheduler_type == "cosine_with_min_lr" and training.logging_first_step
    assert data.datasets[0].path == "json", data.datasets
    return training


def schedule(base_lr, total, warmup, kwargs):
    """The lr TRL logs after each optimizer step (transformers' scheduler.get_last_lr() after step())."""
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.AdamW([p], lr=base_lr)
    sched = get_scheduler("cosine_with_min_lr", opt, num_warmup_steps=warmup, num_training_steps=total,
                          scheduler_specific_kwargs=kwargs)
    used, logged = [], []
    for _ in range(total):
        used.append(sched.get_last_lr()[0])
        opt.step()
        sched.step()
        logged.append(sched.get_last_lr()[0])
    return {"base_lr": base_lr, "total": total, "warmup": warmup, "kwargs": kwargs, "used": used, "logged": logged}


def main():
    os.makedirs(OUT, exist_ok=True)
    dumps = {
        "grpo_config_use_cpu": dict(use_cpu=True),
        "grpo_config_bf16_false": dict(bf16=False),
        # the settings each paper's recipe changes (GRPOConfig's help; TRL's docs/source/paper_index.md for GSPO)
        "grpo_config_dapo": dict(use_cpu=True, loss_type="dapo", epsilon_high=0.28, mask_truncated_completions=True,
                                 beta=0.0),
        "grpo_config_dr_grpo": dict(use_cpu=True, loss_type="dr_grpo", scale_rewards="none", beta=0.0),
        "grpo_config_gspo": dict(use_cpu=True, importance_sampling_level="sequence", loss_type="grpo", beta=0.0,
                                 epsilon=3e-4, epsilon_high=4e-4, gradient_accumulation_steps=1,
                                 steps_per_generation=4),
    }
    for name, extra in dumps.items():
        d = GRPOConfig(output_dir="Qwen2-0.5B-GRPO", **extra).to_dict()
        with open(os.path.join(OUT, name + ".json"), "w") as f:
            json.dump(d, f, indent=1)
            f.write("\n")
        if name == "grpo_config_use_cpu":
            with open(os.path.join(OUT, name + ".yaml"), "w") as f:
                yaml.safe_dump(d, f, sort_keys=False)
        print(f"{name}: {len(d)} keys")
    text = TRL_GRPO_YAML % trl.__version__
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as tmp:
        tmp.write(text)
    try:
        check_trl_grpo_file(tmp.name)
    finally:
        os.unlink(tmp.name)
    with open(os.path.join(OUT, "trl_grpo.yaml"), "w") as f:
        f.write(text)
    schedules = [schedule(1e-4, 2, 0, {"min_lr_rate": 0.1}), schedule(3e-4, 10, 3, {"min_lr_rate": 0.25}),
                 schedule(1e-4, 7, 0, {"min_lr": 1e-5})]
    with open(os.path.join(OUT, "schedules.json"), "w") as f:
        json.dump({"versions": {"trl": trl.__version__, "transformers": transformers.__version__,
                                "torch": torch.__version__}, "schedules": schedules}, f, indent=1)
        f.write("\n")
    texts = ["<think>\nThis is my reasoning.\n</think>\nThis is my answer.",
             "<think>\nThis is my reasoning.\nThis is my answer.", "<think></think>", "<think>a</think>",
             "x<think>a</think>b", "\n<think>a</think>", "line one\n<think>a</think>\nanswer",
             "<think>a<think>b</think>c", "<think>a</think>\n<think>b</think>", "<THINK>a</THINK>",
             "<think>a</think>answer\n\nmore lines\n", " <think>a</think>", "plain text", "",
             "<think>multi\nline\nreasoning</think>", "<think>a</think><think>"]
    rewards = think_format_reward([[{"content": t}] for t in texts])
    with open(os.path.join(OUT, "think_format.json"), "w") as f:
        json.dump({"trl": trl.__version__, "cases": [{"completion": t, "reward": r} for t, r in zip(texts, rewards)]},
                  f, indent=1)
        f.write("\n")
    print(f"{OUT}: trl {trl.__version__}, transformers {transformers.__version__}")


if __name__ == "__main__":
    sys.exit(main())
