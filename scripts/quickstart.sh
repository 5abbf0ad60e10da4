#!/usr/bin/env bash
# Fresh machine to first result: install dependencies, build, then run the
# conformance check and a small benchmark over mpirun on this machine.  Uses
# the NVLink backend where every rank has a supported GPU, else the HOST backend.
set -euo pipefail
cd "$(dirname "$0")/.."
bash .ci/install-deps.sh
export PATH=/usr/local/cuda/bin:$PATH
cmake -S . -B build -G Ninja ${MOE_EP_CMAKE_ARGS:-}
cmake --build build
# Open MPI needs these to run as root or without an ssh client (single host only).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_plm_rsh_agent=sh
NP=${NP:-2}
mpirun -np "$NP" --oversubscribe build/tools/moe_ep_conformance check --backend auto
mpirun -np "$NP" --oversubscribe build/tools/moe_ep_conformance bench --backend auto -b 1 -e 64 -f 4 -w 2 -n 10
