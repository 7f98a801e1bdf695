#!/usr/bin/env python3
"""make_tool_model.py — a tiny checkpoint that really calls tools, and TRL's tokens for one of its conversations.

Writes tests/data/models/tiny-tool-f32/ (a 3-layer Qwen2ForCausalLM in f32: 0.65 MB of weights, 0.78 MB in all) and
tests/data/agent/tool_model_goldens.json. Not a test by itself: tests/test_agent_train.c trains on it with colt.

The tokenizer is a byte-level BPE (digits split one by one, no split between words) trained here on the
conversations below: 799 ids, Qwen2.5's special tokens (<|endoftext|>, <|im_start|>, <|im_end|>, eos <|im_end|>),
<tool_call> and friends as added tokens, Qwen2.5's chat template verbatim (hermes tool calls, prefix-preserving);
the model has 800 embedding rows, so it can sample an id the tokenizer does not have, as Qwen2.5 can. The model is
supervised (fixed seed, one CPU thread, 800 steps, 2-3 minutes) on conversations rendered the way GRPOTrainer
builds them (prompt ids from apply_chat_template(tools=...), completion ids, TRL's _get_tool_suffix_ids, the next
turn), the loss on the model's turns only. The user says "OP A B" (A, B in 0..99) and the system part lists the tools
of tests/data/agent/calc_tools.py (add, div, slow, big):
  add  -> calls add(a, b); after the result, repeats it            (the tool works)
  div  -> calls div(a, b), b often 0; repeats the result or says "error" (a tool that raises)
  mul  -> calls mul(a, b), which is not a tool; says "error"        (an unknown tool)
  slow -> calls slow(a, b), which sleeps 600 s; says "error"         (a hanging tool, cut by tool_timeout)
  bad  -> writes an add call whose JSON lacks a closing brace       (malformed: plain content, no call)
  big  -> calls big(a, b), whose 600-character result fits no completion (results dropped)
After a result starting with {'error' the model says "error", otherwise it repeats the result.

The goldens: TRL's tool suffix ids for one result, and for 7 prompts (every case but slow, which would sleep
30 s here) the prompt ids and a greedy rollout as TRL's _tool_call_loop makes it with transformers' generate
(completion ids, tool_mask, the completion's messages), so colt's loop can be compared token for token.
The script prints the sha256 of model.safetensors and whether it is the committed one (EXPECTED_SHA256; two
runs on 2026-11-29, torch 2.15 CPU, gave it).

Usage: HF_HUB_OFFLINE=1 python3 tests/ref/make_tool_model.py     (torch 2.x CPU, transformers 5.24, trl 1.16)
"""
import hashlib
import importlib.util
import json
import os
import random
import sys
import types

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers  # noqa: E402
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM  # noqa: E402
from transformers.utils import get_json_schema  # noqa: E402
from trl.chat_template_utils import add_response_schema, parse_response  # noqa: E402
from trl.trainer.grpo_trainer import GRPOTrainer  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHARED = os.environ.get("COLT_SHARED_DATA", os.path.join(ROOT, "..", "shared", "data"))
OUT = os.path.join(ROOT, "tests", "data", "models", "tiny-tool-f32")
GOLDENS = os.path.join(ROOT, "tests", "data", "agent", "tool_model_goldens.json")
TOOLS_PY = os.path.join(ROOT, "tests", "data", "agent", "calc_tools.py")

VOCAB = 800
SEED = 1234
EXPECTED_SHA256 = "a913f71b9ffa0e81a2be2195f7edb85d072b3f7b322b29b421ed9c467c0de0cb"
STEPS = int(os.environ.get("TOOL_MODEL_STEPS", "800"))
BATCH = 32
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
ADDED = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]
OPS = ["add", "div", "mul", "slow", "bad", "big"]
TIMEOUT_TEXT = "{'error': 'Tool slow timed out after 1 s'}"


def load_tools():
    spec = importlib.util.spec_from_file_location("calc_tools", TOOLS_PY)
    module = importlib.util.module_from_spec(spec)
    sys.modules["calc_tools"] = module
    spec.loader.exec_module(module)
    return [module.add, module.div, module.slow, module.big]


def qwen25_template():
    with open(os.path.join(SHARED, "qwen2.5-tokenizer", "tokenizer_config.json"), encoding="utf-8") as f:
        return json.load(f)["chat_template"]


def make_tokenizer(corpus, template):
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    # digits one by one (numbers are copied digit by digit), everything else merged freely, across words:
    # the long system part with the tools' schemas, the same in every prompt, becomes a few dozen tokens
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB - len(ADDED), special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   additional_special_tokens=["<|im_start|>", "<|im_end|>"], chat_template=template)
    fast.add_tokens(ADDED)
    assert len(fast) <= VOCAB, len(fast)
    return fast


