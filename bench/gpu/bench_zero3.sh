#!/usr/bin/env bash
# bench_zero3.sh — what ZeRO stages cost and save at 2 ranks: the same GRPO round (bench/gpu/grpo_bench.yaml,
# 16 prompts x 8 completions x 256 tokens per rank, micro-batches of MICRO) with zero_stage 0, 2 and 3, on GPUs 0
# and 1 when the machine has two (NCCL: stage 3 gathers a layer while the one before computes) and with both
# ranks sharing GPU 0 (NCCL refuses that: every gather goes through host memory). Prints per rank: s/step and its
# parts, the allocator's peak beside the dry-run plan's expected peak, and the plan's weight / gradient /
# optimizer shares — stage 3's training-time weights are this rank's half plus two layer windows and the
# embedding / lm_head, the whole weights gathered only to generate.
# Usage: bash bench/gpu/bench_zero3.sh TOKENIZER_DIR PROMPTS_JSONL [preset]   (preset default qwen2.5-1.5b)
#   STAGES="2 3" (default "0 2 3") and SHARED=0 (skip the shared-GPU rows) shorten it.
set -euo pipefail
cd "$(dirname "$0")/../.."
COLT=${COLT:-build-cuda/colt}
tok=$1
prompts=$2
preset=${3:-qwen2.5-1.5b}
work=${WORK:-/tmp/colt-bench-zero3}
steps=${STEPS:-4}
micro=${MICRO:-32}
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
gpus=$(nvidia-smi -L | wc -l)
mkdir -p "$work"
[ -f "$work/$preset/config.json" ] || $COLT init --arch qwen2 --preset "$preset" --tokenizer "$tok" --out "$work/$preset" 2>/dev/null
layouts=()
[ "$gpus" -ge 2 ] && layouts+=("2 GPUs:--devices [0,1]")
[ "${SHARED:-1}" = 1 ] && layouts+=("shared:--devices [0,0]")
echo "| ranks on | zero_stage | s/step | generation | training | gradient sync | optimizer | allocated peak GB | plan GB | plan: weights / gradients / optimizer GB |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"
for layout in "${layouts[@]}"; do
  label=${layout%%:*}
  devices=${layout#*:}
  for z in ${STAGES:-0 2 3}; do
    args=(--config bench/gpu/grpo_bench.yaml --model "$work/$preset" --dataset "$prompts" --device cuda
          --nproc_per_node 2 $devices --per_device_train_batch_size "$micro" --gradient_accumulation_steps $((128 / micro))
          --zero_stage "$z" --max_steps "$steps")
    $COLT train "${args[@]}" --output_dir "$work/plan" --dry_run --json --world_size 2 > "$work/plan-$z.json" 2>/dev/null || true
    run="$work/run-${label// /}-$z"
    rm -rf "$run"
    if ! $COLT train "${args[@]}" --output_dir "$run" > "$run.log" 2>&1; then
      echo "| $label | $z | failed: $(tail -1 "$run.log") |"
      continue
    fi
    python3 - "$run/metrics.jsonl" "$work/plan-$z.json" "$label" "$z" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
rows = [r for r in rows if "step_time" in r][1:]  # leave out the first step (graphs, cuBLAS plans)
mean = lambda k: sum(r.get(k, 0.0) for r in rows) / len(rows)
try:
    plan = json.load(open(sys.argv[2]))["per_device_gb"]
except Exception:
    plan = {}
train = mean("time/training") - mean("time/optimizer") - mean("time/gradient_sync")
print(f"| {sys.argv[3]} | {sys.argv[4]} | {mean('step_time'):.2f} | {mean('time/generation'):.2f} | {train:.2f} | "
      f"{mean('time/gradient_sync'):.3f} | {mean('time/optimizer'):.3f} | "
      f"{max(r.get('memory/allocated_peak_gb', 0) for r in rows):.2f} | {plan.get('expected_peak', 0):.2f} | "
      f"{plan.get('weights', 0):.2f} (+{plan.get('weights_gathered', 0):.2f} to generate) / {plan.get('gradients', 0):.2f} / "
      f"{plan.get('optimizer_state', 0):.2f} |")
PY
  done
done
echo
echo "Command: bash bench/gpu/bench_zero3.sh $tok $prompts $preset (means over steps 2-$steps; $(nvidia-smi -L | head -1 | cut -d'(' -f1 | sed 's/GPU 0: //'))"
