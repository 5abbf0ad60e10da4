#!/usr/bin/env bash
# Installs what moe_ep needs to build and test on Debian 12 (the CUDA toolkit,
# which provides nvcc and the static CUDA runtime, is expected in /usr/local/cuda).
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends \
  build-essential cmake ninja-build pkg-config \
  libopenmpi-dev openmpi-bin \
  catch2 libcli11-dev libdlpack-dev \
  >/dev/null
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  echo "note: add /usr/local/cuda/bin to PATH (nvcc)"
fi
