"""rollout_worker.py — colt's worker for TRL 1.16's rollout_func (GRPOTrainer(rollout_func=...)).

Not a program to run by hand: colt embeds this text in its binary and starts

    python3 -c 'import json, sys; setup = json.loads(sys.stdin.readline()); exec(...)'

which reads this source from the first line of stdin, with the setup:

    {"source": ..., "function": {"file": PATH or null, "module": NAME or null, "function": NAME, "display": TEXT},
     "args": {GRPO settings: num_generations, max_completion_length, temperature, ...},
     "tokenizer": {"eos_token_id": N, "pad_token_id": N or null, "bos_token_id": ..., "eos_token": TEXT, ...}}

It imports the function and answers {"ok": true, "python": "3.11.7"} or {"error": "..."}. Then, one request at a
time (the worker is single-threaded; colt waits for the answer):

    {"id": 1, "op": "rollout", "prompts": [...]}  -> {"id": 1, "result": {"prompt_ids": ..., ...}}
                                                  or {"id": 1, "error": "raised ValueError: ..."}

While the function runs, the trainer object it was given asks colt for what only colt has, one line each,
and reads colt's answer (the next line) before going on:

    {"ask": 7, "op": "generate", "prompts": [[ids], ...], "n": 1, "max_tokens": N, "temperature": T, "top_p": P,
     "top_k": K, "min_p": M, "streams": [S, ...] or null}
        -> {"ask": 7, "completion_ids": [[...], ...], "logprobs": [[...], ...], "finish": ["stop" or "length", ...]}
    {"ask": 8, "op": "encode", "texts": [TEXT, ...], "add_special_tokens": bool}  -> {"ask": 8, "ids": [[...], ...]}
    {"ask": 9, "op": "decode", "ids": [[...], ...], "skip_special_tokens": bool}  -> {"ask": 9, "texts": [...]}
    {"ask": 10, "op": "chat_template", "conversations": [[messages], ...], "tools": [...] or null,
     "add_generation_prompt": bool, "kwargs": {...}}                              -> {"ask": 10, "texts": [...]}
    any ask colt cannot do -> {"ask": N, "error": "..."}: the trainer object raises RuntimeError with it

stdout carries only the protocol: the user's print() goes to stderr, stdin reads /dev/null.
Not a sandbox: the user's code runs with colt's permissions. Not TRL's trainer: only what rollout
functions use (args, num_generations, processing_class, generate, generate_rollout_completions).
"""
import asyncio
import importlib
import importlib.util
import inspect
import json
import os
import sys
import threading
import traceback
from types import SimpleNamespace

WORKER_FILE = "colt_rollout_worker.py"


def exception_line(exc):
    text = "".join(traceback.format_exception_only(type(exc), exc))
    return " ".join(line.strip() for line in text.splitlines() if line.strip()) or type(exc).__name__


def report(exc, what):
    """The traceback to stderr (colt forwards it), the last line for the reply."""
    te = traceback.TracebackException(type(exc), exc, exc.__traceback__)
    te.stack = traceback.StackSummary.from_list(
        [f for f in te.stack if f.filename != WORKER_FILE and not f.filename.startswith("<frozen importlib")])
    sys.stderr.write("%s:\n%s" % (what, "".join(te.format())))
    sys.stderr.flush()
    return exception_line(exc)


def load_function(spec):
    path = spec.get("file")
    if not path:
        module = importlib.import_module(spec["module"])
    else:
        folder = os.path.dirname(path)
        if folder not in sys.path:
            sys.path.insert(0, folder)
        stem = os.path.splitext(os.path.basename(path))[0]
        name = stem if stem.isidentifier() and stem not in sys.modules else "colt_rollout_module"
        module_spec = importlib.util.spec_from_file_location(name, path)
        if module_spec is None or module_spec.loader is None:
            raise ImportError("%s is not a Python source file" % path)
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[name] = module
        module_spec.loader.exec_module(module)
    name = spec["function"]
    if not hasattr(module, name):
        return None, "%s has no function '%s'" % (spec["display"], name)
    func = getattr(module, name)
    if not callable(func):
        return None, "'%s' in %s is not callable (it is of type %s)" % (name, spec["display"], type(func).__name__)
    return func, None


class Channel:
    """Asks colt, one line out and its answer in, while the rollout function runs."""

    def __init__(self, proto_in, proto_out):
        self.proto_in, self.proto_out, self.next = proto_in, proto_out, 0
        self.lock = threading.Lock()  # a function's threads ask one at a time: an answer is the next line

    def send(self, obj):
        self.proto_out.write(json.dumps(obj, ensure_ascii=True, allow_nan=False).encode("ascii") + b"\n")
        self.proto_out.flush()

    def ask(self, op, **fields):
        with self.lock:
            self.next += 1
            ask_id = self.next
            self.send({"ask": ask_id, "op": op, **fields})
            line = self.proto_in.readline()
        if not line:
            raise RuntimeError("colt closed the channel")
        answer = json.loads(line)
        if answer.get("ask") != ask_id:
            raise RuntimeError("colt answered ask %r, expected %d" % (answer.get("ask"), ask_id))
        if "error" in answer:
            raise RuntimeError("colt: %s" % answer["error"])
        return answer


