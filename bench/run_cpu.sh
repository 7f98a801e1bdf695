#!/usr/bin/env bash
# CPU benchmarks: tokenizer throughput (colt vs HF tokenizers when pip's
# `tokenizers` is installed) and forward tokens/s. Prints markdown tables.
set -euo pipefail
cd "$(dirname "$0")/.."
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores"
echo
./build/bench_tokenizer
if python3 -c "import tokenizers" 2>/dev/null; then
  echo
  python3 bench/bench_tokenizer_hf.py
fi
echo
OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(nproc)} ./build/bench_forward
echo
OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(nproc)} ./build/bench_train_step
