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
# Found once through pkg-config, the library stays found: a later cargo command
# without PKG_CONFIG_PATH reruns the build script (it watches the variable) and
# must still link, without the "not located" warning.
pc_dir="$target_dir/pkg-config-once/pkgconfig"
mkdir -p "$pc_dir" || exit 1
printf 'libdir=%s\nName: moe_ep\nDescription: moe_ep\nVersion: 0\nLibs: -L${libdir} -lmoe_ep\n' "$lib_dir" \
  >"$pc_dir/moe_ep.pc" || exit 1
env -u MOE_EP_LIB_DIR PKG_CONFIG_PATH="$pc_dir" PKG_CONFIG_LIBDIR=/nonexistent \
    CARGO_TARGET_DIR="$target_dir/pkg-config-once" \
    "$cargo" test --offline --quiet --manifest-path "$manifest" -p moe-ep-sys --no-run || exit 1
out=$(env -u MOE_EP_LIB_DIR -u PKG_CONFIG_PATH PKG_CONFIG_LIBDIR=/nonexistent \
      CARGO_TARGET_DIR="$target_dir/pkg-config-once" \
      "$cargo" test --offline --verbose --manifest-path "$manifest" -p moe-ep-sys 2>&1)
rc=$?
case "$out" in
  *"moe-ep-sys"*"build-script-build"*) ;;
  *) echo "$out"; echo "FAIL: the build script did not rerun without PKG_CONFIG_PATH"; exit 1 ;;
esac
case "$out" in
  *"libmoe_ep not located"*) echo "$out"; echo "FAIL: the library found before was forgotten"; exit 1 ;;
esac
[ $rc = 0 ] || { echo "$out"; echo "FAIL: cargo test without PKG_CONFIG_PATH after a build with it"; exit 1; }
export MOE_EP_LIB_DIR="$lib_dir" CARGO_TARGET_DIR="$target_dir"
# The safe crate's doc example only compiles (no_run); its examples run here.
"$cargo" test --offline --manifest-path "$manifest" --workspace || exit 1
"$cargo" run --offline --quiet --manifest-path "$manifest" -p moe-ep --example dispatch_combine || exit 1
[ -n "$mpiexec" ] || exit 0
"$cargo" build --offline --quiet --manifest-path "$manifest" -p moe-ep --features mpi --example mpi_host || exit 1
for n in 1 2; do
  "$mpiexec" -n $n --oversubscribe "$target_dir/debug/examples/mpi_host" || { echo "FAIL: mpi_host on $n ranks"; exit 1; }
done
