"""TRL's helper for rollout functions, for colt's trainer object.

    from colt import generate_rollout_completions   # instead of: from trl.experimental.openenv import ...

A rollout_func runs in colt's rollout worker (src/train/rollout_worker.py), whose trainer object generates with
colt's engine on the trainer's current weights; this hands the call to it. Same arguments and return form as
TRL's: one dict per prompt with prompt_ids, completion_ids, logprobs and text.
"""


def generate_rollout_completions(trainer, prompts, *, generation_overrides=None, as_chat=None):
    """One completion per prompt (a text, or messages rendered with the chat template)."""
    if not hasattr(trainer, "generate_rollout_completions"):
        raise TypeError("generate_rollout_completions: %s is not colt's trainer object (a rollout_func gets it "
                        "as its second argument)" % type(trainer).__name__)
    return trainer.generate_rollout_completions(prompts, generation_overrides=generation_overrides, as_chat=as_chat)
