"""Rollout functions for tests/test_rollout_func.c, written for TRL 1.16's GRPOTrainer(rollout_func=...) and run
unchanged by colt (tests/ref/make_rollout_func_goldens.py runs them in TRL).

fixed_game: a teacher-forced two-turn game: completion k of a prompt (k = its place in its group) is the model's
"guess k", the environment's " result R" (masked out: env_mask 0) and the model's " done" with the eos token, except
the last of each group, which ends without eos (truncated). Every id comes from the trainer's tokenizer and chat
template, so the prompt and completion ids test those too. Extra fields: guess (a list: one per completion) and
label (not a list: every completion's)."""


def fixed_game(prompts, trainer):
    tok = trainer.processing_class
    G = trainer.num_generations
    out = {"prompt_ids": [], "completion_ids": [], "logprobs": [], "env_mask": [], "guess": []}
    for i, prompt in enumerate(prompts):
        k = i % G
        text = tok.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)
        turn1 = tok.encode("guess %d" % k, add_special_tokens=False)
        env = tok.encode(" result %d" % (7 * k + len(prompt[-1]["content"])), add_special_tokens=False)
        turn2 = tok.encode(" done", add_special_tokens=False) + ([tok.eos_token_id] if k < G - 1 else [])
        completion = turn1 + env + turn2
        out["prompt_ids"].append(tok.encode(text, add_special_tokens=False))
        out["completion_ids"].append(completion)
        out["logprobs"].append([-0.125 * (j + 1) for j in range(len(completion))])
        out["env_mask"].append([1] * len(turn1) + [0] * len(env) + [1] * len(turn2))
        out["guess"].append(k)
    out["label"] = "fixed"
    return out
