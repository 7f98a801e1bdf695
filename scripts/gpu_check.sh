#!/usr/bin/env bash
# gpu_check.sh — what the device machine runs: the GPU tests and benchmarks of
# a CUDA build made on the development machine (build-cuda/), with the Debian
# shared libraries it links carried in .devlibs/ (the device image lacks them).
# Results go to $OUT (or ./gpu-results). Usage: bash scripts/gpu_check.sh [tests|bench|all]
set -uo pipefail
cd "$(dirname "$0")/.."
what=${1:-all}
out=${OUT:-gpu-results}
mkdir -p "$out"
[ -d .devlibs ] && export LD_LIBRARY_PATH="$PWD/.devlibs:${LD_LIBRARY_PATH:-}"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-8}
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv | tee "$out/gpu.txt"
status=0
if [ "$what" = tests ] || [ "$what" = all ]; then
  for t in build-cuda/test_cuda_*; do
    [ -x "$t" ] || continue
    echo "== $t"
    "$t" 2>&1 | tee "$out/$(basename "$t").log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  done
fi
if [ "$what" = bench ] || [ "$what" = all ]; then
  for b in build-cuda/bench_gemm build-cuda/bench_gpu_*; do
    [ -x "$b" ] || continue
    echo "== $b"
    "$b" 2>&1 | tee "$out/$(basename "$b").md"
  done
fi
exit $status
