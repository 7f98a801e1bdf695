"""make_serve_logprob_goldens.py — goldens for colt serve's echo and top log-probs (tests/test_serve_logprobs.py).

transformers on models/stories260K (fp32, CPU): for each prompt, the greedy continuation (generate,
do_sample=False) and, at every position of prompt + continuation, log_softmax(logits) of the token
there and the K most likely tokens with their log-probs: what vLLM's OpenAI server returns with
echo and logprobs K (raw_logprobs, its default logprobs_mode). The chat case renders its messages
with a chat template through the tokenizer's apply_chat_template. One more greedy case runs with vLLM's
logit bias, repetition, frequency and presence penalties (transformers' processors in vLLM's order).

    python3 tests/ref/make_serve_logprob_goldens.py   # writes tests/data/serve_logprob_goldens.json
"""
import json
import os

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LogitsProcessor, LogitsProcessorList
from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor, SequenceBiasLogitsProcessor

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODEL = os.path.join(ROOT, "models", "stories260K")
OUT = os.path.join(ROOT, "tests", "data", "serve_logprob_goldens.json")
K = 3
MAX_NEW = 12
PROMPTS = ["Once upon a time", "Tom and Lily went to the park", "The little dog was sad because"]
CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }} said: {{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}Then{% endif %}")
CHAT_MESSAGES = [{"role": "user", "content": "Once upon a time there was a cat"}]


def scores(model, ids):
    """log p(ids[t] | ids[<t]) and the K best (id, log-prob) at each position t >= 1."""
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].double()
    lp = torch.log_softmax(logits, dim=-1)
    token_lp = [None] + [lp[t - 1, ids[t]].item() for t in range(1, len(ids))]
    top = torch.topk(lp[:-1], K, dim=-1)
    top_ids = [None] + top.indices.tolist()
    top_lp = [None] + top.values.tolist()
    return token_lp, top_ids, top_lp


def case(model, prompt_ids, max_new=MAX_NEW):
    out = model.generate(torch.tensor([prompt_ids]), do_sample=False, max_new_tokens=max_new,
                         eos_token_id=model.config.eos_token_id, pad_token_id=0)
    completion = out[0, len(prompt_ids):].tolist()
    token_lp, top_ids, top_lp = scores(model, prompt_ids + completion)
    return {"prompt_ids": prompt_ids, "completion_ids": completion, "logprobs": token_lp, "top_ids": top_ids,
            "top_logprobs": top_lp}


class CompletionPenalties(LogitsProcessor):
    """vLLM's frequency and presence penalties over the completion's tokens (vllm/model_executor/layers/utils.py
    apply_penalties: logits -= frequency * output_bin_counts; logits -= presence * output_mask)."""

    def __init__(self, n_prompt, frequency, presence):
        self.n_prompt, self.frequency, self.presence = n_prompt, frequency, presence

    def __call__(self, input_ids, scores):
        counts = torch.zeros_like(scores)
        output = input_ids[:, self.n_prompt:]
        if output.shape[1]:
            counts.scatter_add_(1, output, torch.ones_like(output, dtype=scores.dtype))
        scores = scores - self.frequency * counts
        return scores - self.presence * (counts > 0).to(scores.dtype)


PENALISED = dict(prompt="Once upon a time", max_tokens=40, repetition_penalty=1.2, frequency_penalty=0.8,
                 presence_penalty=0.6, logit_bias={"400": 3.0, "261": -2.0})


def penalised_case(model, tok):
    """Greedy with vLLM's logit bias, repetition, frequency and presence penalties, in vLLM's order."""
    c = dict(PENALISED)
    ids = tok(c["prompt"])["input_ids"]
    processors = LogitsProcessorList([
        SequenceBiasLogitsProcessor({(int(t),): b for t, b in c["logit_bias"].items()}),
        RepetitionPenaltyLogitsProcessor(c["repetition_penalty"]),
        CompletionPenalties(len(ids), c["frequency_penalty"], c["presence_penalty"])])
    out = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=c["max_tokens"],
                         logits_processor=processors, eos_token_id=model.config.eos_token_id, pad_token_id=0)
    c["completion_ids"] = out[0, len(ids):].tolist()
    plain = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=c["max_tokens"],
                           eos_token_id=model.config.eos_token_id, pad_token_id=0)
    c["unpenalised_ids"] = plain[0, len(ids):].tolist()
    return c


def main():
    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(MODEL)
    model = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32).eval()
    cases = []
    for p in PROMPTS:
        c = case(model, tok(p)["input_ids"])
        c["prompt"] = p
        c["prompt_ids_text"] = tok.decode(c["prompt_ids"])  # what echo shows of an id prompt (vLLM decodes it)
        cases.append(c)
    chat_ids = tok.apply_chat_template(CHAT_MESSAGES, chat_template=CHAT_TEMPLATE, add_generation_prompt=True,
                                       tokenize=True, return_dict=False)
    chat = case(model, list(chat_ids))
    chat["messages"] = CHAT_MESSAGES
    with open(OUT, "w") as f:
        json.dump({"model": "models/stories260K", "k": K, "max_new_tokens": MAX_NEW, "completions": cases,
                   "chat_template": CHAT_TEMPLATE, "chat": chat, "penalised": penalised_case(model, tok)}, f,
                  indent=1)
        f.write("\n")
    print(f"wrote {OUT}: {len(cases)} completion cases and one chat case")


if __name__ == "__main__":
    main()
