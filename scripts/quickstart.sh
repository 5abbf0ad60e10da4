#!/usr/bin/env bash
# Fresh machine to first result: install the dependencies, configure build/
# (tests included, so that `cmake --build build` builds them next), build only
# what the main job needs (libmoe_ep, libmoe_ep_mpi, moe_ep_conformance), then
# run the conformance check and a small benchmark over mpirun on this machine.
# The backend is NVLink where every rank has a supported GPU, else HOST (whose
# timings say that the code runs, not how fast).
#   bash scripts/quickstart.sh            NP=4 bash scripts/quickstart.sh
#   MOE_EP_CMAKE_ARGS=...  more configure arguments (e.g. -DCMAKE_CUDA_ARCHITECTURES=90)
#   MOE_EP_SKIP_DEPS=1     do not run .ci/install-deps.sh (already installed)
set -euo pipefail
cd "$(dirname "$0")/.."
[ "${MOE_EP_SKIP_DEPS:-0}" = 1 ] || bash .ci/install-deps.sh
export PATH=/usr/local/cuda/bin:$PATH
# Kernels for this machine's GPUs; without a GPU they never run, and one
# architecture compiles in half the time of the default two.
arch=()
case " ${MOE_EP_CMAKE_ARGS:-} " in
  *CMAKE_CUDA_ARCHITECTURES*) ;;
  *) if nvidia-smi -L 2> /dev/null | grep -q '^GPU'; then arch=(-DCMAKE_CUDA_ARCHITECTURES=native)
     else arch=(-DCMAKE_CUDA_ARCHITECTURES=90); fi ;;
esac
cmake -S . -B build -G Ninja "${arch[@]}" ${MOE_EP_CMAKE_ARGS:-}
cmake --build build --target moe_ep moe_ep_mpi moe_ep_conformance
# Open MPI needs these to run as root or without an ssh client (single host only).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_plm_rsh_agent=sh
NP=${NP:-2}
mpirun -np "$NP" --oversubscribe build/tools/moe_ep_conformance check --backend auto
mpirun -np "$NP" --oversubscribe build/tools/moe_ep_conformance bench --backend auto -b 1 -e 64 -f 4 -w 2 -n 10
echo "next: cmake --build build && ctest --test-dir build -LE slow --output-on-failure"
