#!/usr/bin/env python3
"""make_lora_goldens.py — LoRA adapters and goldens from PEFT, for tests/test_lora.c.

For two tiny checkpoints of tests/data/models, a PEFT LoRA adapter is made with get_peft_model and its
B matrices set to random non-zero values (PEFT initialises B to zero, which would make the adapter a
no-op), then saved with save_pretrained to tests/data/lora/<name>/ (adapter_config.json +
adapter_model.safetensors):
  qwen3-all-linear: tiny-qwen3-f32 (q_norm / k_norm), r 4, lora_alpha 8, every linear layer of the block
  llama-qv-rslora:  tiny-llama-f32 (q/k/v/o biases, untied), r 8, lora_alpha 16, q_proj and v_proj only
                    (PEFT's default for Llama), use_rslora (scaling alpha / sqrt(r))

tests/data/lora/goldens.json holds per adapter, computed by PEFT in fp32:
  - log p(ids[t] | ids[<t]) of two sequences, and the same with the adapter merged (merge_and_unload)
  - a greedy continuation (model.generate) and its smallest top-1 / top-2 logit margin
  - gradients of the loss of tests/ref/make_grad_goldens.py (three sequences, temperature 0.7, fixed
    per-token weights) with respect to every lora_A / lora_B: in full up to 128 entries, else 64 entries at
    fixed random indices, always the L2 norm.
  - the same with lora_dropout (DROPOUT), PEFT's dropout modules given colt's masks: element i of the
    packed batch's [tokens, in] input of target t in layer l is kept when colt's Philox
    (core/rng.c) draws rng_uniform(DROPOUT_SEED, (DROPOUT_KEY << 16) ^ (l << 3) ^ t, i) >= DROPOUT.

Usage:
  python3 tests/ref/make_lora_goldens.py
  python3 tests/ref/make_lora_goldens.py --check ADAPTER_DIR NAME
      loads an adapter colt saved onto NAME's base model with PeftModel.from_pretrained and compares
      its log-probs with NAME's goldens; exits non-zero on a mismatch.
Needs torch, transformers and peft.
"""
import json
import os
import sys

import peft
import torch
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import AutoModelForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_model_goldens import greedy, log_probs, sequences  # noqa: E402  (the same helpers as the model goldens)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODELS = os.path.join(ROOT, "tests", "data", "models")
OUT = os.path.join(ROOT, "tests", "data", "lora")
TEMPERATURE = 0.7
LENGTHS = [7, 12, 5]
COMPLETION = [4, 6, 3]
FULL_MAX = 128
N_SAMPLE = 64

DROPOUT, DROPOUT_SEED, DROPOUT_KEY = 0.25, 1234, 7
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]  # colt's LoraTarget order
MASK32 = 0xFFFFFFFF


def rng_uniform(seed, stream, counter):
    """core/rng.c's rng_uniform: Philox4x32-10, the top 24 bits of the first word."""
    c0, c1, c2, c3 = counter & MASK32, counter >> 32, stream & MASK32, stream >> 32
    k0, k1 = seed & MASK32, seed >> 32
    for _ in range(10):
        p0, p1 = 0xD2511F53 * c0, 0xCD9E8D57 * c2
        c0, c1, c2, c3 = (p1 >> 32) ^ c1 ^ k0, p1 & MASK32, (p0 >> 32) ^ c3 ^ k1, p0 & MASK32
        k0, k1 = (k0 + 0x9E3779B9) & MASK32, (k1 + 0xBB67AE85) & MASK32
    return (c0 >> 8) * (1.0 / 16777216.0)


class ColtDropout(torch.nn.Module):
    """PEFT's lora_dropout with colt's mask for (layer, target): rows offset by the tokens of the sequences
    before the current one (ctx["offset"]), as colt packs them."""

    def __init__(self, layer, target, ctx):
        super().__init__()
        self.stream = (DROPOUT_KEY << 16) ^ (layer << 3) ^ target
        self.ctx = ctx

    def forward(self, x):
        T, n_in = x.shape[-2], x.shape[-1]
        first = self.ctx["offset"] * n_in
        keep = [rng_uniform(DROPOUT_SEED, self.stream, first + i) >= DROPOUT for i in range(T * n_in)]
        mask = torch.tensor(keep, dtype=x.dtype).reshape(x.shape)
        return x * mask * torch.tensor(1.0 / (1.0 - DROPOUT), dtype=torch.float32).to(x.dtype)


