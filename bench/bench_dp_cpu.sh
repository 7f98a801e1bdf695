#!/usr/bin/env bash
# bench_dp_cpu.sh — the cost of data parallelism for a GRPO step on CPU ranks:
# the demo config (stories260K, 32 completions of up to 48 tokens a step) in
# one process and in 2 ranks under mpirun (16 completions each, the same
# global batch), split into generation, scoring, log-probs, training and the
# gradient exchange (the host path: gathered over MPI and summed in rank
# order). Each rank is one thread (OMP_NUM_THREADS=1), so 2 ranks use 2 cores
# where one process uses one. Prints a markdown table.
# Usage: bash bench/bench_dp_cpu.sh [steps]   (default 6; needs mpirun: scripts/setup.sh installs it)
set -euo pipefail
cd "$(dirname "$0")/.."
COLT=${COLT:-build/colt}
steps=${1:-6}
work=${WORK:-/tmp/colt-bench-dp-cpu}
rm -rf "$work" && mkdir -p "$work"
common=(--config examples/demo.yaml --device cpu --max_steps "$steps" --logging_steps 1 --eval_dataset null
        --save_steps 0 --log_completions_count 0 --deterministic true)
echo "| demo, 32 completions a step | processes | s/step | generation | scoring | log-probs | training | gradient sync |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|"
run() { # name, processes, launcher prefix...
  local name=$1 procs=$2
  shift 2
  if ! OMP_NUM_THREADS=1 "$@" $COLT train "${common[@]}" --nproc_per_node 1 \
      --per_device_train_batch_size $((32 / procs)) --output_dir "$work/$name" > "$work/$name.log" 2>&1; then
    echo "| $name | $procs | failed: $(tail -1 "$work/$name.log") |"
    return
  fi
  python3 - "$work/$name/metrics.jsonl" "$name" "$procs" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()][1:]  # step 1 left out (warm-up)
mean = lambda k: sum(r.get(k, 0.0) for r in rows) / len(rows)
print(f"| {sys.argv[2]} | {sys.argv[3]} | {mean('step_time'):.3f} | {mean('time/generation'):.3f} | "
      f"{mean('time/scoring'):.3f} | {mean('time/logprobs'):.3f} | {mean('time/training'):.3f} | "
      f"{mean('time/gradient_sync'):.4f} |")
PY
}
run one-process 1 env
if command -v mpirun > /dev/null; then
  run mpirun-2 2 mpirun --oversubscribe --allow-run-as-root -np 2
else
  echo "| mpirun-2 | 2 | not run: no mpirun |"
fi
echo
echo "Command: bash bench/bench_dp_cpu.sh $steps (means over steps 2-$steps; $(nproc) cores: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'))"
