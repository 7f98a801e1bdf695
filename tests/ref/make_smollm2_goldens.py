#!/usr/bin/env python3
"""make_smollm2_goldens.py — goldens for tests/test_smollm2.c from transformers, on the SmolLM2-135M-Instruct
folder that scripts/get_smollm2.sh makes.

Loads the folder with transformers in fp32 (its bf16 weights upcast, as colt's CPU forward does) and writes
tests/data/smollm2_goldens.json:
  chat      a three-message conversation without a system message (the template inserts SmolLM2's), the
            text and ids apply_chat_template gives with the generation prompt;
  logprobs  a fixed sequence (the chat ids + a fixed assistant answer with digits after whitespace runs and
            punctuation, ending in <|im_end|>): its answer text, the ids, log p(ids[t] | ids[<t]) for t >= 1;
  greedy    32 new tokens of greedy decoding from the chat ids with no stop (model.generate, do_sample off,
            eos ignored), the smallest top-1 / top-2 logit margin over those steps, and the completion
            decoded up to the first <|im_end|> (what `colt generate` prints).
Not a test by itself. Needs torch, transformers and the converted folder.

Usage:
  python3 tests/ref/make_smollm2_goldens.py [MODEL_DIR]
      MODEL_DIR defaults to $COLT_SMOLLM2_DIR, else models/smollm2-135m-instruct
"""
import json
import os
import sys

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "tests", "data", "smollm2_goldens.json")
N_GREEDY = 32

CHAT_MESSAGES = [
    {"role": "user", "content": "What is the capital of France?"},
    {"role": "assistant", "content": "The capital of France is Paris."},
    {"role": "user", "content": "Name three rivers that flow through it, in one short sentence."},
]
# Digits after whitespace runs ("\n\n1", "    2", "  37") are where SmolLM2's pre-tokenizer (each digit alone
# first) and plain byte-level BPE disagree.
ANSWER = ("The Seine flows through Paris:\n\n1. It is 777 km long (482.5 miles).\n    2. About  37 bridges cross "
          "it!<|im_end|>\n")


def log_probs(model, ids):
    """log p(ids[t] | ids[<t]) for t = 1..T-1, fp32 forward, log-softmax in float64."""
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].double()
    lp = torch.log_softmax(logits, dim=-1)
    return [lp[t - 1, ids[t]].item() for t in range(1, len(ids))]


def greedy(model, prompt, n_new):
    """Greedy continuation with no eos stop, and the smallest top-1 / top-2 logit margin seen."""
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                             do_sample=False, max_new_tokens=n_new, min_new_tokens=n_new, eos_token_id=None,
                             pad_token_id=0, output_scores=True, return_dict_in_generate=True)
    new = out.sequences[0, len(prompt):].tolist()
    margins = [(s[0].topk(2).values[0] - s[0].topk(2).values[1]).item() for s in out.scores]
    return new, min(margins)


def main():
    model_dir = sys.argv[1] if len(sys.argv) > 1 else os.environ.get(
        "COLT_SMOLLM2_DIR", os.path.join(ROOT, "models", "smollm2-135m-instruct"))
    if not os.path.isfile(os.path.join(model_dir, "config.json")):
        raise SystemExit(f"{model_dir}: no model folder (make it with scripts/get_smollm2.sh)")
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager").eval()
    eos = model.generation_config.eos_token_id
    assert eos == 2 and tok.convert_ids_to_tokens(eos) == "<|im_end|>", eos

    text = tok.apply_chat_template(CHAT_MESSAGES, add_generation_prompt=True, tokenize=False)
    ids = tok.apply_chat_template(CHAT_MESSAGES, add_generation_prompt=True, tokenize=True, return_dict=False)
    answer_ids = tok.encode(ANSWER, add_special_tokens=False)
    seq = ids + answer_ids
    lp = log_probs(model, seq)
    new, margin = greedy(model, ids, N_GREEDY)
    stop = new.index(eos) + 1 if eos in new else len(new)
    completion = tok.decode(new[:stop], skip_special_tokens=True)
    print(f"chat: {len(ids)} ids; logprobs over T={len(seq)} (mean {sum(lp) / len(lp):.3f}, "
          f"min {min(lp):.3f}); greedy {N_GREEDY} tokens, min top-2 margin {margin:.4f}, "
          f"eos at new token {stop if eos in new else 'none'}")
    print(f"completion: {completion!r}")

    golden = {
        "about": "made by tests/ref/make_smollm2_goldens.py from the folder scripts/get_smollm2.sh writes",
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "eos_token_id": eos,
        "chat": {"messages": CHAT_MESSAGES, "text": text, "ids": ids},
        "logprobs": {"answer": ANSWER, "answer_ids": answer_ids, "ids": seq, "logprobs": lp},
        "greedy": {"prompt": ids, "new_tokens": new, "min_margin": margin, "completion_until_eos": new[:stop],
                   "completion_text": completion},
    }
    with open(OUT, "w") as f:
        json.dump(golden, f, indent=1)
        f.write("\n")
    print(f"wrote {os.path.relpath(OUT, ROOT)}")


if __name__ == "__main__":
    main()
