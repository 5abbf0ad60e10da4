#!/bin/sh
# cargo test --offline for bindings/rust against the library just built.
#   run_cargo_tests.sh CARGO LIB_DIR TARGET_DIR MANIFEST [MPIEXEC]
# With MPIEXEC, also the `mpi` feature: the mpi_host example (the MPI
# adapter, HOST backend) on 1 and 2 ranks.
# Skips (77) only where no cargo is installed.
set -u
cargo=$1; lib_dir=$2; target_dir=$3; manifest=$4; mpiexec=${5:-}
if ! command -v "$cargo" >/dev/null 2>&1; then
  echo "SKIP: cargo not found"; exit 77
fi
export MOE_EP_LIB_DIR="$lib_dir" CARGO_TARGET_DIR="$target_dir"
# The safe crate's doc example only compiles (no_run); its examples run here.
"$cargo" test --offline --manifest-path "$manifest" --workspace || exit 1
"$cargo" run --offline --quiet --manifest-path "$manifest" -p moe-ep --example dispatch_combine || exit 1
[ -n "$mpiexec" ] || exit 0
"$cargo" build --offline --quiet --manifest-path "$manifest" -p moe-ep --features mpi --example mpi_host || exit 1
for n in 1 2; do
  "$mpiexec" -n $n --oversubscribe "$target_dir/debug/examples/mpi_host" || { echo "FAIL: mpi_host on $n ranks"; exit 1; }
done