def tool_result(op, a, b):
    """What the model gets back (TRL's str(result) or {'error': ...}), None when the call never happens."""
    if op == "add":
        return str(a + b)
    if op == "div":
        return "{'error': 'integer division or modulo by zero'}" if b == 0 else str(a // b)
    if op == "mul":
        return "{'error': 'Tool mul not found.'}"
    if op == "slow":
        return TIMEOUT_TEXT
    return None  # bad: no call; big: dropped


def first_turn(op, a, b):
    name = "add" if op == "bad" else op
    args = json.dumps({"a": a, "b": b})
    if op == "bad":
        args = args[:-1]  # the arguments' closing brace missing
    return '<tool_call>\n{"name": "%s", "arguments": %s}\n</tool_call>' % (name, args)


def example(rng):
    op = rng.choice(OPS)
    a = rng.randrange(100)
    b = rng.randrange(100) if op != "div" or rng.random() < 0.5 else 0
    if op == "div" and b != 0:
        b = rng.randrange(1, 10)
    return op, a, b


class Renderer:
    """Ids as GRPOTrainer builds them: prompt ids, completion ids, TRL's tool suffix ids."""

    def __init__(self, tok, tools):
        self.tok, self.tools = tok, tools
        self.fake = types.SimpleNamespace(processing_class=tok, _tokenizer=tok, chat_template=None,
                                          chat_template_kwargs={}, _is_vlm=False)

    def prompt(self, op, a, b):
        return self.tok.apply_chat_template([{"role": "user", "content": f"{op} {a} {b}"}], tools=self.tools,
                                            add_generation_prompt=True, tokenize=True, return_dict=False)

    def text_ids(self, text):
        return self.tok.encode(text, add_special_tokens=False)

    def suffix(self, name, content):
        return GRPOTrainer._get_tool_suffix_ids(self.fake, [{"role": "tool", "name": name, "content": content}])

    def conversation(self, op, a, b):
        """(ids, loss mask): the prompt, the model's first turn, and when a result comes back, it and the reply."""
        prompt = self.prompt(op, a, b)
        end = self.text_ids("<|im_end|>")
        turn = self.text_ids(first_turn(op, a, b)) + end
        ids, mask = prompt + turn, [0] * len(prompt) + [1] * len(turn)
        result = tool_result(op, a, b)
        if result is not None:
            suffix = self.suffix(op, result)
            reply = self.text_ids("error" if result.startswith("{'error'") else result) + end
            ids += suffix + reply
            mask += [0] * len(suffix) + [1] * len(reply)
        return ids, mask


def train(model, renderer, rng):
    torch.manual_seed(SEED)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.98), weight_decay=0.0)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=3e-3, total_steps=STEPS, pct_start=0.05)
    model.train()
    for step in range(STEPS):
        batch = [renderer.conversation(*example(rng)) for _ in range(BATCH)]
        T = max(len(ids) for ids, _ in batch)
        x = torch.zeros(BATCH, T, dtype=torch.long)
        y = torch.full((BATCH, T), -100, dtype=torch.long)
        att = torch.zeros(BATCH, T, dtype=torch.long)
        for i, (ids, mask) in enumerate(batch):
            x[i, :len(ids)] = torch.tensor(ids)
            att[i, :len(ids)] = 1
            for t in range(1, len(ids)):
                if mask[t]:
                    y[i, t - 1] = ids[t]
        logits = model(input_ids=x, attention_mask=att).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1),
                                                 ignore_index=-100)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 100 == 0 or step == STEPS - 1:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
    model.eval()


def greedy_turn(model, ids, stop, budget):
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                             do_sample=False, max_new_tokens=budget, eos_token_id=stop, pad_token_id=0)
    return out[0, len(ids):].tolist()


def rollout(model, renderer, tools, op, a, b, budget):
    """TRL's _tool_call_loop for one prompt, greedy: completion ids, tool_mask, the completion's messages."""
    tok = renderer.tok
    prompt = renderer.prompt(op, a, b)
    stop = tok.convert_tokens_to_ids("<|im_end|>")
    completion = greedy_turn(model, prompt, stop, budget)
    mask = [1] * len(completion)
    messages = [parse_response(tok, completion, prefix=prompt, tools=tools)]
    calls = messages[-1].get("tool_calls")
    while calls:
        by_name = {t.__name__: t for t in tools}
        contents = []
        for call in calls:
            f = call["function"]
            try:
                if f["name"] not in by_name:
                    raise ValueError(f"Tool {f['name']} not found.")
                contents.append((f["name"], str(by_name[f["name"]](**f["arguments"]))))
            except Exception as e:  # noqa: BLE001 — TRL's
                contents.append((f["name"], str({"error": str(e)})))
        tool_messages = [{"role": "tool", "name": n, "content": c} for n, c in contents]
        suffix = GRPOTrainer._get_tool_suffix_ids(renderer.fake, [dict(m) for m in tool_messages])
        context = prompt + completion + suffix
        if len(completion) + len(suffix) > budget:
            break
        messages += tool_messages
        post = greedy_turn(model, context, stop, budget - len(completion) - len(suffix))
        completion, mask = completion + suffix + post, mask + [0] * len(suffix) + [1] * len(post)
        if not post:
            break
        messages.append(parse_response(tok, post, prefix=context, tools=tools))
        calls = messages[-1].get("tool_calls")
    return prompt, completion, mask, messages


