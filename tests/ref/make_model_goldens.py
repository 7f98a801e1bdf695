#!/usr/bin/env python3
"""make_model_goldens.py — tiny reference checkpoints and forward goldens from transformers.

Writes tests/data/models/{tiny-qwen2,tiny-llama,tiny-llama3,tiny-qwen3}-{f32,bf16}/ (save_pretrained) and
tests/data/models/goldens.json: per-token log-probs log p(ids[t] | ids[<t]) computed by
transformers in fp32 (bf16 checkpoints are loaded upcast to fp32, as colt does on CPU),
and greedy continuations from model.generate(do_sample=False). Also goldens for the
pretrained stories260K (shared data). Not a test by itself: tests/test_model.c compares.

tiny-llama3 is a Llama 3.2-style checkpoint (llama3 RoPE scaling whose bands all fall inside its
16-wide heads, tied embeddings) saved as a real folder is today: its f32 folder is what transformers 5
writes (sharded safetensors with an index, rope_parameters, "dtype", a byte-level BPE tokenizer whose
tokenizer_config.json has model_max_length 1000000000000000019884624838656, chat_template.jinja beside
it, generation_config.json with a list of eos ids), its bf16 folder carries the same weights with
config.json rewritten in transformers 4.x's form (top-level rope_theta + rope_scaling, "torch_dtype").
Its golden entry adds "chat": the ids apply_chat_template gives for a conversation and the greedy
completion that generate() stops at the second eos id (tests/test_hf_folder.c).

tiny-qwen3 is a Qwen3ForCausalLM: q_norm / k_norm per head before RoPE, head_dim 24 given explicitly (the
heads are wider than hidden_size / num_attention_heads = 16), no q/k/v bias, untied.

Usage:
  python3 tests/ref/make_model_goldens.py            # regenerate everything
  python3 tests/ref/make_model_goldens.py --only qwen3 [ARCH ...]
      regenerate only these architectures' folders and golden entries, keeping the others' as they are
  python3 tests/ref/make_model_goldens.py --check DIR GOLDEN_NAME
      load a checkpoint colt saved (DIR) with transformers and compare its log-probs
      against the golden entry GOLDEN_NAME (e.g. tiny-llama-f32); exits non-zero on mismatch.
"""
import json
import os
import sys

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, Qwen2Config, Qwen3Config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "tests", "data", "models")
SHARED = os.environ.get("COLT_SHARED_DATA", os.path.join(ROOT, "..", "shared", "data"))
STORIES = os.path.join(SHARED, "models", "stories260K", "hf")
# The eos id of the tiny models: greedy runs set it to None so generation never stops early.
TINY_EOS = 2


def log_probs(model, ids):
    """log p(ids[t] | ids[<t]) for t = 1..T-1, fp32 forward, log-softmax in float64."""
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].double()
    lp = torch.log_softmax(logits, dim=-1)
    return [lp[t - 1, ids[t]].item() for t in range(1, len(ids))]


def greedy(model, prompt, n_new):
    """Greedy continuation (no eos stop) and the smallest top-1 / top-2 logit margin seen."""
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                             do_sample=False, max_new_tokens=n_new, min_new_tokens=n_new,
                             eos_token_id=None, pad_token_id=0, output_scores=True,
                             return_dict_in_generate=True)
    new = out.sequences[0, len(prompt):].tolist()
    margin = min((s[0].topk(2).values[0] - s[0].topk(2).values[1]).item() for s in out.scores)
    return new, margin


def load_fp32(path):
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager").eval()


# tiny-llama3's RoPE: wavelengths 2*pi / 10000^(-2j/16) = 6.3, 20, 63, 199, ... against the bands
# [64 / 8, 64 / 1]: frequency 0 kept, 1-2 smoothed, 3-7 divided by 4.
LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 4.0, "low_freq_factor": 1.0,
               "high_freq_factor": 8.0, "original_max_position_embeddings": 64}
LLAMA3_VOCAB = 320
CHAT_TEMPLATE = os.path.join(ROOT, "tests", "data", "llama3_chat_template.jinja")
CHAT_MESSAGES = [{"role": "system", "content": "You are a tiny test model."},
                 {"role": "user", "content": "What is two plus two? Answer briefly."}]