def _plain(ids):
    """A list of ints from a list, tuple or tensor-like (tolist)."""
    if hasattr(ids, "tolist"):
        ids = ids.tolist()
    return [int(i) for i in ids]


class Encoding(dict):
    """transformers' BatchEncoding as far as rollout functions read it: enc["input_ids"] or enc.input_ids."""

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


class Tokenizer:
    """trainer.processing_class: colt's tokenizer and chat template, as the few tokenizer calls rollout
    functions make (apply_chat_template, encode, decode, batch_decode, __call__)."""

    def __init__(self, channel, info):
        self._channel = channel
        for key, value in info.items():
            setattr(self, key, value)

    def apply_chat_template(self, conversation, tools=None, add_generation_prompt=False, tokenize=True,
                            return_dict=True, continue_final_message=False, **kwargs):
        """transformers 5's: text with tokenize=False, else the ids, in an Encoding unless return_dict=False."""
        batched = bool(conversation) and isinstance(conversation[0], (list, tuple))
        conversations = [list(c) for c in conversation] if batched else [list(conversation)]
        if continue_final_message:
            raise NotImplementedError("apply_chat_template(continue_final_message=True) is not in colt")
        kwargs.pop("return_tensors", None)
        answer = self._channel.ask("chat_template", conversations=conversations, tools=tools,
                                   add_generation_prompt=bool(add_generation_prompt), kwargs=kwargs)
        texts = answer["texts"]
        if not tokenize:
            return texts if batched else texts[0]
        ids = self._channel.ask("encode", texts=texts, add_special_tokens=False)["ids"]
        if return_dict:
            return Encoding(input_ids=ids if batched else ids[0],
                            attention_mask=[[1] * len(i) for i in ids] if batched else [1] * len(ids[0]))
        return ids if batched else ids[0]

    def encode(self, text, add_special_tokens=True, **kwargs):
        return self._channel.ask("encode", texts=[text], add_special_tokens=bool(add_special_tokens))["ids"][0]

    def __call__(self, text, add_special_tokens=True, **kwargs):
        batched = isinstance(text, (list, tuple))
        ids = self._channel.ask("encode", texts=list(text) if batched else [text],
                                add_special_tokens=bool(add_special_tokens))["ids"]
        return Encoding(input_ids=ids if batched else ids[0],
                        attention_mask=[[1] * len(i) for i in ids] if batched else [1] * len(ids[0]))

    def batch_decode(self, sequences, skip_special_tokens=False, **kwargs):
        return self._channel.ask("decode", ids=[_plain(s) for s in sequences],
                                 skip_special_tokens=bool(skip_special_tokens))["texts"]

    def decode(self, token_ids, skip_special_tokens=False, **kwargs):
        return self.batch_decode([token_ids], skip_special_tokens=skip_special_tokens)[0]


class Trainer:
    """The `trainer` a rollout function gets: TRL's attributes that rollout functions read, and colt's
    engine on the trainer's current weights through generate()."""

    def __init__(self, channel, setup):
        self._channel = channel
        self.args = SimpleNamespace(**setup["args"])
        a = self.args
        self.num_generations = a.num_generations
        self.num_generations_eval = getattr(a, "num_generations_eval", None) or a.num_generations
        self.max_completion_length = a.max_completion_length
        self.temperature, self.top_p, self.top_k = a.temperature, a.top_p, a.top_k
        self.min_p, self.repetition_penalty = a.min_p, a.repetition_penalty
        self.processing_class = Tokenizer(channel, setup["tokenizer"])
        self.tokenizer = self.processing_class
        self.use_vllm = True  # colt's engine plays vLLM's part: TRL's helpers check this
        self.vllm_mode = a.vllm_mode
        self.state = SimpleNamespace(global_step=0)
        self.model = SimpleNamespace(training=True)

    def generate(self, prompt_ids, n=1, max_tokens=None, temperature=None, top_p=None, top_k=None, min_p=None,
                 streams=None):
        """Completes each prompt (a list of token ids) n times with colt's engine on the current weights.
        Returns {"prompt_ids", "completion_ids", "logprobs", "finish"}, n entries per prompt in order
        (prompt i's at i*n .. i*n+n-1); logprobs are the sampling log-probs of each token."""
        prompts = [_plain(p) for p in prompt_ids]
        answer = self._channel.ask("generate", prompts=prompts, n=int(n), max_tokens=max_tokens,
                                   temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p,
                                   streams=None if streams is None else [int(s) for s in streams])
        return {"prompt_ids": [p for p in prompts for _ in range(int(n))], "completion_ids": answer["completion_ids"],
                "logprobs": answer["logprobs"], "finish": answer["finish"]}

    def generate_rollout_completions(self, prompts, generation_overrides=None, as_chat=None):
        """TRL's trl.experimental.openenv.generate_rollout_completions: one completion per prompt (a text, or
        a list of messages rendered with the chat template), as dicts of prompt_ids, completion_ids,
        logprobs and text."""
        if not prompts:
            return []
        kw = dict(generation_overrides or {})
        if kw.pop("n", 1) != 1:
            raise ValueError("generate_rollout_completions expects n=1.")
        streams = kw.pop("streams", None)
        allowed = {"max_tokens", "temperature", "top_p", "top_k", "min_p"}
        unknown = sorted(set(kw) - allowed)
        if unknown:
            raise ValueError("generate_rollout_completions: colt's engine takes %s, not %s"
                             % (", ".join(sorted(allowed)), ", ".join(unknown)))
        if as_chat is None:
            as_chat = isinstance(prompts[0], (list, tuple))
        tok = self.processing_class
        if as_chat:
            ids = tok.apply_chat_template([list(p) for p in prompts], add_generation_prompt=True, tokenize=True,
                                          return_dict=False)
        else:
            ids = self._channel.ask("encode", texts=list(prompts), add_special_tokens=True)["ids"]
        out = self.generate(ids, n=1, streams=streams, **kw)
        texts = tok.batch_decode(out["completion_ids"], skip_special_tokens=True)
        return [{"prompt_ids": p, "completion_ids": c, "logprobs": lp, "text": t}
                for p, c, lp, t in zip(out["prompt_ids"], out["completion_ids"], out["logprobs"], texts)]


