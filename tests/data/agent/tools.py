"""Tools for tests/test_tool_calls.c and tests/ref/make_tool_goldens.py: what a
TRL user passes as GRPOTrainer(tools=[...]), with type hints and Google-style
docstrings (transformers.utils.get_json_schema reads both)."""
import asyncio
import time


def calculator(a: float, b: float, op: str = "+") -> float:
    """Applies an arithmetic operator to two numbers.

    Args:
        a: The left operand.
        b: The right operand.
        op: One of +, -, * and /.
    """
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    if op == "/":
        return a / b
    raise ValueError(f"unknown operator {op!r}")


def lookup(keys: list[str], upper: bool = False) -> dict:
    """Looks words up in a tiny dictionary.

    Args:
        keys: The words to look up.
        upper: Whether to upper-case the answers.
    """
    table = {"cat": "a small feline", "dog": "a loyal canine"}
    return {k: (table.get(k, "?").upper() if upper else table.get(k, "?")) for k in keys}


async def weather(city: str) -> str:
    """Gets the weather of a city.

    Args:
        city: The city's name.
    """
    await asyncio.sleep(0.01)
    if not city.strip():
        raise ValueError("no such city")
    return f"Sunny in {city}, 21 degrees"


def sleepy(seconds: float) -> str:
    """Sleeps, then says so.

    Args:
        seconds: How long to sleep.
    """
    time.sleep(seconds)
    return "woke up"


def no_args() -> int:
    """Returns the answer."""
    return 42



def freeze() -> str:
    """Runs a regular expression that backtracks for ages inside the re module's C code, which holds the
    interpreter lock all along: no other thread of the worker runs, as with a tool stuck in C code."""
    import re

    re.match(r"(a+)+$", "a" * 64 + "b")
    return "never"
