#!/usr/bin/env bash
# The Python wheel on the 2-GPU machine (device kind nvidia-h200-x2): the
# bundled libmoe_ep.so.0 (static CUDA runtime) must drive the NVLink backend
# with nothing set.  The machine cannot reach PyPI, so build the wheel first,
# where PyPI is reachable, and carry it:
#   pip wheel --no-deps -w .gpu-wheel bindings/python \
#       --config-settings=cmake.define.CMAKE_CUDA_ARCHITECTURES=90
# Then, from the repository root:  OUT=/some/dir bash scripts/gpu/wheel_check.sh .gpu-wheel/moe_ep-*.whl
# Runs test_torch.py (gloo + HOST; NCCL and mpi4py bootstraps + NVLINK_TWO_SIDED)
# and the single-process numpy suite against the installed wheel.
set -uo pipefail
OUT=${OUT:-$PWD/gpu-wheel-out}
mkdir -p "$OUT"
wheel=${1:?usage: wheel_check.sh path/to/moe_ep-*.whl}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_plm_rsh_agent=sh
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
# Nothing may point at another copy of the library.
unset MOE_EP_LIBRARY MOE_EP_MPI_LIBRARY LD_LIBRARY_PATH
site=$(mktemp -d)
python3 -m pip install --no-deps --no-index --target "$site" "$wheel" > "$OUT/install.log" 2>&1 ||
  { tail -20 "$OUT/install.log"; exit 1; }
export PYTHONPATH=$site
python3 - "$site" <<'PY' 2>&1 | tee "$OUT/import.log" || exit 1
import sys
import moe_ep
from moe_ep import _lib
assert _lib.lib().loaded_from.startswith(sys.argv[1]), _lib.lib().loaded_from
print("wheel library:", _lib.lib().loaded_from, "version", moe_ep.get_version(),
      "nvlink supported on GPU 0:", moe_ep.is_platform_supported(0))
PY
T=bindings/python/tests R=test/bindings/run_python_tests.sh
rc=0
echo "== torch, 2 ranks (wheel)"
timeout 120 bash $R python3 2 "pytest torch mpi4py" $T/test_torch.py -vv 2>&1 | tee "$OUT/torch.log" | tail -15 || rc=1
echo "== numpy inputs, 1 process (wheel)"
timeout 60 bash $R python3 0 "numpy pytest" $T/test_numpy_inputs.py -q 2>&1 | tee "$OUT/numpy.log" | tail -4 || rc=1
echo "rc=$rc"
exit $rc
