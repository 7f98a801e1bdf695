#!/usr/bin/env bash
# make_devlibs.sh — collects the Debian shared libraries a build-cuda binary
# links (jansson, PCRE2, utf8proc, libyaml, OpenMP, OpenBLAS and its Fortran
# runtime, Open MPI, Gloo and what they load) into .devlibs/, so the binary runs on a GPU machine whose image
# lacks them: carry .devlibs and the binaries, then
#   export LD_LIBRARY_PATH=$PWD/.devlibs; build-cuda/test_cuda_ops
# (scripts/gpu_check.sh does that). CUDA's own libraries are not copied: the
# GPU machine has them.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-build-cuda/colt}
mkdir -p .devlibs
# Everything the binary links except the C runtime and CUDA's own libraries
# (the GPU machine has those, in versions that match its driver).
ldd "$bin" | awk '/=>/ {print $1, $3}' | while read -r name path; do
  case "$name" in
    libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|ld-linux*|libstdc++*|libgcc_s*) ;;
    libcuda*|libcublas*|libnccl*|libnvidia*|libnvrtc*|libnvJitLink*) ;;
    *) cp -L "$path" ".devlibs/$name" ;;
  esac
done
du -sh .devlibs