def main():
    torch.manual_seed(SEED)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    tools = load_tools()
    template = qwen25_template()

    # The tokenizer: a byte-level one renders the corpus, the BPE learns from it.
    corpus_rng = random.Random(SEED)
    bootstrap = make_tokenizer(["x"], template)
    schemas = [get_json_schema(t) for t in tools]
    corpus = []
    for _ in range(400):
        op, a, b = example(corpus_rng)
        messages = [{"role": "user", "content": f"{op} {a} {b}"},
                    {"role": "assistant", "content": first_turn(op, a, b)}]
        result = tool_result(op, a, b)
        if result is not None:
            messages += [{"role": "tool", "name": op, "content": result},
                         {"role": "assistant", "content": "error" if result.startswith("{'error'") else result}]
        corpus.append(bootstrap.apply_chat_template(messages, tools=schemas, tokenize=False))
    tok = make_tokenizer(corpus, template)
    add_response_schema(tok)  # what GRPOTrainer does when tools are given
    renderer = Renderer(tok, tools)
    n_prompt = len(renderer.prompt("add", 12, 30))
    print(f"vocabulary {len(tok)}, prompt of 'add 12 30': {n_prompt} tokens")

    cfg = Qwen2Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      rope_theta=10000.0, rms_norm_eps=1e-6, tie_word_embeddings=True,
                      bos_token_id=None, eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"),
                      pad_token_id=tok.convert_tokens_to_ids("<|endoftext|>"), initializer_range=0.05)
    model = Qwen2ForCausalLM(cfg).float()
    train(model, renderer, random.Random(SEED + 1))

    os.makedirs(OUT, exist_ok=True)
    model.generation_config.eos_token_id = cfg.eos_token_id
    model.generation_config.pad_token_id = cfg.pad_token_id
    model.save_pretrained(OUT)
    tok.save_pretrained(OUT)
    # add_response_schema's response_schema is TRL's runtime addition, not part of the checkpoint
    cfg_path = os.path.join(OUT, "tokenizer_config.json")
    with open(cfg_path, encoding="utf-8") as f:
        tok_cfg = json.load(f)
    tok_cfg.pop("response_schema", None)
    with open(cfg_path, "w", encoding="utf-8") as f:
        json.dump(tok_cfg, f, indent=2, ensure_ascii=False)
        f.write("\n")

    # Greedy rollouts as TRL makes them: the parity golden and a look at every behaviour.
    budget = 64
    goldens = {"budget": budget, "rollouts": []}
    ok = 0
    for op, a, b in [("add", 12, 30), ("add", 3, 4), ("div", 7, 0), ("div", 50, 7), ("mul", 6, 7), ("slow", 1, 2),
                     ("bad", 5, 6), ("big", 8, 9)]:
        if op == "slow":
            continue  # sleeps 30 s; its first turn is checked by colt
        prompt, completion, mask, messages = rollout(model, renderer, tools, op, a, b, budget)
        print(f"{op} {a} {b}: {json.dumps(messages)}  ({len(completion)} tokens, {sum(mask)} the model's)")
        goldens["rollouts"].append({"user": f"{op} {a} {b}", "prompt_ids": prompt, "completion_ids": completion,
                                    "tool_mask": mask, "messages": messages})
        final = messages[-1].get("content") if messages[-1]["role"] == "assistant" else None
        ok += (op == "add" and final == str(a + b))
    goldens["suffix_add_42"] = renderer.suffix("add", "42")
    with open(GOLDENS, "w", encoding="utf-8") as f:
        json.dump(goldens, f, indent=1)
        f.write("\n")
    with open(os.path.join(OUT, "model.safetensors"), "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    size = sum(os.path.getsize(os.path.join(OUT, n)) for n in os.listdir(OUT))
    print(f"wrote {OUT} ({size} bytes), model.safetensors sha256 {digest} "
          f"({'the committed one' if digest == EXPECTED_SHA256 else 'NOT the committed ' + EXPECTED_SHA256})")
    print(f"wrote {GOLDENS}; add rollouts right: {ok}/2")


if __name__ == "__main__":
    main()
