#!/usr/bin/env bash
# The main job: GRPO on the CPU with the real pretrained stories260K (shipped
# in models/, MIT, see models/stories260K/README.md), no network. The reward
# asks for stories that go to the park (examples/demo.yaml). Run by `make demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
COLT=build/colt
OUT=runs/demo

echo "== colt train --config examples/demo.yaml"
$COLT train --config examples/demo.yaml --output_dir "$OUT"

echo
echo "== held-out prompts, before and after (from $OUT/eval_before.jsonl and eval_after.jsonl)"
show_samples() {  # first completion of the first three prompts, without Python
  awk -v n=3 -v g=8 'NR % g == 1 && shown < n { print "  " $0; shown++ }' "$1"
}
echo "-- before:"; show_samples "$OUT/eval_before.jsonl"
echo "-- after:";  show_samples "$OUT/eval_after.jsonl"

echo
echo "== summary ($OUT/summary.json)"
grep -E '"(eval_reward_before|eval_reward_after|eval_reward_gain|steps|seconds)"' "$OUT/summary.json"
echo
echo "reward curve: $OUT/reward_curve.svg   metrics: $OUT/metrics.jsonl   model: $OUT/"
echo "try it:  $COLT generate --model $OUT --prompt 'Once upon a time, there was a little fox named Sam.' --max_new_tokens 48"
