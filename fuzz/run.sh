#!/usr/bin/env bash
# Runs every libFuzzer target in BUILD_DIR for SECONDS each, with a corpus per
# target under fuzz/corpus-NAME (ignored by git) seeded from fuzz/seeds/NAME.
# Usage: bash fuzz/run.sh BUILD_DIR SECONDS
set -euo pipefail
build=${1:-build-fuzz}
seconds=${2:-60}
cd "$(dirname "$0")/.."
status=0
for bin in "$build"/fuzz_*; do
  [ -x "$bin" ] || continue
  name=$(basename "$bin")
  mkdir -p "fuzz/corpus-$name"
  seeds=""
  [ -d "fuzz/seeds/$name" ] && seeds="fuzz/seeds/$name"
  echo "== $name for ${seconds}s"
  if ! UBSAN_OPTIONS=halt_on_error=1 "$bin" -max_total_time="$seconds" -rss_limit_mb=4096 -timeout=10 -print_final_stats=1 \
       "fuzz/corpus-$name" $seeds 2>&1 | tail -n 12; then
    status=1
  fi
done
exit $status
