#!/usr/bin/env bash
# The main job until the GRPO trainer lands: generation with the real pretrained
# stories260K (shipped in models/, MIT, see models/stories260K/README.md),
# on the CPU, no network. Run by `make demo` after the build.
set -euo pipefail
cd "$(dirname "$0")/.."
COLT=build/colt
MODEL=models/stories260K

echo "== greedy continuation of 'Once upon a time' (equals transformers' greedy output)"
$COLT generate --model "$MODEL" --prompt "Once upon a time" --max_new_tokens 60

echo
echo "== 3 sampled stories (temperature 0.8, top_p 0.95, seed 42; same seed, same stories)"
$COLT generate --model "$MODEL" --prompt "Once upon a time, a little dog" --max_new_tokens 80 \
  --temperature 0.8 --top_p 0.95 --seed 42 --n 3 | sed 's/^/  > /'

echo
echo "== tokens and log-probs of a sentence under the model (colt tokenize | colt score)"
ids=$(echo '{"text": "Lily saw a big red ball in the park."}' | $COLT tokenize --model "$MODEL")
echo "  ids:      $ids"
echo "$ids" | $COLT score --model "$MODEL" | sed 's/^/  logprobs: /'

echo
echo "== throughput: 64 completions of 128 tokens, batched"
start=$(date +%s.%N)
$COLT generate --model "$MODEL" --prompt "Once upon a time" --max_new_tokens 128 --ignore_eos \
  --temperature 1.0 --seed 1 --n 64 --json > /dev/null
end=$(date +%s.%N)
awk -v s="$start" -v e="$end" 'BEGIN { printf "  %d tokens in %.2f s = %.0f tokens/s (CPU)\n", 64*128, e-s, 64*128/(e-s) }'
