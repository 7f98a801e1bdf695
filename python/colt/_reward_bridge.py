"""The stand-ins colt's reward worker calls for GRPOTrainer's Python reward functions.

colt runs Python reward functions in a worker process of its own
(src/data/reward_worker.py). For functions handed to GRPOTrainer as objects, the
trainer names this module as their module: `from colt._reward_bridge import f`
gives a stand-in that sends f's keyword arguments to the trainer's process over
the Unix socket in $COLT_REWARD_SOCKET and returns what the real f returned
there. So the user's function runs in the user's process, with its closures
and state, and the worker still checks the result as for any reward function.

The socket speaks JSON lines: {"function": NAME, "kwargs": {...}} ->
{"rewards": [...]} or {"error": "<the exception's last line>"}.
Not a public interface.
"""
import json
import os
import socket

_connection = None  # this worker's socket file, opened at the first call


class RewardFunctionError(Exception):
    """The user's reward function raised in the trainer's process (its traceback is printed there)."""


def _call(name, kwargs):
    global _connection
    if _connection is None:
        path = os.environ.get("COLT_REWARD_SOCKET")
        if not path:
            raise RewardFunctionError("COLT_REWARD_SOCKET is not set: this module answers only for colt.GRPOTrainer")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(path)
        _connection = sock.makefile("rwb")
    _connection.write(json.dumps({"function": name, "kwargs": kwargs}).encode() + b"\n")
    _connection.flush()
    line = _connection.readline()
    if not line:
        raise RewardFunctionError("the GRPOTrainer process closed the reward socket")
    reply = json.loads(line)
    if "error" in reply:
        raise RewardFunctionError(reply["error"])
    return reply["rewards"]


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)

    def stand_in(**kwargs):
        return _call(name, kwargs)

    stand_in.__name__ = name
    return stand_in
