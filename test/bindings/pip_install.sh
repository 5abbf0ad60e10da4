#!/bin/sh
# `pip install bindings/python` into a scratch target directory, then import
# the installed copy (not the source tree) and call into the library.
#   pip_install.sh PYTHON SRC WORK
# Skips (77) only where PYTHON lacks pip or setuptools.
set -u
py=$1; src=$2; work=$3
if ! "$py" -c "import setuptools" >/dev/null 2>&1 || ! "$py" -m pip --version >/dev/null 2>&1; then
  echo "SKIP: $py lacks pip or setuptools (Debian: python3-pip python3-setuptools)"; exit 77
fi
rm -rf "$work" && mkdir -p "$work" || exit 1
# Build from a copy: setuptools writes build/ and *.egg-info next to the sources.
cp -r "$src" "$work/src_copy" || exit 1
# --no-build-isolation --no-index: CI has no PyPI at test time; setuptools is
# taken from the interpreter.
"$py" -m pip install --no-build-isolation --no-deps --no-index --disable-pip-version-check \
    --target "$work/site" "$work/src_copy" || { echo "FAIL: pip install"; exit 1; }
cd "$work" || exit 1
PYTHONPATH="$work/site" PYTHONDONTWRITEBYTECODE=1 "$py" - "$work/site" <<'PY' || exit 1
import os, sys
import moe_ep
assert os.path.dirname(moe_ep.__file__).startswith(sys.argv[1]), moe_ep.__file__
print("installed", moe_ep.__file__, "library version", moe_ep.get_version())
PY
