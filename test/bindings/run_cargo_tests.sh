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
# Where neither MOE_EP_LIB_DIR nor pkg-config finds the library, the build
# warns, naming both (and still tries the linker's default path).
out=$(env -u MOE_EP_LIB_DIR PKG_CONFIG_PATH= PKG_CONFIG_LIBDIR=/nonexistent CARGO_TARGET_DIR="$target_dir/no-lib" \
      "$cargo" check --offline --manifest-path "$manifest" -p moe-ep-sys 2>&1)
case "$out" in
  *"MOE_EP_LIB_DIR is not set and \`pkg-config --variable=libdir moe_ep\` found nothing"*) ;;
  *) echo "$out"; echo "FAIL: no build warning naming MOE_EP_LIB_DIR and pkg-config"; exit 1 ;;
esac
export MOE_EP_LIB_DIR="$lib_dir" CARGO_TARGET_DIR="$target_dir"
# The safe crate's doc example only compiles (no_run); its examples run here.
"$cargo" test --offline --manifest-path "$manifest" --workspace || exit 1
"$cargo" run --offline --quiet --manifest-path "$manifest" -p moe-ep --example dispatch_combine || exit 1
[ -n "$mpiexec" ] || exit 0
"$cargo" build --offline --quiet --manifest-path "$manifest" -p moe-ep --features mpi --example mpi_host || exit 1
for n in 1 2; do
  "$mpiexec" -n $n --oversubscribe "$target_dir/debug/examples/mpi_host" || { echo "FAIL: mpi_host on $n ranks"; exit 1; }
done
