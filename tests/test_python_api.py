"""test_python_api.py — the Python package (python/colt) as a TRL user runs it, against the built binary.

CTest runs it with PYTHONPATH=python and COLT_BINARY=<the build's colt> (CMakeLists.txt); by hand:
    PYTHONPATH=python COLT_BINARY=build/colt python3 tests/test_python_api.py

  - TRL's GRPO quickstart with only the import line changed (a local model folder, the demo's
    prompts through datasets.load_dataset when `datasets` is installed, else a list of dicts):
    it trains (the weights move) and saves;
  - notebook style: a reward closure over a Python object and a callable object with state run
    in this process; the mean each step logs as rewards/<name>/mean is the mean of exactly what
    they returned; callbacks get every logged step; a callback's should_training_stop ends the
    run early with a checkpoint;
  - a reward function that raises: train() raises with the exception's line, the run stops;
  - peft_config (PEFT's LoraConfig, or a stand-in of its fields without peft): PEFT files saved;
  - save_model(dir) copies the model and not the run's logs; refused arguments are one-line errors;
  - rollout_func as a file's function: it trains, its extra field reaches a reward running here.
Exits 1 on any failure, 77 when the built binary is missing.
"""
import json
import os
import shutil
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = os.path.join(ROOT, "models", "stories260K")
PROMPTS = os.path.join(ROOT, "examples", "data", "demo_train.jsonl")
SMALL = dict(max_steps=2, num_generations=4, per_device_train_batch_size=8, max_completion_length=12,
             logging_steps=1, save_steps=0, learning_rate=2e-3, log_completions_count=0, disable_tqdm=True)
failures = 0
checks = 0


def check(cond, what):
    global failures, checks
    checks += 1
    if not cond:
        failures += 1
        print("FAIL: " + what, flush=True)


