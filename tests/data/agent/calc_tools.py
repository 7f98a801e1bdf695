"""The tools tests/data/models/tiny-tool-f32 was trained to call (tests/ref/make_tool_model.py,
tests/test_agent_train.c): one that works, one that raises, one that hangs and one whose result never
fits a completion. The model also calls "mul", which is deliberately not here (an unknown tool)."""
import time


def add(a: int, b: int) -> int:
    """Adds two numbers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a + b


def div(a: int, b: int) -> int:
    """Divides two numbers.

    Args:
        a: The dividend.
        b: The divisor.
    """
    return a // b


def slow(a: int, b: int) -> int:
    """Adds two numbers, slowly.

    Args:
        a: The first number.
        b: The second number.
    """
    time.sleep(600)  # far longer than any run takes: only tool_timeout ends the wait
    return a + b


def big(a: int, b: int) -> str:
    """Writes a long text.

    Args:
        a: The first number.
        b: The second number.
    """
    return "x" * 600
