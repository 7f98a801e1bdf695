"""A code-execution tool the model may call (TRL's tools=[run_python]): the code runs in a fresh Python
subprocess with limits, and what it printed is the tool message the model reads next.

The limits, each a one-line answer the model can read instead of a stopped run:
  - wall time (RUN_SECONDS) and CPU time: the process is killed past them;
  - memory (MEMORY_BYTES of address space) and file size written (FILE_BYTES);
  - no more than OUTPUT_CHARS of output come back;
  - python -I -S (no user site, no environment variables read), an empty environment, a temporary working
    folder removed afterwards, stdin closed.
Not a sandbox: the code runs as the training's user and may reach the network and the file system. For
untrusted models, run the tool inside a container or a jail (nsjail, bubblewrap) instead of this process."""
import os
import signal
import subprocess
import sys
import tempfile

RUN_SECONDS = 5
MEMORY_BYTES = 512 * 1024 * 1024
FILE_BYTES = 1024 * 1024
OUTPUT_CHARS = 2000


# The child sets its own limits before it runs the code (preexec_fn is not safe in the tool worker, whose
# tools run on threads); the code is passed as an argument, never pasted into this text.
_LAUNCH = (
    "import resource, sys\n"
    "for kind, value in ((resource.RLIMIT_CPU, {cpu}), (resource.RLIMIT_AS, {memory}), "
    "(resource.RLIMIT_FSIZE, {files}), (resource.RLIMIT_NPROC, 64)):\n"
    "    resource.setrlimit(kind, (value, value))\n"
    "code = sys.argv[1]\n"
    "del sys.argv[1]\n"
    "exec(compile(code, '<code>', 'exec'), {{'__name__': '__main__'}})\n"
).format(cpu=RUN_SECONDS, memory=MEMORY_BYTES, files=FILE_BYTES)


def run_python(code: str) -> str:
    """Runs Python code and returns what it printed.

    Args:
        code: A Python program; use print() to show results.
    """
    with tempfile.TemporaryDirectory(prefix="colt-run-python-") as folder:
        child = subprocess.Popen([sys.executable, "-I", "-S", "-c", _LAUNCH, code], cwd=folder, env={},
                                 stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                 errors="replace", start_new_session=True)
        try:
            out, err = child.communicate(timeout=RUN_SECONDS)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)  # the code's own children too: they share its session
            child.communicate()
            return f"error: the code ran longer than {RUN_SECONDS} s and was stopped"
    if child.returncode > 0:  # the traceback's last line says what went wrong
        out += "error: " + (err.strip().splitlines() or ["exit status %d" % child.returncode])[-1]
    elif child.returncode < 0:
        out += "error: stopped by " + _signal_name(-child.returncode)
    if len(out) > OUTPUT_CHARS:
        out = out[:OUTPUT_CHARS] + f"\n... ({len(out) - OUTPUT_CHARS} more characters not shown)"
    return out


def _signal_name(number):
    names = {signal.SIGXCPU: "the CPU time limit", signal.SIGXFSZ: "the file size limit", signal.SIGKILL: "SIGKILL"}
    try:
        return names.get(number, signal.Signals(number).name)
    except ValueError:
        return f"signal {number}"
