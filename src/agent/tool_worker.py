"""tool_worker.py — colt's worker for Python tools and environments (TRL 1.16's
GRPOTrainer(tools=[...], environment_factory=...)).

Not a program to run by hand: colt embeds this text in its binary (CMake turns
it into a header) and starts

    python3 -c 'import json, sys; setup = json.loads(sys.stdin.readline()); exec(...)'

which reads this source from the first line of stdin, with the setup:

    {"source": ..., "tools": [{"file": PATH or null, "module": NAME or null, "function": NAME, "display": TEXT}],
     "environments": [{"name": NAME or null, "file": ..., "module": ..., "class": NAME, "display": TEXT}, ...]}

"environments" is empty without environment_factory, one entry named null for
TRL's single factory, one per name for TRL's dict {name: factory} (in the
dict's order). It imports the files or modules, makes each tool's JSON schema
as apply_chat_template does for a callable (transformers.utils.get_json_schema:
type hints and a Google-style docstring), probes one instance of each
environment as TRL does (it must define reset; its public functions other than
reset and get_reward, found on the class in name order, are tools), and answers

    {"ok": true, "python": "3.11.7", "tools": [schema, ...], "async_tools": [NAME, ...],
     "environments": [{"name": NAME or null, "class": NAME, "class_index": K, "methods": [NAME, ...],
                       "async_methods": [NAME, ...], "schemas": [schema, ...], "has_reward": bool}, ...]}
    or {"error": "..."}

class_index is the index of the first environment whose probe has the same
type: TRL gives each class with get_reward one reward column (two names of one
class share it).

Then it serves one JSON line per request until stdin closes. Every request
carries an "id" that its answer repeats, and answers come in the order they
finish, not the order asked: each request runs on its own thread (async tools
and async get_reward on one event loop thread, as TRL runs them).

    {"id": 1, "op": "call", "name": "calculator", "arguments": {...}, "env": 3 or null, "timeout": 1.0 or null}
        -> {"id": 1, "content": "12", "failed": false}
    {"id": 2, "op": "env_reset", "env": 3, "environment": 0, "row": {...}}
        (creates instance 3 of environments[0] if new, reusing a freed or probed instance of that environment;
         instances are made in the order of these requests; with named environments the row's "environment"
         column is not passed to reset, as in TRL)
        -> {"id": 2, "observation": null or "text" or [...], "environment": NAME or null}
    {"id": 3, "op": "env_reward", "env": 3}  -> {"id": 3, "reward": 1.0 or null}
    {"id": 4, "op": "env_free", "env": 3}    -> {"id": 4, "ok": true}   (the instance goes back to the pool)
    {"id": 5, "op": "reward", "function": {"file": ..., "module": ..., "function": NAME, "display": TEXT},
     "kwargs": {"prompts": [...], "completions": [...], ...}, "envs": [3, 4, null]}
        -> {"id": 5, "rewards": [1.0, null, 0.5]}   (TRL passes environments=[instances] to every reward
           function when there are environments; so such rewards run here, beside the instances. NaN, inf
           and None are null, TRL's "no reward")
    any op that cannot be done -> {"id": N, "error": "..."}; env_reward of an environment that does not exist
    (lost with a killed worker) also carries "worker_lost": true, as colt's own answers for requests a killed
    worker held do

A call is TRL's _tool_call_loop: the tools are the standalone ones plus, with
"env", that environment's methods, by __name__; the result the model sees is
str(result) (a list is passed through, as TRL does for multimodal results); a
tool that raises gives str({"error": str(e)}) with "failed": true, an unknown
name str({"error": f"Tool {name} not found."}). Beyond TRL (which has no time
limit): a call still running after "timeout" seconds is answered
str({"error": f"Tool {name} timed out after {timeout:g} s"}), "failed" and
"timed_out" true, and its thread is abandoned (Python cannot stop it); colt
kills the whole worker if even that answer does not come (a tool that holds
the interpreter). An async tool that raises when called, before it is
awaited (wrong arguments), is answered with "raised_on_call" true: TRL puts
that error among the sync tools' results, not after them.

stdout carries only the protocol: the user's print() and anything written to
file descriptor 1 go to stderr, and file descriptor 0 reads /dev/null.
Not a sandbox: the user's code runs with colt's permissions.
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

# transformers without PyTorch prints an advice when imported (get_json_schema is all the worker uses of it),
# which would land in colt's one-line errors
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

WORKER_FILE = "colt_tool_worker.py"  # the name colt's bootstrap compiles this text under


def exception_line(exc):
    """The traceback's last line, on one line."""
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


