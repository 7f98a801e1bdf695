"""rewards.py - the learning race's reward functions, one file for colt and TRL unchanged.

TRL's signature, f(prompts, completions, **columns) -> list of floats; colt runs the same file through its
Python reward worker (`reward_funcs: [bench/learning/rewards.py:correct, bench/learning/rewards.py:answer_format]`,
docs/rewards.md), bench/learning/trl_grpo.py imports it for GRPOTrainer, and bench/learning/score_hf.py uses
`is_correct` to score a checkpoint with transformers.

- correct: 1.0 when the completion's answer equals the row's `answer`, else 0.0. The answer is read as colt's
  `math` reward (and so `colt eval`) reads it: the text after the last "####", else the last \\boxed{...},
  else the last number; normalised (spaces, $, thousands commas, trailing periods) and compared as numbers.
  This is that rule for the integer answers of bench/learning/make_task.py, not all of colt's normaliser
  (no LaTeX fractions, \\text{}, degrees).
- answer_format: 0.5 when the completion ends with "The answer is N." (the line the prompt asks for; the
  period optional), else 0.0. Worth half a correct answer, so that the format alone cannot win.
No dependencies beyond the standard library.
"""
import re

_NUMBER = re.compile(r"(?:(?<![\w)])-)?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:/\d+)?|(?:(?<![\w)])-)?\.\d+")
_FORMAT = re.compile(r"The answer is \$?-?[0-9][0-9,]*(\.[0-9]+)?\.?\s*$")


def _text(completion):
    """A completion as text: TRL and colt pass [{"role": "assistant", "content": text}] for chat prompts."""
    if isinstance(completion, list):
        return completion[-1]["content"] if completion else ""
    return completion


def _boxed(text):
    best = None
    for m in re.finditer(r"\\boxed", text):
        q = m.end()
        while q < len(text) and text[q] == " ":
            q += 1
        if q >= len(text) or text[q] != "{":
            continue
        depth = 0
        for i in range(q, len(text)):
            if text[i] == "{":
                depth += 1
            elif text[i] == "}":
                depth -= 1
                if depth == 0:
                    best = text[q + 1:i]
                    break
    return best


def _normalise(s):
    s = re.sub(r"\s+", "", s)
    s = re.sub(r"\\?\$", "", s)
    s = re.sub(r"(?<=\d),(?=\d{3}(?!\d))", "", s)
    s = re.sub(r"^[a-zA-Z]=", "", s)
    s = re.sub(r"\.+$", "", s)
    s = re.sub(r"^\+", "", s)
    return s or None


def extract_answer(text):
    """The completion's answer as colt's math reward finds it, or None."""
    i = text.rfind("####")
    if i >= 0:
        a = _normalise(text[i + 4:].lstrip("#").split("\n", 1)[0])
        if a is not None:
            return a
    b = _boxed(text)
    if b is not None:
        a = _normalise(b)
        if a is not None:
            return a
    nums = _NUMBER.findall(text)
    return _normalise(nums[-1]) if nums else None


def is_correct(text, reference):
    a, r = extract_answer(text), _normalise(str(reference))
    if a is None or r is None:
        return False
    try:
        x, y = float(a), float(r)
        return abs(x - y) <= 1e-6 * max(abs(x), abs(y)) or x == y
    except ValueError:
        return a == r


def correct(completions, answer, **kwargs):
    return [1.0 if is_correct(_text(c), ref) else 0.0 for c, ref in zip(completions, answer)]


def answer_format(completions, **kwargs):
    return [0.5 if _FORMAT.search(_text(c)) else 0.0 for c in completions]
