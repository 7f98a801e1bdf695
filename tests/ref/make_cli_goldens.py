"""Goldens for tests/cli_contracts.sh: what transformers/tokenizers say the CLI must print.

Run: python3 tests/ref/make_cli_goldens.py   (needs pip torch, transformers, tokenizers; no network)
Writes tests/data/cli_goldens.json. CI compares against it without Python.
"""
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHARED = os.path.join(ROOT, "..", "shared", "data")
STORIES = os.path.join(ROOT, "models", "stories260K")
QWEN = os.path.join(SHARED, "qwen2.5-tokenizer")

out = {}

# tokenize / detokenize with the Qwen2.5 tokenizer (text: no special tokens; messages: chat template).
qtok = AutoTokenizer.from_pretrained(QWEN)
texts = ["Hello world", "  leading spaces and\ttabs\n\nnew lines", "数学 is math: 1+1=2 😀",
         "<|im_start|>user\nhi<|im_end|>"]
out["qwen_tokenize_text"] = [{"text": t, "ids": qtok(t, add_special_tokens=False)["input_ids"]} for t in texts]
convs = [
    ([{"role": "user", "content": "What is 2+2?"}], True),
    ([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
      {"role": "assistant", "content": "Hello!"}], False),
]
out["qwen_tokenize_messages"] = [
    {"messages": m, "add_generation_prompt": g,
     "ids": list(qtok.apply_chat_template(m, add_generation_prompt=g, tokenize=True, return_dict=False))}
    for m, g in convs]
ids = out["qwen_tokenize_text"][2]["ids"] + [151645]
out["qwen_detokenize"] = {"ids": ids, "text": qtok.decode(ids, skip_special_tokens=False)}

# score and greedy generate with the real stories260K.
torch.manual_seed(0)
stok = AutoTokenizer.from_pretrained(STORIES)
model = AutoModelForCausalLM.from_pretrained(STORIES, torch_dtype=torch.float32)
model.eval()
prompt_ids = stok("Once upon a time")["input_ids"]
with torch.no_grad():
    gen = model.generate(torch.tensor([prompt_ids]), max_new_tokens=40, do_sample=False,
                         eos_token_id=None, pad_token_id=0)
completion = gen[0, len(prompt_ids):].tolist()
full = gen[0].tolist()
with torch.no_grad():
    logits = model(torch.tensor([full])).logits.float()
logp = torch.log_softmax(logits, dim=-1)[0, :-1].gather(1, torch.tensor(full[1:])[:, None])[:, 0]
out["stories_generate"] = {"prompt": "Once upon a time", "prompt_ids": prompt_ids, "completion_ids": completion,
                           "completion_text": stok.decode(completion, skip_special_tokens=True)}
out["stories_score"] = {"ids": full, "logprobs": logp.tolist()}

path = os.path.join(ROOT, "tests", "data", "cli_goldens.json")
with open(path + ".tmp", "w") as f:
    json.dump(out, f, ensure_ascii=False, indent=1)
os.replace(path + ".tmp", path)
print("wrote", path, file=sys.stderr)
print(out["stories_generate"]["completion_text"], file=sys.stderr)
