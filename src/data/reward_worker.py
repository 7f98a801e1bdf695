"""reward_worker.py — colt's worker for Python reward functions (TRL's signature).

Not a program to run by hand: colt embeds this text in its binary (CMake turns
it into a header) and starts

    python3 -c 'import json, sys; setup = json.loads(sys.stdin.readline()); exec(...)'

which reads this source from the first line of stdin, as {"source": ...,
"file": ..., "module": ...}, and runs it. It imports the user's file (or
module) once, answers {"ok": true, ...} or {"error": "..."}, then serves one
JSON line per request on its stdin and stdout until stdin closes:

    {"op": "check", "function": "reward_len"}
        -> {"name": "<its __name__>"} or {"error": "..."}
    {"op": "call", "function": "reward_len", "kwargs": {"prompts": [...], "completions": [...],
                                                      "completion_ids": [...], "<column>": [...]}}
        -> {"rewards": [float or null, ...]} or {"error": "<the exception's last line>"}

The function is called as TRL's GRPOTrainer calls it: reward_func(prompts=...,
completions=..., completion_ids=..., **columns). None or NaN in its result
becomes null (TRL's "no reward"); a result that is not a list of numbers, of
the wrong length, or with an infinity is an error. A traceback goes to stderr
in full, which colt forwards line by line prefixed "[reward <file>]".

stdout carries only the protocol: the user's print() and anything written to
file descriptor 1 go to stderr, and file descriptor 0 reads /dev/null.
Not a sandbox: the user's code runs with colt's permissions.
"""
import asyncio
import importlib
import importlib.util
import inspect
import json
import math
import os
import sys
import traceback


WORKER_FILE = "colt_reward_worker.py"  # the name colt's bootstrap compiles this text under


def exception_line(exc):
    """The traceback's last line ("ZeroDivisionError: division by zero"), on one
    line; a SyntaxError says where."""
    if isinstance(exc, SyntaxError) and exc.filename:
        return "%s: %s (%s, line %s)" % (type(exc).__name__, exc.msg, os.path.basename(exc.filename), exc.lineno)
    text = "".join(traceback.format_exception_only(type(exc), exc))
    return " ".join(line.strip() for line in text.splitlines() if line.strip()) or type(exc).__name__


def report(exc, what):
    """The traceback to stderr (colt forwards it) without this worker's frames
    and importlib's, the last line for the reply."""
    te = traceback.TracebackException(type(exc), exc, exc.__traceback__)
    te.stack = traceback.StackSummary.from_list(
        [f for f in te.stack if f.filename != WORKER_FILE and not f.filename.startswith("<frozen importlib")])
    sys.stderr.write("%s:\n%s" % (what, "".join(te.format())))
    sys.stderr.flush()
    return exception_line(exc)


def load_module(setup):
    """Imports the user's file as a module named after it (so its own imports of
    siblings work: its folder goes first on sys.path), or a dotted module name
    from sys.path, where the current directory comes first as for `python -c`."""
    path = setup.get("file")
    if not path:
        return importlib.import_module(setup["module"])
    folder = os.path.dirname(path)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    stem = os.path.splitext(os.path.basename(path))[0]
    name = stem if stem.isidentifier() and stem not in sys.modules else "colt_reward_module"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError("%s is not a Python source file" % path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def find_function(module, setup, name):
    """The callable `name` of the module, or an error text that says what is there."""
    where = setup["display"]
    if not hasattr(module, name):
        functions = sorted(k for k, v in vars(module).items()
                           if inspect.isfunction(v) and getattr(v, "__module__", None) == module.__name__
                           and not k.startswith("_"))
        listed = ", ".join(functions[:12]) + (", ..." if len(functions) > 12 else "")
        return None, "%s has no function '%s' (%s)" % (
            where, name, "it defines: " + listed if functions else "it defines no functions")
    func = getattr(module, name)
    if not callable(func):
        return None, "'%s' in %s is not callable (it is of type %s)" % (name, where, type(func).__name__)
    return func, None


async def await_result(awaitable):
    return await awaitable


def to_rewards(result, n):
    """A list of floats or None per completion, or an error text."""
    if isinstance(result, (str, bytes, dict)) or not hasattr(result, "__iter__"):
        return None, "returned %s, expected a list of %d numbers or None" % (type(result).__name__, n)
    values = list(result)
    if len(values) != n:
        return None, "returned %d rewards for %d completions (one per completion)" % (len(values), n)
    out = []
    for i, v in enumerate(values):
        if v is None:
            out.append(None)
            continue
        if isinstance(v, (str, bytes)) or not hasattr(v, "__float__"):
            text = repr(v)
            if len(text) > 40:
                text = text[:37] + "..."
            return None, "rewards[%d] is %s %s, expected a number or None" % (i, type(v).__name__, text)
        try:
            f = float(v)
        except (TypeError, ValueError) as exc:
            return None, "rewards[%d]: %s" % (i, exception_line(exc))
        if math.isnan(f):
            out.append(None)
        elif math.isinf(f):
            return None, "rewards[%d] is %s, not a finite number" % (i, f)
        else:
            out.append(f)
    return out, None


def main(setup):
    # The protocol keeps private copies of stdin and stdout; the user's code gets
    # /dev/null and stderr. Nothing is buffered in sys.stdin yet: colt sends the
    # next line only after the answer to the first.
    proto_in = os.fdopen(os.dup(0), "rb")
    proto_out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    sys.stdout = sys.stderr
    sys.stdin = open(os.devnull)

    def answer(obj):
        proto_out.write(json.dumps(obj, ensure_ascii=True, allow_nan=False).encode("ascii") + b"\n")
        proto_out.flush()

    try:
        module = load_module(setup)
    except BaseException as exc:  # SystemExit and KeyboardInterrupt at import are errors too
        answer({"error": "importing %s failed: %s" % (setup["display"], report(exc, "importing " + setup["display"]))})
        return
    answer({"ok": True, "python": sys.version.split()[0]})

    functions = {}
    for line in proto_in:
        request = json.loads(line)
        name = request["function"]
        if name not in functions:
            func, error = find_function(module, setup, name)
            if error:
                answer({"error": error})
                continue
            functions[name] = func
        func = functions[name]
        if request["op"] == "check":
            func_name = getattr(func, "__name__", None)
            answer({"name": func_name if isinstance(func_name, str) and func_name else name})
            continue
        kwargs = request["kwargs"]
        n = len(kwargs["completions"])
        try:
            result = func(**kwargs)
            if inspect.isawaitable(result):  # TRL also takes async reward functions
                result = asyncio.run(await_result(result))
        except BaseException as exc:
            answer({"error": report(exc, "reward function '%s' raised" % name)})
            continue
        rewards, error = to_rewards(result, n)
        answer({"error": error} if error else {"rewards": rewards})


if __name__ == "__colt_reward_worker__":
    main(setup)  # noqa: F821 — given by colt's bootstrap