def make_tiny(arch, seed):
    common = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=256, max_position_embeddings=128, rms_norm_eps=1e-6,
                  bos_token_id=1, eos_token_id=TINY_EOS, initializer_range=0.15)
    if arch == "qwen2":
        cfg = Qwen2Config(tie_word_embeddings=True, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                          **common)
    elif arch == "qwen3":
        cfg = Qwen3Config(tie_word_embeddings=False, attention_bias=False, head_dim=24,
                          rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, **common)
    elif arch == "llama3":
        common.update(vocab_size=LLAMA3_VOCAB, max_position_embeddings=256, bos_token_id=0)  # the tokenizer's
        cfg = LlamaConfig(tie_word_embeddings=True, attention_bias=False, rope_parameters=dict(LLAMA3_ROPE),
                          **common)
    else:
        cfg = LlamaConfig(tie_word_embeddings=False, attention_bias=True,
                          rope_parameters={"rope_type": "default", "rope_theta": 50000.0}, **common)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32, attn_implementation="eager").eval()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            # Biases and norm weights get random non-zero values so the test exercises them.
            if name.endswith(".bias"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
            elif "norm" in name:
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
    return model


def sequences(seed, vocab):
    g = torch.Generator().manual_seed(seed)
    long_ids = [1] + torch.randint(3, vocab, (39,), generator=g).tolist()
    short_ids = [1] + torch.randint(3, vocab, (6,), generator=g).tolist()
    prompt = [1] + torch.randint(3, vocab, (5,), generator=g).tolist()
    return long_ids, short_ids, prompt


def make_tokenizer():
    """A byte-level BPE tokenizer (Llama 3's special tokens) trained on a few sentences, as a
    PreTrainedTokenizerFast: save_pretrained writes tokenizer.json, tokenizer_config.json (with transformers'
    default model_max_length, int(1e30)) and chat_template.jinja."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    corpus = ["You are a tiny test model.", "What is two plus two? Answer briefly.", "The answer is four.",
              "system user assistant", "Once upon a time there was a small model that answered questions."] * 4
    trainer = trainers.BpeTrainer(vocab_size=LLAMA3_VOCAB - 16, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus, trainer)
    with open(CHAT_TEMPLATE) as f:
        template = f.read()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|begin_of_text|>", eos_token="<|eot_id|>",
                                   chat_template=template)
    assert len(fast) <= LLAMA3_VOCAB, len(fast)
    return fast


def to_legacy_config(path):
    """Rewrites PATH/config.json in transformers 4.x's form: top-level rope_theta, rope_scaling, torch_dtype."""
    cfg_path = os.path.join(path, "config.json")
    with open(cfg_path) as f:
        cfg = json.load(f)
    rope = cfg.pop("rope_parameters")
    cfg["rope_theta"] = rope.pop("rope_theta")
    cfg["rope_scaling"] = rope
    cfg["torch_dtype"] = cfg.pop("dtype")
    with open(cfg_path, "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")


def make_chat_golden(path, model, tok):
    """The chat ids and a greedy completion that stops at the second eos id of generation_config.json."""
    ids = tok.apply_chat_template(CHAT_MESSAGES, add_generation_prompt=True, tokenize=True, return_dict=False)
    text = tok.apply_chat_template(CHAT_MESSAGES, add_generation_prompt=True, tokenize=False)
    free, _ = greedy(model, ids, 24)
    # Stop at a token first seen at new position >= 6, so the stop is visibly honoured.
    k = next(i for i in range(6, len(free)) if free[i] not in free[:i])
    stop = free[k]
    eot = tok.convert_tokens_to_ids("<|eot_id|>")
    model.generation_config.eos_token_id = [eot, stop]
    model.generation_config.bos_token_id = tok.bos_token_id
    model.generation_config.do_sample = False
    model.generation_config.save_pretrained(path)
    ref = load_fp32(path)
    with torch.no_grad():
        out = ref.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                           max_new_tokens=24, pad_token_id=eot)
    completion = out[0, len(ids):].tolist()
    assert completion == free[:k + 1], (completion, free)
    return {"messages": CHAT_MESSAGES, "text": text, "ids": ids, "eos_token_id": [eot, stop],
            "completion": completion}


ARCHS = (("qwen2", 1234), ("llama", 4321), ("llama3", 3232), ("qwen3", 5656))


