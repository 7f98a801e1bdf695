#!/usr/bin/env bash
# pack_device.sh — what a GPU run needs beside the working tree, in one folder
# that travels with it (.devcarry/, ignored by git): the CUDA build's binaries,
# the Debian shared libraries they link (scripts/make_devlibs.sh), and the
# Qwen2.5 tokenizer, GSM8K and the GRPO benchmark's prompts made from it, compressed to
# stay under the device's 64 MiB transfer limit. On the device:
#   tar xf .devcarry/bundle.tar.xz && export LD_LIBRARY_PATH=$PWD/.devlibs
# Usage: bash scripts/pack_device.sh [binary ...]  (default: colt and every GPU test and bench)
# COLT_BUILD=DIR takes the binaries from DIR instead of build-cuda.
# COLT_DEVCARRY=DIR packs into DIR instead of .devcarry (a second packer working beside the first;
# DIR must be git-ignored to travel as a carry path, e.g. .devcarry-attn).
set -euo pipefail
cd "$(dirname "$0")/.."
carry=${COLT_DEVCARRY:-.devcarry}
shared=${COLT_SHARED_DATA:-../shared/data}
build=${COLT_BUILD:-build-cuda}
bins=("$@")
if [ ${#bins[@]} -eq 0 ]; then
  bins=("$build"/colt "$build"/test_cuda_* "$build"/bench_*)
fi
bash scripts/make_devlibs.sh "$build"/colt > /dev/null
[ -x "$build"/bench_serve ] && bash scripts/make_devlibs.sh "$build"/bench_serve > /dev/null # libcurl
rm -rf "$carry" && mkdir -p "$carry/data/qwen2.5-tokenizer" "$carry/data/gsm8k"
cp "$shared"/gsm8k/*.jsonl "$carry/data/gsm8k/"
cp "$shared"/qwen2.5-tokenizer/*.json "$carry/data/qwen2.5-tokenizer/"
python3 - "$shared/gsm8k/train.jsonl" "$carry/data/gsm8k_prompts.jsonl" <<'PY'
import json, sys
with open(sys.argv[1]) as f, open(sys.argv[2], "w") as out:
    for line in f:
        q = json.loads(line)["question"]
        out.write(json.dumps({"prompt": [{"role": "user", "content": q}]}) + "\n")
PY
# xz -9: its 64 MB window sees that the binaries are mostly the same bytes (each links every kernel),
# so the whole set packs to ~13 MB instead of ~75 MB with -6 (over the 64 MiB limit); one thread, ~3 min.
tar cf - "${bins[@]}" .devlibs "$carry/data" | xz -T1 -9 > "$carry/bundle.tar.xz"
rm -rf "$carry/data"
du -sh "$carry/bundle.tar.xz"