def with_colt_dropout(model):
    ctx = {"offset": 0}
    for name, module in model.named_modules():
        if hasattr(module, "lora_dropout") and "default" in module.lora_dropout:
            parts = name.split(".")
            layer = int(parts[parts.index("layers") + 1])
            module.lora_dropout["default"] = ColtDropout(layer, TARGETS.index(parts[-1]), ctx)
    return ctx


ADAPTERS = [
    {"name": "qwen3-all-linear", "base": "tiny-qwen3-f32", "seed": 71,
     "config": dict(r=4, lora_alpha=8, target_modules="all-linear")},
    {"name": "llama-qv-rslora", "base": "tiny-llama-f32", "seed": 72,
     "config": dict(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], use_rslora=True)},
]


def load_base(base):
    return AutoModelForCausalLM.from_pretrained(os.path.join(MODELS, base), dtype=torch.float32,
                                                attn_implementation="eager").eval()


def gradients(model, seed, vocab, ctx=None):
    """The loss of make_grad_goldens.py on a fixed batch; gradients of the trainable (LoRA) parameters.
    ctx: with_colt_dropout's, told where each sequence starts in colt's packed batch."""
    g = torch.Generator().manual_seed(seed)
    seqs, targets, weights = [], [], []
    for T, k in zip(LENGTHS, COMPLETION):
        ids = torch.randint(3, vocab, (T,), generator=g).tolist()
        tgt = [-1] * T
        for p in range(T - k - 1, T - 1):
            tgt[p] = ids[p + 1]
        w = [round(float(x), 6) if t >= 0 else 0.0 for x, t in zip(torch.randn(T, generator=g).tolist(), tgt)]
        seqs.append(ids), targets.append(tgt), weights.append(w)
    model.zero_grad()
    loss = torch.zeros((), dtype=torch.float64)
    all_lp = []
    offset = 0
    for ids, tgt, w in zip(seqs, targets, weights):
        if ctx is not None:
            ctx["offset"] = offset
        offset += len(ids)
        lsm = torch.log_softmax(model(torch.tensor([ids])).logits[0].double() / TEMPERATURE, dim=-1)
        lp = []
        for p, t in enumerate(tgt):
            lp.append(lsm[p, t].item() if t >= 0 else 0.0)
            if t >= 0:
                loss = loss + w[p] * lsm[p, t]
        all_lp.append(lp)
    loss.backward()
    grads = {}
    gs = torch.Generator().manual_seed(seed + 100)
    for pname, p in model.named_parameters():
        if not p.requires_grad:
            assert p.grad is None, pname
            continue
        name = pname.replace(".default", "")  # PEFT's saved names drop the adapter name
        gr = p.grad.detach().flatten().double()
        entry = {"numel": gr.numel(), "norm": gr.norm().item()}
        if gr.numel() <= FULL_MAX:
            entry["full"] = gr.tolist()
        else:
            idx = torch.randperm(gr.numel(), generator=gs)[:N_SAMPLE].sort().values
            entry["idx"], entry["val"] = idx.tolist(), gr[idx].tolist()
        grads[name] = entry
    return {"sequences": seqs, "targets": targets, "weights": weights, "logprobs": all_lp, "loss": loss.item(),
            "grads": grads}


