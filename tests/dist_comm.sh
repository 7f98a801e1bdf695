#!/usr/bin/env bash
# dist_comm.sh — test_dist_comm under mpirun: every communicator op over MPI
# with 2 and 4 ranks, then a rank that hangs (the others must report the 5 s
# timeout and abort the job) and a rank that exits early (the job must end,
# well within the timeout). Usage: dist_comm.sh <folder of test_dist_comm>.
# Exits 77 (skipped) only when mpirun is missing or the build has no MPI.
set -u
bin_dir=${1:?usage: dist_comm.sh <folder with test_dist_comm>}
here=$(cd "$(dirname "$0")" && pwd)
exe=$bin_dir/test_dist_comm
if ! command -v mpirun >/dev/null 2>&1; then
  echo "dist_comm: mpirun not found (apt-get install openmpi-bin, or scripts/setup.sh): skipped"
  exit 77
fi
[ -x "$exe" ] || { echo "dist_comm: $exe not built"; exit 1; }
if ! "$exe" --backends | grep -qw mpi; then
  echo "dist_comm: this build has no MPI (libopenmpi-dev missing when configured): skipped"
  exit 77
fi
# Open MPI keeps its init allocations until exit: suppress those, not leak
# checks. Full (slow) unwinding on malloc, so stacks through Open MPI, built
# without frame pointers, reach the library names the suppressions match.
export LSAN_OPTIONS="suppressions=$here/lsan_openmpi.supp${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}fast_unwind_on_malloc=0"
# CI runs as root and on few cores; shared memory without cross-process
# memory attach, which containers often forbid.
mpi=(mpirun --oversubscribe --allow-run-as-root --mca btl self,vader --mca btl_vader_single_copy_mechanism none)

runs=0 failed=0
out=$(mktemp)
trap 'rm -f "$out"' EXIT

run() { # name, expected ("ok" or "fails"), max seconds, mpirun arguments...
  local name=$1 want=$2 max=$3
  shift 3
  local t0 t1 rc
  t0=$(date +%s.%N)
  timeout 120 "${mpi[@]}" "$@" >"$out" 2>&1
  rc=$?
  t1=$(date +%s.%N)
  local took
  took=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
  local verdict=pass
  if [ "$want" = ok ] && [ $rc -ne 0 ]; then verdict="FAIL (exit $rc)"; fi
  if [ "$want" = fails ] && [ $rc -eq 0 ]; then verdict="FAIL (the job succeeded)"; fi
  if [ $rc -eq 124 ]; then verdict="FAIL (still running after 120 s)"; fi
  if awk -v t="$took" -v m="$max" 'BEGIN { exit !(t > m) }'; then verdict="FAIL (took $took s, limit $max s)"; fi
  if grep -q "wrong failure\|^FAIL" "$out"; then verdict="FAIL (a rank saw the wrong thing)"; fi
  case $name in hang*)
    grep -q "EXPECTED-FAILURE-SEEN" "$out" || verdict="FAIL (no rank reported the timeout)" ;;
  esac
  runs=$((runs + 1))
  echo "dist_comm: $name: $verdict in $took s"
  if [ "$verdict" != pass ]; then
    failed=$((failed + 1))
    sed 's/^/    /' "$out"
  else
    grep -E "checks|EXPECTED-FAILURE-SEEN" "$out" | sed 's/^/    /'
  fi
}

run "2 ranks, all ops" ok 100 -np 2 "$exe"
run "4 ranks, all ops" ok 100 -np 4 "$exe"
run "hang: rank 1 of 3 hangs, 5 s timeout" fails 40 -np 3 "$exe" --fail=hang --timeout=5
run "exit: rank 1 of 3 exits early, 5 s timeout" fails 40 -np 3 "$exe" --fail=exit --timeout=5
echo "dist_comm: $runs runs, $failed failed"
[ $failed -eq 0 ]
