"""An environment as TRL 1.16 takes it (GRPOTrainer(environment_factory=WriterEnv)), sized for the tiny tool model
tests/data/models/tiny-tool-f32. That model knows four tools (add, div, slow, big, in that order in its prompt)
and answers "OP A B" by calling OP(a, b) and repeating the result; here add, div and slow are standalone tools
(tests/data/agent/calc_tools.py) and big is the environment's method (TRL lists an environment's methods after
the standalone tools, so the prompt is the one the model knows).

The dataset's prompt is only "big"; each rollout's environment picks two numbers in reset() and returns them,
and TRL (and colt) append that text to the prompt's last message, so the model reads "big A B". The
environment's big answers with the sum of its own numbers; get_reward() checks the move: 1 when the model
called big with the environment's numbers. One instance per rollout; instances are made once and reset
every round.

Instances are numbered as they are made (TRL and colt both make them in batch order) and the number shifts b,
so the completions of one prompt get different prompts: deterministic, and the same in TRL and colt."""


class WriterEnv:
    made = 0

    def __init__(self):
        self.number = WriterEnv.made
        WriterEnv.made += 1
        self.a = self.b = None
        self.called_with = None

    def reset(self, a, b, **row) -> str:
        self.a, self.b = int(a), int(b) + self.number % 3
        self.called_with = None
        return f" {self.a} {self.b}"

    def big(self, a: int, b: int) -> str:
        """Writes a long text.

        Args:
            a: The first number.
            b: The second number.
        """
        self.called_with = (a, b)
        return str(self.a + self.b)

    def get_reward(self) -> float:
        return 1.0 if self.called_with == (self.a, self.b) else 0.0


def says_the_sum(completions, environments, **kwargs):
    """A reward that reads the environments (TRL passes environments=[...]): 1 when the model's last message
    is the sum of its environment's numbers (what the environment's big answers)."""
    rewards = []
    for messages, env in zip(completions, environments):
        last = messages[-1]
        said = last.get("content") if last["role"] == "assistant" else None
        rewards.append(1.0 if said is not None and said.strip() == str(env.a + env.b) else 0.0)
    return rewards
