#!/usr/bin/env python3
"""reward_example.py — a user reward program for colt's "command" reward.

colt starts this program once and, for every batch, writes one JSON line to its
stdin:

    {"prompts": [...], "completions": [...], "<column>": [...], ...}

with one list entry per completion, and one list per dataset column other than
"prompt" (null where a row lacks the column). The program answers with one line

    {"rewards": [number or null, ...]}

on stdout (null means "no reward for this completion", like None in TRL) and
flushes. Anything for humans goes to stderr: stdout carries only the protocol.

This example rewards a completion that mentions the row's "target" word
(case-insensitive, as a whole word): 1.0 if it does, 0.0 if not, and null for
rows without a target. Use it in a config as:

    rewards:
      - type: command
        command: python3 examples/reward_example.py
        timeout: 30
"""
import json
import re
import sys


def reward(completion, target):
    if not isinstance(target, str) or not target:
        return None
    return 1.0 if re.search(r"\b" + re.escape(target) + r"\b", completion, re.IGNORECASE) else 0.0


def main():
    for line in sys.stdin:  # one request per line, until colt closes our stdin
        request = json.loads(line)
        completions = request["completions"]
        targets = request.get("target", [None] * len(completions))
        rewards = [reward(c, t) for c, t in zip(completions, targets)]
        sys.stdout.write(json.dumps({"rewards": rewards}) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
