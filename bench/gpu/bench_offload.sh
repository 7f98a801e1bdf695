#!/usr/bin/env bash
# bench_offload.sh — a full-parameter GRPO step of a Qwen2.5-7B shape on one GPU with the optimizer offloaded
# (offload_optimizer cpu), the GRPO benchmark's round (bench/gpu/grpo_bench.yaml: 16 prompts x 8 generations
# x 256 tokens), trained in micro-batches of 16 (gradient_accumulation_steps 8: the same 128 sequences per
# optimizer step). Prints: the dry-run plan, what the run without offload says (the plan refuses it before
# loading weights), and a table of the step's parts — generation, training (forward + backward), the
# optimizer (D2H + host AdamW + H2D, and the host AdamW alone) — with the allocator's peak beside the plan's.
# Usage: bash bench/gpu/bench_offload.sh TOKENIZER_DIR PROMPTS_JSONL [preset]   (preset default qwen2.5-7b)
# COLT_TRAIN_ARGS (environment) is appended to colt train's arguments, e.g. two GPUs with ZeRO-2:
#   COLT_TRAIN_ARGS="--nproc_per_node 2 --zero_stage 2 --per_device_train_batch_size 8"
set -euo pipefail
cd "$(dirname "$0")/../.."
COLT=${COLT:-build-cuda/colt}
tok=$1
prompts=$2
preset=${3:-qwen2.5-7b}
work=${WORK:-/tmp/colt-bench-offload}
steps=${STEPS:-4}
mkdir -p "$work"
if [ ! -f "$work/$preset/config.json" ]; then
  t0=$(date +%s)
  $COLT init --arch qwen2 --preset "$preset" --tokenizer "$tok" --out "$work/$preset" 2>/dev/null
  echo "colt init $preset: $(( $(date +%s) - t0 )) s"
fi
args=(--config bench/gpu/grpo_bench.yaml --model "$work/$preset" --dataset "$prompts" --device cuda
      --per_device_train_batch_size 16 --gradient_accumulation_steps 8 --max_steps "$steps" ${COLT_TRAIN_ARGS:-})
echo "== plan (colt train --dry_run, this GPU) =="
$COLT train "${args[@]}" --output_dir "$work/run" --offload_optimizer cpu --dry_run || true
echo
echo "== without offload =="
$COLT train "${args[@]}" --output_dir "$work/run-device" 2>&1 | tail -1 || true
echo
echo "== with offload_optimizer cpu =="
rm -rf "$work/run"
$COLT train "${args[@]}" --output_dir "$work/run" --offload_optimizer cpu > "$work/train.log" 2>&1 || { tail -5 "$work/train.log"; exit 1; }
grep -E "memory plan|gradient_checkpointing|optimizer:" "$work/train.log" || true
python3 - "$work/run/metrics.jsonl" "$preset" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
rows = [r for r in rows if "step_time" in r][1:]  # leave out the first step
mean = lambda k: sum(r.get(k, 0.0) for r in rows) / len(rows)
print("| model | s/step | generation | training (fwd+bwd) | optimizer (D2H + host AdamW + H2D) | host AdamW | allocated peak GB | engine peak GB |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
train = mean("time/training") - mean("time/optimizer")
print(f"| {sys.argv[2]} full, offload_optimizer cpu | {mean('step_time'):.2f} | {mean('time/generation'):.2f} | {train:.2f} | "
      f"{mean('time/optimizer'):.2f} | {mean('time/optimizer_host_adamw'):.2f} | {max(r.get('memory/allocated_peak_gb', 0) for r in rows):.1f} | "
      f"{mean('engine/peak_memory_gb'):.1f} |")
PY
echo
echo "Command: ${COLT_TRAIN_ARGS:+COLT_TRAIN_ARGS=\"$COLT_TRAIN_ARGS\" }bash bench/gpu/bench_offload.sh $tok $prompts $preset (means over steps 2-$steps)"
