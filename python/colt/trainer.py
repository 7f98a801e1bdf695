"""GRPOTrainer: TRL 1.16's GRPOTrainer signature, the run done by the `colt` binary.

train() writes the datasets (JSON Lines) and the settings (JSON) into a private
folder, starts `colt train --config` on them, and while it runs:
  - answers the reward functions given as Python objects: colt's reward worker
    calls colt._reward_bridge stand-ins, which send each call here over a Unix
    socket; the real function runs in this process, one call at a time;
  - forwards colt's output, reads output_dir/metrics.jsonl as colt appends it,
    moves a progress bar (tqdm, when installed) and calls the callbacks' on_log;
  - passes Ctrl-C on to colt, which finishes the step, saves a checkpoint and exits.
It computes nothing itself: the model, generation, losses and optimizer are colt's.
"""
import asyncio
import inspect
import json
import math
import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from types import SimpleNamespace

from .config import GRPOConfig

# What colt writes into output_dir besides the model (save_model copies the rest).
_RUN_FILES = {"metrics.jsonl", "completions.jsonl", "summary.json", "reward_curve.svg", "training_curves.svg",
              "serve.log", "trainer_state.json"}


def colt_binary():
    """The colt executable: $COLT_BINARY, else the one this package was built with, else `colt` on PATH."""
    path = os.environ.get("COLT_BINARY")
    if path:
        return path
    bundled = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin", "colt")
    if os.access(bundled, os.X_OK):
        return bundled
    found = shutil.which("colt")
    if found:
        return found
    raise FileNotFoundError("no colt binary: install this package with `pip install .` in colt's repository "
                            "(it builds one), or set COLT_BINARY to a built colt")


def _json_value(value):
    """json.dumps's default= for dataset cells: NumPy and torch scalars and arrays become plain values."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if hasattr(value, "item"):
        return value.item()
    raise TypeError("a dataset value of type %s cannot be written as JSON" % type(value).__name__)


def _dataset_rows(dataset, what):
    """A list of row dicts from a datasets.Dataset, a list of dicts or any iterable of them."""
    if hasattr(dataset, "keys") and hasattr(dataset, "values") and not hasattr(dataset, "column_names"):
        raise TypeError("%s is a dict (a DatasetDict?): pass one split, e.g. dataset['train']" % what)
    rows = dataset.to_list() if hasattr(dataset, "to_list") else list(dataset)
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise TypeError("%s[%d] is a %s, expected a dict with a 'prompt'" % (what, i, type(row).__name__))
    if not rows:
        raise ValueError("%s has no rows" % what)
    return rows


def _write_dataset(dataset, folder, name, what):
    """The path colt reads: the caller's own file, or the rows written as JSON Lines into folder."""
    if dataset is None:
        return None
    if isinstance(dataset, (str, os.PathLike)):
        return os.path.abspath(os.fspath(dataset))
    path = os.path.join(folder, name)
    with open(path, "w", encoding="utf-8") as f:
        for row in _dataset_rows(dataset, what):
            f.write(json.dumps(row, ensure_ascii=False, default=_json_value) + "\n")
    return path


def _peft_settings(peft_config):
    """A PEFT LoraConfig as colt's settings (TRL's ModelConfig names)."""
    if type(peft_config).__name__ != "LoraConfig" and not hasattr(peft_config, "lora_alpha"):
        raise TypeError("peft_config: colt trains LoRA adapters; got a %s" % type(peft_config).__name__)
    settings = {"use_peft": True}
    for ours, theirs in [("lora_r", "r"), ("lora_alpha", "lora_alpha"), ("lora_dropout", "lora_dropout"),
                         ("use_rslora", "use_rslora")]:
        value = getattr(peft_config, theirs, None)
        if value is not None:
            settings[ours] = value
    targets = getattr(peft_config, "target_modules", None)
    if targets is not None:
        settings["lora_target_modules"] = targets if isinstance(targets, str) else sorted(targets)
    for unsupported in ("modules_to_save", "layers_to_transform"):
        if getattr(peft_config, unsupported, None):
            raise ValueError("peft_config.%s: colt's LoRA does not support it" % unsupported)
    return settings


def _model_path(model):
    if isinstance(model, (str, os.PathLike)):
        return os.fspath(model)
    folder = getattr(model, "name_or_path", None)
    if isinstance(folder, str) and os.path.isdir(folder):
        print("colt: loading the model from %s (colt reads the folder, not the Python object)" % folder,
              file=sys.stderr)
        return folder
    raise TypeError("model: colt takes a Hugging Face model folder (a path); got a %s" % type(model).__name__)


