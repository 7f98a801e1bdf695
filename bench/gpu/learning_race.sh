#!/usr/bin/env bash
# learning_race.sh — the learning race (issue 40, docs/learning.md): the same model, task and hyperparameters
# trained by colt (colocated, server mode on the same GPU, async server mode) and by TRL 1.16's GRPOTrainer,
# several seeds each, one run at a time (each wall clock measured alone); reward per step and per second,
# held-out accuracy before and after (colt eval, greedy pass@1), one colt checkpoint also scored by
# transformers. Not a speed benchmark of random weights: bench_grpo.sh and bench_server_mode.sh are those.
#
# Usage: MODEL=DIR bash bench/gpu/learning_race.sh          (or the folder as the first argument)
# Environment (defaults in brackets):
#   RUNS     systems to run, in order ["colt colt_server colt_async trl"]; also trl_cb (TRL with
#            use_transformers_continuous_batching; it casts the policy to bf16 in place, see trl_grpo.py)
#   SEEDS    ["1 2 3"]            HP     shared hyperparameters [bench/learning/race.yaml]
#   COLT     [build-cuda/colt]   DEVICE cuda or cpu [cuda]   PYTHON [python3]   TRL_GEN generate|cb [generate]
#   RESULTS  results [$OUT, else race-results]; when it is not $OUT, the script copies it into $OUT at the end:
#            RESULTS=/tmp/race/results in both calls of a split race gathers both in one table
#   WORK     models and logs of the runs [/tmp/learning-race]
#   HELDOUT_LIMIT  held-out problems scored [100]   MAX_STEPS  overrides max_steps on both sides
#   SERVER_MEM     colt serve's --gpu_memory_utilization on the shared GPU [0.3]
# Results under $OUT: logs/<system>_s<seed>.metrics.jsonl (colt's metrics.jsonl; TRL's from its callback),
# logs/*.log, eval/base.json and eval/<system>_s<seed>.json (colt eval), eval/hf_<system>_s<seed>.json
# (transformers), then race.csv, race.md and race_*.png from bench/learning/summarize.py. A second call with
# other RUNS and the same RESULTS adds to it (summarize.py reads everything there), so the race can be split.
#
# The task: bench/learning/make_task.py's add2 (two 2-digit numbers added, word problems; train 2000,
# held-out 100, seed 0), made into $WORK/data. Rewards: bench/learning/rewards.py correct + answer_format,
# the same file on both sides.
#
# GPU time, estimated for one H200 with race.yaml (40 steps of 16 prompts x 8 completions x <= 96 tokens;
# the base model's completions average 64 tokens and 29% reach 96, so every HF generate call runs all 96):
#   TRL, HF generate: ~2.5-3.5 s/step (96 decode steps of a 30-layer model, overhead-bound at ~25-35 ms
#     each, plus ~0.3-0.5 s for the forward and backward of 128 x ~180 tokens) -> 100-140 s + ~25 s
#     import, load and save + ~10 s eval per seed: 3 seeds ~7-8 min. Run it in a call of its own, RUNS=trl
#     (if the first seed shows more than ~4 s/step in logs/trl_s1.log, split: SEEDS="1 2", then SEEDS=3).
#   colt colocated ~0.3-0.5 s/step -> ~20 s + ~10 s load and eval per seed; server and async ~2x (two
#     processes on one GPU, weights through the host each step) -> colt's three systems x 3 seeds ~3-4 min:
#     RUNS="colt colt_server colt_async" in the other call, with the base model's eval and the transformers
#     check (under a minute). Total ~11-13 min.
#   CPU smoke test (docs/learning.md): HP=bench/learning/race_tiny.yaml DEVICE=cpu COLT=build/colt SEEDS=1
#     HELDOUT_LIMIT=4, every system, 2 steps.
set -uo pipefail
cd "$(dirname "$0")/../.."
MODEL=${MODEL:-${1:-}}
[ -n "$MODEL" ] && [ -f "$MODEL/config.json" ] || { echo "learning_race: give MODEL=DIR (a Hugging Face folder)" >&2; exit 2; }
COLT=${COLT:-build-cuda/colt}
DEVICE=${DEVICE:-cuda}
PYTHON=${PYTHON:-python3}
HP=${HP:-bench/learning/race.yaml}
RUNS=${RUNS:-colt colt_server colt_async trl}
SEEDS=${SEEDS:-1 2 3}
TRL_GEN=${TRL_GEN:-generate}
RESULTS=${RESULTS:-${OUT:-race-results}}
WORK=${WORK:-/tmp/learning-race}
HELDOUT_LIMIT=${HELDOUT_LIMIT:-100}
SERVER_MEM=${SERVER_MEM:-0.3}
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
mkdir -p "$RESULTS/logs" "$RESULTS/eval" "$WORK"
RESULTS=$(cd "$RESULTS" && pwd)
log() { echo "learning_race: $(date -u +%T) $*"; }

