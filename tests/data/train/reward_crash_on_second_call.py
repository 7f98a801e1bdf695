"""A reward program for tests: answers the first call with zeros, then exits
with status 3, so the trainer must stop with a clear error after saving."""
import json
import sys

first = True
for line in sys.stdin:
    req = json.loads(line)
    if not first:
        sys.exit(3)
    first = False
    print(json.dumps({"rewards": [0.0] * len(req["completions"])}), flush=True)
