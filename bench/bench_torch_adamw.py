"""bench_torch_adamw.py — the peer of bench_host_adamw: PyTorch's AdamW on the CPU (what an offloaded
optimizer without DeepSpeed's CPUAdam runs), foreach and fused, over the same number of fp32
parameters, with the same 30 bytes-per-parameter count of memory traffic (fp32 parameter, gradient and
moments; PyTorch keeps no separate master and writes no bf16 copy, so it moves 28). Reference only: colt
does not use PyTorch. Usage: python3 bench/bench_torch_adamw.py [millions, default 512] [threads ...]"""
import sys
import time

import torch

millions = int(sys.argv[1]) if len(sys.argv) > 1 else 512
threads = [int(t) for t in sys.argv[2:]] or [torch.get_num_threads()]
n = millions << 20
p = torch.nn.Parameter(torch.randn(n) * 0.01)
p.grad = torch.randn(n) * 1e-3
print(f"torch {torch.__version__} AdamW on the CPU, {millions} M parameters\n")
print("| threads | variant | step s | params/s | GB/s (28 B/param) |")
print("|---:|---|---:|---:|---:|")
for t in threads:
    torch.set_num_threads(t)
    for variant in ("foreach", "fused"):
        opt = torch.optim.AdamW([p], lr=1e-6, weight_decay=0.01, **{variant: True})
        opt.step()  # allocates the moments
        best = 1e30
        for _ in range(3):
            t0 = time.perf_counter()
            opt.step()
            best = min(best, time.perf_counter() - t0)
        print(f"| {t} | {variant} | {best:.3f} | {n / best:.2e} | {28 * n / best / 1e9:.1f} |")
        del opt
