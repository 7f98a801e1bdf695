#!/usr/bin/env bash
# multi_gpu.sh — colt on every GPU of one machine (issue 26): the machine's
# record (GPUs, driver, NCCL, link topology), colocated GRPO against server
# mode and async server mode on the same GPUs (section 1), data-parallel
# scaling of colocated GRPO (2), 7B ZeRO-3 (3), the largest model (4), world
# size N against one process and a rank killed mid-run (5), and tensor
# parallelism (6: bench_tp.sh's TP sweep on the 7B shape).
# Runs what the machine has (1, 2, 4 or 8 GPUs); parts whose code does not
# exist yet say so. Prints markdown; raw logs stay under $WORK.
# Usage: bash bench/gpu/multi_gpu.sh TOKENIZER_DIR PROMPTS_JSONL [presets]   (presets: qwen2.5-0.5b qwen2.5-1.5b)
#   SECTIONS="2 3 4 5" (environment) runs only those sections (default: all; the machine record always).
#   TP_PRESET (qwen2.5-7b) is section 6's shape. Section 1: PRESETS1 (qwen2.5-1.5b), BATCH_SCALES (1),
#   STEPS1 (5), EXTRA1 (more colt train arguments for its runs, e.g. "--zero_stage 3" for qwen2.5-7b),
#   SERVER_GPUS (1; e.g. "1 2": a tensor-parallel server on the last 2), SERVER_DP (1; e.g. 2: the server GPUs
#   split into that many data-parallel replicas, server_data_parallel_size; counts it does not divide are left out).
#   (scripts/pack_device.sh makes the tokenizer and prompts from ../shared/data)
# The GRPO step is bench/gpu/grpo_bench.yaml's: 16 prompts x 8 completions x 256 tokens per GPU (weak
# scaling: the global batch grows with the GPUs, per-GPU work stays), random-weight Qwen2.5 shapes.
set -euo pipefail
cd "$(dirname "$0")/../.."
COLT=${COLT:-build-cuda/colt}
tok=$1
prompts=$2
shift 2
presets=${*:-qwen2.5-0.5b qwen2.5-1.5b}
work=${WORK:-/tmp/colt-multi-gpu}
rm -rf "$work" && mkdir -p "$work"
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
gpus=$(nvidia-smi -L | wc -l)
sections=${SECTIONS:-1 2 3 4 5 6}
want() { [[ " $sections " == *" $1 "* ]]; }

echo "## Machine"
echo
nvidia-smi -L | sed 's/^/    /'
echo "    driver $(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1)"
echo
echo '```'
nvidia-smi topo -m 2>/dev/null | sed -n '1,/^$/p' || echo "(nvidia-smi topo -m failed)"
echo '```'

counts=()
for n in 1 2 4 8; do [ "$n" -le "$gpus" ] && counts+=("$n"); done

# Metrics means over steps 2.. (step 1 captures CUDA graphs and picks cuBLAS algorithms).
summary() { # metrics.jsonl, label, ranks
  python3 - "$@" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()][1:]
mean = lambda k: sum(r.get(k, 0.0) for r in rows) / len(rows)
ranks = int(sys.argv[3])
tokens = mean("completions/mean_length") * 128 * ranks
print(f"| {sys.argv[2]} | {ranks} | {mean('step_time'):.3f} | {tokens / mean('step_time'):,.0f} | "
      f"{tokens / mean('step_time') / ranks:,.0f} | {mean('time/generation'):.3f} | {mean('time/training'):.3f} | "
      f"{mean('time/gradient_sync'):.4f} |")
PY
}

