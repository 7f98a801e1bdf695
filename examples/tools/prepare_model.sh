#!/usr/bin/env bash
# prepare_model.sh — SmolLM2-135M-Instruct with a chat template that renders tools: TRL (and colt) put the
# tools' JSON schemas into the prompt through the chat template and read the model's calls in the format the
# template asks for. SmolLM2's own template has no tools, so this folder pairs its weights and tokenizer
# (symlinks) with Qwen2.5's ChatML template (hermes: <tool_call>{json}</tool_call>, the same <|im_start|> /
# <|im_end|> tokens SmolLM2 has). Fetch SmolLM2 first: bash scripts/get_smollm2.sh.
#
#   bash examples/tools/prepare_model.sh [SMOLLM2_DIR]   # -> models/smollm2-135m-instruct-tools
set -euo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
SRC=$(cd "${1:-${COLT_SMOLLM2_DIR:-$REPO/models/smollm2-135m-instruct}}" && pwd)
OUT=$REPO/models/smollm2-135m-instruct-tools
for f in config.json generation_config.json model.safetensors tokenizer.json tokenizer_config.json; do
    [ -e "$SRC/$f" ] || { echo "prepare_model.sh: $SRC/$f not found (run bash scripts/get_smollm2.sh)" >&2; exit 1; }
done
mkdir -p "$OUT"
for f in config.json generation_config.json model.safetensors tokenizer.json tokenizer_config.json; do
    ln -sf "$SRC/$f" "$OUT/$f"
done
cp "$REPO/examples/tools/hermes_chat_template.jinja" "$OUT/chat_template.jinja"
echo "prepare_model.sh: $OUT (SmolLM2 weights, hermes tool-call chat template)"