MODULES = {}


class SetupError(Exception):
    """A setup problem colt reports as is (no traceback)."""


def load_module(spec):
    """The user's file as a module named after it (its folder first on sys.path),
    or a dotted module name; each once."""
    key = ("file", spec["file"]) if spec.get("file") else ("module", spec["module"])
    if key in MODULES:
        return MODULES[key]
    path = spec.get("file")
    if not path:
        module = importlib.import_module(spec["module"])
    else:
        folder = os.path.dirname(path)
        if folder not in sys.path:
            sys.path.insert(0, folder)
        stem = os.path.splitext(os.path.basename(path))[0]
        name = stem if stem.isidentifier() and stem not in sys.modules else "colt_tool_module_%d" % len(MODULES)
        module_spec = importlib.util.spec_from_file_location(name, path)
        if module_spec is None or module_spec.loader is None:
            raise ImportError("%s is not a Python source file" % path)
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[name] = module
        try:
            module_spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[name]
            raise
    MODULES[key] = module
    return module


def find(module, spec, name, what):
    if not hasattr(module, name):
        raise SetupError("%s has no %s '%s'" % (spec["display"], what, name))
    value = getattr(module, name)
    if not callable(value):
        raise SetupError("'%s' in %s is not callable (it is of type %s)" % (name, spec["display"], type(value).__name__))
    return value


def environment_methods(instance):
    """TRL's tools of an environment: the functions of its class, in name order,
    that are public and neither reset nor get_reward, bound to the instance."""
    return [getattr(instance, n) for n, _ in inspect.getmembers(type(instance), predicate=inspect.isfunction)
            if n not in ("reset", "get_reward") and not n.startswith("_")]


