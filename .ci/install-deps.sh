#!/usr/bin/env bash
# Installs what moe_ep needs to build and test on Debian 12 (the CUDA toolkit,
# which provides nvcc and the static CUDA runtime, is expected in /usr/local/cuda).
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends \
  build-essential cmake ninja-build pkg-config clang-format-14 \
  libopenmpi-dev openmpi-bin \
  catch2 libcli11-dev libdlpack-dev \
  python3-numpy python3-pytest python3-mpi4py python3-pip python3-setuptools python3-venv python3-matplotlib \
  binutils clang-14 libclang-rt-14-dev \
  >/dev/null
# clang-14 + libclang-rt-14-dev: the sanitizer and libFuzzer CTest tests (label
# sanitize, test/sanitizers); libclang-rt-14-dev holds libclang_rt.fuzzer and the
# ASan/UBSan runtimes.
# The plot test runs with the first python3 on PATH, which need not be Debian's.
if ! python3 -c "import matplotlib" >/dev/null 2>&1; then
  python3 -m pip install -q matplotlib || echo "warning: matplotlib not installed; the plot test will be skipped"
fi
# The wheel test (python_bindings_pip_install) builds bindings/python with pip's
# build isolation, which fetches scikit-build-core from PyPI, and installs
# ml_dtypes (the [numpy] extra) into its venv: both need PyPI at test time.
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  echo "note: add /usr/local/cuda/bin to PATH (nvcc)"
fi
