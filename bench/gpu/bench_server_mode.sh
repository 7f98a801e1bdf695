#!/usr/bin/env bash
# bench_server_mode.sh — a GRPO step colocated vs server mode vs asynchronous
# server mode, on ONE GPU shared by two processes (colt serve and colt train;
# the weights then go through pinned host memory, Gloo), on the issue's
# configuration (bench/gpu/grpo_bench.yaml: 16 prompts x 8 generations x 256
# tokens, one micro-batch, beta 0) with random-weight Qwen2.5-shaped models.
# Prints a markdown table: s/step, generation (waiting for it, in async),
# weight push seconds and GB/s, training, the sampler/trainer log-prob
# difference and the staleness.
# Usage: bash bench/gpu/bench_server_mode.sh TOKENIZER_DIR PROMPTS_JSONL [preset ...]
#   (as bench_grpo.sh; presets default to qwen2.5-0.5b qwen2.5-1.5b).
# SERVER_MEM (environment, default 0.3): colt serve's --gpu_memory_utilization, its KV pool's share of
# the GPU (the trainer needs the rest). The first step is left out of the means.
set -euo pipefail
cd "$(dirname "$0")/../.."
COLT=${COLT:-build-cuda/colt}
tok=$1
prompts=$2
shift 2
presets=${*:-qwen2.5-0.5b qwen2.5-1.5b}
work=${WORK:-/tmp/colt-bench-server-mode}
server_mem=${SERVER_MEM:-0.3}
mkdir -p "$work"
server_pid=
stop_server() {  # by its PID, bounded: SIGTERM, then SIGKILL after 30 s
  if [ -n "$server_pid" ]; then
    kill "$server_pid" 2>/dev/null || true
    for _ in $(seq 300); do kill -0 "$server_pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
    server_pid=
  fi
}
trap stop_server EXIT

summary() {  # metrics.jsonl label
  python3 - "$1" "$2" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
rows = [r for r in rows if "step_time" in r][1:]  # leave out the first step
mean = lambda k: sum(r.get(k, 0.0) for r in rows) / len(rows)
print(f"| {sys.argv[2]} | {mean('step_time'):.3f} | {mean('time/generation'):.3f} | {mean('time/weight_sync'):.3f} | "
      f"{mean('weight_sync/gb_per_s'):.2f} | {mean('time/training'):.3f} | "
      f"{mean('sampling/sampling_logp_difference/mean'):.2e} | {mean('staleness'):.1f} |")
PY
}

echo "| model, mode | s/step | generation | weight push s | push GB/s | training | logp diff mean | staleness |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|"
# the server's /colt/ endpoints and weight channel need a key; colt serve and colt train both read this one
export COLT_API_KEY=${COLT_API_KEY:-$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')}
for p in $presets; do
  if [ ! -f "$work/$p/config.json" ]; then
    $COLT init --arch qwen2 --preset "$p" --tokenizer "$tok" --out "$work/$p" 2>/dev/null
  fi
  common=(--config bench/gpu/grpo_bench.yaml --model "$work/$p" --dataset "$prompts" --device cuda --deterministic true)
  rm -rf "$work/colocate-$p"
  if $COLT train "${common[@]}" --output_dir "$work/colocate-$p" > "$work/colocate-$p.log" 2>&1; then
    summary "$work/colocate-$p/metrics.jsonl" "$p colocated"
  else
    echo "| $p colocated | failed: $(tail -1 "$work/colocate-$p.log") |"
  fi
  $COLT serve --model "$work/$p" --device cuda --deterministic --port 0 --max_model_len 1024 \
    --gpu_memory_utilization "$server_mem" > "$work/serve-$p.log" 2>&1 &
  server_pid=$!
  port=
  for _ in $(seq 1200); do  # 120 s at most
    port=$(grep -o 'listening on http://127.0.0.1:[0-9]*' "$work/serve-$p.log" | head -1 | sed 's/.*://') || true
    [ -n "$port" ] && break
    kill -0 "$server_pid" 2>/dev/null || break
    sleep 0.1
  done
  if [ -z "$port" ]; then
    echo "| $p server | colt serve did not start: $(tail -1 "$work/serve-$p.log") |"
    stop_server
    continue
  fi
  group_port=$((20000 + RANDOM % 20000))
  for mode in server async; do
    extra=(--vllm_mode server --vllm_server_port "$port" --vllm_group_port "$group_port")
    [ "$mode" = async ] && extra+=(--async_generation true)
    rm -rf "$work/$mode-$p"
    if $COLT train "${common[@]}" "${extra[@]}" --output_dir "$work/$mode-$p" > "$work/$mode-$p.log" 2>&1; then
      summary "$work/$mode-$p/metrics.jsonl" "$p $mode (2 processes, 1 GPU)"
    else
      echo "| $p $mode | failed: $(tail -1 "$work/$mode-$p.log") |"
    fi
    group_port=$((group_port + 1))
  done
  stop_server
done
echo
echo "Command: SERVER_MEM=$server_mem bash bench/gpu/bench_server_mode.sh $tok $prompts $presets (means over steps 2-6)"
