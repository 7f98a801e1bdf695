#!/usr/bin/env bash
# bench_fewshot.sh — offline throughput on an lm-eval-like workload: the 1319
# GSM8K test questions, each after the same 8 worked examples as a multi-turn
# chat (bench/gpu/make_fewshot_prompts.py: ~1200-token prompts that share ~1100
# tokens), greedy, 256 new tokens each (ignore eos: random weights), all given to
# one `colt generate --prompts` call; with and without prefix caching. Prints a
# markdown table. Models: random-weight Qwen2.5-shaped checkpoints (colt init).
# Usage: bash bench/gpu/bench_fewshot.sh TOKENIZER_DIR GSM8K_DIR [preset ...]
#   presets default to qwen2.5-1.5b.
set -euo pipefail
cd "$(dirname "$0")/../.."
COLT=${COLT:-build-cuda/colt}
tok=$1
gsm8k=$2
shift 2
presets=${*:-qwen2.5-1.5b}
work=${WORK:-/tmp/colt-bench-fewshot}
mkdir -p "$work"
python3 bench/gpu/make_fewshot_prompts.py "$gsm8k" > "$work/prompts.jsonl"
echo "| model | prefix caching | prompts | prompt tokens | prefilled | new tokens | seconds | output tok/s | total tok/s | peak running |"
echo "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"
for p in $presets; do
  [ -d "$work/$p" ] || $COLT init --arch qwen2 --preset "$p" --tokenizer "$tok" --out "$work/$p" > /dev/null
  for flag in "" --no_prefix_caching; do
    line=$($COLT generate --model "$work/$p" --prompts "$work/prompts.jsonl" --max_new_tokens 256 --ignore_eos \
      --temperature 0 --bench --device "${COLT_DEVICE:-cuda}" $flag)
    python3 - "$p" "${flag:-on}" "$line" <<'PY'
import json, sys
r = json.loads(sys.argv[3])
caching = "off" if sys.argv[2] == "--no_prefix_caching" else "on"
total = r["prompt_tokens"] + r["generated_tokens"]
print(f"| {sys.argv[1]} | {caching} | {r['sequences']} | {r['prompt_tokens']} | {r['prefill_tokens']} | "
      f"{r['generated_tokens']} | {r['seconds']:.2f} | {r['generated_tokens'] / r['seconds']:,.0f} | "
      f"{total / r['seconds']:,.0f} | {r['peak_running']} |")
PY
  done
done
echo
echo "Command: bash bench/gpu/bench_fewshot.sh $tok $gsm8k $presets"
