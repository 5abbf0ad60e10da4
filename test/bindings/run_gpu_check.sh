#!/usr/bin/env bash
# The Python bindings on a machine with 2 GPUs (with .device-deps/ present):
# builds libmoe_ep + libmoe_ep_mpi only, then runs
#   - test_torch.py on 2 ranks: gloo bootstrap + HOST backend (CPU bf16), then
#     NVLINK_TWO_SIDED on CUDA tensors with the NCCL and mpi4py bootstraps;
#   - the single-process suite (numpy 2.x: versioned DLPack capsules);
#   - test_mpi.py on 2 ranks (mpi4py bootstrap, HOST backend).
# Run from the repository root:  OUT=/some/dir bash test/bindings/run_gpu_check.sh
set -uo pipefail
OUT=${OUT:-$PWD/gpu-bindings-out}
mkdir -p "$OUT"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_plm_rsh_agent=sh
# Never NVLink multicast on these machines.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
B=build-pydev T=bindings/python/tests R=test/bindings/run_python_tests.sh
python3 -c "import torch, numpy, mpi4py, pytest; print('torch', torch.__version__, 'gpus', torch.cuda.device_count(), 'numpy', numpy.__version__, 'mpi4py', mpi4py.__version__)"
start=$(date +%s)
(cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
   -DCMAKE_PREFIX_PATH="$PWD/.device-deps/usr" -DMOE_EP_BUILD_TESTS=OFF -DMOE_EP_BUILD_TOOLS=OFF &&
 ninja -C $B -j"$(nproc)" moe_ep moe_ep_mpi) > "$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
cc -std=c99 -Iinclude bindings/layout_probe/moe_ep_layout_probe.c -o $B/layout_probe && $B/layout_probe > $B/layout.txt
echo "build: $(( $(date +%s) - start )) s"
export MOE_EP_LIBRARY=$PWD/$B/src/libmoe_ep.so.0 MOE_EP_MPI_LIBRARY=$PWD/$B/src/libmoe_ep_mpi.so.0
export PYTHONPATH=$PWD/bindings/python/src MOE_EP_LAYOUT_PROBE_OUTPUT=$PWD/$B/layout.txt
rc=0
echo "== torch, 2 ranks"
timeout 90 bash $R python3 2 "pytest torch" $T/test_torch.py -vv 2>&1 | tee "$OUT/torch.log" || rc=1
echo "== single process"
timeout 30 bash $R python3 0 "numpy pytest" $T/test_api.py $T/test_threads.py -q 2>&1 | tee "$OUT/single.log" | tail -6 || rc=1
echo "== mpi4py, 2 ranks"
timeout 30 bash $R python3 2 "numpy pytest mpi4py" $T/test_mpi.py 2>&1 | tee "$OUT/mpi.log" | tail -8 || rc=1
echo "rc=$rc"
exit $rc
