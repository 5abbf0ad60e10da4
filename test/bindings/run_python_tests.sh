#!/bin/sh
# Runs a pytest suite of the Python bindings, optionally under mpiexec.
#   run_python_tests.sh PYTHON NP "MODULES" PYTEST_ARGS...
# NP = 0 runs pytest directly; NP > 0 runs it on NP ranks under $MPIEXEC.
# MODULES (space-separated) must all be importable by PYTHON; otherwise the
# test is skipped with exit code 77 (CTest SKIP_RETURN_CODE), naming what is
# missing.  Anything else that goes wrong is a failure.
set -u
py=$1; np=$2; modules=$3; shift 3
if ! command -v "$py" >/dev/null 2>&1; then
  echo "SKIP: no Python interpreter ($py)"; exit 77
fi
for m in $modules; do
  if ! "$py" -c "import $m" >/dev/null 2>&1; then
    echo "SKIP: Python module '$m' is not importable by $py (see docs/ffi.md for what to install)"; exit 77
  fi
done
# Tests must not write into the source tree (bytecode, pytest cache).
export PYTHONDONTWRITEBYTECODE=1
# A fresh directory the ranks share (torch.distributed meets through a file there).
MOE_EP_TEST_TMPDIR=$(mktemp -d) || exit 1
export MOE_EP_TEST_TMPDIR
if [ "$np" = 0 ]; then
  "$py" -m pytest -p no:cacheprovider -rs "$@"
else
  "${MPIEXEC:-mpiexec}" -n "$np" --oversubscribe "$py" -m pytest -p no:cacheprovider -q -rs "$@"
fi
rc=$?
rm -rf "$MOE_EP_TEST_TMPDIR"
exit $rc
