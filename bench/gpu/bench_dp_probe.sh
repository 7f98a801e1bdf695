#!/usr/bin/env bash
# bench_dp_probe.sh — where data parallelism's cost per GPU comes from: the GRPO benchmark's 1.5B step
# (bench/gpu/grpo_bench.yaml) alone on GPU 0, alone on GPU 1, as two independent runs at once, alone with a
# rank's share of the host threads, and as --nproc_per_node 2; prints step, generation, engine
# (time/generation_engine), its decode steps and their wait for the GPU (time/generation_decode[_wait]) and
# training means over steps 2-6 for each. Needs 2 GPUs.
# Usage: bash bench/gpu/bench_dp_probe.sh TOKENIZER_DIR PROMPTS_JSONL [preset]   (preset default qwen2.5-1.5b)
#   SAME_PROMPT=1: every run takes PROMPTS_JSONL's first prompt, repeated (each rank's round then the single
#   run's work exactly); NCCL_ROWS=1: also --nproc_per_node 2 with the gradients through the host
#   (--ddp_backend gloo: no NCCL communicator), with NCCL_P2P_DISABLE=1, NCCL_CUMEM_ENABLE=0, NCCL_RAS_ENABLE=0
#   and NCCL_IGNORE_CPU_AFFINITY=1 (session 26: none of them moved the engine).
#   QUICK=1: only the run alone on GPU 0 and the --nproc_per_node 2 run.
#   THREADS=1: during the --nproc_per_node 2 run, samples every thread of the ranks once a second
#   (/proc/PID/task/*/stat) and prints the threads that used the most CPU, with their names.
set -u
cd "$(dirname "$0")/../.."
COLT=${COLT:-build-cuda/colt}
tok=$1
prompts=$2
preset=${3:-qwen2.5-1.5b}
W=${WORK:-/tmp/colt-dp-probe}
mkdir -p "$W"
if [ "${SAME_PROMPT:-0}" = 1 ]; then
  python3 -c "import sys; line = open(sys.argv[1]).readline(); open(sys.argv[2], 'w').write(line * 2000)" \
    "$prompts" "$W/same_prompt.jsonl"
  prompts=$W/same_prompt.jsonl
fi
[ -f "$W/$preset/config.json" ] || $COLT init --arch qwen2 --preset "$preset" --tokenizer "$tok" --out "$W/$preset" 2>/dev/null
run() { # GPU label [colt train arguments...]
  local gpu=$1 label=$2
  shift 2
  rm -rf "${W:?}/$label"
  CUDA_VISIBLE_DEVICES=$gpu $COLT train --config bench/gpu/grpo_bench.yaml --model "$W/$preset" --dataset "$prompts" \
    --device cuda --max_steps 6 --output_dir "$W/$label" "$@" > "$W/$label.log" 2>&1 || echo "$label failed: $(tail -1 "$W/$label.log")"
}
row() { # description label...
  python3 - "$W" "$@" <<'PY'
import json, sys
work, what, labels = sys.argv[1], sys.argv[2], sys.argv[3:]
means = []
for label in labels:
    rows = [json.loads(l) for l in open(f"{work}/{label}/metrics.jsonl") if l.strip()][1:]
    means.append(lambda k, rows=rows: sum(r.get(k, 0) for r in rows) / len(rows))
cell = lambda k: " / ".join(f"{m(k):.3f}" for m in means)
print(f"| {what} | {cell('step_time')} | {cell('time/generation')} | {cell('time/generation_engine')} | "
      f"{cell('time/generation_decode')} | {cell('time/generation_decode_wait')} | {cell('time/training')} |")
PY
}
# engine: this rank's engine call; decode: its pure decode steps, of which "wait" waited for the GPU (the
# rest of decode is the host's work; engine - decode is the call's setup, prefill and teardown)
echo "| run | step s | generation s | engine s | decode s | decode wait s | training s |"
echo "|---|---:|---:|---:|---:|---:|---:|"
run 0 alone0 && row "alone on GPU 0" alone0
if [ "${QUICK:-0}" != 1 ]; then
  run 1 alone1 && row "alone on GPU 1" alone1
  run 0 pair0 & run 1 pair1 & wait
  row "two independent runs at once (GPU 0 / GPU 1)" pair0 pair1
  OMP_NUM_THREADS=$(( $(nproc) / 2 )) run 0 half && row "alone on GPU 0, OMP_NUM_THREADS=nproc/2" half
fi
sample_threads() { # OUT_FILE: "second pid tid name cpu-ticks" every second while ranks run
  local out=$1
  : > "$out"
  for i in $(seq 1 600); do
    # the ranks are exec'd from /proc/self/exe (their name is "exe"): find them by their arguments
    for p in $(pgrep -f 'colt train'); do
      for t in /proc/$p/task/*; do
        # the name sits between the first "(" and the last ")" and may hold spaces; utime and stime
        # are the 12th and 13th fields after it
        awk -v i="$i" -v p="$p" '{ a = index($0, "("); b = match($0, /\) [A-Za-z] /); name = substr($0, a + 1, b - a - 1)
          gsub(/ /, "_", name); split(substr($0, b + 2), f, " "); print i, p, $1, name, f[12] + f[13] }' \
          "$t/stat" 2>/dev/null
      done
    done >> "$out"
    sleep 1
  done
}
if [ "${THREADS:-0}" = 1 ]; then sample_threads "$W/threads.txt" & sampler=$!; fi
run 0,1 dp2 --nproc_per_node 2 && row "--nproc_per_node 2 (rank 0)" dp2
if [ "${THREADS:-0}" = 1 ]; then
  kill "$sampler" 2>/dev/null
  python3 - "$W/threads.txt" <<'PY'
import collections, sys
first, last, name = {}, {}, {}
for line in open(sys.argv[1]):
    i, pid, tid, nm, ticks = line.split()
    key = (pid, tid)
    first.setdefault(key, int(ticks))
    last[key], name[key] = int(ticks), nm
used = sorted(((last[k] - first[k]) / 100.0, k) for k in first)[::-1]
print("\nCPU seconds per thread over the --nproc_per_node 2 run (sampled once a second; the launcher included):")
print("| pid | tid | thread | CPU s |\n|---:|---:|---|---:|")
for s, (pid, tid) in used[:20]:
    print(f"| {pid} | {tid} | {name[(pid, tid)]} | {s:.2f} |")
PY
fi
if [ "${NCCL_ROWS:-0}" = 1 ]; then
  run 0,1 dp2_host --nproc_per_node 2 --ddp_backend gloo && row "--nproc_per_node 2 --ddp_backend gloo (no NCCL)" dp2_host
  NCCL_P2P_DISABLE=1 run 0,1 dp2_p2p --nproc_per_node 2 && row "--nproc_per_node 2, NCCL_P2P_DISABLE=1" dp2_p2p
  NCCL_CUMEM_ENABLE=0 run 0,1 dp2_cumem --nproc_per_node 2 && row "--nproc_per_node 2, NCCL_CUMEM_ENABLE=0" dp2_cumem
  NCCL_RAS_ENABLE=0 run 0,1 dp2_ras --nproc_per_node 2 && row "--nproc_per_node 2, NCCL_RAS_ENABLE=0" dp2_ras
  NCCL_IGNORE_CPU_AFFINITY=1 run 0,1 dp2_aff --nproc_per_node 2 && row "--nproc_per_node 2, NCCL_IGNORE_CPU_AFFINITY=1" dp2_aff
fi
echo
echo "Command: bash bench/gpu/bench_dp_probe.sh $tok $prompts $preset ($(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), $(nproc) host cores)"
