"""Environments for tests/test_tool_calls.c and tests/ref/make_tool_goldens.py:
what a TRL user passes as GRPOTrainer(environment_factory=MathEnv). One
instance per rollout; reset(**row) gets the dataset row; the public methods
(not reset, not get_reward, not _private) are the tools."""


class MathEnv:
    def __init__(self):
        self.total = 0
        self.target = None

    def reset(self, **row) -> str:
        self.total = int(row.get("start", 0))
        self.target = row.get("target")
        return f" (start at {self.total}, reach {self.target})"

    def add(self, n: int) -> int:
        """Adds a number to the running total.

        Args:
            n: The number to add.
        """
        self.total += n
        return self.total

    def total_so_far(self) -> str:
        """Says the running total."""
        return f"total={self.total}"

    def get_reward(self) -> float:
        return 1.0 if self.total == self.target else 0.0

    def _helper(self):
        return "not a tool"


def total_reward(completions, environments, **kwargs):
    """A reward function that reads the rollouts' environments (TRL passes environments=[...])."""
    return [None if env is None else float(env.total) for env in environments]
