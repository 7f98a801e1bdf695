#!/usr/bin/env bash
# gpu_check.sh — what the device machine runs: the GPU tests and benchmarks of
# a CUDA build made on the development machine. When .devcarry/bundle.tar.xz is
# there (scripts/pack_device.sh) it is unpacked first: build-cuda/ binaries, the
# Debian shared libraries they link (.devlibs/) and the GRPO benchmark's data.
# Results go to $OUT (or ./gpu-results).
# Usage: bash scripts/gpu_check.sh [part ...]
#   parts: tests cli decode floor grpo grpo-fast train gemm agent agent-multi fewshot (default: all but floor,
#   agent-multi (2 GPUs for its TP and async halves) and fewshot)
set -uo pipefail
cd "$(dirname "$0")/.."
parts=${*:-tests cli decode grpo grpo-fast train gemm agent}
out=${OUT:-gpu-results}
mkdir -p "$out"
[ -f .devcarry/bundle.tar.xz ] && tar xf .devcarry/bundle.tar.xz
[ -d .devlibs ] && export LD_LIBRARY_PATH="$PWD/.devlibs:${LD_LIBRARY_PATH:-}"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-8}
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv | tee "$out/gpu.txt"
status=0
for part in $parts; do
  case $part in
    tests)
      for t in build-cuda/test_cuda_*; do
        [ -x "$t" ] || continue
        echo "== $t"
        timeout 300 "$t" > "$out/$(basename "$t").log" 2>&1
        rc=$?
        tail -3 "$out/$(basename "$t").log"
        [ $rc -eq 0 ] || { echo "   exit $rc"; status=1; }
      done ;;
    cli)
      echo "== colt generate: greedy stories260K on cpu and cuda_f32 (the same text), cuda bf16, --bench"
      for dev in cpu cuda_f32 cuda; do
        build-cuda/colt generate --model models/stories260K --prompt "Once upon a time" --max_new_tokens 40 \
          --device $dev 2>&1 | tee "$out/generate_$dev.txt"
      done
      cmp -s "$out/generate_cpu.txt" "$out/generate_cuda_f32.txt" && echo "cpu == cuda_f32" || { echo "cpu != cuda_f32"; status=1; }
      build-cuda/colt generate --model models/stories260K --prompt "Once upon a time" --n 256 --temperature 1 \
        --max_new_tokens 200 --ignore_eos --bench --device cuda 2>&1 | tee "$out/generate_bench.txt"
      echo "== colt generate --deterministic: the first of 8 sampled completions == the same one alone"
      for n in 8 1; do
        build-cuda/colt generate --model models/stories260K --prompt "Once upon a time" --n $n --temperature 1 \
          --max_new_tokens 60 --json --deterministic --device cuda 2>&1 | head -1 > "$out/generate_det_$n.txt"
      done
      cat "$out/generate_det_1.txt"
      cmp -s "$out/generate_det_8.txt" "$out/generate_det_1.txt" && echo "alone == in a batch of 8" ||
        { echo "deterministic: alone != in a batch of 8"; status=1; } ;;
    decode) echo "== bench_decode"; build-cuda/bench_decode ${DECODE_PRESETS:-0.5b 1.5b 7b} 2>&1 | tee "$out/bench_decode.md" ;;
    floor)
      echo "== bench_grid_sync, bench_layer_floor (the batch-1 decode kernel's floors)"
      build-cuda/bench_grid_sync 2>&1 | tee "$out/bench_grid_sync.md"
      build-cuda/bench_layer_floor 2>&1 | tee "$out/bench_layer_floor.md" ;;
    grpo)
      echo "== bench_grpo"
      bash bench/gpu/bench_grpo.sh .devcarry/data/qwen2.5-tokenizer .devcarry/data/gsm8k_prompts.jsonl 2>&1 |
        tee "$out/bench_grpo.md"
      cp /tmp/colt-bench-grpo/train-*.log "$out/" 2>/dev/null ;;
    grpo-fast)
      echo "== bench_grpo, deterministic mode off"
      COLT_TRAIN_ARGS="--deterministic false" WORK=/tmp/colt-bench-grpo-fast bash bench/gpu/bench_grpo.sh \
        .devcarry/data/qwen2.5-tokenizer .devcarry/data/gsm8k_prompts.jsonl 2>&1 | tee "$out/bench_grpo_fast.md"
      cp /tmp/colt-bench-grpo-fast/train-qwen2.5-0.5b.log "$out/train-fast-0.5b.log" 2>/dev/null ;;
    fewshot)
      echo "== bench_fewshot"
      bash bench/gpu/bench_fewshot.sh .devcarry/data/qwen2.5-tokenizer .devcarry/data/gsm8k ${FEWSHOT_PRESETS:-} 2>&1 |
        tee "$out/bench_fewshot.md" ;;
    train) echo "== bench_gpu_train_step"; build-cuda/bench_gpu_train_step 2>&1 | tee "$out/bench_gpu_train_step.md" ;;
    gemm) echo "== bench_gemm"; build-cuda/bench_gemm 20 2>&1 | tee "$out/bench_gemm.md" ;;
    agent)
      echo "== multi-turn tool calling on the GPU, deterministic mode: engine and trainer log-probs equal"
      a=tests/data/agent
      for dev in cuda cuda_f32; do
        build-cuda/colt train --model tests/data/models/tiny-tool-f32 --dataset $a/tool_prompts.jsonl \
          --tools "[\"$a/calc_tools.py:add\",\"$a/calc_tools.py:div\",\"$a/calc_tools.py:big\"]" --tool_timeout 5 \
          --max_tool_calling_iterations 2 --reward_funcs "[\"$a/tool_rewards.py:repeats_tool_result\"]" \
          --num_generations 4 --per_device_train_batch_size 36 --max_completion_length 64 --max_prompt_length 128 \
          --beta 0.04 --learning_rate 1e-3 --logging_steps 1 --log_completions_count 0 --save_steps 0 --seed 7 \
          --report_to none --max_steps 3 --deterministic true --device $dev --output_dir "$out/agent_$dev" \
          > "$out/agent_$dev.log" 2>&1 || { echo "   colt train with tools on $dev failed"; status=1; continue; }
        python3 - "$out/agent_$dev/metrics.jsonl" "$dev" <<'PY' || status=1
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
diff = max(r["sampling/sampling_logp_difference/max"] for r in rows)
calls = [r["tools/call_frequency"] for r in rows]
print(f"   {sys.argv[2]}: {len(rows)} steps, tools/call_frequency {calls}, largest engine/trainer log-prob difference {diff}")
sys.exit(0 if diff == 0 and min(calls) > 0 else 1)
PY
      done ;;
    agent-multi)
      # tools under tensor parallelism (NCCL, 2 GPUs) and with async_generation (colt serve on GPU 1), and
      # rollout_func on the GPU: each against the same run in one process on one GPU
      echo "== tools with tensor_parallel_size 2, async_generation, rollout_func (deterministic, cuda_f32)"
      a=tests/data/agent
      tool_args=(--model tests/data/models/tiny-tool-f32 --dataset $a/tool_prompts.jsonl
        --tools "[\"$a/calc_tools.py:add\",\"$a/calc_tools.py:div\",\"$a/calc_tools.py:big\"]" --tool_timeout 5
        --max_tool_calling_iterations 2 --reward_funcs "[\"$a/tool_rewards.py:repeats_tool_result\"]"
        --num_generations 4 --per_device_train_batch_size 36 --max_completion_length 64 --max_prompt_length 128
        --beta 0.04 --learning_rate 1e-3 --logging_steps 1 --log_completions_count 1000 --save_steps 0 --seed 7
        --report_to none --max_steps 3 --deterministic true --device cuda_f32)
      gpus=$(nvidia-smi -L | wc -l)
      build-cuda/colt train "${tool_args[@]}" --nproc_per_node 1 --output_dir "$out/am_one" > "$out/am_one.log" 2>&1 ||
        { echo "   one GPU: failed: $(tail -1 "$out/am_one.log")"; status=1; }
      runs=()
      if [ "$gpus" -ge 2 ]; then
        NCCL_NVLS_ENABLE=0 build-cuda/colt train "${tool_args[@]}" --tensor_parallel_size 2 --nproc_per_node 2 \
          --output_dir "$out/am_tp2" > "$out/am_tp2.log" 2>&1 || { echo "   TP 2: failed: $(tail -1 "$out/am_tp2.log")"; status=1; }
        runs+=(am_tp2)
        build-cuda/colt train "${tool_args[@]}" --vllm_mode server --server_devices '[1]' --devices '[0]' \
          --async_generation true --learning_rate 0 --output_dir "$out/am_async" > "$out/am_async.log" 2>&1 ||
          { echo "   async: failed: $(tail -1 "$out/am_async.log")"; status=1; }
        build-cuda/colt train "${tool_args[@]}" --nproc_per_node 1 --learning_rate 0 --output_dir "$out/am_one_lr0" \
          > "$out/am_one_lr0.log" 2>&1
        runs+=(am_async:am_one_lr0)
      fi
      python3 - "$out" "${runs[@]}" <<'PY' || status=1