def make_all():
    goldens = {"peft_version": peft.__version__, "torch_version": torch.__version__, "temperature": TEMPERATURE,
               "adapters": []}
    for spec in ADAPTERS:
        torch.manual_seed(spec["seed"])
        model = get_peft_model(load_base(spec["base"]), LoraConfig(lora_dropout=0.0, **spec["config"]))
        g = torch.Generator().manual_seed(spec["seed"] + 1)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.copy_(0.5 * torch.randn(p.shape, generator=g))
        model.eval()
        path = os.path.join(OUT, spec["name"])
        model.save_pretrained(path)
        readme = os.path.join(path, "README.md")
        if os.path.exists(readme):
            os.remove(readme)
        # The base model's path relative to the repository, not this machine's absolute one.
        cfg_path = os.path.join(path, "adapter_config.json")
        with open(cfg_path) as f:
            cfg = json.load(f)
        cfg["base_model_name_or_path"] = f"tests/data/models/{spec['base']}"
        if isinstance(cfg["target_modules"], list):  # PEFT writes a set's order: make the file reproducible
            cfg["target_modules"] = sorted(cfg["target_modules"])
        with open(cfg_path, "w") as f:
            json.dump(cfg, f, indent=2, sort_keys=True)
            f.write("\n")
        # What the tests load: the saved files, onto a freshly loaded base.
        ref = PeftModel.from_pretrained(load_base(spec["base"]), path).eval()
        vocab = ref.config.vocab_size
        long_ids, short_ids, prompt = sequences(spec["seed"], vocab)
        base_lp = log_probs(load_base(spec["base"]), long_ids)
        lps = [log_probs(ref, ids) for ids in (long_ids, short_ids)]
        gap = max(abs(a - b) for a, b in zip(base_lp, lps[0]))
        print(f"{spec['name']}: the adapter moves log-probs by up to {gap:.3g}")
        assert gap > 0.05, gap
        new, margin = greedy(ref, prompt, 20)
        print(f"{spec['name']}: greedy min top-2 margin {margin:.4f}")
        train = PeftModel.from_pretrained(load_base(spec["base"]), path, is_trainable=True)
        train.train(False)  # no dropout; autograd on
        grads = gradients(train, spec["seed"] + 2, vocab)
        dropped = PeftModel.from_pretrained(load_base(spec["base"]), path, is_trainable=True)
        dropped.train(False)  # colt's masks, not torch's RNG
        grads_dropout = gradients(dropped, spec["seed"] + 2, vocab, with_colt_dropout(dropped))
        grads_dropout.update({"p": DROPOUT, "seed": DROPOUT_SEED, "key": DROPOUT_KEY})
        merged = PeftModel.from_pretrained(load_base(spec["base"]), path).merge_and_unload().eval()
        merged_lp = [log_probs(merged, ids) for ids in (long_ids, short_ids)]
        goldens["adapters"].append({
            "name": spec["name"], "base": f"tests/data/models/{spec['base']}",
            "dir": f"tests/data/lora/{spec['name']}",
            "logprobs": [{"ids": ids, "logprobs": lp, "merged_logprobs": mlp}
                         for ids, lp, mlp in zip((long_ids, short_ids), lps, merged_lp)],
            "greedy": {"prompt": prompt, "new_tokens": new, "min_margin": margin},
            "train": grads,
            "train_dropout": grads_dropout,
        })
    with open(os.path.join(OUT, "goldens.json"), "w") as f:
        json.dump(goldens, f, indent=None, separators=(",", ":"))
        f.write("\n")
    print("wrote", os.path.join(OUT, "goldens.json"))


def check(adapter_dir, name):
    with open(os.path.join(OUT, "goldens.json")) as f:
        entry = next(a for a in json.load(f)["adapters"] if a["name"] == name)
    base = os.path.basename(entry["base"])
    model = PeftModel.from_pretrained(load_base(base), adapter_dir).eval()
    worst = 0.0
    for seq in entry["logprobs"]:
        lp = log_probs(model, seq["ids"])
        worst = max(worst, max(abs(a - b) for a, b in zip(lp, seq["logprobs"])))
    print(f"PEFT loaded {adapter_dir} onto {base}; max |logprob diff| vs {name}: {worst:.3g}")
    return 0 if worst < 1e-4 else 1


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--check":
        sys.exit(check(sys.argv[2], sys.argv[3]))
    make_all()
