"""test_example_tools.py — examples/tools/code_tool.py's run_python, the code-execution tool of the agents
example: what it returns for code that works, raises, runs too long (its children too), asks for too much
memory, writes too large a file or prints too much, that the code sees an empty environment and an empty
temporary folder, and that its JSON schema (what the model is shown) comes out of transformers'
get_json_schema as colt's tool worker makes it. Exits 77 without transformers. ~3 s."""
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples", "tools"))
try:
    from transformers.utils import get_json_schema
except ImportError:
    print("test_example_tools: skipped: no transformers (the tool worker makes schemas with it)")
    sys.exit(77)
import code_tool

failures = 0


def check(ok, what):
    global failures
    print(("ok   " if ok else "FAIL ") + what)
    failures += not ok


def run(code):
    t0 = time.monotonic()
    out = code_tool.run_python(code)
    return out, time.monotonic() - t0


out, _ = run("print(sum(range(10)))")
check(out == "45\n", f"prints: {out!r}")
out, _ = run("1/0")
check(out == "error: ZeroDivisionError: division by zero", f"raises: {out!r}")
out, _ = run("print('before'); raise ValueError('bad')")
check(out == "before\nerror: ValueError: bad", f"prints, then raises: {out!r}")
code_tool.RUN_SECONDS = 1
out, seconds = run("import subprocess, sys, time\n"
                   "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)'])\n"
                   "print(child.pid, flush=True)\ntime.sleep(30)")
check(out == "error: the code ran longer than 1 s and was stopped" and seconds < 5,
      f"a 30 s program (and its child) stopped after {seconds:.1f} s: {out!r}")
time.sleep(0.2)
left = os.popen("ps -eo args | grep -c '[t]ime.sleep(30)'").read().strip()
check(left == "0", f"no process of it left ({left})")
out, _ = run("x = bytearray(2 * 1024 ** 3)")
check(out == "error: MemoryError", f"2 GB past the 512 MB limit: {out!r}")
out, _ = run("open('big', 'wb').write(b'x' * (2 * 1024 * 1024))")
check(out.startswith("error: OSError: [Errno 27] File too large"), f"a 2 MB file past the 1 MB limit: {out!r}")
out, _ = run("print('a' * 5000)")
check(len(out) < 2100 and out.endswith("(3001 more characters not shown)"), f"5000 characters cut: ...{out[-40:]!r}")
out, _ = run("import os; print(sorted(k for k in os.environ if k != 'LC_CTYPE'), os.listdir('.'))")
check(out == "[] []\n", f"an empty environment and folder: {out!r}")
schema = get_json_schema(code_tool.run_python)
check(schema["function"]["name"] == "run_python" and schema["function"]["parameters"]["properties"]["code"]["type"]
      == "string" and schema["function"]["parameters"]["required"] == ["code"], f"schema: {schema}")
print(f"test_example_tools: {failures} failure(s)")
sys.exit(1 if failures else 0)
