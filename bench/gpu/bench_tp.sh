#!/usr/bin/env bash
# bench_tp.sh — tensor parallelism against one GPU and against data parallelism on the same GPUs, for one
# Qwen2.5 shape (random weights, colt init):
#   generation: colt generate --bench on PROMPTS x 8 completions x 256 tokens, eos ignored, at
#               tensor_parallel_size 1 (one GPU) and 2 (mpirun -np 2, GPUs 0 and 1; NCCL when they are two
#               GPUs, else the host path);
#   GRPO step:  bench/gpu/grpo_bench.yaml (16 prompts x 8 x 256 tokens per model) at TP 1 on one GPU, TP 2 on
#               two, and DP 2 (two whole models, the same batch per model) on the same two, plain and with
#               zero_stage 2 — s/step and completion tokens per second per GPU; a layout the memory plan
#               refuses prints its one-line reason.
# Prints markdown tables with the card from nvidia-smi. Usage:
#   bash bench/gpu/bench_tp.sh TOKENIZER_DIR GSM8K_PROMPTS_JSONL [preset]   (preset default qwen2.5-1.5b)
#   PARTS="gen" or "train" runs one half; N_PROMPTS (32) sets the generation prompts; GEN_TPS ("1 2") the
#   generation's tensor_parallel_sizes; TRAIN_LAYOUTS ("label:GPUs:tensor_parallel_size:extra args;...") the
#   GRPO rows, e.g. "TP 2 x DP 2:4:2:;DP 4 zero_stage 2:4:1:--zero_stage 2" on four GPUs.
set -euo pipefail
cd "$(dirname "$0")/../.."
COLT=${COLT:-build-cuda/colt}
tok=$1
prompts=$2
preset=${3:-qwen2.5-1.5b}
work=${WORK:-/tmp/colt-bench-tp}
parts=${PARTS:-gen train}
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
MPIRUN="mpirun --allow-run-as-root --oversubscribe --bind-to none -x NCCL_NVLS_ENABLE -x LD_LIBRARY_PATH -x PATH"
gpus=$(nvidia-smi -L | wc -l)
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
mkdir -p "$work"
[ -f "$work/$preset/config.json" ] || $COLT init --arch qwen2 --preset "$preset" --tokenizer "$tok" --out "$work/$preset" 2>/dev/null
echo "card: $card x $gpus; preset $preset; $(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1) driver"

if [[ " $parts " == *" gen "* ]]; then
  python3 - "$prompts" "$work/gen_prompts.jsonl" "${N_PROMPTS:-32}" <<'PY'
import json, sys
with open(sys.argv[1]) as f, open(sys.argv[2], "w") as out:
    for i, line in enumerate(f):
        if i == int(sys.argv[3]): break
        out.write(json.dumps({"messages": json.loads(line)["prompt"]}) + "\n")
PY
  gen=(generate --model "$work/$preset" --prompts "$work/gen_prompts.jsonl" --n 8 --max_new_tokens 256 --ignore_eos
       --temperature 1.0 --seed 1 --device cuda --bench)
  echo
  echo "| generation | GPUs | sequences | tokens/s | decode tokens/s | steps | graph steps | s |"
  echo "|---|---:|---:|---:|---:|---:|---:|---:|"
  for tp in ${GEN_TPS:-1 2}; do
    label="TP $tp"
    [ "$gpus" -lt "$tp" ] && label="$label (shared GPU)"
    if [ "$tp" = 1 ]; then out=$($COLT "${gen[@]}" 2> "$work/gen-$tp.log" | tail -1) || out=""
    else out=$($MPIRUN -np "$tp" $COLT "${gen[@]}" --tensor_parallel_size "$tp" 2> "$work/gen-$tp.log" | tail -1) || out=""; fi
    if [ -z "$out" ]; then echo "| $label | failed: $(tail -1 "$work/gen-$tp.log") |"; continue; fi
    python3 - "$out" "$label" "$tp" <<'PY'
import json, sys
r = json.loads(sys.argv[1])
print(f"| {sys.argv[2]} | {sys.argv[3]} | {r['sequences']} | {r['tokens_per_s']:.0f} | {r['decode_tokens_per_s']:.0f} | "
      f"{r['steps']} | {r['graph_steps']} | {r['seconds']:.2f} |")
PY
  done
fi

if [[ " $parts " == *" train "* ]]; then
  echo
  echo "| GRPO step | GPUs | s/step | generation s | training s | completion tokens/s/GPU | allocated peak GB (KV pool included) |"
  echo "|---|---:|---:|---:|---:|---:|---:|"
  IFS=';' read -ra layouts <<< "${TRAIN_LAYOUTS:-TP 1:1:1:;TP 2:2:2:;DP 2:2:1:;DP 2 zero_stage 2:2:1:--zero_stage 2}"
  for layout in "${layouts[@]}"; do
    IFS=: read -r label n tp extra <<< "$layout"
    if [ "$gpus" -ge "$n" ]; then devices="[$(seq -s, 0 $((n - 1)))]"; else devices="[$(yes 0 | head -n "$n" | paste -sd,)]"; label="$label (shared GPU)"; fi
    run="$work/train-${label// /}"
    rm -rf "$run"
    if ! $COLT train --config bench/gpu/grpo_bench.yaml --model "$work/$preset" --dataset "$prompts" --device cuda \
         --nproc_per_node "$n" --devices "$devices" --tensor_parallel_size "$tp" --max_steps "${STEPS:-4}" $extra \
         --output_dir "$run" > "$run.log" 2>&1; then
      echo "| $label | failed: $(grep -v "starting" "$run.log" | grep -m1 "colt train" | cut -c1-300) |"
      continue
    fi
    python3 - "$run/metrics.jsonl" "$label" "$n" "$tp" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
rows = [r for r in rows if "step_time" in r][1:]  # leave out the first step (graphs, cuBLAS plans)
mean = lambda k: sum(r.get(k, 0.0) for r in rows) / len(rows)
n, tp = int(sys.argv[3]), int(sys.argv[4])
tokens = 128 * 256 * (n // tp)  # completions per model x tokens x models
print(f"| {sys.argv[2]} | {n} | {mean('step_time'):.2f} | {mean('time/generation'):.2f} | {mean('time/training'):.2f} | "
      f"{tokens / mean('step_time') / n:.0f} | {max(r.get('memory/allocated_peak_gb', 0) for r in rows):.1f} |")
PY
  done
fi
