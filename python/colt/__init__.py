"""colt's Python entry point: TRL's GRPOTrainer signature, colt's engine.

    from colt import GRPOConfig, GRPOTrainer      # instead of: from trl import ...

GRPOTrainer hands the run to the `colt` binary (built into this package by
`pip install .`, or $COLT_BINARY, or `colt` on PATH) and answers it: reward
functions run here, in the caller's process (closures, notebook functions and
stateful objects work), the metrics come back to callbacks and a progress bar.
Nothing is reimplemented in Python; docs/python.md says what maps to what.
"""
from .config import GRPOConfig
from .rollout import generate_rollout_completions
from .trainer import GRPOTrainer, colt_binary

__all__ = ["GRPOConfig", "GRPOTrainer", "colt_binary", "generate_rollout_completions"]
