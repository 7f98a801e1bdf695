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

Then the same with TRL's dict of environments, environment_factory={"writer": WriterEnv, "count": CountEnv,
"writer2": WriterEnv, "mul": MulEnv} (examples/environments/counter.py) on examples/environments/mixed.jsonl, whose rows pick
their environment: each prompt rendered with its environment's tools alone, a call to another environment's
method answered "Tool big not found.", one reward column per class with get_reward (WriterEnv once for its two
names, CountEnv; None for the other classes' rollouts), the pool per name. Writes tests/data/agent/env_dict_goldens.json: the samples as above plus
each one's environment, TRL's tools/* metrics, and TRL's errors for a row naming an unknown environment and for
a dict without a dataset.

Usage: HF_HUB_OFFLINE=1 python3 tests/ref/make_env_goldens.py [--dict]   (torch CPU, transformers 5.24, trl 1.16;
--dict: only the dict's goldens)
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
OUT_DICT = os.path.join(ROOT, "tests", "data", "agent", "env_dict_goldens.json")
G = 2            # num_generations
BUDGET = 48      # max_completion_length


def load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def run(factory, rows, reward_funcs, out_path, extra=None):
    """TRL's _generate_and_score_completions on rows (each num_generations times); writes out_path."""
    torch.manual_seed(0)
    torch.set_num_threads(1)
    calc = load(os.path.join(ROOT, "tests", "data", "agent", "calc_tools.py"), "calc_tools")
    # as make_tool_model.py made it (AutoTokenizer would rebuild another pre-tokenizer)
    tok = PreTrainedTokenizerFast.from_pretrained(MODEL)
    model = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32)
    with tempfile.TemporaryDirectory() as tmp:
        args = GRPOConfig(output_dir=tmp, per_device_train_batch_size=len(rows) * G, num_generations=G,
                          max_completion_length=BUDGET, generation_kwargs={"do_sample": False}, use_cpu=True,
                          bf16=False, report_to=[], logging_steps=1, seed=0)
        trainer = GRPOTrainer(model=model, reward_funcs=reward_funcs, args=args,
                              train_dataset=Dataset.from_list(rows), processing_class=tok,
                              tools=[calc.add, calc.div, calc.slow], environment_factory=factory)
        inputs = [row for row in rows for _ in range(G)]  # TRL's RepeatSampler: each prompt num_generations times
        out = trainer._generate_and_score_completions(inputs)
    names = list(trainer._logs["rewards"].keys())
    samples = []
    for i in range(len(inputs)):
        prompt = out["prompt_ids"][i][out["prompt_mask"][i].bool()].tolist()
        n = int(out["completion_mask"][i].sum())
        completion = out["completion_ids"][i][:n].tolist()
        mask = out["tool_mask"][i][:n].tolist() if "tool_mask" in out else [1] * n
        rewards = {}
        for name in names:
            value = trainer._logs["rewards"][name][i]
            rewards[name] = None if value != value else value  # NaN (no reward) as null
        samples.append({"row": i // G, "prompt_ids": prompt, "completion_ids": completion, "tool_mask": mask,
                        "prompt": tok.decode(prompt), "messages": trainer._logs["completion"][i],
                        "rewards": rewards})
        if isinstance(factory, dict):
            samples[-1]["environment"] = inputs[i]["environment"]
        print(f"sample {i}: {tok.decode(prompt)[-30:]!r} -> {json.dumps(samples[-1]['messages'])} "
              f"rewards {samples[-1]['rewards']}")
    golden = {"num_generations": G, "max_completion_length": BUDGET, "reward_names": names, "samples": samples}
    mode = "train" if trainer.model.training else "eval"  # the mode TRL logged the round's metrics under
    golden["metrics"] = {k: v[-1] for k, v in trainer._metrics[mode].items() if k.startswith("tools/")}
    golden.update(extra or {})
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(golden, f, indent=1)
        f.write("\n")
    print(f"wrote {out_path}")


def trl_error(**kwargs):
    """The message of TRL's ValueError for these GRPOTrainer arguments (a tiny run that fails early)."""
    tok = PreTrainedTokenizerFast.from_pretrained(MODEL)
    model = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32)
    with tempfile.TemporaryDirectory() as tmp:
        args = GRPOConfig(output_dir=tmp, per_device_train_batch_size=G, num_generations=G, max_steps=1,
                          max_completion_length=BUDGET, use_cpu=True, bf16=False, report_to=[])
        rows = kwargs.pop("rows", None)
        try:
            trainer = GRPOTrainer(model=model, args=args, processing_class=tok,
                                  train_dataset=Dataset.from_list(rows) if rows else None, **kwargs)
            trainer._generate_and_score_completions([row for row in rows for _ in range(G)])
        except ValueError as exc:
            return str(exc)
    raise SystemExit("TRL accepted %r" % kwargs)


def main():
    writer = load(os.path.join(EXAMPLE, "writer.py"), "writer")
    if "--dict" not in sys.argv:
        with open(os.path.join(EXAMPLE, "writer.jsonl"), encoding="utf-8") as f:
            rows = [json.loads(line) for line in f]
        run(writer.WriterEnv, rows, [writer.says_the_sum], OUT)
    writer.WriterEnv.made = 0  # the instances are numbered anew, as in a fresh process
    counter = load(os.path.join(EXAMPLE, "counter.py"), "counter")
    with open(os.path.join(EXAMPLE, "mixed.jsonl"), encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    factory = {"writer": writer.WriterEnv, "count": counter.CountEnv, "writer2": writer.WriterEnv,
               "mul": counter.MulEnv}
    errors = {
        "unknown_environment": trl_error(rows=[dict(rows[0], environment="chess")], environment_factory=factory,
                                         reward_funcs=[writer.says_the_sum]),
        "dict_without_dataset": trl_error(rows=None, environment_factory=factory, reward_funcs=[writer.says_the_sum]),
    }
    writer.WriterEnv.made = 0
    run(factory, rows, [writer.says_the_sum], OUT_DICT, {"errors": errors})


if __name__ == "__main__":
    main()
