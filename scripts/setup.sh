#!/usr/bin/env bash
# setup.sh — installs what colt builds with, from Debian 12's packages.
# Skips apt entirely when everything is already there (offline re-runs work).
set -euo pipefail
PACKAGES=(build-essential cmake pkg-config clang libclang-rt-dev libomp-dev
          libjansson-dev libpcre2-dev libutf8proc-dev libopenblas-dev libyaml-dev python3
          libopenmpi-dev openmpi-bin libgloo-dev libprotobuf-c-dev protobuf-c-compiler
          libmicrohttpd-dev libcurl4-openssl-dev libxxhash-dev)
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all packages present"
  exit 0
fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
echo "setup: installing ${missing[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
