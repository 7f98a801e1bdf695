#!/usr/bin/env python3
"""make_reward_model_goldens.py — tiny sequence-classification reward models and their scores from transformers
and TRL, for tests/test_reward_model.c.

Writes tests/data/models/tiny-qwen2-rm/ (Qwen2ForSequenceClassification) and tiny-llama-rm/
(LlamaForSequenceClassification): random fp32 decoders of the tiny test models' shape with a `score` head
(num_labels 1, no bias), saved with save_pretrained, each with the byte-level BPE tokenizer of
tests/data/models/tiny-llama3-f32 (its Llama 3 chat template ends every message with <|eot_id|>, its eos):
  - tiny-qwen2-rm's tokenizer has a pad token of its own (<|end_of_text|>);
  - tiny-llama-rm's has none, so TRL pads with the eos <|eot_id|>, and a chat's final <|eot_id|> is then a
    "pad" token the score skips: transformers scores the last token that is not the pad id.
Then tests/data/models/reward_model_goldens.json:
  - "ids": token sequences (some with pad ids inside and at the end) scored by the model in one right-padded
    batch with its attention mask, config.pad_token_id set as TRL sets it: logits[:, 0];
  - "plain", "conversational" and "multi_turn": prompts and completions scored exactly as TRL 1.16's
    GRPOTrainer._calculate_rewards scores a model reward (trl.data_utils.apply_chat_template with the reward
    model's own tokenizer for conversational prompts, prompt + completion for plain ones; the tokenizer called
    with padding=True, padding_side="right", add_special_tokens=False), with the texts and ids for diagnosis;
    "multi_turn" completions are lists of messages as a tool-calling rollout makes them (assistant turns with
    tool_calls, tool results), the conversation prompt + completion rendered with the reward model's template.
The reward models' chat template is the base one plus each assistant turn's tool calls (name and arguments), so
a conversation's calls reach the scored text.

Usage: python3 tests/ref/make_reward_model_goldens.py
"""
import copy
import json
import os

import torch
import transformers
import trl
from transformers import AutoModelForSequenceClassification, AutoTokenizer, LlamaConfig, Qwen2Config
from trl.data_utils import apply_chat_template, is_conversational

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "tests", "data", "models")
TOKENIZER = os.path.join(OUT, "tiny-llama3-f32")

