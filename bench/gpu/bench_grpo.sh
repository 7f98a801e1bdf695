#!/usr/bin/env bash
# bench_grpo.sh — GRPO step time on the GPU for models of public shapes, the
# issue's configuration (bench/gpu/grpo_bench.yaml: 16 prompts x 8 generations
# x 256 completion tokens, one micro-batch, beta 0), split into generation,
# log-probs, scoring and training; prints a markdown table.
# Usage: bash bench/gpu/bench_grpo.sh TOKENIZER_DIR PROMPTS_JSONL [preset ...]
#   TOKENIZER_DIR: Qwen2.5's tokenizer files; PROMPTS_JSONL: {"prompt": [messages]} rows
#   (scripts/pack_device.sh makes both from ../shared/data). Presets (colt init's) default to
#   qwen2.5-0.5b qwen2.5-1.5b. The first step (CUDA graph capture, cuBLAS
#   heuristics) is left out of the means. Llama 3 presets get the Qwen tokenizer's
#   vocabulary (151936; the bundle has no Llama 3 tokenizer): their layers are
#   Llama 3's, their embedding and lm_head 18% larger.
# COLT_TRAIN_ARGS (environment) is appended to colt train's arguments, e.g.
#   COLT_TRAIN_ARGS="--deterministic false" turns the deterministic mode off (on by default for bf16);
#   COLT_TRAIN_ARGS="--use_peft true" trains LoRA adapters (r 16, all linear layers) instead of every weight.
set -euo pipefail
cd "$(dirname "$0")/../.."
COLT=${COLT:-build-cuda/colt}
tok=$1
prompts=$2
shift 2
presets=${*:-qwen2.5-0.5b qwen2.5-1.5b}
work=${WORK:-/tmp/colt-bench-grpo}
mkdir -p "$work"
echo "| model | s/step | generation | log-probs | scoring | training | KV pool GB | seqs held | peak GB | preemptions | logp diff mean | logp diff max | activation alloc/free |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
for p in $presets; do
  rm -rf "$work/run-$p"  # the checkpoint is kept: a second pass (e.g. with LoRA) reuses it
  init_args=()
  case $p in
    qwen2.5-*) init_args=(--arch qwen2) ;;
    llama3*) init_args=(--vocab_size 151936) ;;
  esac
  if [ ! -f "$work/$p/config.json" ]; then
    $COLT init "${init_args[@]}" --preset "$p" --tokenizer "$tok" --out "$work/$p" 2>/dev/null
  fi
  label=$p
  case " ${COLT_TRAIN_ARGS:-} " in *" --use_peft true "*) label="$p LoRA" ;; esac
  if ! $COLT train --config bench/gpu/grpo_bench.yaml --model "$work/$p" --dataset "$prompts" \
      --output_dir "$work/run-$p" --device cuda ${COLT_TRAIN_ARGS:-} > "$work/train-$p.log" 2>&1; then
    echo "| $label | failed: $(tail -1 "$work/train-$p.log") |"
    continue
  fi
  python3 - "$work/run-$p/metrics.jsonl" "$label" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
rows = [r for r in rows if "step_time" in r][1:]  # leave out the first step
mean = lambda k: sum(r.get(k, 0.0) for r in rows) / len(rows)
print(f"| {sys.argv[2]} | {mean('step_time'):.3f} | {mean('time/generation'):.3f} | {mean('time/logprobs'):.3f} | "
      f"{mean('time/scoring'):.3f} | {mean('time/training'):.3f} | {mean('engine/kv_pool_gb'):.1f} | "
      f"{mean('engine/sequences_held'):.0f} | {mean('engine/peak_memory_gb'):.1f} | {mean('engine/preemptions'):.0f} | "
      f"{mean('sampling/sampling_logp_difference/mean'):.2e} | {max(r.get('sampling/sampling_logp_difference/max', 0) for r in rows):.2e} | "
      f"{mean('time/activation_memory'):.3f} |")
PY
done
echo
echo "Command: ${COLT_TRAIN_ARGS:+COLT_TRAIN_ARGS=\"$COLT_TRAIN_ARGS\" }bash bench/gpu/bench_grpo.sh $tok $prompts $presets (means over steps 2-6)"
