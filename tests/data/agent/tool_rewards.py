"""Rewards for tests/test_agent_train.c and examples/tools: what a TRL user writes for a model that calls
tools. Each completion comes as its list of messages (TRL's form with tools): the model's turns, parsed,
and the tool messages between them."""
import json
import os


def repeats_tool_result(completions, **kwargs):
    """1 when the last message is the model's and says exactly what the last tool answered, else 0."""
    rewards = []
    for messages in completions:
        results = [m["content"] for m in messages if m["role"] == "tool"]
        last = messages[-1]
        said = last.get("content") if last["role"] == "assistant" else None
        rewards.append(1.0 if results and said is not None and said.strip() == str(results[-1]).strip() else 0.0)
    return rewards


def record_messages(prompts, completions, **kwargs):
    """Appends each completion's messages to messages.jsonl in the current directory (the test reads them); 0."""
    with open(os.path.join(os.getcwd(), "messages.jsonl"), "a", encoding="utf-8") as f:
        for prompt, messages in zip(prompts, completions):
            f.write(json.dumps({"user": prompt[-1]["content"], "messages": messages}) + "\n")
    return [0.0] * len(completions)
