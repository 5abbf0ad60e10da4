#!/usr/bin/env bash
# One device call: the pull combine after the proxy-fence change (all, 24, 16, 8 SMs; 1 to 4096 tokens) and the
# latency probe's "call" lines (a call timed as the bench times it).  (It also ran the copy-engine variant of the
# pull on 16 SMs, removed in the seventh session.)
#   usage: OUT=/dir bash scripts/gpu/fence_and_call_floor.sh
set -u
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_plm_rsh_agent=sh NCCL_NVLS_ENABLE=0
B=build-final
cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_PREFIX_PATH=$PWD/.device-deps/usr > /tmp/b.log 2>&1 && ninja -C $B -j32 moe_ep_conformance moe_ep_latency_probe >> /tmp/b.log 2>&1 || { tail -20 /tmp/b.log; exit 1; }
T="$B/tools/moe_ep_conformance bench --backend nvlink --hidden 7168 --topk 8 --experts 256 --dtype bf16 --routing uniform -w 10 -n 40 --graph --no-baselines --zero-copy-combine"
for sms in 0 24 16 8; do echo "== pull sms $sms"; timeout 40 mpirun -np 2 --bind-to none $T -t 1,128,512,4096 --num-sms $sms 2>&1 | grep -E "^ +[0-9]+ \|"; done
timeout 60 $B/tools/latency_probe/moe_ep_latency_probe --only call --json $OUT/latency_call.json > $OUT/latency_call.txt 2>&1; echo "probe exit $?"; cat $OUT/latency_call.txt | head -40
