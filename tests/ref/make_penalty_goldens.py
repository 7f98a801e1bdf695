"""make_penalty_goldens.py — goldens for sampler_apply_penalties (tests/test_sampler.c): vLLM's logit bias and
penalties, in vLLM's order (vllm/v1/sample/sampler.py: the logit-bias processor, then apply_penalties).

  - the logit bias by transformers' SequenceBiasLogitsProcessor (single-token sequences: a bias added to the
    token's logit, what vLLM's LogitBiasLogitsProcessor does);
  - the repetition penalty by transformers' RepetitionPenaltyLogitsProcessor over prompt + completion ids
    (vLLM's apply_repetition_penalties: positive logits divided, others multiplied, for tokens in the prompt
    or the output);
  - frequency and presence as vllm/model_executor/layers/utils.py apply_penalties writes them (vllm is not
    installable beside this torch; the two lines are OpenAI's definition):
        logits -= frequency_penalties.unsqueeze(dim=1) * output_bin_counts
        logits -= presence_penalties.unsqueeze(dim=1) * output_mask
    with output_bin_counts the completion's token counts and output_mask counts > 0.

    python3 tests/ref/make_penalty_goldens.py   # writes tests/data/penalty_goldens.json
"""
import json
import os

import torch
from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor, SequenceBiasLogitsProcessor

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "tests", "data", "penalty_goldens.json")
V = 64
SETTINGS = [  # repetition, frequency, presence, number of biased tokens
    (1.0, 0.0, 0.0, 3),
    (1.0, 0.5, 0.0, 0),
    (1.0, 0.0, 1.5, 0),
    (1.3, 0.0, 0.0, 0),
    (1.2, 0.7, 0.4, 4),
    (0.8, -1.0, -0.5, 2),
    (1.0, 2.0, 2.0, 5),
]


def main():
    torch.manual_seed(0)
    cases = []
    for rep, freq, pres, n_bias in SETTINGS:
        for trial in range(2):
            logits = (torch.randn(V) * (1 + trial)).float()
            n_prompt = 6 + 3 * trial
            ids = torch.randint(0, 24, (n_prompt + 10,))  # repeats, in the prompt and the completion
            prompt, output = ids[:n_prompt], ids[n_prompt:]
            bias = {int(t): float(b) for t, b in zip(torch.randperm(V)[:n_bias], torch.randn(n_bias) * 5)}
            scores = logits.clone()[None]
            if bias:
                scores = SequenceBiasLogitsProcessor({(t,): b for t, b in bias.items()})(ids[None], scores)
            if rep != 1.0:
                scores = RepetitionPenaltyLogitsProcessor(rep)(ids[None], scores)
            counts = torch.bincount(output, minlength=V)[None]
            scores -= torch.tensor([freq]).unsqueeze(dim=1) * counts
            scores -= torch.tensor([pres]).unsqueeze(dim=1) * (counts > 0)
            cases.append(dict(repetition_penalty=rep, frequency_penalty=freq, presence_penalty=pres,
                              logits=logits.tolist(), history=ids.tolist(), n_prompt=n_prompt,
                              bias_ids=list(bias.keys()), bias_values=list(bias.values()),
                              penalised=scores[0].tolist()))
    with open(OUT + ".tmp", "w") as f:
        json.dump(cases, f)
        f.write("\n")
    os.replace(OUT + ".tmp", OUT)
    print("wrote", OUT, len(cases), "cases")


if __name__ == "__main__":
    main()
