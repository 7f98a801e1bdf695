#!/usr/bin/env python3
"""make_env_goldens.py — TRL 1.16's own environment rollouts on the tiny tool model, for tests/test_agent_train.c.

Builds TRL's GRPOTrainer(environment_factory=WriterEnv) (examples/environments/writer.py) on
tests/data/models/tiny-tool-f32 with greedy generation (generation_kwargs do_sample False) and runs its own
_generate_and_score_completions on a batch of examples/environments/writer.jsonl's rows, each repeated
num_generations times as TRL's sampler repeats them: the environment pool, reset(**row) and its observation
appended to the prompt, the environment's method as each rollout's tool, the tool-call loop, and the rewards
(says_the_sum, which reads environments=[...], and the environment's get_reward, a reward named WriterEnv).
The standalone tools are add, div and slow of tests/data/agent/calc_tools.py (the environment's big follows them).

Writes tests/data/agent/env_goldens.json: per sample, its prompt ids (TRL's, padding removed), completion ids,
tool_mask, the completion's messages and each reward.

Usage: HF_HUB_OFFLINE=1 python3 tests/ref/make_env_goldens.py     (torch CPU, transformers 5.24, trl 1.16)
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
EXAMPLE = os.path.join(ROOT, "examples", "environments")
OUT = os.path.join(ROOT, "tests", "data", "agent", "env_goldens.json")
G = 2            # num_generations
BUDGET = 48      # max_completion_length


def load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def main():
    torch.manual_seed(0)
    torch.set_num_threads(1)
    writer = load(os.path.join(EXAMPLE, "writer.py"), "writer")
    calc = load(os.path.join(ROOT, "tests", "data", "agent", "calc_tools.py"), "calc_tools")
    with open(os.path.join(EXAMPLE, "writer.jsonl"), encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    # as make_tool_model.py made it (AutoTokenizer would rebuild another pre-tokenizer)
    tok = PreTrainedTokenizerFast.from_pretrained(MODEL)
    model = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32)
    with tempfile.TemporaryDirectory() as tmp:
        args = GRPOConfig(output_dir=tmp, per_device_train_batch_size=len(rows) * G, num_generations=G,
                          max_completion_length=BUDGET, generation_kwargs={"do_sample": False}, use_cpu=True,
                          bf16=False, report_to=[], logging_steps=1, seed=0)
        trainer = GRPOTrainer(model=model, reward_funcs=[writer.says_the_sum], args=args,
                              train_dataset=Dataset.from_list(rows), processing_class=tok,
                              tools=[calc.add, calc.div, calc.slow], environment_factory=writer.WriterEnv)
        inputs = [row for row in rows for _ in range(G)]  # TRL's RepeatSampler: each prompt num_generations times
        out = trainer._generate_and_score_completions(inputs)
    names = list(trainer._logs["rewards"].keys())
    samples = []
    for i in range(len(inputs)):
        prompt = out["prompt_ids"][i][out["prompt_mask"][i].bool()].tolist()
        n = int(out["completion_mask"][i].sum())
        completion = out["completion_ids"][i][:n].tolist()
        mask = out["tool_mask"][i][:n].tolist() if "tool_mask" in out else [1] * n
        samples.append({"row": i // G, "prompt_ids": prompt, "completion_ids": completion, "tool_mask": mask,
                        "prompt": tok.decode(prompt), "messages": trainer._logs["completion"][i],
                        "rewards": {name: trainer._logs["rewards"][name][i] for name in names}})
        print(f"sample {i}: {tok.decode(prompt)[-30:]!r} -> {json.dumps(samples[-1]['messages'])} "
              f"rewards {samples[-1]['rewards']}")
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump({"num_generations": G, "max_completion_length": BUDGET, "reward_names": names,
                   "samples": samples}, f, indent=1)
        f.write("\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
