#!/usr/bin/env bash
# bench_dp.sh — the cost of data parallelism for a GRPO step on the GPU: the
# same global batch (bench/gpu/grpo_bench.yaml: 16 prompts x 8 completions x
# 256 tokens) in one process, in two processes sharing GPU 0, and in two
# processes on GPUs 0 and 1 (when there are two), each rank taking 64 of the
# 128 completions. colt starts the processes itself (--nproc_per_node 2). Two
# ranks on two GPUs all-reduce the gradients over NCCL in buckets during the
# backward pass ("gradient sync" is then what the backward did not hide); two
# ranks sharing GPU 0 sum them through the host (Gloo over loopback: NCCL
# refuses two ranks on one GPU). Prints a markdown table.
# Usage: bash bench/gpu/bench_dp.sh TOKENIZER_DIR PROMPTS_JSONL [preset]   (preset: qwen2.5-0.5b)
set -euo pipefail
cd "$(dirname "$0")/../.."
COLT=${COLT:-build-cuda/colt}
tok=$1
prompts=$2
preset=${3:-qwen2.5-0.5b}
work=${WORK:-/tmp/colt-bench-dp}
rm -rf "$work" && mkdir -p "$work"
$COLT init --arch qwen2 --preset "$preset" --tokenizer "$tok" --out "$work/model" 2>/dev/null
gpus=$(nvidia-smi -L | wc -l)
echo "| $preset, 128 completions a step | processes | s/step | generation | log-probs | training | gradient sync (in training, exposed) |"
echo "|---|---:|---:|---:|---:|---:|---:|"
run() { # name, extra args
  local name=$1
  shift
  if ! $COLT train --config bench/gpu/grpo_bench.yaml --model "$work/model" --dataset "$prompts" --device cuda \
      --output_dir "$work/run-$name" "$@" > "$work/train-$name.log" 2>&1; then
    echo "| $name | failed: $(tail -1 "$work/train-$name.log") |"
    return
  fi
  python3 - "$work/run-$name/metrics.jsonl" "$name" "$*" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()][1:]  # the first step (graph capture) left out
mean = lambda k: sum(r.get(k, 0.0) for r in rows) / len(rows)
procs = 2 if "nproc_per_node 2" in sys.argv[3] else 1
print(f"| {sys.argv[2]} | {procs} | {mean('step_time'):.3f} | {mean('time/generation'):.3f} | {mean('time/logprobs'):.3f} | "
      f"{mean('time/training'):.3f} | {mean('time/gradient_sync'):.4f} |")
PY
}
run one-gpu --nproc_per_node 1
run two-ranks-gpu0 --nproc_per_node 2 --devices '[0,0]' --per_device_train_batch_size 64
if [ "$gpus" -ge 2 ]; then run two-gpus --nproc_per_node 2 --devices '[0,1]' --per_device_train_batch_size 64; fi
echo
echo "Command: bash bench/gpu/bench_dp.sh $tok $prompts $preset (means over steps 2-6; $(nvidia-smi -L | head -1 | cut -d'(' -f1))"