"$PYTHON" bench/learning/make_task.py --task add2 --out "$WORK/data" > /dev/null || exit 1
TRAIN=$WORK/data/add2_train.jsonl
HELD=$WORK/data/add2_heldout.jsonl
TOKENS=$("$PYTHON" -c "import sys, yaml; print(yaml.safe_load(open(sys.argv[1]))['max_completion_length'])" "$HP")
STEPS_ARG=()
[ -n "${MAX_STEPS:-}" ] && STEPS_ARG=(--max_steps "$MAX_STEPS")
det=()
[ "$DEVICE" = cpu ] || det=(--deterministic)
cp "$HP" "$RESULTS/hyperparameters.yaml"
{ echo "model: $MODEL"; echo "device: $DEVICE"; echo "runs: $RUNS"; echo "seeds: $SEEDS"; echo "trl_generation: $TRL_GEN"
  command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  "$PYTHON" -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
  "$PYTHON" -c "import trl; print('trl', trl.__version__)" 2>/dev/null || echo "trl: not importable"; } > "$RESULTS/environment_$(date -u +%H%M%S).txt" 2>&1

# colt eval, greedy pass@1 on the held-out split: eval/NAME.json
held_eval() {  # name model_dir
  if ! "$COLT" eval --model "$2" --dataset "$HELD" --prompt_column prompt --answer_column answer \
      --max_completion_length "$TOKENS" --limit "$HELDOUT_LIMIT" --device "$DEVICE" "${det[@]}" \
      --output "$RESULTS/eval/$1.json" --completions "$RESULTS/eval/$1.completions.jsonl" \
      > "$RESULTS/logs/eval_$1.log" 2>&1; then
    log "eval $1 failed: $(tail -1 "$RESULTS/logs/eval_$1.log")"
    return 1
  fi
  log "eval $1: $(grep '^all' "$RESULTS/logs/eval_$1.log")"
}

