#!/bin/sh
# The Python wheel as a new user gets it: build the wheel from bindings/python
# (scikit-build-core through pip's build isolation, which fetches it from
# PyPI; the libraries are built by the project's CMake), install it into a
# fresh venv, and import it with nothing set: no MOE_EP_LIBRARY, no
# LD_LIBRARY_PATH, no PYTHONPATH.  Leaves WORK/venv for the tests that run
# in it (python_wheel_numpy, doc_examples_python).
#   pip_install.sh PYTHON SRC WORK [CUDA_ARCHITECTURES]
#
# The venv is made with --system-site-packages so that Debian's mpi4py
# (python3-mpi4py, built against the system Open MPI like libmoe_ep_mpi),
# numpy and pytest are visible; pip installs only what is missing
# (ml_dtypes from the [numpy] extra).  Without Debian's mpi4py, pip builds
# mpi4py from source with mpicc (libopenmpi-dev).
# CUDA_ARCHITECTURES, if given, narrows the kernels compiled for the wheel to
# save CI time; users get the project's default.
# Skips (77) only where PYTHON cannot make a venv (Debian: python3-venv).
set -u
py=$1; src=$2; work=$3; archs=${4:-}
if ! "$py" -m venv --help >/dev/null 2>&1 || ! "$py" -c "import ensurepip" >/dev/null 2>&1; then
  echo "SKIP: $py cannot create a venv (Debian: apt-get install python3-venv)"; exit 77
fi
# Nothing from the build tree may leak into the venv or the import.
unset MOE_EP_LIBRARY MOE_EP_MPI_LIBRARY PYTHONPATH LD_LIBRARY_PATH
export PYTHONDONTWRITEBYTECODE=1 PIP_DISABLE_PIP_VERSION_CHECK=1
rm -rf "$work/venv" "$work/dist" && mkdir -p "$work" || exit 1
"$py" -m venv --system-site-packages "$work/venv" || { echo "FAIL: venv"; exit 1; }
vpy=$work/venv/bin/python
# Build from a copy: nothing is written into the source tree.  The CMake build
# directory persists in WORK, so a second run only relinks.
rm -rf "$work/src" && mkdir -p "$work/src" || exit 1
(cd "$src/../.." && tar cf - --exclude=./build --exclude='./build-*' --exclude=./.git \
   --exclude='./bindings/rust/target' --exclude='./.device-deps' --exclude='./.gpu-*' .) |
  (cd "$work/src" && tar xf -) || { echo "FAIL: copy of the source tree"; exit 1; }
set -- --config-settings=build-dir="$work/wheel-build"
[ -n "$archs" ] && set -- "$@" --config-settings=cmake.define.CMAKE_CUDA_ARCHITECTURES="$archs"
start=$(date +%s)
"$vpy" -m pip wheel --no-deps -w "$work/dist" "$@" "$work/src/bindings/python" ||
  { echo "FAIL: pip wheel bindings/python"; exit 1; }
echo "wheel built in $(( $(date +%s) - start )) s"
wheel=$(ls "$work"/dist/moe_ep-*.whl) || exit 1
size=$(wc -c < "$wheel")
echo "wheel: $(basename "$wheel"), $size bytes"
"$vpy" - "$wheel" <<'PY' || exit 1
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
print("\n".join("  " + n for n in names))
libs = sorted(n for n in names if ".so" in n)
assert libs == ["moe_ep/libmoe_ep.so.0", "moe_ep/libmoe_ep_mpi.so.0"], libs
PY
# Small: the core library carries its kernels and the static CUDA runtime,
# nothing else (debug info stripped).
[ "$size" -lt 25000000 ] || { echo "FAIL: wheel of $size bytes (expected < 25 MB)"; exit 1; }
"$vpy" -m pip install "${wheel}[mpi,numpy]" || { echo "FAIL: pip install of the wheel"; exit 1; }
cd "$work" || exit 1
"$vpy" - "$work/venv" <<'PY' || exit 1
import os, subprocess, sys
import moe_ep
from moe_ep import _lib
venv = os.path.realpath(sys.argv[1])
pkg = os.path.realpath(os.path.dirname(moe_ep.__file__))
assert pkg.startswith(venv), f"moe_ep imported from {pkg}, not from the venv {venv}"
core = os.path.realpath(_lib.lib().loaded_from)
mpi = os.path.realpath(_lib.mpi_lib().loaded_from)
assert os.path.dirname(core) == pkg and os.path.dirname(mpi) == pkg, (core, mpi)
needed = subprocess.run(["readelf", "-d", core], capture_output=True, text=True).stdout
assert "cudart" not in needed, "libmoe_ep.so.0 must link the CUDA runtime statically:\n" + needed
print("import moe_ep: version", moe_ep.get_version(), "from", core, "and", mpi)
PY