def metrics(folder):
    with open(os.path.join(folder, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def weights(folder):
    with open(os.path.join(folder, "model.safetensors"), "rb") as f:
        return f.read()


def quickstart(tmp):
    """TRL's quickstart (docs: GRPO Trainer), the import line changed, local model and data."""
    try:
        from datasets import load_dataset
        dataset = load_dataset("json", data_files=PROMPTS, split="train")
        source = "datasets.Dataset"
    except ImportError:
        print("SKIPPED: datasets.load_dataset (datasets not installed): the quickstart runs on a list of dicts")
        with open(PROMPTS) as f:
            dataset = [json.loads(line) for line in f]
        source = "list of dicts"

    from colt import GRPOConfig, GRPOTrainer

    def reward_len(completions, **kwargs):
        return [-abs(20 - len(completion)) for completion in completions]

    training_args = GRPOConfig(output_dir=os.path.join(tmp, "Qwen2-0.5B-GRPO"), **SMALL)
    trainer = GRPOTrainer(model=MODEL, reward_funcs=reward_len, args=training_args, train_dataset=dataset)
    out = trainer.train()
    m = metrics(training_args.output_dir)
    moved = weights(training_args.output_dir) != weights(MODEL)
    print("quickstart (%s): %d steps logged, reward %s, weights moved: %s" % (source, len(m), m[-1].get("reward"), moved))
    check(out.global_step == 2 and len(m) == 2, "quickstart: %d steps, %d metric lines" % (out.global_step, len(m)))
    check("rewards/reward_len/mean" in m[0], "quickstart: no rewards/reward_len/mean in %s" % sorted(m[0]))
    check(moved, "quickstart: the saved weights equal the initial model's")


def notebook(tmp):
    from colt import GRPOConfig, GRPOTrainer

    class Tally:  # state the reward closure keeps in this process
        def __init__(self):
            self.returned = []

    tally = Tally()

    def park(completions, prompts, **kwargs):
        assert len(prompts) == len(completions)
        values = [1.0 if "park" in c else 0.0 for c in completions]
        tally.returned.append(values)
        return values

    class LengthScore:  # a callable object with state, named by its class as TRL does
        __name__ = "length_score"

        def __init__(self):
            self.calls = 0

        def __call__(self, completions, completion_ids, **kwargs):
            self.calls += 1
            return [len(ids) / 10 for ids in completion_ids]

    length_score = LengthScore()

    class Recorder:
        def __init__(self):
            self.logs, self.begun, self.ended = [], 0, 0

        def on_train_begin(self, args, state, control, **kwargs):
            self.begun += 1

        def on_log(self, args, state, control, logs=None, **kwargs):
            self.logs.append(logs)

        def on_train_end(self, args, state, control, **kwargs):
            self.ended += 1

    recorder = Recorder()
    with open(PROMPTS) as f:
        rows = [json.loads(line) for line in f][:32]
    args = GRPOConfig(output_dir=os.path.join(tmp, "notebook"), **dict(SMALL, max_steps=3))
    trainer = GRPOTrainer(model=MODEL, reward_funcs=[park, length_score], args=args, train_dataset=rows,
                          callbacks=[recorder])
    trainer.train()
    worst = 0.0
    for step, (values, logs) in enumerate(zip(tally.returned, recorder.logs)):
        worst = max(worst, abs(sum(values) / len(values) - logs["rewards/park/mean"]))
    print("notebook: %d calls of the closure, %d of the callable object, %d on_log; rewards/park/mean vs the "
          "closure's own values: max |diff| %.2g" % (len(tally.returned), length_score.calls, len(recorder.logs), worst))
    check(len(tally.returned) == 3 and length_score.calls == 3, "notebook: reward calls %d and %d, want 3 each" %
          (len(tally.returned), length_score.calls))
    check(len(recorder.logs) == 3 and recorder.begun == 1 and recorder.ended == 1,
          "notebook: callbacks saw %d logs, %d begins, %d ends" % (len(recorder.logs), recorder.begun, recorder.ended))
    check(len(recorder.logs) == 3 and worst < 1e-6, "notebook: logged reward means differ from the closure's by %g" % worst)
    check(all("rewards/length_score/mean" in logs for logs in recorder.logs), "notebook: no rewards/length_score/mean")

    # a callback that stops the run: colt finishes the step, saves a checkpoint and exits 0
    class StopAfterFirst:
        def on_log(self, args, state, control, logs=None, **kwargs):
            control.should_training_stop = True

    args = GRPOConfig(output_dir=os.path.join(tmp, "stopped"), **dict(SMALL, max_steps=50))
    out = GRPOTrainer(model=MODEL, reward_funcs=park, args=args, train_dataset=rows,
                      callbacks=[StopAfterFirst()]).train()
    saved = [d for d in os.listdir(args.output_dir) if d.startswith("checkpoint-")]
    print("should_training_stop after step 1: stopped at step %d of 50, %s" % (out.global_step, saved))
    check(1 <= out.global_step < 50 and saved, "should_training_stop: step %d, checkpoints %s" % (out.global_step, saved))


def errors(tmp):
    from colt import GRPOConfig, GRPOTrainer

    def divide(completions, **kwargs):
        return [len(c) / 0 for c in completions]

    args = GRPOConfig(output_dir=os.path.join(tmp, "raises"), **SMALL)
    try:
        GRPOTrainer(model=MODEL, reward_funcs=divide, args=args, train_dataset=PROMPTS).train()
        message = None
    except RuntimeError as exc:
        message = str(exc)
    print("a raising reward function: %s" % message)
    check(message is not None and "reward function 'divide' raised ZeroDivisionError: division by zero" in message,
          "raising reward: %s" % message)

    refused = [
        ("tools", lambda: GRPOTrainer(model=MODEL, reward_funcs=divide, train_dataset=PROMPTS, tools=[divide]),
         NotImplementedError, "tools"),
        ("a model object", lambda: GRPOTrainer(model=object(), reward_funcs=divide, train_dataset=PROMPTS),
         TypeError, "model folder"),
        ("a DatasetDict", lambda: GRPOTrainer(model=MODEL, reward_funcs=divide, args=GRPOConfig(output_dir=tmp),
                                              train_dataset={"train": []}).train(), TypeError, "one split"),
        ("a reward that is a number", lambda: GRPOTrainer(model=MODEL, reward_funcs=[3],
                                                          args=GRPOConfig(output_dir=tmp), train_dataset=PROMPTS).train(),
         TypeError, "reward_funcs[0]"),
    ]
    for what, call, kind, words in refused:
        try:
            call()
            got = None
        except Exception as exc:
            got = exc
        check(isinstance(got, kind) and words in str(got), "%s: got %r" % (what, got))
    print("refused: %s" % ", ".join(r[0] for r in refused))

    # tools reach colt's settings by the name its tool worker imports them by
    import json as json_module
    trainer = GRPOTrainer(model=MODEL, reward_funcs=divide, args=GRPOConfig(output_dir=tmp), train_dataset=PROMPTS,
                          tools=[json_module.dumps, "tools.py:add"])
    tools = trainer._settings(tmp).get("tools")
    check(tools == ["json.dumps", "tools.py:add"], "tools in the settings: %r" % (tools,))

    # an environment class too; with one, TRL passes environments=[...] to every reward function, so colt runs
    # them beside the environments in its tool worker, which imports them by name as well
    trainer = GRPOTrainer(model=MODEL, reward_funcs=[json_module.dumps], args=GRPOConfig(output_dir=tmp),
                          train_dataset=PROMPTS, environment_factory=json_module.JSONDecoder)
    settings, (specs, local) = trainer._settings(tmp), trainer._reward_specs()
    check(settings.get("environment_factory") == "json.decoder.JSONDecoder" and specs == ["json.dumps"] and not local,
          "environment_factory in the settings: %r, rewards %r" % (settings.get("environment_factory"), specs))
    # TRL's dict of environments goes to colt's settings as a mapping, in its order
    trainer = GRPOTrainer(model=MODEL, reward_funcs=[json_module.dumps], args=GRPOConfig(output_dir=tmp),
                          train_dataset=PROMPTS, environment_factory={"b": json_module.JSONDecoder,
                                                                      "a": "envs.py:MathEnv"})
    envs = trainer._settings(tmp).get("environment_factory")
    check(envs == {"b": "json.decoder.JSONDecoder", "a": "envs.py:MathEnv"} and list(envs) == ["b", "a"],
          "a dict environment_factory in the settings: %r" % (envs,))
    refused = [
        ("a dict of environments without a dataset",
         lambda: GRPOTrainer(model=MODEL, reward_funcs=divide, environment_factory={"a": json_module.JSONDecoder}),
         ValueError, "requires a `train_dataset` with an `environment` column"),
        ("a local reward with an environment",
         lambda: GRPOTrainer(model=MODEL, reward_funcs=divide, train_dataset=PROMPTS,
                             environment_factory=json_module.JSONDecoder)._reward_specs(),
         NotImplementedError, "reward_funcs[0]"),
    ]
    for what, call, kind, words in refused:
        try:
            call()
            got = None
        except Exception as exc:
            got = exc
        check(isinstance(got, kind) and words in str(got), "%s: got %r" % (what, got))
    print("environment_factory: %s; refused: %s" % (settings.get("environment_factory"),
                                                    ", ".join(r[0] for r in refused)))


def rollout_func(tmp):
    """rollout_func: a function in a file (TRL's rollout_func(prompts, trainer)) runs in colt's rollout worker;
    its extra field reaches a reward function that runs here; a function colt's worker cannot import is refused."""
    from colt import GRPOConfig, GRPOTrainer, generate_rollout_completions
    seen = []

    def turns_reward(completions, turns, **kwargs):
        seen.extend(turns)
        return [float(t) for t in turns]

    game = os.path.join(ROOT, "tests", "data", "rollout", "game_rollouts.py") + ":two_turn"
    args = GRPOConfig(output_dir=os.path.join(tmp, "rollout"), **dict(SMALL, max_steps=1, max_completion_length=16))
    GRPOTrainer(model=MODEL, reward_funcs=turns_reward, args=args, train_dataset=PROMPTS, rollout_func=game).train()
    logged = metrics(os.path.join(tmp, "rollout"))
    check(seen == [2] * 8 and logged and logged[0].get("rewards/turns_reward/mean") == 2.0,
          "rollout_func's extra field 'turns' in a local reward: %r, logged %r" % (
              seen, logged[0].get("rewards/turns_reward/mean") if logged else None))
    try:
        GRPOTrainer(model=MODEL, reward_funcs=turns_reward, train_dataset=PROMPTS, rollout_func=lambda p, t: {})
        got = None
    except Exception as exc:
        got = exc
    check(isinstance(got, NotImplementedError) and "rollout_func" in str(got), "a lambda rollout_func: %r" % got)
    try:
        generate_rollout_completions(object(), ["x"])
        got = None
    except Exception as exc:
        got = exc
    check(isinstance(got, TypeError), "generate_rollout_completions outside a rollout: %r" % got)
    print("rollout_func: %s trained one step, its extra field reached a local reward (%d completions); a lambda "
          "is refused" % (game.rsplit("/", 1)[-1], len(seen)))


def lora_and_save(tmp):
    from colt import GRPOConfig, GRPOTrainer
    try:
        from peft import LoraConfig
        which = "peft.LoraConfig"
    except ImportError:
        class LoraConfig:  # the fields GRPOTrainer reads, as PEFT names them
            def __init__(self, r=8, lora_alpha=8, lora_dropout=0.0, target_modules=None, use_rslora=False):
                self.r, self.lora_alpha, self.lora_dropout = r, lora_alpha, lora_dropout
                self.target_modules, self.use_rslora = target_modules, use_rslora
        which = "a stand-in with LoraConfig's fields (peft not installed)"

    args = GRPOConfig(output_dir=os.path.join(tmp, "lora"), **SMALL)
    trainer = GRPOTrainer(model=MODEL, reward_funcs=lambda completions, **kw: [len(c) / 50 for c in completions],
                          args=args, train_dataset=PROMPTS,
                          peft_config=LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"]))
    trainer.train()
    with open(os.path.join(args.output_dir, "adapter_config.json")) as f:
        adapter = json.load(f)
    print("peft_config (%s): adapter_config.json r=%s alpha=%s targets=%s" % (
        which, adapter.get("r"), adapter.get("lora_alpha"), adapter.get("target_modules")))
    check(adapter.get("r") == 4 and adapter.get("lora_alpha") == 8 and
          sorted(adapter.get("target_modules") or []) == ["q_proj", "v_proj"], "LoRA: adapter_config.json %s" % adapter)

    copy = os.path.join(tmp, "copy")
    trainer.save_model(copy)
    names = sorted(os.listdir(copy))
    print("save_model(dir): %s" % names)
    check("adapter_model.safetensors" in names and "metrics.jsonl" not in names, "save_model copied %s" % names)


def main():
    binary = os.environ.get("COLT_BINARY")
    if not binary or not os.access(binary, os.X_OK):
        print("SKIP: COLT_BINARY is not a built colt (%s)" % binary)
        return 77
    os.environ["COLT_BINARY"] = os.path.abspath(binary)  # the runs happen in a scratch folder
    tmp = tempfile.mkdtemp(prefix="colt_test_python_api_")
    os.chdir(tmp)
    try:
        quickstart(tmp)
        notebook(tmp)
        errors(tmp)
        rollout_func(tmp)
        lora_and_save(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("test_python_api: %d checks, %d failures" % (checks, failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
