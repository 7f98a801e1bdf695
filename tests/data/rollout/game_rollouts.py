"""Rollout functions for tests/test_rollout_func.c that generate with colt's engine.

two_turn: a two-turn game on plain-text prompts. Turn 1 is TRL's generate_rollout_completions (one completion per
prompt: TRL's helper, as colt's trainer object offers it); the environment answers " Then" (env_mask 0); turn 2
continues the whole conversation with trainer.generate on RNG streams 0, 1, ... given explicitly. Each call appends
what was asked and generated to game_log.jsonl in the current directory, for the test to replay with colt generate.
two_turn_async: the same, as a coroutine (TRL awaits nothing; colt runs it to completion).

The rest break one rule each, for the errors colt must report."""
import asyncio
import json
import time


def two_turn(prompts, trainer):
    tok = trainer.processing_class
    first = trainer.generate_rollout_completions(prompts, generation_overrides={"max_tokens": 6})
    env = tok.encode(" Then", add_special_tokens=False)
    turn2_prompts = [r["prompt_ids"] + r["completion_ids"] + env for r in first]
    second = trainer.generate(turn2_prompts, max_tokens=6, streams=list(range(len(first))))
    with open("game_log.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps({"step": trainer.state.global_step, "prompts": prompts,
                            "turn1_prompt_ids": [r["prompt_ids"] for r in first],
                            "turn1": [r["completion_ids"] for r in first],
                            "turn2_prompt_ids": turn2_prompts, "turn2": second["completion_ids"]}) + "\n")
    out = {"prompt_ids": [], "completion_ids": [], "logprobs": [], "env_mask": [], "turns": []}
    for r, c, lp in zip(first, second["completion_ids"], second["logprobs"]):
        out["prompt_ids"].append(r["prompt_ids"])
        out["completion_ids"].append(r["completion_ids"] + env + c)
        out["logprobs"].append(r["logprobs"] + [None] * len(env) + lp)
        out["env_mask"].append([1] * len(r["completion_ids"]) + [0] * len(env) + [1] * len(c))
        out["turns"].append(2)
    return out


async def two_turn_async(prompts, trainer):
    await asyncio.sleep(0)
    return two_turn(prompts, trainer)


def _one_token(prompts, trainer):
    ids = trainer.processing_class.encode("Once", add_special_tokens=False)
    return {"prompt_ids": [ids] * len(prompts), "completion_ids": [ids] * len(prompts),
            "logprobs": [[0.0] * len(ids)] * len(prompts)}


def missing_logprobs(prompts, trainer):
    out = _one_token(prompts, trainer)
    del out["logprobs"]
    return out


def raises(prompts, trainer):
    raise ValueError("the game broke")


def one_short(prompts, trainer):
    out = _one_token(prompts, trainer)
    return {k: v[:-1] for k, v in out.items()}


def out_of_vocab(prompts, trainer):
    out = _one_token(prompts, trainer)
    out["completion_ids"] = [[100000]] + out["completion_ids"][1:]
    return out


def too_long(prompts, trainer):
    out = _one_token(prompts, trainer)
    out["completion_ids"] = [[5] * 40] * len(prompts)
    out["logprobs"] = [[0.0] * 40] * len(prompts)
    return out


def bad_mask(prompts, trainer):
    out = _one_token(prompts, trainer)
    out["env_mask"] = [[1, 1] + [0] * len(out["completion_ids"][0])] * len(prompts)
    return out


def too_many_tokens(prompts, trainer):
    trainer.generate([[1, 2, 3]], max_tokens=1000)


def slow(prompts, trainer):
    time.sleep(60)
