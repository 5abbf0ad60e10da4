#!/bin/sh
# Builds and runs an outside consumer against an install prefix.
#   run_consumer.sh cmake  PREFIX WORK CMAKE_COMMAND GENERATOR
#   run_consumer.sh cmake_mpi PREFIX WORK CMAKE_COMMAND GENERATOR MPIEXEC
#   run_consumer.sh pkgconfig PREFIX WORK
#   run_consumer.sh tool PREFIX WORK MPIEXEC
#   run_consumer.sh rust PREFIX WORK CARGO BINDINGS
# The consumer checks that the library it loads lives under PREFIX.  The tool
# mode runs the installed prefix/bin/moe_ep_conformance `check` on the HOST
# backend, 2 ranks, in an environment holding only PATH, HOME and Open MPI's
# OMPI_* settings, from a copy of the prefix moved elsewhere: the run paths
# ($ORIGIN) must find the libraries.
set -u
mode=$1; prefix=$2; work=$3
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work" && mkdir -p "$work" || exit 1
case "$mode" in
  cmake)
    cmake=$4; gen=$5
    # CMAKE_PREFIX_PATH only: nothing from the build tree is visible.
    "$cmake" -S "$here/cmake_project" -B "$work" -G "$gen" -DCMAKE_PREFIX_PATH="$prefix" \
        -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF || exit 1
    "$cmake" --build "$work" || exit 1
    exec "$work/consumer" "$prefix"
    ;;
  cmake_mpi)
    # The MPI adapter through the package alone: the consumer's CMake project
    # has no find_package(MPI); moe_ep::moe_ep_mpi must bring MPI with it.
    cmake=$4; gen=$5; mpiexec=$6
    [ -f "$(find "$prefix" -name moe_epMpiTargets.cmake | head -n 1)" ] ||
      { echo "SKIP: this install has no MPI adapter"; exit 77; }
    "$cmake" -S "$here/cmake_mpi_project" -B "$work" -G "$gen" -DCMAKE_PREFIX_PATH="$prefix" \
        -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF || exit 1
    "$cmake" --build "$work" || exit 1
    exec "$mpiexec" -n 1 "$work/mpi_consumer" "$prefix"
    ;;
  pkgconfig)
    command -v pkg-config >/dev/null 2>&1 || { echo "SKIP: pkg-config not installed"; exit 77; }
    pcdir=$(dirname "$(find "$prefix" -name moe_ep.pc | head -n 1)")
    [ -f "$pcdir/moe_ep.pc" ] || { echo "FAIL: no moe_ep.pc under $prefix"; exit 1; }
    export PKG_CONFIG_PATH="$pcdir"
    # The .pc must describe where it was installed, not the configure-time prefix.
    libdir=$(pkg-config --variable=libdir moe_ep)
    case "$(cd "$libdir" 2>/dev/null && pwd -P)" in
      "$(cd "$prefix" && pwd -P)"/*) ;;
      *) echo "FAIL: moe_ep.pc under $prefix says libdir=$libdir (not relocatable;" \
              "use prefix=\${pcfiledir}/../.. in cmake/moe_ep.pc.in)"; exit 1 ;;
    esac
    echo "pkg-config --cflags --libs moe_ep: $(pkg-config --cflags --libs moe_ep)"
    make -C "$here/pkgconfig_project" OUT="$work" || exit 1
    exec "$work/consumer" "$prefix"
    ;;
  rust)
    # An application crate outside the tree (rust_app/, copied to WORK) that
    # finds the installed library through pkg-config only, and whose binary
    # runs with no LD_LIBRARY_PATH (its build.rs records the run path).
    cargo=$4; bindings=$5
    command -v "$cargo" >/dev/null 2>&1 || { echo "SKIP: cargo not found"; exit 77; }
    command -v pkg-config >/dev/null 2>&1 || { echo "SKIP: pkg-config not installed"; exit 77; }
    cp -r "$here/rust_app/." "$work/" || exit 1
    sed "s|@BINDINGS@|$bindings|g" "$work/Cargo.toml.in" > "$work/Cargo.toml" && rm "$work/Cargo.toml.in" || exit 1
    pcdir=$(dirname "$(find "$prefix" -name moe_ep.pc | head -n 1)")
    (cd "$work" && unset MOE_EP_LIB_DIR && PKG_CONFIG_PATH="$pcdir" CARGO_TARGET_DIR="$work/target" \
       "$cargo" build --offline --quiet) || { echo "FAIL: cargo build of the outside crate"; exit 1; }
    exec env -u LD_LIBRARY_PATH "$work/target/debug/moe_ep_rust_app"
    ;;
  tool)
    mpiexec=$4
    [ -x "$prefix/bin/moe_ep_conformance" ] ||
      { echo "SKIP: moe_ep_conformance was not built (needs CLI11 and MPI)"; exit 77; }
    # Relocatable: run a copy of the whole prefix, moved after installation.
    cp -a "$prefix" "$work/moved_prefix" || exit 1
    prefix="$work/moved_prefix"
    tool="$prefix/bin/moe_ep_conformance"
    command -v readelf >/dev/null 2>&1 || { echo "FAIL: readelf (binutils) not found"; exit 1; }
    for f in "$tool" "$(dirname "$(find "$prefix" -name 'libmoe_ep_mpi.so.*' | head -n 1)")/libmoe_ep_mpi.so"; do
      runpath=$(readelf -d "$f" | sed -n 's/.*(RUNPATH).*\[\(.*\)\]/\1/p')
      echo "$f: RUNPATH $runpath"
      case "$runpath" in
        '$ORIGIN'*) ;;
        *) echo "FAIL: $f has no \$ORIGIN run path"; exit 1 ;;
      esac
    done
    # What only some modes use is loaded at run time: NCCL (the baseline) and
    # cuBLAS (--overlap-gemm); MPI through its C API only (no libmpi_cxx).
    needed=$(readelf -d "$tool" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | tr '\n' ' ')
    echo "$tool: NEEDED $needed"
    case "$needed" in
      *libcublas*|*libnccl*|*libmpi_cxx*) echo "FAIL: $tool links cuBLAS, NCCL or MPI's C++ library"; exit 1 ;;
    esac
    set --
    for var in $(env | sed -n 's/^\(OMPI_[A-Za-z0-9_]*\)=.*/\1/p'); do
      set -- "$@" "$var=$(printenv "$var")"
    done
    cd "$work" || exit 1
    exec env -i PATH="$(dirname "$mpiexec"):/usr/bin:/bin" HOME="${HOME:-/}" "$@" \
      "$mpiexec" -n 2 --oversubscribe "$tool" check --backend host
    ;;
esac
echo "usage: run_consumer.sh cmake|pkgconfig PREFIX WORK ..."; exit 2
