#!/usr/bin/env bash
# bench_8b.sh — issue 41's headline workload: an 8B-class full-parameter GRPO step with ~1K-token
# completions (a random-weight Llama-3.1-8B shape with the Qwen tokenizer's vocabulary, 16 GSM8K prompts
# x 8 completions x 1,024 tokens per GPU, beta 0), in the layouts given, and the throughput as NeMo-RL
# reports it: every token of a step (prompts and completions) / (step time x GPUs).
# Not a correctness test (the DP / ZeRO identity tests are); random weights never stop early, so every
# completion is 1,024 tokens.
# Usage: bash bench/gpu/bench_8b.sh TOKENIZER_DIR PROMPTS_JSONL LAYOUT...
#   LAYOUT is "GPUS:ARGS" with ARGS colt train arguments joined by commas, e.g.
#   "1:--offload_optimizer,cpu,--gradient_checkpointing,true"  "2:--zero_stage,2,--per_device_train_batch_size,8"
#   The global batch is 128 completions per GPU (weak scaling); per_device_train_batch_size (default 16) sets
#   the micro-batch, gradient_accumulation_steps is worked out from it.
# STEPS (default 3) steps a run, means over steps 2..; PRESET (llama3.1-8b); WORK (/tmp/colt-bench-8b).
set -euo pipefail
cd "$(dirname "$0")/../.."
COLT=${COLT:-build-cuda/colt}
tok=$1
prompts=$2
shift 2
preset=${PRESET:-llama3.1-8b}
work=${WORK:-/tmp/colt-bench-8b}
steps=${STEPS:-3}
mkdir -p "$work"
if [ ! -f "$work/$preset/config.json" ]; then
  t0=$(date +%s)
  init_args=(--vocab_size 151936)
  case $preset in qwen2.5-*) init_args=(--arch qwen2) ;; qwen3-*) init_args=() ;; esac
  $COLT init "${init_args[@]}" --preset "$preset" --tokenizer "$tok" --out "$work/$preset" 2>/dev/null
  echo "colt init $preset: $(( $(date +%s) - t0 )) s"
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | sed 's/^/    /'
echo
echo "| layout | GPUs | s/step | generation | training (fwd+bwd) | optimizer | tokens/step (all) | tokens/s/GPU (NeMo-RL's) | completion tokens/s/GPU | peak GB/GPU |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
i=0
for layout in "$@"; do
  i=$((i + 1))
  gpus=${layout%%:*}
  IFS=, read -r -a extra <<< "${layout#*:}"
  micro=16
  for ((k = 0; k < ${#extra[@]}; k++)); do
    [ "${extra[$k]}" = --per_device_train_batch_size ] && micro=${extra[$((k + 1))]}
  done
  out=$work/run-$i
  rm -rf "$out"
  if ! $COLT train --config bench/gpu/grpo_bench.yaml --model "$work/$preset" --dataset "$prompts" --device cuda \
      --max_completion_length 1024 --max_steps "$steps" --nproc_per_node "$gpus" \
      --per_device_train_batch_size "$micro" --gradient_accumulation_steps $((128 / micro)) \
      "${extra[@]}" --output_dir "$out" > "$work/train-$i.log" 2>&1; then
    echo "| ${layout#*:} | $gpus | failed: $(tail -1 "$work/train-$i.log") |"
    continue
  fi
  python3 - "$out/metrics.jsonl" "${layout#*:}" "$gpus" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
rows = [r for r in rows if "step_time" in r]
gpus = int(sys.argv[3])
tokens = [b["num_tokens"] - a["num_tokens"] for a, b in zip(rows, rows[1:])]  # this step's, all ranks
rows = rows[1:]  # leave out the first step (CUDA graphs, cuBLAS heuristics)
mean = lambda k: sum(r.get(k, 0.0) for r in rows) / len(rows)
step, tok = mean("step_time"), sum(tokens) / len(tokens)
completion = mean("completions/mean_length") * 128 * gpus
print(f"| {sys.argv[2].replace(',', ' ')} | {gpus} | {step:.2f} | {mean('time/generation'):.2f} | "
      f"{mean('time/training') - mean('time/optimizer'):.2f} | {mean('time/optimizer'):.2f} | {tok:,.0f} | "
      f"{tok / step / gpus:,.0f} | {completion / step / gpus:,.0f} | {max(r.get('memory/allocated_peak_gb', 0) for r in rows):.1f} |")
PY
  # the trained model (16 GB of bf16 each) is not needed: three runs and the random-weight model would fill a
  # 64 GB disk
  rm -f "$out"/model*.safetensors
done
echo
echo "Command: STEPS=$steps bash bench/gpu/bench_8b.sh $tok $prompts $* (means over steps 2-$steps)"
