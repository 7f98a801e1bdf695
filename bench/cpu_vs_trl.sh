#!/usr/bin/env bash
# cpu_vs_trl.sh — colt against TRL's GRPOTrainer on this machine's CPU, back to back, with the same model,
# prompts, reward, hyperparameters and seeds: the demo (examples/demo.yaml: stories260K, 4 prompts x 8
# completions of 48 tokens, beta 0.1, eval off), and SmolLM2-135M-Instruct (2 prompts x 8 = 16 completions
# of 64 tokens) when models/smollm2-135m-instruct exists (bash scripts/get_smollm2.sh makes it). colt runs
# as the README says (`colt train --config ...`, no environment variables); TRL with use_cpu, fp32, no
# gradient checkpointing (bench/cpu_trl_grpo.py). Prints one markdown row per run (median seconds per step
# after the first, and its split) and the medians over the seeds.
#
#   bash bench/cpu_vs_trl.sh                     # 60 steps, seeds 1 2 3
#   STEPS=20 SEEDS="1" bash bench/cpu_vs_trl.sh  # shorter
#   SMOLLM2_STEPS=6 ...                          # SmolLM2's steps (default 8)
#   TRL_ENV="OMP_WAIT_POLICY=passive" ...        # environment words for TRL's process only (torch's OpenMP
#                                                # spins by default: on a busy machine passive is its best)
#
# Needs build/colt (make build) and python3 with torch, transformers and trl. Timings move with whatever
# else runs: look at `uptime` before, and compare rows of one session only.
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${STEPS:-60}
SEEDS=${SEEDS:-1 2 3}
SMOLLM2_STEPS=${SMOLLM2_STEPS:-8}
SMOLLM2=${COLT_SMOLLM2_DIR:-models/smollm2-135m-instruct}
TRL_ENV=${TRL_ENV:-}
OUT=$(mktemp -d /tmp/colt-cpu-vs-trl.XXXXXX)
trap 'rm -rf "$OUT"' EXIT

echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores usable; load: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "colt: $(git rev-parse --short HEAD 2>/dev/null || echo '?'); TRL $(python3 -c 'import trl; print(trl.__version__)'), torch $(python3 -c 'import torch; print(torch.__version__)')${TRL_ENV:+; TRL run with $TRL_ENV}"
echo

# median of the numbers on stdin
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

# colt's metrics.jsonl -> "s/step generation logprobs training" (medians over the steps after the first)
colt_split() {
  python3 - "$1" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])][1:]
med = lambda k: statistics.median(r[k] for r in rows)
train = [r["time/training"] + r.get("time/optimizer", 0) for r in rows]
print("%.3f %.3f %.3f %.3f" % (med("step_time"), med("time/generation"), med("time/logprobs"), statistics.median(train)))
EOF
}

# TRL's JSON line -> the same four numbers
trl_split() {
  python3 - "$1" <<'EOF'
import json, statistics, sys
steps = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])["steps"][1:]
med = lambda k: statistics.median(s[k] for s in steps)
print("%.3f %.3f %.3f %.3f" % (med("step"), med("generation"), med("logprobs"), med("training")))
EOF
}

# run_pair NAME MODEL STEPS COMPLETIONS TOKENS PROMPTS: colt then TRL for every seed
run_pair() {
  local name=$1 model=$2 steps=$3 g=$4 tokens=$5 prompts=$6
  echo "### $name: $prompts prompts x $g completions of $tokens tokens, $steps steps"
  echo
  echo "| run | seed | wall s | s/step | generation | log-probs | training + optimizer | last reward |"
  echo "|---|---:|---:|---:|---:|---:|---:|---:|"
  : > "$OUT/colt.$name" && : > "$OUT/trl.$name"
  for seed in $SEEDS; do
    local dir="$OUT/colt-$name-$seed" t0 t1
    t0=$(date +%s.%N)
    build/colt train --config examples/demo.yaml --model "$model" --output_dir "$dir" --seed "$seed" \
      --max_steps "$steps" --num_generations "$g" --per_device_train_batch_size $((g * prompts)) \
      --max_completion_length "$tokens" --eval_dataset null --save_strategy no --logging_steps 1 > "$dir.log" 2>&1
    t1=$(date +%s.%N)
    local split reward
    split=$(colt_split "$dir/metrics.jsonl")
    reward=$(tail -1 "$dir/metrics.jsonl" | python3 -c 'import json,sys; print("%.3f" % json.load(sys.stdin)["reward"])')
    echo "$split" >> "$OUT/colt.$name"
    printf '| colt | %s | %.1f | %s | %s |\n' "$seed" "$(echo "$t1 - $t0" | bc)" "$(echo "$split" | sed 's/ / | /g')" "$reward"

    t0=$(date +%s.%N)
    env $TRL_ENV python3 bench/cpu_trl_grpo.py "$model" examples/data/demo_train.jsonl "$steps" "$g" "$tokens" "$prompts" "$seed" \
      > "$OUT/trl-$name-$seed.json" 2> "$OUT/trl-$name-$seed.log"
    t1=$(date +%s.%N)
    split=$(trl_split "$OUT/trl-$name-$seed.json")
    reward=$(tail -1 "$OUT/trl-$name-$seed.json" | python3 -c 'import json,sys; r=json.load(sys.stdin)["reward"]; print("%.3f" % r[-1] if r else "-")')
    echo "$split" >> "$OUT/trl.$name"
    printf '| TRL | %s | %.1f | %s | %s |\n' "$seed" "$(echo "$t1 - $t0" | bc)" "$(echo "$split" | sed 's/ / | /g')" "$reward"
  done
  for who in colt trl; do
    local cols=()
    for c in 1 2 3 4; do cols+=("$(cut -d' ' -f$c "$OUT/$who.$name" | median)"); done
    printf '| **%s median** | | | **%s** | %s | %s | %s | |\n' "$who" "${cols[0]}" "${cols[1]}" "${cols[2]}" "${cols[3]}"
  done
  echo
}

run_pair demo models/stories260K "$STEPS" 8 48 4
if [ -f "$SMOLLM2/config.json" ]; then
  run_pair smollm2-135m "$SMOLLM2" "$SMOLLM2_STEPS" 8 64 2
else
  echo "(SmolLM2-135M-Instruct: no $SMOLLM2; bash scripts/get_smollm2.sh makes it)"
fi
