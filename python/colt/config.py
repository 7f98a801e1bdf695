"""GRPOConfig: TRL 1.16's GRPOConfig arguments, kept as the caller wrote them.

colt's `train` command takes TRL's GRPOConfig names (and transformers'
TrainingArguments', and TRL's ModelConfig's) and checks them itself: the value
it cannot honour is refused there with one line saying what to do instead. So
this class does not restate TRL's defaults or ranges; it records the arguments
the caller set and hands exactly those to colt, whose defaults are TRL's.
"""
import json

# transformers' TrainingArguments writes to "trainer_output" when output_dir is not given.
DEFAULT_OUTPUT_DIR = "trainer_output"


class GRPOConfig:
    """GRPOConfig(output_dir=..., learning_rate=..., num_generations=..., ...).

    Any keyword of TRL's GRPOConfig. Attributes read back what was set, or
    None (output_dir: "trainer_output", as transformers). `to_dict()` is what
    colt receives.
    """

    def __init__(self, output_dir=None, **kwargs):
        settings = dict(kwargs)
        settings["output_dir"] = output_dir if output_dir is not None else DEFAULT_OUTPUT_DIR
        object.__setattr__(self, "_settings", settings)

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        return self._settings.get(name)

    def __setattr__(self, name, value):
        self._settings[name] = value

    def to_dict(self):
        """The settings as colt's config file gets them (JSON values)."""
        out = {}
        for key, value in self._settings.items():
            if isinstance(value, (set, tuple)):
                value = list(value)
            try:
                json.dumps(value)
            except TypeError:
                raise TypeError("GRPOConfig: %s=%r is not a plain value colt can take (a number, string, bool, "
                                "list or dict)" % (key, value)) from None
            out[key] = value
        return out

    def __repr__(self):
        return "GRPOConfig(%s)" % ", ".join("%s=%r" % kv for kv in sorted(self._settings.items()))