def generate_rollout_completions(trainer, prompts, *, generation_overrides=None, as_chat=None):
    """TRL's helper of this name, on colt's trainer object."""
    return trainer.generate_rollout_completions(prompts, generation_overrides=generation_overrides, as_chat=as_chat)


def no_nan(value):
    """NaN and infinities as None (JSON has none; TRL reads a None log-prob as NaN, as colt does)."""
    if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
        return None
    if isinstance(value, list):
        return [no_nan(v) for v in value]
    if isinstance(value, dict):
        return {k: no_nan(v) for k, v in value.items()}
    return value


def scalar(value):
    """json.dumps's default=: NumPy and torch scalars and arrays as plain numbers and lists."""
    if hasattr(value, "tolist"):
        return no_nan(value.tolist())
    if hasattr(value, "item"):
        return no_nan(value.item())
    raise TypeError("a value of type %s cannot be sent as JSON" % type(value).__name__)


def plain_result(output):
    """The function's dict as JSON: lists of lists of numbers (tensors and tuples too), other keys as given."""
    if not isinstance(output, dict):
        raise TypeError("rollout_func must return a dict, it returned %s" % type(output).__name__)
    result = {}
    for key, value in output.items():
        if not isinstance(key, str):
            raise TypeError("rollout_func returned a key of type %s; keys must be strings" % type(key).__name__)
        if hasattr(value, "tolist"):
            value = value.tolist()
        if isinstance(value, (list, tuple)):
            value = [v.tolist() if hasattr(v, "tolist") else list(v) if isinstance(v, tuple) else v for v in value]
        result[key] = no_nan(value)
    return result


def main(setup):
    proto_in = os.fdopen(os.dup(0), "rb")
    proto_out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    sys.stdout = sys.stderr
    sys.stdin = open(os.devnull)
    channel = Channel(proto_in, proto_out)

    # `from colt import generate_rollout_completions` works in the user's file whether or not colt's Python
    # package is installed: the installed one hands the call to this trainer object too.
    try:
        import colt  # noqa: F401
    except ImportError:
        shim = type(sys)("colt")
        shim.generate_rollout_completions = generate_rollout_completions
        sys.modules["colt"] = shim
    try:
        func, problem = load_function(setup["function"])
    except BaseException as exc:
        channel.send({"error": "loading rollout_func failed: " + report(exc, "loading rollout_func")})
        return
    if problem:
        channel.send({"error": problem})
        return
    trainer = Trainer(channel, setup)
    channel.send({"ok": True, "python": sys.version.split()[0]})
    for line in proto_in:
        request = json.loads(line)
        rid = request.get("id")
        if request.get("op") != "rollout":
            channel.send({"id": rid, "error": "unknown op %r" % (request.get("op"),)})
            continue
        trainer.state.global_step = request.get("global_step", 0)
        try:
            output = func(request["prompts"], trainer)
            if inspect.isawaitable(output):
                async def wait():
                    return await output
                output = asyncio.run(wait())
            result = plain_result(output)
        except BaseException as exc:
            channel.send({"id": rid, "error": "raised " + report(exc, "rollout_func raised")})
            continue
        try:
            line = json.dumps({"id": rid, "result": result}, ensure_ascii=True, allow_nan=False, default=scalar)
        except (TypeError, ValueError) as exc:
            line = json.dumps({"id": rid, "error": "returned what cannot be sent as JSON: "
                                                   + exception_line(exc)})
        proto_out.write(line.encode("ascii") + b"\n")
        proto_out.flush()


if __name__ == "__colt_rollout_worker__":
    main(setup)  # noqa: F821 — given by colt's bootstrap