import json, sys, os
out, ok = sys.argv[1], True
def load(run):
    rows = [json.loads(l) for l in open(f"{out}/{run}/completions.jsonl")] if os.path.exists(f"{out}/{run}/completions.jsonl") else []
    metrics = [json.loads(l) for l in open(f"{out}/{run}/metrics.jsonl")] if os.path.exists(f"{out}/{run}/metrics.jsonl") else []
    return rows, metrics
for pair in sys.argv[2:]:
    run, base = (pair.split(":") + ["am_one"])[:2]
    a, am = load(run)
    b, bm = load(base)
    keys = ("reward", "tools/call_frequency", "tools/failure_frequency")
    same_text = len(a) == len(b) and len(a) > 0 and all(x.get("completion") == y.get("completion") for x, y in zip(a, b))
    diffs = {k: max((abs(x.get(k, 0) - y.get(k, 0)) for x, y in zip(am, bm)), default=None) for k in keys}
    lp = max((r.get("sampling/sampling_logp_difference/max", 0) for r in am), default=None)
    print(f"   {run} vs {base}: {len(a)} completions logged, identical text: {same_text}; metric differences {diffs}; "
          f"engine/trainer logp difference max {lp}")
    ok &= same_text and all(v == 0 for v in diffs.values())
sys.exit(0 if ok else 1)
PY
      # rollout_func: a two-turn game generating through trainer.generate on the GPU's engine
      r=tests/data/rollout
      build-cuda/colt train --model tests/data/models/tiny-tool-f32 --dataset examples/data/demo_train.jsonl \
        --rollout_func $r/game_rollouts.py:two_turn --reward_funcs "[\"$r/rollout_rewards.py:turn_count\"]" \
        --num_generations 4 --per_device_train_batch_size 8 --max_completion_length 16 --seed 7 --max_steps 2 \
        --logging_steps 1 --save_steps 0 --report_to none --deterministic true --device cuda_f32 \
        --output_dir "$out/am_rollout" > "$out/am_rollout.log" 2>&1 &&
        echo "   rollout_func on the GPU: $(tail -1 "$out/am_rollout.log")" ||
        { echo "   rollout_func: failed: $(tail -1 "$out/am_rollout.log")"; status=1; } ;;
    replicas)
      # two data-parallel colt serve replicas (both on GPU 1 on a 2-GPU machine: a correctness check, not a
      # speed one) against one replica: the same completions and weights, the pushes over NCCL
      echo "== server mode with 2 replicas against 1 (qwen2.5-0.5b shape, deterministic, 3 steps)"
      w=/tmp/colt-replicas
      mkdir -p $w
      [ -f $w/m/config.json ] || build-cuda/colt init --arch qwen2 --preset qwen2.5-0.5b \
        --tokenizer .devcarry/data/qwen2.5-tokenizer --out $w/m 2>/dev/null
      rargs=(--config bench/gpu/grpo_bench.yaml --model $w/m --dataset .devcarry/data/gsm8k_prompts.jsonl --device cuda
             --max_steps 3 --vllm_mode server --devices '[0]' --vllm_gpu_memory_utilization 0.3 --log_completions_count 1000)
      NCCL_NVLS_ENABLE=0 build-cuda/colt train "${rargs[@]}" --server_devices '[1]' --output_dir $w/one > "$out/replicas_one.log" 2>&1 ||
        { echo "   1 replica: failed: $(tail -1 "$out/replicas_one.log")"; status=1; }
      NCCL_NVLS_ENABLE=0 build-cuda/colt train "${rargs[@]}" --server_devices '[1, 1]' --server_data_parallel_size 2 \
        --output_dir $w/two > "$out/replicas_two.log" 2>&1 || { echo "   2 replicas: failed: $(tail -1 "$out/replicas_two.log")"; status=1; }
      python3 - $w/one $w/two <<'PY' || status=1
import json, sys, hashlib
one, two = sys.argv[1:3]
rows = lambda d: [json.loads(l) for l in open(d + "/completions.jsonl")]
a, b = rows(one), rows(two)
same = len(a) == len(b) > 0 and all(x["completion"] == y["completion"] for x, y in zip(a, b))
digest = lambda d: hashlib.sha256(open(d + "/model.safetensors", "rb").read()).hexdigest()
m = lambda d: [json.loads(l) for l in open(d + "/metrics.jsonl")]
sync = [r.get("time/weight_sync") for r in m(two)]
print(f"   2 replicas vs 1: {len(a)} completions, identical: {same}; weights identical: {digest(one) == digest(two)}; "
      f"weight push s (2 replicas) {sync}")
sys.exit(0 if same and digest(one) == digest(two) else 1)
PY
      ;;
  esac
done
exit $status
