"""Rewards for examples/tools: with tools, TRL (and colt) give each completion as its list of messages:
the model's turns ({"role": "assistant", "content", "tool_calls"}) and the tool messages between them."""
import re


def _number(text):
    found = re.findall(r"-?\d+(?:\.\d+)?", text or "")
    return float(found[-1]) if found else None


def correct(completions, answer, **kwargs):
    """1 when the model's last message ends with the right number, else 0."""
    rewards = []
    for messages, want in zip(completions, answer):
        last = messages[-1]
        said = _number(last.get("content")) if last["role"] == "assistant" else None
        rewards.append(1.0 if said is not None and abs(said - float(want)) < 1e-6 else 0.0)
    return rewards


def used_calculator(completions, **kwargs):
    """0.5 when the calculator was called and answered without an error, else 0."""
    return [0.5 if any(m["role"] == "tool" and not str(m["content"]).startswith("{'error'") for m in messages)
            else 0.0 for messages in completions]