def _plain_rewards(result):
    """The function's result as JSON values; colt's worker checks them (length, types, infinities)."""
    if inspect.isawaitable(result):
        result = asyncio.run(result)
    if isinstance(result, (str, bytes, dict)) or not hasattr(result, "__iter__"):
        return repr(result)  # the worker names what came back
    out = []
    for v in result:
        if v is None or isinstance(v, (bool, int, float)):
            out.append(None if isinstance(v, float) and math.isnan(v) else v)
        elif hasattr(v, "__float__") and not isinstance(v, (str, bytes)):
            f = float(v)
            out.append(None if math.isnan(f) else f)
        else:
            out.append(v if isinstance(v, str) else repr(v))
    return out


class _RewardServer:
    """Answers colt._reward_bridge's stand-ins on a Unix socket in a private folder."""

    def __init__(self, functions, folder):
        self.functions = functions
        self.path = os.path.join(folder, "rewards.sock")
        self.lock = threading.Lock()  # the user's functions run one call at a time, as in TRL
        self.error = None  # the last exception's line, for train()'s error
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(self.path)
        self.sock.listen(64)
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn):
        with conn, conn.makefile("rwb") as f:
            for line in f:
                request = json.loads(line)
                name = request["function"]
                try:
                    with self.lock:
                        reply = {"rewards": _plain_rewards(self.functions[name](**request["kwargs"]))}
                except Exception as exc:
                    print("colt: reward function '%s' raised:" % getattr(self.functions.get(name), "__name__", name),
                          file=sys.stderr)
                    traceback.print_exc()
                    last = "".join(traceback.format_exception_only(type(exc), exc)).strip().splitlines()
                    reply = {"error": last[-1] if last else type(exc).__name__}
                    self.error = "reward function '%s' raised %s" % (
                        getattr(self.functions.get(name), "__name__", name), reply["error"])
                f.write(json.dumps(reply).encode() + b"\n")
                f.flush()

    def close(self):
        try:
            self.sock.close()
        finally:
            if os.path.exists(self.path):
                os.unlink(self.path)


def _progress_bar(enabled):
    if not enabled:
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return None
    return tqdm(total=0, unit="step", dynamic_ncols=True)


def _tool_spec(tool, what, kind="function"):
    """colt's name for a tool, an environment class or a reward that reads environments: a string as given
    ("tools.py:add", "module.add"); a function or class by the module it is imported from, which colt's tool
    worker imports again (a tool's schema comes from its type hints and docstring there, as TRL's
    get_json_schema reads them)."""
    if isinstance(tool, str):
        return tool
    if not callable(tool):
        raise TypeError("%s is a %s: give a %s or a \"file.py:name\"" % (what, type(tool).__name__, kind))
    module, name = getattr(tool, "__module__", None), getattr(tool, "__qualname__", "")
    if not module or module == "__main__" or "." in name or "<" in name:
        raise NotImplementedError(
            "%s (%s): colt runs tools and environments in its own Python worker, which imports them: define the %s "
            "at the top level of a module (not the script you run) and pass it, or pass \"file.py:%s\""
            % (what, name or repr(tool), kind, getattr(tool, "__name__", kind)))
    return "%s.%s" % (module, name)


