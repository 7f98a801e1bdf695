"""GPU check: colt's bf16 CUDA forward against transformers in bf16 on the same GPU.

A random Qwen2.5-0.5B-shaped checkpoint (written by `colt init`), random token
sequences; per-token log-probs from `colt score --device cuda` and from
transformers (torch_dtype=bfloat16, sdpa attention) on cuda. Both are bf16
implementations with fp32 accumulation, so they differ by rounding, not by
formula: the check states its tolerance on the mean and the max difference,
and prints the fp32 reference distance of each for scale.
Run on the GPU machine from the repository root:
    python3 tests/gpu/check_transformers_bf16.py [COLT_BINARY]
"""
import json
import os
import subprocess
import sys
import tempfile

import torch
from transformers import AutoModelForCausalLM

colt = sys.argv[1] if len(sys.argv) > 1 else "build-cuda/colt"
tmp = tempfile.mkdtemp(prefix="colt_bf16_")
model_dir = os.path.join(tmp, "qwen2.5-0.5b-random")
subprocess.run([colt, "init", "--arch", "qwen2", "--preset", "qwen2.5-0.5b", "--out", model_dir, "--seed", "7",
                "--dtype", "bf16"], check=True)

g = torch.Generator().manual_seed(0)
seqs = [torch.randint(0, 151000, (n,), generator=g).tolist() for n in (64, 257, 1000)]

out = subprocess.run([colt, "score", "--model", model_dir, "--device", "cuda"],
                     input="".join(json.dumps({"ids": s}) + "\n" for s in seqs),
                     capture_output=True, text=True, check=True).stdout.splitlines()
colt_lp = [json.loads(line)["logprobs"] for line in out]


def hf_logprobs(dtype):
    m = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, attn_implementation="sdpa").cuda().eval()
    res = []
    with torch.no_grad():
        for s in seqs:
            ids = torch.tensor([s], device="cuda")
            logits = m(ids).logits.float()
            lp = torch.log_softmax(logits, -1)[0, :-1].gather(1, ids[0, 1:, None])[:, 0]
            res.append(lp.cpu())
    del m
    torch.cuda.empty_cache()
    return res


hf_bf16, hf_f32 = hf_logprobs(torch.bfloat16), hf_logprobs(torch.float32)
fail = False
print("| tokens | mean abs diff colt-bf16 vs HF-bf16 | max | HF-bf16 vs HF-fp32 mean | max |")
print("|---:|---:|---:|---:|---:|")
for s, c, hb, hf in zip(seqs, colt_lp, hf_bf16, hf_f32):
    d = (torch.tensor(c) - hb).abs()
    ref = (hb - hf).abs()
    print(f"| {len(s)} | {d.mean():.4f} | {d.max():.4f} | {ref.mean():.4f} | {ref.max():.4f} |")
    # Tolerance: colt-bf16 may differ from HF-bf16 by no more than ~2x what bf16 itself moves HF.
    if d.mean() > max(2 * ref.mean(), 0.02) or d.max() > max(2 * ref.max(), 0.25):
        fail = True
print("FAILED" if fail else "colt bf16 forward agrees with transformers bf16 (within 2x bf16's own deviation)")
sys.exit(1 if fail else 0)
