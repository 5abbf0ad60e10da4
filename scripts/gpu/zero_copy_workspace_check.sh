#!/usr/bin/env bash
# Seventh session, one device call (one GPU is enough: the NVLink backend runs
# several ranks per GPU): the zero-copy workspace without the push combine's
# landing rows (the copy-engine pull variant removed).  Every NVLink GPU suite
# (the overlapped one now with 3 pull producers) and float_convert_gpu (the
# scalar_pair helper); check --zero-copy-combine on 2 and 4 ranks; memcheck and
# racecheck on [zero_copy]; the bench header's workspace size at the DeepSeek
# shape with and without the view (times on one GPU are not NVLink figures).
#   usage: OUT=/dir bash scripts/gpu/zero_copy_workspace_check.sh [BUDGET_S]
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
BUDGET=${1:-400}
BUILD=${BUILD:-build-final}
SUMMARY=$OUT/summary.txt
source "$(dirname "$0")/steps.sh"
build_step 150 moe_ep_conformance test_nvlink_gpu moe_ep_kill_peer_probe test_float_convert
TOOL=$BUILD/tools/moe_ep_conformance
GPU_TEST=$BUILD/test/nvlink/test_nvlink_gpu
MPI2="mpirun -np 2 --bind-to none"
SAN="compute-sanitizer --print-limit 20 --error-exitcode 3"
nvidia-smi -L > "$OUT/gpus.txt" 2>&1
nvlink_suites 90 float_convert_gpu $(cd $BUILD && ctest -N -L gpu | sed -n 's/^ *Test *#[0-9]*: \(nvlink_gpu[a-z0-9_]*\)$/\1/p')
step check_zero_copy_np2 60 $MPI2 $TOOL check --backend nvlink --zero-copy-combine
step check_zero_copy_np4 90 mpirun -np 4 --oversubscribe --bind-to none $TOOL check --backend nvlink --zero-copy-combine
step check_push_np2 60 $MPI2 $TOOL check --backend nvlink
step memcheck_zero_copy 90 $MPI2 -x MOE_EP_FABRIC=0 $SAN --tool memcheck $GPU_TEST "[zero_copy]"
step racecheck_zero_copy 90 $MPI2 -x MOE_EP_FABRIC=0 $SAN --tool racecheck $GPU_TEST "[zero_copy]"
B="bench --backend nvlink --hidden 7168 --topk 8 --experts 256 --dtype bf16 --routing uniform -t 4096 -w 1 -n 3 --no-baselines"
PICK="orkspace|#wrong" NPICK=4 step ws_zero_copy 60 $MPI2 -x MOE_EP_LOG=info $TOOL $B --zero-copy-combine
PICK="orkspace|#wrong" NPICK=4 step ws_push 60 $MPI2 -x MOE_EP_LOG=info $TOOL $B
echo "total $(($(date +%s) - START)) s, exit $rc" | tee -a "$SUMMARY"
exit $rc