PLAIN_PROMPTS = ["Once upon a time", "The answer is", "What is two plus two?"]
PLAIN_COMPLETIONS = [" there was a small model.", " four.", " It is four. The answer is four."]
CHAT_PROMPTS = [
    [{"role": "user", "content": "What is two plus two?"}],
    [{"role": "system", "content": "You are a tiny test model."},
     {"role": "user", "content": "Answer briefly."}],
    [{"role": "user", "content": "Once upon a time"}],
]
CHAT_COMPLETIONS = ["The answer is four.", "four", "there was a small model that answered questions."]
TOOL_PROMPTS = [
    [{"role": "user", "content": "What is 12 times 7?"}],
    [{"role": "system", "content": "Use the tools."}, {"role": "user", "content": "Weather in Paris?"}],
    [{"role": "user", "content": "Add 2 and 3, then double it."}],
]
TOOL_COMPLETIONS = [
    [{"role": "assistant", "content": "",
      "tool_calls": [{"type": "function", "function": {"name": "multiply", "arguments": {"a": 12, "b": 7}}}]},
     {"role": "tool", "name": "multiply", "content": "84"},
     {"role": "assistant", "content": "12 times 7 is 84."}],
    [{"role": "assistant", "content": "Let me look.",
      "tool_calls": [{"type": "function", "function": {"name": "weather", "arguments": {"city": "Paris"}}}]},
     {"role": "tool", "name": "weather", "content": "sunny, 21 C"},
     {"role": "assistant", "content": "It is sunny in Paris."}],
    [{"role": "assistant", "content": "",
      "tool_calls": [{"type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}}]},
     {"role": "tool", "name": "add", "content": "5"},
     {"role": "assistant", "content": "",
      "tool_calls": [{"type": "function", "function": {"name": "multiply", "arguments": {"a": 5, "b": 2}}}]},
     {"role": "tool", "name": "multiply", "content": "10"},
     {"role": "assistant", "content": "The answer is 10."}],
]
# The base template with each assistant turn's tool calls rendered (names and arguments in a fixed order, no
# dict-to-JSON filter whose spacing could differ between template engines).
RM_TEMPLATE = (
    "{% for message in messages %}{% if loop.index0 == 0 %}{{ bos_token }}{% endif %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim }}"
    "{% if message['tool_calls'] is defined %}{% for call in message['tool_calls'] %}"
    "<call>{{ call['function']['name'] }}"
    "{% for key, value in call['function']['arguments'].items() %} {{ key }}={{ value }}{% endfor %}</call>"
    "{% endfor %}{% endif %}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)


def make_rm(arch, seed):
    common = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=320, max_position_embeddings=256, rms_norm_eps=1e-6,
                  bos_token_id=0, eos_token_id=2, initializer_range=0.15, num_labels=1)
    if arch == "qwen2":
        cfg = Qwen2Config(tie_word_embeddings=False, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                          **common)
    else:
        cfg = LlamaConfig(tie_word_embeddings=False, attention_bias=False,
                          rope_parameters={"rope_type": "default", "rope_theta": 50000.0}, **common)
    torch.manual_seed(seed)
    model = AutoModelForSequenceClassification.from_config(cfg, dtype=torch.float32,
                                                           attn_implementation="eager").eval()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            # Biases and norm weights non-trivial, and a score head large enough that scores differ visibly.
            if name.endswith(".bias"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
            elif "norm" in name:
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            elif name == "score.weight":
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    return model


def load_as_trl(path):
    """The reward model and its tokenizer as GRPOTrainer.__init__ sets them up for reward_funcs=[path]."""
    model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=1, dtype=torch.float32,
                                                               attn_implementation="eager").eval()
    tok = AutoTokenizer.from_pretrained(path)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    model.config.get_text_config().pad_token_id = tok.pad_token_id
    return model, tok


def trl_scores(model, tok, prompts, completions):
    """GRPOTrainer._calculate_rewards' branch for a model reward (TRL 1.16), verbatim but for the device moves.
    Conversational completions are lists of messages, as TRL makes them (one assistant turn, or a tool-calling
    rollout's turns)."""
    if is_conversational({"prompt": prompts[0]}):
        completions = [c if isinstance(c, list) else [{"role": "assistant", "content": c}] for c in completions]
        messages = [{"messages": p + c} for p, c in zip(prompts, completions, strict=True)]
        texts = [apply_chat_template(x, tok)["text"] for x in messages]
    else:
        texts = [p + c for p, c in zip(prompts, completions, strict=True)]
    inputs = tok(text=texts, return_tensors="pt", padding=True, padding_side="right", add_special_tokens=False)
    with torch.inference_mode():
        scores = model(**inputs).logits[:, 0]
    ids = [[int(t) for t, m in zip(row, mask) if m] for row, mask in zip(inputs["input_ids"], inputs["attention_mask"])]
    return texts, ids, [float(s) for s in scores]


def id_sequences(pad, seed):
    g = torch.Generator().manual_seed(seed)
    seqs = [torch.randint(3, 320, (n,), generator=g).tolist() for n in (17, 5, 1, 30, 9)]
    seqs[0][8] = pad                # a pad id inside: scored past it
    seqs[1] += [pad, pad]           # trailing pad ids: the last non-pad token is scored
    seqs[4][0] = pad                # a pad id first
    seqs.append([pad, pad, pad])    # nothing but pad: transformers' argmax picks position 0
    return seqs


def padded_scores(model, pad, seqs):
    """One right-padded batch with its attention mask, as a tokenizer pads it."""
    T = max(len(s) for s in seqs)
    ids = torch.tensor([s + [pad] * (T - len(s)) for s in seqs])
    mask = torch.tensor([[1] * len(s) + [0] * (T - len(s)) for s in seqs])
    with torch.inference_mode():
        return [float(x) for x in model(input_ids=ids, attention_mask=mask).logits[:, 0]]


def main():
    base_tok = AutoTokenizer.from_pretrained(TOKENIZER)
    goldens = {"transformers_version": transformers.__version__, "trl_version": trl.__version__,
               "torch_version": torch.__version__, "models": []}
    for arch, seed, pad_token in (("qwen2", 777, "<|end_of_text|>"), ("llama", 888, None)):
        name = f"tiny-{arch}-rm"
        path = os.path.join(OUT, name)
        model = make_rm(arch, seed)
        model.save_pretrained(path)
        tok = AutoTokenizer.from_pretrained(TOKENIZER)
        if pad_token:
            tok.pad_token = pad_token
        tok.chat_template = RM_TEMPLATE
        tok.save_pretrained(path)
        model, tok = load_as_trl(path)
        pad = tok.pad_token_id
        seqs = id_sequences(pad, seed)
        # score_bf16: the same model with bf16 weights and compute (transformers' own bf16 error is the
        # yardstick of a bf16 device's scores: tests/gpu/test_cuda_reward_model.c)
        bf16_scores = padded_scores(copy.deepcopy(model).to(torch.bfloat16), pad, seqs)
        entry = {"name": name, "dir": f"tests/data/models/{name}", "pad_token_id": pad,
                 "ids": [{"ids": s, "score": x, "score_bf16": y}
                         for s, x, y in zip(seqs, padded_scores(model, pad, seqs), bf16_scores)]}
        for kind, prompts, completions in (("plain", PLAIN_PROMPTS, PLAIN_COMPLETIONS),
                                           ("conversational", CHAT_PROMPTS, CHAT_COMPLETIONS),
                                           ("multi_turn", TOOL_PROMPTS, TOOL_COMPLETIONS)):
            texts, ids, scores = trl_scores(model, tok, prompts, completions)
            entry[kind] = [{"prompt": p, "completion": c, "text": t, "ids": i, "score": s}
                           for p, c, t, i, s in zip(prompts, completions, texts, ids, scores)]
        # The chat ends with the eos: when it is the pad id, the token before it is scored, else the eos itself.
        last = entry["conversational"][0]["ids"][-1]
        print(f"{name}: pad id {pad}, a chat ends with id {last} ({tok.convert_ids_to_tokens(last)}); scores "
              + " ".join(f"{e['score']:.4f}" for e in entry["plain"] + entry["conversational"] + entry["multi_turn"]))
        assert all("<call>" in e["text"] for e in entry["multi_turn"])  # the calls reach the scored text
        scores = [e["score"] for e in entry["plain"] + entry["conversational"] + entry["ids"]]
        assert max(scores) - min(scores) > 0.1, scores  # scores that differ: a test that can fail
        goldens["models"].append(entry)
    del base_tok
    with open(os.path.join(OUT, "reward_model_goldens.json"), "w") as f:
        json.dump(goldens, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
