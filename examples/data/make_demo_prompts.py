"""Writes the demo's prompt sets: story openings in the TinyStories style.

Run: python3 examples/data/make_demo_prompts.py  (no dependencies)
The openings are combinations of names, animals and places; the eval set uses
names that the training set does not, so the held-out reward measures a
behaviour (taking the story to the park), not memorised prompts.
"""
import itertools
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))
TRAIN_NAMES = ["Tim", "Lily", "Ben", "Sue", "Max", "Anna", "Tom", "Mia"]
EVAL_NAMES = ["Sam", "Zoe", "Jack", "Lucy"]
OPENINGS = [
    "Once upon a time, there was a little {kind} named {name}.",
    "One day, {name} the {kind} woke up early.",
    "{name} was a happy {kind} who liked to play.",
    "There was once a small {kind} called {name}.",
]
KINDS_TRAIN = ["girl", "boy", "dog", "cat"]
KINDS_EVAL = ["bunny", "bird"]


def rows(names, kinds):
    for opening, name, kind in itertools.product(OPENINGS, names, kinds):
        yield {"prompt": opening.format(name=name, kind=kind), "name": name}


def write(path, items):
    with open(path + ".tmp", "w") as f:
        for r in items:
            f.write(json.dumps(r) + "\n")
    os.replace(path + ".tmp", path)


train = list(rows(TRAIN_NAMES, KINDS_TRAIN))      # 4 x 8 x 4 = 128
evals = list(rows(EVAL_NAMES, KINDS_EVAL))[::2]   # 16 held-out prompts
write(os.path.join(HERE, "demo_train.jsonl"), train)
write(os.path.join(HERE, "demo_eval.jsonl"), evals)
print(len(train), "train prompts,", len(evals), "eval prompts")
