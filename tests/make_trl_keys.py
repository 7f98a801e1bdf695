#!/usr/bin/env python3
"""make_trl_keys.py — tests/data/trl_config_keys.txt: every setting a TRL user
can put in a GRPO config, from the installed trl itself.

The names are the dataclass fields of trl.GRPOConfig (which inherits
transformers' TrainingArguments) followed by those of trl.ModelConfig (the
model/PEFT arguments TRL's scripts parse beside it), then those of the
`trl grpo` command's own argument classes (trl/scripts/grpo.py's
GRPOScriptArguments, trl.DatasetMixtureConfig), each once, in declaration
order. test_train_config checks that colt classifies every one of them
(honoured, accepted as a no-op, or refused as a known but unsupported key) and
that docs/trl_config.md has a row for each.

Run (from the repository root): python3 tests/make_trl_keys.py
Needs: pip install trl transformers (torch is not needed: only the config
dataclasses are imported). Reference data only; colt does not depend on them.
"""
import dataclasses
import os

import transformers
import trl
from trl import DatasetMixtureConfig, GRPOConfig, ModelConfig
from trl.scripts.grpo import GRPOScriptArguments

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "trl_config_keys.txt")


def main():
    names = []
    for cls in (GRPOConfig, ModelConfig, GRPOScriptArguments, DatasetMixtureConfig):
        for field in dataclasses.fields(cls):
            if field.name not in names:
                names.append(field.name)
    with open(OUT, "w") as f:
        f.write(f"# trl {trl.__version__}, transformers {transformers.__version__}: "
                f"dataclasses.fields of trl.GRPOConfig, trl.ModelConfig, `trl grpo`'s GRPOScriptArguments and "
                f"DatasetMixtureConfig (tests/make_trl_keys.py)\n")
        for name in names:
            f.write(name + "\n")
    print(f"{OUT}: {len(names)} keys (trl {trl.__version__}, transformers {transformers.__version__})")


if __name__ == "__main__":
    main()
