"""Rewards for tests/test_rollout_func.c: they read the rollout function's extra fields (guess, label) beside a
dataset column (a), as TRL passes them."""


def guess_reward(completions, guess, label, a, **kwargs):
    assert all(lab == "fixed" for lab in label), label
    return [float(g) * 0.5 + float(x) / 10 + len(c[0]["content"]) / 100 for c, g, x in zip(completions, guess, a)]


def turn_count(completions, turns, **kwargs):
    return [float(t) for t in turns]
