#!/usr/bin/env bash
# bench_serve.sh — `colt serve` under load against `colt generate` offline on
# the same prompts: every prompt of a `colt generate --prompts` file once,
# greedy, MAX_TOKENS new tokens each (ignore eos, so every request makes them
# all), first offline in one `colt generate --prompts` call, then as streamed
# HTTP requests from bench_serve with C clients in a closed loop, for each C.
# Prints a markdown table: requests/s, output tokens/s, time to first token and
# request latency p50 / p99, streamed and as whole answers (STREAM_MODES), and
# the server's side of each row from /metrics: time inside engine steps, steps
# and CUDA-graph steps, the decode steps' token rate. One server for all rows
# (after a warm-up round).
# Usage: bash bench/gpu/bench_serve.sh MODEL_DIR PROMPTS_JSONL [concurrency ...]
#   concurrency defaults to "1 16 64 256"; MAX_TOKENS (256), TEMPERATURE (0: greedy; the offline row stays greedy), COLT (build-cuda/colt),
#   BENCH (build-cuda/bench_serve), COLT_DEVICE (cuda), SERVE_ARGS (more colt serve arguments). On the CPU, e.g.:
#   COLT=build/colt BENCH=build/bench_serve COLT_DEVICE=cpu MAX_TOKENS=64 \
#     bash bench/gpu/bench_serve.sh models/stories260K examples/data/demo_train.jsonl 1 8 32
set -euo pipefail
cd "$(dirname "$0")/../.."
COLT=${COLT:-build-cuda/colt}
BENCH=${BENCH:-build-cuda/bench_serve}
device=${COLT_DEVICE:-cuda}
max_tokens=${MAX_TOKENS:-256}
model=$1
prompts=$2
shift 2
levels=${*:-1 16 64 256}
n=$(grep -c . "$prompts")
work=$(mktemp -d)
pid=""
cleanup() {
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then kill -TERM "$pid"; wait "$pid" || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

offline=$($COLT generate --model "$model" --prompts "$prompts" --max_new_tokens "$max_tokens" --ignore_eos \
  --temperature 0 --bench --device "$device")

# every client is this machine: one address may hold every connection (colt serve gives it half by default)
$COLT serve --model "$model" --port 0 --device "$device" --max_queued_sequences 100000 --max_connections_per_ip 512 \
  ${SERVE_ARGS:-} > "$work/serve.log" 2>&1 &
pid=$!
port=""
for _ in $(seq 1200); do # 120 s at most
  port=$(grep -o 'listening on http://127.0.0.1:[0-9]*' "$work/serve.log" | sed 's/.*://' || true)
  [ -n "$port" ] && break
  kill -0 "$pid" 2>/dev/null || { cat "$work/serve.log" >&2; exit 1; }
  sleep 0.1
done
[ -n "$port" ] || { echo "colt serve did not start" >&2; cat "$work/serve.log" >&2; exit 1; }
url=http://127.0.0.1:$port
$BENCH --url "$url" --prompts "$prompts" --requests 64 --concurrency 64 --max_tokens 16 --ignore_eos > /dev/null

echo "| mode | clients | requests | output tokens | seconds | requests/s | output tok/s | TTFT p50 ms | TTFT p99 ms | latency p50 s | latency p99 s | engine busy s | engine between steps s | engine idle s | engine steps (graph) | engine decode tok/s | client CPU s |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
python3 - "$offline" <<'PY'
import json, sys
r = json.loads(sys.argv[1])
print(f"| colt generate (offline) | - | {r['sequences']} | {r['generated_tokens']} | {r['seconds']:.2f} | "
      f"{r['sequences'] / r['seconds']:.2f} | {r['generated_tokens'] / r['seconds']:,.0f} | - | - | - | - | - | - | - | - | - | - |")
PY
for c in $levels; do
  for mode in ${STREAM_MODES:-stream no_stream}; do
    flag=""
    [ "$mode" = no_stream ] && flag=--no_stream
    line=$($BENCH --url "$url" --prompts "$prompts" --requests "$n" --concurrency "$c" --max_tokens "$max_tokens" \
      --ignore_eos --temperature "${TEMPERATURE:-0}" $flag)
    # The server's side of the same interval (bench_serve reads /metrics right before and after its requests):
    # time inside engine steps, between them and idle, steps (of them CUDA-graph replays), and the pure decode
    # steps' token rate. Engine busy well under the client's seconds: the time went outside the engine.
    python3 - "$line" <<'PY'
import json, sys
r = json.loads(sys.argv[1])
d = lambda k: r["server"].get(k, 0.0)
err = f" ({r['errors']} errors)" if r["errors"] else ""
mode = "streamed" if r["stream"] else "whole answers"
dec = d("decode_step_tokens") / d("decode_seconds") if d("decode_seconds") > 0 else 0
ttft = (f"{r['ttft_p50_ms']:.1f} | {r['ttft_p99_ms']:.1f}") if r["stream"] else "- | -"
print(f"| colt serve, {mode}{err} | {r['concurrency']} | {r['requests']} | {r['output_tokens']} | {r['seconds']:.2f} | "
      f"{r['requests_per_s']:.2f} | {r['output_tokens_per_s']:,.0f} | {ttft} | "
      f"{r['latency_p50_s']:.3f} | {r['latency_p99_s']:.3f} | {d('seconds'):.2f} | {d('loop_seconds'):.2f} | "
      f"{d('idle_seconds'):.2f} | {d('steps'):.0f} ({d('graph_steps'):.0f}) | {dec:,.0f} | {r['client_cpu_s']:.2f} |")
PY
  done
done
echo
echo "Command: MAX_TOKENS=$max_tokens COLT_DEVICE=$device SERVE_ARGS='${SERVE_ARGS:-}' bash bench/gpu/bench_serve.sh $model $prompts $levels ($n prompts)"