def make_all(only=None):
    os.makedirs(OUT, exist_ok=True)
    goldens = {"transformers_version": transformers.__version__, "torch_version": torch.__version__,
               "models": []}
    kept = {}
    if only:  # keep every other entry (and its versions) as it is
        with open(os.path.join(OUT, "goldens.json")) as f:
            goldens = json.load(f)
        kept = {m["name"]: m for m in goldens["models"]}
        goldens["models"] = []
        goldens.setdefault("regenerated", {})
        for arch in only:
            goldens["regenerated"][arch] = {"transformers_version": transformers.__version__,
                                            "torch_version": torch.__version__}
    for arch, seed in ARCHS:
        if only and arch not in only:
            for dtype_name in ("f32", "bf16"):
                goldens["models"].append(kept[f"tiny-{arch}-{dtype_name}"])
            continue
        model = make_tiny(arch, seed)
        long_ids, short_ids, prompt = sequences(seed, model.config.vocab_size)
        for dtype_name, dtype in (("f32", torch.float32), ("bf16", torch.bfloat16)):
            name = f"tiny-{arch}-{dtype_name}"
            path = os.path.join(OUT, name)
            chat = None
            if arch == "llama3" and dtype_name == "f32":
                # A real folder as transformers 5 saves one: sharded weights, tokenizer files, eos list.
                model.to(dtype).save_pretrained(path, max_shard_size="150KB")
                tok = make_tokenizer()
                tok.save_pretrained(path)
                chat = make_chat_golden(path, load_fp32(path), tok)
            else:
                model.to(dtype).save_pretrained(path)
                if arch == "llama3":
                    to_legacy_config(path)
            model.to(torch.float32)
            ref = load_fp32(path)
            new, margin = greedy(ref, prompt, 20)
            print(f"{name}: greedy min top-2 margin {margin:.4f}")
            entry = {
                "name": name, "dir": f"tests/data/models/{name}",
                "logprobs": [{"ids": ids, "logprobs": log_probs(ref, ids)} for ids in (long_ids, short_ids)],
                "greedy": {"prompt": prompt, "new_tokens": new, "min_margin": margin},
            }
            if chat:
                chat["logprobs"] = log_probs(ref, chat["ids"] + chat["completion"])
                entry["chat"] = chat
            if arch == "llama3":
                # The goldens must tell llama3 RoPE from the default: the same weights with default RoPE.
                plain = load_fp32(path)
                plain.config.rope_parameters = {"rope_type": "default", "rope_theta": LLAMA3_ROPE["rope_theta"]}
                plain.model.rotary_emb = type(plain.model.rotary_emb)(plain.config)
                gap = max(abs(a - b) for a, b in zip(log_probs(plain, long_ids), entry["logprobs"][0]["logprobs"]))
                print(f"{name}: default RoPE instead of llama3 changes log-probs by up to {gap:.3g}")
                assert gap > 1e-2, gap
            goldens["models"].append(entry)
    if only:
        goldens["models"].append(kept["stories260K"])
        write_goldens(goldens)
        return
    # The pretrained stories260K: greedy continuation of BOS + "Once upon a time".
    tok = AutoTokenizer.from_pretrained(STORIES)
    prompt = tok("Once upon a time")["input_ids"]
    assert prompt[0] == 1, prompt
    ref = load_fp32(STORIES)
    new, margin = greedy(ref, prompt, 40)
    text = tok.decode(new)
    print(f"stories260K: {text!r} (min margin {margin:.4f})")
    assert text.startswith(", there was a little girl named Lily. She loved to play outside in the park."), text
    goldens["models"].append({
        "name": "stories260K", "shared_dir": "models/stories260K/hf",
        "logprobs": [{"ids": prompt + new, "logprobs": log_probs(ref, prompt + new)}],
        "greedy": {"prompt": prompt, "new_tokens": new, "min_margin": margin, "text": text},
    })
    write_goldens(goldens)


def write_goldens(goldens):
    with open(os.path.join(OUT, "goldens.json"), "w") as f:
        json.dump(goldens, f, indent=1)
        f.write("\n")
    print("wrote", os.path.join(OUT, "goldens.json"))


def check(path, golden_name):
    """Loads a colt-saved checkpoint with transformers; compares log-probs with the golden."""
    with open(os.path.join(OUT, "goldens.json")) as f:
        entry = next(m for m in json.load(f)["models"] if m["name"] == golden_name)
    model = load_fp32(path)
    worst = 0.0
    for seq in entry["logprobs"]:
        lp = log_probs(model, seq["ids"])
        worst = max(worst, max(abs(a - b) for a, b in zip(lp, seq["logprobs"])))
    print(f"transformers loaded {path} ({type(model).__name__}); max |logprob diff| vs {golden_name}: {worst:.3g}")
    return 0 if worst < 1e-4 else 1


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--check":
        sys.exit(check(sys.argv[2], sys.argv[3]))
    if len(sys.argv) >= 3 and sys.argv[1] == "--only":
        make_all(only=sys.argv[2:])
    else:
        make_all()
