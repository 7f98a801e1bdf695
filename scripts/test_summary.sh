#!/usr/bin/env bash
# test_summary.sh LOG_DIR — the last lines of `make test`: one line per suite and a total.
#
# The Makefile's test target runs each suite with its output teed to LOG_DIR/<suite>.log and
# its exit status written to LOG_DIR/<suite>.rc:
#   release  ctest in build/       (Release)
#   asan     ctest in build-asan/  (ASan + UBSan)
#   cuda     the CUDA build        (compiled only: CI has no GPU)
# This script reads those files (and each build's Testing/Temporary/LastTest.log for the parts of
# suites that skipped themselves), prints the summary, and exits 1 when any suite failed or did not
# report, 0 otherwise. It runs nothing itself.
set -uo pipefail
logs=${1:-build/test-logs}
failed=0
total_tests=0 total_passed=0 total_skipped=0 total_failed=0

# Warnings in a build log: compiler lines ("x.c:1:2: warning:", nvcc's "x.cu(3): warning #177-D:")
# and CMake's.
count_warnings() {
  grep -cE '(^|[ :)])warning( #[0-9]+-D)?:|^CMake Warning' "$1" 2>/dev/null || true
}

# Prints the summary line of one ctest suite; $1 name, $2 log stem, $3 build folder.
# "; N min S s" from LOG_DIR/<suite>.seconds (the Makefile times each suite), or nothing.
took() {
  local s; s=$(cat "$logs/$1.seconds" 2>/dev/null) || return 0
  printf '; %d min %02d s' $((s / 60)) $((s % 60))
}

ctest_line() {
  local name=$1 log="$logs/$2.log" rcfile="$logs/$2.rc" build=$3
  local rc; rc=$(cat "$rcfile" 2>/dev/null || echo missing)
  local summary; summary=$(grep -E '[0-9]+% tests passed, [0-9]+ tests? failed out of [0-9]+' "$log" 2>/dev/null | tail -1)
  if [ -z "$summary" ]; then
    if [ "$rc" = 0 ]; then rc=missing; fi
    printf '%-12s did not run: build or setup failed (exit %s; see %s)\n' "$name" "$rc" "$log"
    failed=1
    return
  fi
  local n bad; n=$(sed -E 's/.* out of ([0-9]+).*/\1/' <<<"$summary"); bad=$(sed -E 's/.*, ([0-9]+) tests? failed.*/\1/' <<<"$summary")
  # ctest lists tests that did not run as "\t  7 - name (Skipped)" and failures as "\t  2 - name (Failed)"
  local skipped_names failed_names
  skipped_names=$(grep -E '^[[:space:]]+[0-9]+ - [^ ]+ \(Skipped\)' "$log" | awk '{print $3}' | sort -u | paste -sd, - | sed 's/,/, /g')
  failed_names=$(awk '/The following tests FAILED:/ {f = 1; next} f && /^[[:space:]]+[0-9]+ - / {print $3 ($4 == "(Failed)" ? "" : " " $4); next} {f = 0}' "$log" |
                 sort -u | paste -sd, - | sed 's/,/, /g')
  local skipped=0; [ -n "$skipped_names" ] && skipped=$(tr ',' '\n' <<<"$skipped_names" | wc -l)
  local passed=$((n - bad - skipped))
  local parts=0
  [ -f "$build/Testing/Temporary/LastTest.log" ] && parts=$(grep -c '^SKIPPED: ' "$build/Testing/Temporary/LastTest.log" || true)
  local line
  line=$(printf '%-12s %d tests: %d passed, %d skipped' "$name" "$n" "$passed" "$skipped")
  [ -n "$skipped_names" ] && line+=" ($skipped_names)"
  line+=", $bad failed"
  [ -n "$failed_names" ] && line+=" ($failed_names)"
  [ "$parts" -gt 0 ] && line+="; $parts parts skipped (listed above)"
  line+="; build: $(count_warnings "$log") warnings"
  line+="$(took "$2")"
  echo "$line"
  total_tests=$((total_tests + n)) total_passed=$((total_passed + passed))
  total_skipped=$((total_skipped + skipped)) total_failed=$((total_failed + bad))
  if [ "$rc" != 0 ] || [ "$bad" != 0 ]; then failed=1; fi
}

# Tests that skipped part of their checks say so; list each once (the Release run's words).
if [ -f build/Testing/Temporary/LastTest.log ] && grep -q '^SKIPPED: ' build/Testing/Temporary/LastTest.log; then
  echo
  echo "Parts skipped (a missing ../shared/data or optional Python package; docs/testing.md):"
  grep '^SKIPPED: ' build/Testing/Temporary/LastTest.log | sort -u | sed 's/^/  /'
fi

echo
echo "== make test: summary (logs in $logs/)"
ctest_line "Release" release build
ctest_line "ASan/UBSan" asan build-asan

rc=$(cat "$logs/cuda.rc" 2>/dev/null || echo missing)
if grep -q 'no nvcc found' "$logs/cuda.log" 2>/dev/null; then
  cuda="skipped: no nvcc"
elif [ "$rc" = 0 ]; then
  if grep -qE 'Building (CUDA|C|CXX) object' "$logs/cuda.log"; then
    cuda="compiled, $(count_warnings "$logs/cuda.log") warnings"
  else
    cuda="compiled (up to date, nothing rebuilt: warnings not counted)"
  fi
else
  cuda="FAILED (exit $rc; see $logs/cuda.log)"
  failed=1
fi
printf '%-12s %s%s\n' "CUDA build" "$cuda" "$(took cuda)"

verdict=OK
[ "$failed" = 0 ] || verdict=FAILED
printf '%-12s %d tests: %d passed, %d skipped, %d failed; CUDA build %s — %s\n' "total" "$total_tests" \
  "$total_passed" "$total_skipped" "$total_failed" "${cuda%% (*}" "$verdict"
[ "$failed" = 0 ]