class Worker:
    def __init__(self, setup, answer):
        self.answer_line = answer
        self.lock = threading.Lock()
        self.pending = set()
        # Everything that can fail without transformers first: importing it takes a second or two.
        specs = setup["tools"]
        self.tools = [find(load_module(spec), spec, spec["function"], "function") for spec in specs]
        self.environments = []  # per environment: name, factory, cls, info (the answer's entry), free instances
        self.envs = {}  # instance id -> (environment index, instance)
        for env_spec in setup.get("environments") or []:
            factory = find(load_module(env_spec), env_spec, env_spec["class"], "class")
            probe = factory()  # TRL probes one instance of each environment, then keeps it in that one's pool
            members = [n for n, _ in inspect.getmembers(type(probe), predicate=inspect.isfunction)]
            if "reset" not in members:
                raise SetupError("environment '%s' (%s) must define a method reset(self, **row), as TRL requires"
                                 % (env_spec["class"], env_spec["display"]))
            methods = environment_methods(probe)
            class_index = next((i for i, e in enumerate(self.environments) if e["cls"] is type(probe)),
                               len(self.environments))
            info = {"name": env_spec.get("name"), "class": type(probe).__name__, "class_index": class_index,
                    "methods": [m.__name__ for m in methods],
                    "async_methods": [m.__name__ for m in methods if inspect.iscoroutinefunction(m)],
                    "has_reward": "get_reward" in members}
            self.environments.append({"name": env_spec.get("name"), "factory": factory, "cls": type(probe),
                                      "spec": env_spec, "methods": methods, "info": info, "free": [probe]})

        from transformers.utils import get_json_schema  # apply_chat_template's own conversion

        self.schemas = []
        for func, spec in zip(self.tools, specs):
            try:
                self.schemas.append(get_json_schema(func))
            except Exception as exc:
                raise SetupError("tool '%s' (%s): its JSON schema cannot be made (%s); a tool needs type hints and "
                                 "a docstring with an Args: section" % (spec["function"], spec["display"],
                                                                        exception_line(exc))) from None
        for env in self.environments:
            schemas = []
            for m in env["methods"]:
                try:
                    schemas.append(get_json_schema(m))
                except Exception as exc:
                    raise SetupError("environment '%s' (%s): method %s is a tool, but its JSON schema cannot be made "
                                     "(%s); give it type hints and a docstring, or a name starting with _"
                                     % (env["spec"]["class"], env["spec"]["display"], m.__name__,
                                        exception_line(exc))) from None
            env["info"]["schemas"] = schemas
            del env["methods"]  # the probe's bound methods: the probe is in the pool, reset like any instance
        self.loop = None

    def event_loop(self):
        """One event loop on a daemon thread for every async tool, as TRL does."""
        if self.loop is None:
            self.loop = asyncio.new_event_loop()
            threading.Thread(target=self.loop.run_forever, daemon=True).start()
        return self.loop

    def answer(self, request_id, obj):
        """Answers a request once: a late answer after a timeout is dropped."""
        with self.lock:
            if request_id not in self.pending:
                return
            self.pending.discard(request_id)
            obj["id"] = request_id
            try:
                line = json.dumps(obj, ensure_ascii=True, allow_nan=False)
            except (TypeError, ValueError) as exc:
                line = json.dumps({"id": request_id, "error": "the answer cannot be sent as JSON: %s"
                                   % exception_line(exc)})
            self.answer_line(line)

    def tool_dicts(self, env):
        """TRL's per-rollout tool dicts: standalone tools plus the environment's methods, by __name__."""
        methods = environment_methods(self.envs[env][1]) if env is not None else []
        sync_tools, async_tools = {}, {}
        for tool in self.tools + methods:
            (async_tools if inspect.iscoroutinefunction(tool) else sync_tools)[tool.__name__] = tool
        return sync_tools, async_tools

    def call(self, request):
        rid, name, env = request["id"], request.get("name"), request.get("env")
        if env is not None and env not in self.envs:
            self.answer(rid, {"error": "environment %s does not exist (reset it first; a restarted worker has "
                                       "none)" % env})
            return
        timeout = request.get("timeout")
        timer, running = None, {}
        if timeout:
            def expire():
                text = str({"error": f"Tool {name} timed out after {timeout:g} s"})
                self.answer(rid, {"content": text, "failed": True, "timed_out": True})
                if "future" in running:  # an async tool can be cancelled; a thread cannot
                    running["future"].cancel()
            timer = threading.Timer(timeout, expire)
            timer.daemon = True
            timer.start()

        def done(result, failed, raised_on_call=False):
            if timer is not None:
                timer.cancel()
            # TRL: content = result if isinstance(result, list) else str(result). A list colt cannot send as
            # JSON (images, objects) goes as its str().
            if isinstance(result, list):
                try:
                    json.dumps(result, allow_nan=False)
                except (TypeError, ValueError):
                    result = str(result)
            answer = {"content": result if isinstance(result, list) else str(result), "failed": failed}
            if raised_on_call:
                answer["raised_on_call"] = True
            self.answer(rid, answer)

        sync_tools, async_tools = self.tool_dicts(env)
        arguments = request.get("arguments")
        try:
            if name in sync_tools:
                func = sync_tools[name]

                def run():
                    try:
                        result, failed = func(**arguments), False
                    except BaseException as exc:  # TRL catches Exception; a SystemExit here must not end the worker
                        result, failed = {"error": str(exc)}, True
                    done(result, failed)

                threading.Thread(target=run, daemon=True).start()
            elif name in async_tools:
                try:
                    coroutine = async_tools[name](**arguments)
                except Exception as e:  # TRL: caught in the call loop, appended with the sync results
                    done({"error": str(e)}, True, raised_on_call=True)
                    return

                async def gather():  # TRL: asyncio.gather(*coros, return_exceptions=True)
                    return (await asyncio.gather(coroutine, return_exceptions=True))[0]

                future = asyncio.run_coroutine_threadsafe(gather(), self.event_loop())
                running["future"] = future

                def finished(f):
                    try:
                        result = f.result()
                    except BaseException as exc:
                        result = exc
                    if isinstance(result, BaseException):
                        done({"error": str(result)}, True)
                    else:
                        done(result, False)

                future.add_done_callback(finished)
            else:
                raise ValueError(f"Tool {name} not found.")
        except Exception as e:
            done({"error": str(e)}, True)

    def env_op(self, request):
        rid, op, env = request["id"], request["op"], request.get("env")
        if not isinstance(env, int):
            self.answer(rid, {"error": "\"env\" must be an integer"})
            return
        if not self.environments:
            self.answer(rid, {"error": "no environment_factory was given"})
            return
        if op == "env_free":
            held = self.envs.pop(env, None)
            if held is not None:
                self.environments[held[0]]["free"].append(held[1])
            self.answer(rid, {"ok": True})
            return
        if op == "env_reward" and env not in self.envs:  # never reset, or lost with a killed worker
            self.answer(rid, {"error": "environment %s does not exist (reset it first)" % env, "worker_lost": True})
            return

        if op == "env_reset":
            index = request.get("environment", 0)
            if not isinstance(index, int) or not 0 <= index < len(self.environments):
                self.answer(rid, {"error": "\"environment\" must be an index below %d" % len(self.environments)})
                return
            held = self.envs.get(env)
            if held is not None and held[0] != index:  # the id now names another environment: give this one back
                self.environments[held[0]]["free"].append(self.envs.pop(env)[1])
            if env not in self.envs:
                # Made here, not on the request's thread, so instances are made in the order their resets are
                # asked for, as TRL's pool makes them in batch order (an environment may number its instances).
                spec = self.environments[index]
                try:
                    self.envs[env] = (index, spec["free"].pop(0) if spec["free"] else spec["factory"]())
                except BaseException as exc:
                    what = "%s()" % spec["info"]["class"]
                    self.answer(rid, {"error": "%s raised %s" % (what, report(exc, what + " raised"))})
                    return
        index, instance = self.envs[env]
        spec = self.environments[index]

        def run():
            try:
                if op == "env_reset":
                    row = request.get("row", {})
                    if spec["name"] is not None:  # TRL: a control field in multi-environment mode, not for reset
                        row = {k: v for k, v in row.items() if k != "environment"}
                    observation = instance.reset(**row)
                    self.answer(rid, {"observation": observation, "environment": spec["name"]})
                    return
                if not hasattr(instance, "get_reward"):
                    self.answer(rid, {"error": "the environment defines no get_reward"})
                    return
                if inspect.iscoroutinefunction(instance.get_reward):
                    reward = asyncio.run_coroutine_threadsafe(instance.get_reward(), self.event_loop()).result()
                else:
                    reward = instance.get_reward()
                self.answer(rid, {"reward": None if reward is None else float(reward)})
            except BaseException as exc:
                what = "%s.%s" % (spec["info"]["class"], "reset" if op == "env_reset" else "get_reward")
                self.answer(rid, {"error": "%s raised %s" % (what, report(exc, what + " raised"))})

        threading.Thread(target=run, daemon=True).start()

    def reward(self, request):
        """A reward function called as TRL calls it when environments exist: its
        columns plus environments=[the rollouts' instances]."""
        rid = request["id"]
        try:
            spec = request["function"]
            func = find(load_module(spec), spec, spec["function"], "function")
            envs = [self.envs[e][1] if e is not None and e in self.envs else None for e in request.get("envs", [])]
        except BaseException as exc:
            self.answer(rid, {"error": str(exc) if isinstance(exc, SetupError) else report(exc, "loading a reward")})
            return

        def run():
            try:
                result = func(**request.get("kwargs", {}), environments=envs)
                if inspect.isawaitable(result):
                    async def wait():
                        return await result
                    result = asyncio.run_coroutine_threadsafe(wait(), self.event_loop()).result()
                values = list(result)
                if len(values) != len(envs):
                    raise ValueError("returned %d rewards for %d completions" % (len(values), len(envs)))
                rewards = []
                for v in values:
                    f = None if v is None else float(v)
                    rewards.append(None if f is None or f != f or f in (float("inf"), float("-inf")) else f)
                self.answer(rid, {"rewards": rewards})
            except BaseException as exc:
                self.answer(rid, {"error": "reward function '%s' raised %s" % (
                    request["function"]["function"], report(exc, "reward function raised"))})

        threading.Thread(target=run, daemon=True).start()

    def serve(self, line):
        request = json.loads(line)
        rid = request.get("id")
        with self.lock:
            self.pending.add(rid)
        op = request.get("op")
        if op == "call":
            self.call(request)
        elif op in ("env_reset", "env_reward", "env_free"):
            self.env_op(request)
        elif op == "reward":
            self.reward(request)
        else:
            self.answer(rid, {"error": "unknown op %r" % (op,)})


def main(setup):
    # The protocol keeps private copies of stdin and stdout; the user's code gets
    # /dev/null and stderr.
    proto_in = os.fdopen(os.dup(0), "rb")
    proto_out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    sys.stdout = sys.stderr
    sys.stdin = open(os.devnull)

    def answer_line(line):
        proto_out.write(line.encode("ascii") + b"\n")
        proto_out.flush()

    try:
        worker = Worker(setup, answer_line)
    except SetupError as exc:
        answer_line(json.dumps({"error": str(exc)}))
        return
    except BaseException as exc:  # the user's import or constructor raised
        answer_line(json.dumps({"error": "loading the tools failed: " + report(exc, "loading the tools")}))
        return
    answer_line(json.dumps({"ok": True, "python": sys.version.split()[0], "tools": worker.schemas,
                            "async_tools": [t.__name__ for t in worker.tools if inspect.iscoroutinefunction(t)],
                            "environments": [e["info"] for e in worker.environments]}))
    for line in proto_in:
        worker.serve(line)


if __name__ == "__colt_tool_worker__":
    main(setup)  # noqa: F821 — given by colt's bootstrap