class GRPOTrainer:
    """GRPOTrainer(model, reward_funcs, args=None, train_dataset=None, eval_dataset=None,
    processing_class=None, reward_processing_classes=None, callbacks=None, optimizers=(None, None),
    peft_config=None, tools=None, rollout_func=None, environment_factory=None)

    model: a Hugging Face model folder. reward_funcs: a function, a list of them, or colt's
    reward specs ("rewards.py:f", {"type": "regex", ...}); functions run in this process.
    train_dataset / eval_dataset: a datasets.Dataset, a list of dicts, or a JSON Lines path.
    callbacks: objects with TRL's on_train_begin / on_log / on_train_end (args, state, control, **kw).
    """

    def __init__(self, model, reward_funcs, args=None, train_dataset=None, eval_dataset=None, processing_class=None,
                 reward_processing_classes=None, callbacks=None, optimizers=(None, None), peft_config=None,
                 tools=None, rollout_func=None, environment_factory=None):
        # TRL calls rollout_func(prompts, trainer): colt's rollout worker imports it by name and does the same
        self.rollout_func = _tool_spec(rollout_func, "rollout_func") if rollout_func else None
        self.tools = [_tool_spec(t, "tools[%d]" % i) for i, t in enumerate(tools or [])]
        # TRL calls the factory with no arguments: colt's tool worker imports the class and does the same.
        # A dict {name: factory} is TRL's several environments, each row's 'environment' picking one.
        if isinstance(environment_factory, dict):
            if not environment_factory:
                raise ValueError("environment_factory: the dict of environments is empty")
            self.environment_factory = {str(name): _tool_spec(f, "environment_factory[%r]" % (name,), "class")
                                        for name, f in environment_factory.items()}
            if train_dataset is None:  # TRL's words
                raise ValueError("A `dict` `environment_factory` (multiple environments) requires a `train_dataset` "
                                 "with an `environment` column to route each example to its environment. Provide a "
                                 "dataset, or pass a single environment factory.")
        else:
            self.environment_factory = (_tool_spec(environment_factory, "environment_factory", "class")
                                        if environment_factory else None)
        if optimizers is not None and any(o is not None for o in optimizers):
            raise NotImplementedError("optimizers: colt uses its own AdamW and schedule (set them in GRPOConfig)")
        if reward_processing_classes is not None:
            raise NotImplementedError("reward_processing_classes: colt scores each reward model (a folder in reward_funcs) "
                                      "with the tokenizer saved in its folder")
        if train_dataset is None:
            raise ValueError("train_dataset is required")
        self.model = _model_path(model)
        self.args = args if args is not None else GRPOConfig()
        self.train_dataset, self.eval_dataset = train_dataset, eval_dataset
        self.processing_class = processing_class  # colt reads the tokenizer from the model folder
        self.peft_config = peft_config
        self.callbacks = list(callbacks or [])
        funcs = reward_funcs if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]
        if reward_funcs is None:
            funcs = []
        if not funcs and not self.environment_factory:
            raise ValueError("reward_funcs: give at least one reward function")
        self.reward_funcs = list(funcs)
        self.state = SimpleNamespace(global_step=0, max_steps=0, epoch=0.0, log_history=[])

    def add_callback(self, callback):
        self.callbacks.append(callback)

    # ------------------------------------------------------------------ the run

    def _reward_specs(self):
        specs, functions = [], {}
        for i, f in enumerate(self.reward_funcs):
            if isinstance(f, (str, dict)):
                specs.append(f)  # colt's own reward specs
            elif callable(f) and self.environment_factory:
                # TRL passes environments=[...] to every reward: the instances live in colt's tool worker, so the
                # function runs there, imported by its module
                specs.append(_tool_spec(f, "reward_funcs[%d]" % i))
            elif callable(f):
                key = "reward_%d" % i
                functions[key] = f
                name = getattr(f, "__name__", None) or type(f).__name__
                specs.append({"type": "python", "module": "colt._reward_bridge", "function": key, "name": name,
                              "python": sys.executable})
            else:
                raise TypeError("reward_funcs[%d] is a %s: colt takes functions or reward specs" % (i, type(f).__name__))
        return specs, functions

    def _settings(self, folder):
        settings = self.args.to_dict()
        settings.pop("disable_tqdm", None)  # this side's progress bar, not colt's
        settings["model"] = self.model
        settings["dataset"] = _write_dataset(self.train_dataset, folder, "train.jsonl", "train_dataset")
        eval_path = _write_dataset(self.eval_dataset, folder, "eval.jsonl", "eval_dataset")
        if eval_path:
            settings["eval_dataset"] = eval_path
        if self.peft_config is not None:
            settings.update(_peft_settings(self.peft_config))
        settings["output_dir"] = os.path.abspath(settings["output_dir"])
        if self.tools:
            settings["tools"] = self.tools
        if self.environment_factory:
            settings["environment_factory"] = self.environment_factory
        if self.rollout_func:
            settings["rollout_func"] = self.rollout_func
        return settings

    def _call_callbacks(self, event, **kwargs):
        control = SimpleNamespace(should_training_stop=False, should_log=False, should_save=False)
        for cb in self.callbacks:
            method = getattr(cb, event, None)
            if method:
                method(self.args, self.state, control, **kwargs)
        return control

    def train(self, resume_from_checkpoint=None):
        """Runs colt train to the end; returns TrainOutput-like (global_step, training_loss, metrics)."""
        folder = tempfile.mkdtemp(prefix="colt_run_")  # 0700: the socket is ours alone
        server = None
        try:
            specs, functions = self._reward_specs()
            settings = self._settings(folder)
            settings["reward_funcs"] = specs
            if resume_from_checkpoint:
                settings["resume_from_checkpoint"] = resume_from_checkpoint
            config_path = os.path.join(folder, "config.json")
            with open(config_path, "w", encoding="utf-8") as f:
                json.dump(settings, f, indent=1)
            env = dict(os.environ)
            if functions:
                server = _RewardServer(functions, folder)
                env["COLT_REWARD_SOCKET"] = server.path
            if functions or self.rollout_func:  # colt's workers import this package (a rollout file may too)
                package_parent = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
                env["PYTHONPATH"] = os.pathsep.join(p for p in [package_parent, env.get("PYTHONPATH")] if p)
            try:
                return self._run([colt_binary(), "train", "--config", config_path], env, settings["output_dir"])
            except RuntimeError as exc:
                if server and server.error:  # the user's exception, not the stand-in's report of it
                    raise RuntimeError("colt train stopped: %s" % server.error) from exc
                raise
        finally:
            if server:
                server.close()
            shutil.rmtree(folder, ignore_errors=True)

    def _run(self, cmd, env, output_dir):
        metrics_path = os.path.join(output_dir, "metrics.jsonl")
        started = time.time()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True,
                                bufsize=1, errors="replace")
        lines = queue.Queue()

        def read_output():
            for line in proc.stdout:
                lines.put(line.rstrip("\n"))
            lines.put(None)

        threading.Thread(target=read_output, daemon=True).start()
        bar = _progress_bar(not self.args.disable_tqdm)
        say = bar.write if bar else print
        last_lines, offset, done, stopping = [], 0, False, False
        self._call_callbacks("on_train_begin")
        try:
            while not done:
                try:
                    line = lines.get(timeout=0.2)
                    while line is not None:
                        say(line)
                        last_lines = (last_lines + [line])[-20:]
                        steps = re.search(r"^colt train: .*?, \d+ prompts, (\d+) steps", line)
                        if steps:
                            self.state.max_steps = int(steps.group(1))
                            if bar:
                                bar.total = self.state.max_steps
                                bar.refresh()
                        line = lines.get_nowait()
                    done = True
                except queue.Empty:
                    pass
                offset, stop = self._read_metrics(metrics_path, offset, started, bar)
                if stop and not stopping:
                    stopping = True
                    proc.send_signal(signal.SIGINT)  # colt finishes the step, saves and exits
            proc.wait()
            self._read_metrics(metrics_path, offset, started, bar)
        except KeyboardInterrupt:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
            raise
        finally:
            if bar:
                bar.close()
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        self._call_callbacks("on_train_end")
        if proc.returncode != 0:
            errors = [l for l in last_lines if l.startswith("colt")] or last_lines or ["(no output)"]
            raise RuntimeError("colt train exited with status %d: %s" % (proc.returncode, errors[-1]))
        losses = [h["loss"] for h in self.state.log_history if isinstance(h.get("loss"), (int, float))]
        return SimpleNamespace(global_step=self.state.global_step,
                               training_loss=sum(losses) / len(losses) if losses else float("nan"),
                               metrics=self.state.log_history[-1] if self.state.log_history else {})

    def _read_metrics(self, path, offset, started, bar):
        """New lines of metrics.jsonl (this run's: written after it started) to the state and callbacks."""
        try:
            st = os.stat(path)
        except OSError:
            return offset, False
        if st.st_mtime < started - 1 or st.st_size <= offset:
            return (0 if st.st_size < offset else offset), False
        stop = False
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
        complete = data[:data.rfind(b"\n") + 1]
        for raw in complete.splitlines():
            try:
                logs = json.loads(raw)
            except ValueError:
                continue
            step = int(logs.get("step", self.state.global_step))
            if step <= self.state.global_step and self.state.log_history:
                continue
            if bar:
                bar.update(step - self.state.global_step)
            self.state.global_step = step
            self.state.epoch = logs.get("epoch", self.state.epoch)
            self.state.log_history.append(logs)
            control = self._call_callbacks("on_log", logs=logs)
            stop = stop or control.should_training_stop
        return offset + len(complete), stop

    def save_model(self, output_dir=None):
        """The final model is in args.output_dir (colt saves it there); another output_dir gets a copy."""
        source = os.path.abspath(self.args.output_dir)
        if output_dir is None or os.path.abspath(output_dir) == source:
            return
        if not os.path.isfile(os.path.join(source, "config.json")) and \
                not os.path.isfile(os.path.join(source, "adapter_config.json")):
            raise FileNotFoundError("save_model: %s has no saved model (train() first)" % source)
        os.makedirs(output_dir, exist_ok=True)
        for name in os.listdir(source):
            path = os.path.join(source, name)
            if os.path.isfile(path) and name not in _RUN_FILES:
                shutil.copy2(path, os.path.join(output_dir, name))
