"""The calculator the model may call (TRL's tools=[calculator]). colt reads its JSON schema from the type
hints and the docstring (transformers.utils.get_json_schema), as TRL does; what it returns, str()'d, is the
tool message the model reads next; if it raises, the model reads {'error': '...'}."""


def calculator(a: float, b: float, op: str) -> float:
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