server_pid=
stop_server() {  # by its PID, bounded: SIGTERM, then SIGKILL after 30 s
  if [ -n "$server_pid" ]; then
    kill "$server_pid" 2> /dev/null || true
    for _ in $(seq 300); do kill -0 "$server_pid" 2> /dev/null || break; sleep 0.1; done
    kill -9 "$server_pid" 2> /dev/null || true
    wait "$server_pid" 2> /dev/null || true
    server_pid=
  fi
}
trap stop_server EXIT
export COLT_API_KEY=${COLT_API_KEY:-$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')}
port=
start_server() {  # one colt serve for the server-mode runs (each run pushes its weights at start)
  [ -n "$server_pid" ] && return 0
  local mem=()
  [ "$DEVICE" = cpu ] || mem=(--gpu_memory_utilization "$SERVER_MEM")
  local serve_log
  serve_log=$RESULTS/logs/serve_$(date -u +%H%M%S).log
  "$COLT" serve --model "$MODEL" --device "$DEVICE" "${det[@]}" --port 0 --max_model_len 1024 "${mem[@]}" \
    > "$serve_log" 2>&1 &
  server_pid=$!
  port=
  for _ in $(seq 1800); do  # 180 s at most
    port=$(grep -o 'listening on http://127.0.0.1:[0-9]*' "$serve_log" | head -1 | sed 's/.*://') || true
    [ -n "$port" ] && kill -0 "$server_pid" 2> /dev/null && return 0
    kill -0 "$server_pid" 2> /dev/null || break
    sleep 0.1
  done
  log "colt serve did not start"
  stop_server
  return 1
}

[ -f "$RESULTS/eval/base.json" ] || held_eval base "$MODEL"

rewards='["bench/learning/rewards.py:correct", "bench/learning/rewards.py:answer_format"]'
group_port=$((20000 + RANDOM % 20000))
hf_done=
for system in $RUNS; do
  for seed in $SEEDS; do
    name=${system}_s$seed
    dir=$WORK/$name
    rm -rf "$dir"
    log "$name: training"
    case $system in
      colt | colt_server | colt_async)
        extra=()
        [ "$system" = colt ] && stop_server  # a colocated run has the GPU to itself
        if [ "$system" != colt ]; then
          start_server || continue
          extra=(--vllm_mode server --vllm_server_port "$port" --vllm_group_port "$group_port")
          group_port=$((group_port + 1))
          [ "$system" = colt_async ] && extra+=(--async_generation true)
        fi
        "$COLT" train --config "$HP" --model "$MODEL" --dataset "$TRAIN" --output_dir "$dir" --seed "$seed" \
          --reward_funcs "$rewards" --device "$DEVICE" --save_strategy no --log_completions_count 0 \
          "${STEPS_ARG[@]}" "${extra[@]}" > "$RESULTS/logs/$name.log" 2>&1
        rc=$? ;;
      trl | trl_cb)
        stop_server
        gen=$TRL_GEN
        [ "$system" = trl_cb ] && gen=cb
        cpu=()
        [ "$DEVICE" = cpu ] && cpu=(--cpu)
        "$PYTHON" bench/learning/trl_grpo.py --hp "$HP" --model "$MODEL" --dataset "$TRAIN" --output_dir "$dir" \
          --seed "$seed" --generation "$gen" "${cpu[@]}" "${STEPS_ARG[@]}" > "$RESULTS/logs/$name.log" 2>&1
        rc=$? ;;
      *) log "unknown system '$system' (colt colt_server colt_async trl trl_cb)"; continue ;;
    esac
    if [ $rc -ne 0 ] || [ ! -s "$dir/metrics.jsonl" ]; then
      log "$name failed (exit $rc): $(tail -1 "$RESULTS/logs/$name.log")"
      continue
    fi
    cp "$dir/metrics.jsonl" "$RESULTS/logs/$name.metrics.jsonl"
    [ -f "$dir/race_run.json" ] && cp "$dir/race_run.json" "$RESULTS/logs/$name.run.json"
    log "$name: $(wc -l < "$dir/metrics.jsonl") steps logged"
    held_eval "$name" "$dir"
    # the first colt checkpoint of this call, scored by transformers (the same answer check)
    if [ "$system" = colt ] && [ -z "$hf_done" ]; then
      if "$PYTHON" bench/learning/score_hf.py --model "$dir" --dataset "$HELD" --limit "$HELDOUT_LIMIT" \
          --max_new_tokens "$TOKENS" --colt_eval "$RESULTS/eval/$name.json" --output "$RESULTS/eval/hf_$name.json" \
          > "$RESULTS/logs/hf_$name.log" 2>&1; then
        log "transformers on $name: $(tail -1 "$RESULTS/logs/hf_$name.log")"
      else
        log "transformers on $name failed: $(tail -1 "$RESULTS/logs/hf_$name.log")"
      fi
      hf_done=1
    fi
  done
done
stop_server
"$PYTHON" bench/learning/summarize.py "$RESULTS" > "$RESULTS/logs/summarize.log" 2>&1 &&
  cat "$RESULTS/race.md" || log "summarize failed: $(tail -3 "$RESULTS/logs/summarize.log")"
if [ -n "${OUT:-}" ] && [ "$(cd "$OUT" && pwd)" != "$RESULTS" ]; then
  cp -r "$RESULTS"/. "$OUT"/
fi
