"""More environments for TRL 1.16's dict of environments (GRPOTrainer(environment_factory={"writer": WriterEnv,
"count": CountEnv, "mul": MulEnv, ...})), sized for the tiny tool model tests/data/models/tiny-tool-f32 like
writer.py. Each row's 'environment' column picks one; only that environment's methods are rendered in its
prompt (after the standalone add, div and slow) and callable by its completions.

CountEnv has a method big with WriterEnv.big's very signature and docstring (the one prompt the tiny model
knows, so it calls it), but answers the product of its numbers; get_reward() is 1 when big was called with
the environment's numbers, 0 when with others, and None (no reward: NaN in its column) when it was not
called. It is a class of its own, so it is a reward column of its own (CountEnv) beside WriterEnv's; each
scores only its own class's rollouts.

MulEnv's only tool is mul and it has no get_reward: its rollouts are scored by no environment column, and
the model, which calls big there, is answered "Tool big not found." (big is another environment's method)."""


class CountEnv:
    def __init__(self):
        self.a = self.b = None
        self.called_with = None

    def reset(self, a, b, **row) -> str:
        self.a, self.b = int(a), int(b)
        self.called_with = None
        return f" {self.a} {self.b}"

    def big(self, a: int, b: int) -> str:
        """Writes a long text.

        Args:
            a: The first number.
            b: The second number.
        """
        self.called_with = (a, b)
        return str(self.a * self.b)

    def get_reward(self):
        if self.called_with is None:
            return None
        return 1.0 if self.called_with == (self.a, self.b) else 0.0


class MulEnv:
    def __init__(self):
        self.a = self.b = None

    def reset(self, a, b, **row) -> str:
        self.a, self.b = int(a), int(b)
        return f" {self.a} {self.b}"

    def mul(self, a: int, b: int) -> str:
        """Multiplies two numbers.

        Args:
            a: The first number.
            b: The second number.
        """
        return str(a * b)
