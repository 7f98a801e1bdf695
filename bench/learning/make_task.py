"""make_task.py - the learning race's task (bench/gpu/learning_race.sh, docs/learning.md): arithmetic word
problems for SmolLM2-135M-Instruct, in TRL's conversational prompt format, seeded, written as train and
held-out JSON Lines files. Not a benchmark: a task a 135M model starts low on and can improve at within
~100 GRPO steps, so that colt and TRL can be compared on a learning curve.

Each row: {"prompt": [{"role": "user", "content": PROBLEM + INSTRUCTION}], "answer": "N", "task": KIND}.
The answer is an integer as a string: colt's `math` reward (and so `colt eval`) and bench/learning/rewards.py
read it the same way.

Usage: python3 bench/learning/make_task.py [--task add2] [--train 2000] [--heldout 100] [--seed 0] [--out DIR]
  writes DIR/TASK_train.jsonl and DIR/TASK_heldout.jsonl (DIR default: bench/learning/data).
Tasks (--task, several with commas for the calibration):
  add2     two 2-digit numbers added            ("Mia has 34 shells. She finds 58 more. ...")
  add3     two 3-digit numbers added
  sub3     a 3-digit number minus a smaller one
  mul      a 2-digit number times a 1-digit number (3-9)
  twostep  a + b - c, 2-digit numbers
The held-out problems are drawn from their own RNG stream and never repeat a training problem (the same
numbers and template), so held-out accuracy measures generalisation to unseen number pairs.
"""
import argparse
import json
import os
import random

INSTRUCTION = '\nWrite the calculation, then end with "The answer is N." where N is the final number.'

NAMES = ["Mia", "Liam", "Ava", "Noah", "Emma", "Omar", "Sofia", "Ravi", "Lena", "Tom", "Yuki", "Sara",
         "Ben", "Chloe", "Ali", "Nina", "Leo", "Zoe", "Ivan", "Maya"]
THINGS = ["apples", "stickers", "marbles", "books", "coins", "pencils", "shells", "cards", "stamps", "beads",
          "cookies", "blocks"]
CONTAINERS = ["box", "bag", "jar", "basket", "crate", "pack"]

ADD = [
    "{n} has {a} {t}. {p} gets {b} more {t}. How many {t} does {n} have now?",
    "{n} collected {a} {t} on Monday and {b} {t} on Tuesday. How many {t} did {n} collect in total?",
    "A shop sold {a} {t} in the morning and {b} {t} in the afternoon. How many {t} did it sell that day?",
    "{n} has {a} {t} and {m} has {b} {t}. How many {t} do they have together?",
]
SUB = [
    "{n} had {a} {t} and gave away {b} of them. How many {t} does {n} have left?",
    "A shop had {a} {t} and sold {b}. How many {t} are left in the shop?",
    "{n} has {a} {t}. {m} has {b} {t}. How many more {t} does {n} have than {m}?",
]
MUL = [
    "A {c} holds {a} {t}. How many {t} are in {b} such {c}es?",
    "{n} buys {b} packs of {t}. Each pack has {a} {t}. How many {t} does {n} buy?",
    "There are {b} rows of {t} with {a} {t} in each row. How many {t} are there?",
]
TWOSTEP = [
    "{n} has {a} {t}. {p} buys {b} more and then gives {c} to {m}. How many {t} does {n} have now?",
    "A shop had {a} {t}. It received {b} more and sold {c}. How many {t} does the shop have now?",
]


def problem(kind, rng):
    """One (text, answer, numbers, key) of KIND: numbers are the operands (held-out pairs never appear in
    training), key the whole problem (template, numbers, object) for de-duplication."""
    n, m = rng.sample(NAMES, 2)
    t = rng.choice(THINGS)
    c = rng.choice(CONTAINERS)
    pron = "She" if n in ("Mia", "Ava", "Emma", "Sofia", "Lena", "Yuki", "Sara", "Chloe", "Nina", "Zoe", "Maya") else "He"
    if kind in ("add2", "add3"):
        lo, hi = (10, 99) if kind == "add2" else (100, 999)
        a, b = rng.randint(lo, hi), rng.randint(lo, hi)
        i = rng.randrange(len(ADD))
        text, ans, key = ADD[i].format(n=n, m=m, p=pron, t=t, a=a, b=b), a + b, (i, a, b)
    elif kind == "sub3":
        a = rng.randint(200, 999)
        b = rng.randint(100, a - 1)
        i = rng.randrange(len(SUB))
        text, ans, key = SUB[i].format(n=n, m=m, t=t, a=a, b=b), a - b, (i, a, b)
    elif kind == "mul":
        a, b = rng.randint(11, 99), rng.randint(3, 9)
        i = rng.randrange(len(MUL))
        plural = c + "es" if c.endswith(("x", "s", "sh", "ch")) else c + "s"
        text = MUL[i].format(n=n, t=t, a=a, b=b, c=c).replace(c + "es?", plural + "?")
        ans, key = a * b, (i, a, b)
    elif kind == "twostep":
        a, b = rng.randint(20, 99), rng.randint(10, 99)
        cc = rng.randint(10, a + b - 5)
        i = rng.randrange(len(TWOSTEP))
        text, ans, key = TWOSTEP[i].format(n=n, m=m, p=pron, t=t, a=a, b=b, c=cc), a + b - cc, (i, a, b, cc)
    else:
        raise SystemExit(f"make_task.py: unknown task {kind!r} (add2, add3, sub3, mul, twostep)")
    return text, str(ans), key[1:], key + (t,)


def rows(kind, count, rng, avoid_numbers):
    """COUNT distinct problems whose operands are not in AVOID_NUMBERS; returns (row, numbers) pairs."""
    out, seen = [], set()
    for _ in range(100 * count):
        if len(out) == count:
            break
        text, ans, numbers, key = problem(kind, rng)
        if key in seen or numbers in avoid_numbers:
            continue
        seen.add(key)
        out.append(({"prompt": [{"role": "user", "content": text + INSTRUCTION}], "answer": ans, "task": kind}, numbers))
    else:
        raise SystemExit(f"make_task.py: {kind} has fewer than {count} distinct problems")
    return out


def write(path, data):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        for row, _ in data:
            f.write(json.dumps(row) + "\n")
    os.replace(tmp, path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", default="add2")
    ap.add_argument("--train", type=int, default=2000)
    ap.add_argument("--heldout", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "data"))
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    for kind in a.task.split(","):
        # held-out first, from its own stream, so --train does not change the held-out problems
        held = rows(kind, a.heldout, random.Random(f"{a.seed}-{kind}-heldout"), set())
        train = rows(kind, a.train, random.Random(f"{a.seed}-{kind}-train"), {k for _, k in held})
        write(os.path.join(a.out, f"{kind}_train.jsonl"), train)
        write(os.path.join(a.out, f"{kind}_heldout.jsonl"), held)
        print(f"make_task: {kind}: {len(train)} train, {len(held)} held-out in {a.out}")


if __name__ == "__main__":
    main()