if want 1; then
echo
echo "## 1. Colocate vs server mode (the write-up's experiments)"
echo
# Colocated: every GPU trains and generates its share. Server mode: colt train starts colt serve on the last GPU
# (server_devices) and trains on the others, the weights pushed over NCCL after every step; synchronous, then with
# async_generation (the server generates round k+1 while round k trains). The same global batch in all three:
# B = 16 N (N-1) j completions (j = round(8 / (N-1)) x BATCH_SCALE: about 128 per GPU at scale 1), micro-batches of
# 16, one optimizer step per round. Throughput counts every GPU of the machine, the server's included; the
# write-up's normalisation (server mode's throughput x N/(N-k) for k server GPUs, as if they trained too) is its
# own column. SERVER_GPUS (default 1): the server's GPU counts to run, e.g. "1 2" (k > 1: colt serve tensor
# parallel over the last k GPUs; a count whose training share does not divide the batch is left out).
if [ "$gpus" -ge 2 ]; then
  echo "| model | layout | global batch | s/step | completion tokens/s | per GPU (all $gpus) | x N/(N-k) | generation | weight push | training | colocated / this |"
  echo "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
  j0=$(( (8 + (gpus - 1) / 2) / (gpus - 1) ))
  [ "$j0" -ge 1 ] || j0=1
  for p in ${PRESETS1:-qwen2.5-1.5b}; do
    [ -f "$work/$p/config.json" ] || $COLT init --arch qwen2 --preset "$p" --tokenizer "$tok" --out "$work/$p" 2>/dev/null
    for scale in ${BATCH_SCALES:-1}; do
      B=$(( 16 * gpus * (gpus - 1) * j0 * scale ))
      common=(--config bench/gpu/grpo_bench.yaml --model "$work/$p" --dataset "$prompts" --device cuda
              --per_device_train_batch_size 16 --max_steps "${STEPS1:-5}" ${EXTRA1:-})
      colocated=""
      layouts="colocate"
      for k in ${SERVER_GPUS:-1}; do
        # k server GPUs (a tensor-parallel colt serve when k > 1) and the batch split evenly over the rest
        [ "$k" -lt "$gpus" ] && [ $(( B % (16 * (gpus - k)) )) -eq 0 ] && [ $(( k % ${SERVER_DP:-1} )) -eq 0 ] &&
          layouts="$layouts server:$k async:$k"
      done
      for layout in $layouts; do
        k=${layout#*:}
        out="$work/s1-$p-$scale-${layout/:/}"
        if [ "$layout" = colocate ]; then
          args=(--nproc_per_node "$gpus" --gradient_accumulation_steps $(( B / (16 * gpus) )))
        else
          devs=$(seq -s, $(( gpus - k )) $(( gpus - 1 )))
          args=(--nproc_per_node $(( gpus - k )) --gradient_accumulation_steps $(( B / (16 * (gpus - k)) ))
                --vllm_mode server --server_devices "[$devs]" --server_data_parallel_size "${SERVER_DP:-1}")
          [ "${layout%%:*}" = async ] && args+=(--async_generation true)
        fi
        if $COLT train "${common[@]}" "${args[@]}" --output_dir "$out" > "$out.log" 2>&1; then
          line=$(python3 - "$out/metrics.jsonl" "$p" "$layout" "$B" "$gpus" "$colocated" "${SERVER_DP:-1}" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
rows = [r for r in rows if "step_time" in r][1:]  # the first step captures graphs and picks cuBLAS plans
mean = lambda k: sum(r.get(k, 0.0) for r in rows) / len(rows)
B, n = int(sys.argv[4]), int(sys.argv[5])
layout, k = (sys.argv[3].split(":") + ["0"])[:2]
k = int(k)
tok = mean("completions/mean_length") * B / mean("step_time")
dp = int(sys.argv[7]) if k else 1
parts = ([f"{dp} replicas"] if dp > 1 else []) + ([f"TP {k // dp}" + (" each" if dp > 1 else "")] if k // dp > 1 else [])
tp = f" ({', '.join(parts)})" if parts else ""
names = {"colocate": f"colocated on {n}", "server": f"server mode {n-k}+{k}{tp}",
         "async": f"server mode {n-k}+{k}{tp}, async"}
norm = f"{tok * n / (n - k) / n:,.0f}" if layout != "colocate" else "-"
ratio = f"{float(sys.argv[6]) / mean('step_time'):.2f}" if sys.argv[6] else "1.00"
print(f"{mean('step_time'):.4f}||| {sys.argv[2]} | {names[layout]} | {B} | {mean('step_time'):.3f} | {tok:,.0f} | "
      f"{tok / n:,.0f} | {norm} | {mean('time/generation'):.3f} | {mean('time/weight_sync'):.3f} | "
      f"{mean('time/training'):.3f} | {ratio} |")
PY
)
          [ "$layout" = colocate ] && colocated=${line%%||*}
          echo "${line#*||}"
        else
          echo "| $p | $layout | $B | failed: $(tail -1 "$out.log") |"
        fi
      done
    done
  done
  echo
  echo "colocated / this: the colocated step time over this layout's (above 1: this layout is faster). The write-up's"
  echo "TRL figures (colocate over server, 8 H100s): 1.43x (1.5B), 1.35x (7B), 1.73x (7B with TP). Server logs: $work/s1-*/serve*.log."
else
  echo "Not run: one GPU (server mode on its own GPU needs two)."
fi
fi

if want 2; then
echo
echo "## 2. Data-parallel scaling (weak: 128 completions of 256 tokens per GPU)"
echo
echo "| model | GPUs | s/step | completion tokens/s | per GPU | generation | training | gradient sync (exposed) |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|"
for p in $presets; do
  $COLT init --arch qwen2 --preset "$p" --tokenizer "$tok" --out "$work/$p" 2>/dev/null
  for n in "${counts[@]}"; do
    log="$work/train-$p-$n.log"
    if NCCL_DEBUG=VERSION $COLT train --config bench/gpu/grpo_bench.yaml --model "$work/$p" --dataset "$prompts" \
        --device cuda --nproc_per_node "$n" --output_dir "$work/run-$p-$n" > "$log" 2>&1; then
      summary "$work/run-$p-$n/metrics.jsonl" "$p" "$n"
    else
      echo "| $p | $n | failed: $(tail -1 "$log") |"
    fi
  done
done
nccl=$(grep -ho "NCCL version [0-9.]*[^ ]*" "$work"/train-*.log 2>/dev/null | head -1 || true)
echo
echo "Gradients: $(grep -ho 'gradients: .*' "$work"/train-*-2.log 2>/dev/null | head -1 || echo 'one GPU only'); ${nccl:-NCCL version not printed}."
echo "Efficiency at N GPUs = tokens/s(N) / (N x tokens/s(1)), from the table."
fi

if want 3; then
echo
echo "## 3. Qwen2.5-7B, every weight trained, ZeRO-3 (and offload) over all $gpus GPUs"
echo
# Per GPU the benchmark's round (128 completions of 256 tokens) in micro-batches of 16, as bench_offload.sh.
if [ "$gpus" -ge 2 ] && [ "${SKIP_7B:-0}" != 1 ]; then
  p7=qwen2.5-7b
  $COLT init --arch qwen2 --preset "$p7" --tokenizer "$tok" --out "$work/$p7" 2>/dev/null
  echo "| setup | GPUs | s/step | completion tokens/s | per GPU | generation | training | allocated peak GB/GPU | plan GB |"
  echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|"
  for extra in "--zero_stage 2" "--zero_stage 3" "--zero_stage 3 --offload_optimizer cpu"; do
    a7=(--config bench/gpu/grpo_bench.yaml --model "$work/$p7" --dataset "$prompts" --device cuda --nproc_per_node "$gpus"
        --per_device_train_batch_size 16 --gradient_accumulation_steps 8 --max_steps "${STEPS_7B:-4}" $extra)
    plan=$($COLT train "${a7[@]}" --output_dir "$work/plan7" --dry_run --json --world_size "$gpus" 2>/dev/null |
           python3 -c "import json,sys; print(f\"{json.load(sys.stdin)['per_device_gb']['expected_peak']:.1f}\")" || echo "?")
    tag=$(echo "$extra" | tr -d ' -')
    if $COLT train "${a7[@]}" --output_dir "$work/run7-$tag" > "$work/run7-$tag.log" 2>&1; then
      python3 - "$work/run7-$tag/metrics.jsonl" "$extra" "$gpus" "$plan" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
rows = [r for r in rows if "step_time" in r][1:]
mean = lambda k: sum(r.get(k, 0.0) for r in rows) / len(rows)
g = int(sys.argv[3])
tok = mean("completions/mean_length") * 128 * g
print(f"| {sys.argv[2]} | {g} | {mean('step_time'):.2f} | {tok / mean('step_time'):,.0f} | {tok / mean('step_time') / g:,.0f} | "
      f"{mean('time/generation'):.2f} | {mean('time/training'):.2f} | "
      f"{max(r.get('memory/allocated_peak_gb', 0) for r in rows):.1f} | {sys.argv[4]} |")
PY
    else
      echo "| $extra | $gpus | failed: $(tail -1 "$work/run7-$tag.log") |"
    fi
  done
  echo
  echo "NeMo-RL's published Llama3.1-8B GRPO: 1,562-2,478 completion tokens/s/GPU (16 H100s, ~1,060-token completions)."
else
  echo "Not run: ${SKIP_7B:+SKIP_7B set; }needs 2 or more GPUs."
fi
fi

if want 4; then
echo
echo "## 4. The largest model: dry-run plans for this machine (zero_stage 3, offload_optimizer cpu)"
echo
for p in qwen2.5-14b qwen2.5-32b; do
  $COLT init --arch qwen2 --preset "$p" --tokenizer "$tok" --out "$work/cfg-$p" --dtype bf16 --config_only 2>/dev/null ||
    mkdir -p "$work/cfg-$p"
  if [ -f "$work/cfg-$p/config.json" ]; then
    $COLT train --config bench/gpu/grpo_bench.yaml --model "$work/cfg-$p" --dataset "$prompts" --device cuda \
      --nproc_per_node "$gpus" --zero_stage 3 --offload_optimizer cpu --per_device_train_batch_size 8 \
      --gradient_accumulation_steps 16 --output_dir "$work/plan-$p" --dry_run 2>&1 | sed 's/^/    /' || true
  fi
done
# One of them trained for real (LARGEST, default qwen2.5-14b: colt init's random weights for 32B take minutes).
big=${LARGEST:-qwen2.5-14b}
if [ "$gpus" -ge 2 ]; then
  t0=$(date +%s)
  $COLT init --arch qwen2 --preset "$big" --tokenizer "$tok" --out "$work/$big" 2>/dev/null
  echo
  echo "$big: colt init took $(( $(date +%s) - t0 )) s. ${STEPS_LARGEST:-2} steps, zero_stage 3 + offload_optimizer cpu, $gpus GPUs:"
  echo
  ab=(--config bench/gpu/grpo_bench.yaml --model "$work/$big" --dataset "$prompts" --device cuda --nproc_per_node "$gpus"
      --zero_stage 3 --offload_optimizer cpu --per_device_train_batch_size 8 --gradient_accumulation_steps 16
      --max_steps "${STEPS_LARGEST:-2}")
  if $COLT train "${ab[@]}" --output_dir "$work/run-$big" > "$work/run-$big.log" 2>&1; then
    python3 - "$work/run-$big/metrics.jsonl" "$big" "$gpus" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
r = rows[-1]  # the last step (the first one captures graphs and picks cuBLAS plans)
g = int(sys.argv[3])
tok = r.get("completions/mean_length", 0) * 128 * g
print("| model | GPUs | s/step | completion tokens/s/GPU | generation | training | optimizer (host AdamW) | allocated peak GB/GPU |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
print(f"| {sys.argv[2]} | {g} | {r['step_time']:.1f} | {tok / r['step_time'] / g:,.0f} | {r.get('time/generation', 0):.1f} | "
      f"{r.get('time/training', 0):.1f} | {r.get('time/optimizer', 0):.1f} ({r.get('time/optimizer_host_adamw', 0):.1f}) | "
      f"{r.get('memory/allocated_peak_gb', 0):.1f} |")
PY
  else
    echo "failed: $(tail -1 "$work/run-$big.log")"
  fi
fi

fi

if want 5; then
echo
echo "## 5. Correctness at scale: world size $gpus against one process, same global batch"
echo
if [ "$gpus" -ge 2 ]; then
  p=${presets%% *}
  [ -f "$work/$p/config.json" ] || $COLT init --arch qwen2 --preset "$p" --tokenizer "$tok" --out "$work/$p" 2>/dev/null
  per=$((128 / gpus))
  common=(--config bench/gpu/grpo_bench.yaml --model "$work/$p" --dataset "$prompts" --device cuda --max_steps 3)
  # One process with one micro-batch of 128; one process with $gpus micro-batches of $per (the ranks' partial
  # sums, accumulated); $gpus ranks with $per each.
  $COLT train "${common[@]}" --nproc_per_node 1 --output_dir "$work/check-1" > "$work/check-1.log" 2>&1 || echo "one process failed: $(tail -1 "$work/check-1.log")"
  $COLT train "${common[@]}" --nproc_per_node 1 --per_device_train_batch_size "$per" --gradient_accumulation_steps "$gpus" \
    --output_dir "$work/check-1-acc" > "$work/check-1-acc.log" 2>&1 || echo "one process, accumulating, failed: $(tail -1 "$work/check-1-acc.log")"
  $COLT train "${common[@]}" --nproc_per_node "$gpus" --per_device_train_batch_size "$per" --output_dir "$work/check-$gpus" \
    > "$work/check-$gpus.log" 2>&1 || echo "$gpus processes failed: $(tail -1 "$work/check-$gpus.log")"
  $COLT train "${common[@]}" --nproc_per_node "$gpus" --per_device_train_batch_size "$per" --zero_stage 3 \
    --output_dir "$work/check-$gpus-z3" > "$work/check-$gpus-z3.log" 2>&1 || echo "$gpus processes, zero_stage 3, failed: $(tail -1 "$work/check-$gpus-z3.log")"
  python3 - "$work/check-$gpus/metrics.jsonl" "$gpus" "$work/check-1-acc/metrics.jsonl" "$work/check-1/metrics.jsonl" \
    "$work/check-$gpus-z3/metrics.jsonl" <<'PY'
import json, math, sys
def rows(path):
    try:
        return [json.loads(l) for l in open(path) if l.strip()]
    except OSError:
        return []
ranks = rows(sys.argv[1])
print(f"| against world size {sys.argv[2]} | step | metrics compared | largest relative difference | in |")
print("|---|---:|---:|---:|---|")
for label, path in (("one process, the same micro-batches accumulated", sys.argv[3]),
                    ("one process, one micro-batch of 128", sys.argv[4]),
                    (f"world size {sys.argv[2]} with zero_stage 3", sys.argv[5])):
    for ra, rb in zip(rows(path), ranks):
        worst, name, n = 0.0, "-", 0
        for k, va in ra.items():
            # timings and the engine's own pool (one per rank) differ by design
            if k.startswith(("time/", "engine/", "memory/")) or k == "step_time" or not isinstance(va, (int, float)):
                continue
            vb = rb.get(k)
            if not isinstance(vb, (int, float)) or (isinstance(va, float) and math.isnan(va)):
                continue
            n += 1
            d = abs(va - vb) / max(abs(va), 1e-6)
            if d > worst:
                worst, name = d, f"{k} ({va:.8g} vs {vb:.8g})"
        print(f"| {label} | {ra.get('step')} | {n} | {worst:.2e} | {name} |")
PY
  echo
  echo "The weights' fingerprint (sum of squares of the fp32 masters and first moments) is compared across ranks after"
  echo "every step by colt itself; a difference stops the job. $(grep -c 'differ' "$work/check-$gpus.log" || true) such stops."

  echo
  echo "### A rank killed mid-run (zero_stage 3: the others wait in layer gathers)"
  echo
  $COLT train "${common[@]}" --max_steps 1000 --nproc_per_node "$gpus" --per_device_train_batch_size "$per" \
    --zero_stage 3 --ddp_timeout 60 --output_dir "$work/kill" > "$work/kill.log" 2>&1 &
  parent=$!
  for _ in $(seq 600); do
    [ -f "$work/kill/metrics.jsonl" ] && [ "$(wc -l < "$work/kill/metrics.jsonl")" -ge 2 ] && break
    sleep 0.5
  done
  victim=$(pgrep -P "$parent" | tail -1)
  t0=$(date +%s.%N)
  kill -9 "$victim"
  status=0
  wait "$parent" || status=$?
  t1=$(date +%s.%N)
  echo "kill -9 of rank $((gpus - 1)) (pid $victim) after step 2: colt exited with status $status after" \
       "$(python3 -c "print(f'{$t1 - $t0:.1f}')") s (ddp_timeout 60 s). Its last line: \`$(tail -1 "$work/kill.log")\`"
else
  echo "Not run: one GPU."
fi
fi

if want 6; then
  echo
  echo "## 6. Tensor parallelism: TP 1 / 2 / 4 / 8 against data parallelism on the same GPUs"
  echo
  if [ "$gpus" -lt 2 ]; then
    echo "Not run: one GPU."
  else
    tps="1" layouts="TP 1:1:1:"
    for n in 2 4 8; do
      [ "$n" -le "$gpus" ] || continue
      tps="$tps $n"
      layouts="$layouts;TP $n:$n:$n:;DP $n zero_stage 2:$n:1:--zero_stage 2"
      [ "$n" -ge 4 ] && layouts="$layouts;TP 2 x DP $((n / 2)):$n:2:"
    done
    GEN_TPS="$tps" TRAIN_LAYOUTS="$layouts" COLT=$COLT WORK="$work/tp" STEPS=3 \
      bash bench/gpu/bench_tp.sh "$tok" "$prompts" "${TP_PRESET:-qwen2.5-7b}" || echo "bench_tp.sh failed"
  fi
fi

echo
echo "Command: bash bench/gpu/multi_gpu.sh $tok $prompts $presets ($(nvidia-smi -L | head -1 | cut -d'(' -f1| sed 's/GPU 0: //'), $gpus GPUs)"
