#!/usr/bin/env python3
"""Keeps the code blocks of README.md and docs/*.md honest.

A fenced block's info string is its language followed by a marker:

    ```c runnable ranks=2      a complete program: compiled and run by a test
    ```python fragment         deliberately partial: shows a few calls, not run
    ```julia untested          complete, but no toolchain here to run it

Every block in a programming language (c, cpp, python, rust, julia) must carry
exactly one marker, so that a new example cannot silently go untested.
Shell, CMake and TOML blocks show commands and are not checked here.
`ranks=N` runs the program under mpiexec with N ranks.  `needs=a,b` (Python)
names what the program needs: modules to import, and `cuda` for one CUDA
device per rank (through torch).  A block that needs `torch` runs with the
environment torchrun would give it (RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR, MASTER_PORT), taken from mpiexec's.

    run_doc_examples.py check [--python-src DIR] FILE...
    run_doc_examples.py run-c --prefix PREFIX --work DIR [--mpiexec M] FILE...
    run_doc_examples.py run-python --python PY --work DIR [--mpiexec M] [--gpu]
                        [--python-src DIR --library LIB [--mpi-library LIB]] FILE...

check also compiles every Python block, runnable or fragment, and with
--python-src (the bindings' source directory) binds every call of a moe_ep
function or constructor, and of the handle's dispatch and combine, to its
real signature, so that a wrong keyword in a fragment fails too.

run-c builds each runnable C block the way the README says, against an
installed prefix: `cc -std=c99 $(pkg-config --cflags --libs moe_ep_mpi)
-Wl,-rpath,<libdir>`, and runs it with nothing from the build tree in the
environment.  run-python runs each runnable Python block with PY: a venv
where the wheel is installed, or, with --python-src and --library, any
interpreter with the package taken from the source tree and the library
from the build.  It runs the blocks that need `cuda` with --gpu, the others
without.  A block whose needs are missing is skipped, saying which.  Exit
status 0 = all passed, 1 = a failure, 77 = something could not run here
(CTest's skip code), saying why.
"""

import ast
import inspect
import socket

import argparse
import os
import re
import shutil
import subprocess
import sys

LANGUAGES = {"c": "c", "cpp": "cpp", "c++": "cpp", "python": "python", "py": "python",
             "rust": "rust", "julia": "julia"}
MARKERS = ("runnable", "fragment", "untested")
RUNNERS = {"c", "python"}  # languages with a runner below
# The prelude a block that needs torch runs under: torchrun's environment from mpiexec's.
TORCHRUN_PRELUDE = """import os, runpy, sys
for name, sources in (("RANK", ("OMPI_COMM_WORLD_RANK", "PMI_RANK")),
                      ("WORLD_SIZE", ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE")),
                      ("LOCAL_RANK", ("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID"))):
    for s in sources:
        if s in os.environ:
            os.environ.setdefault(name, os.environ[s])
            break
    os.environ.setdefault(name, "1" if name == "WORLD_SIZE" else "0")
os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""
FENCE = re.compile(r"^(\s*)```+\s*(.*)$")
SKIP = 77


class Block:
    def __init__(self, path, line, info, code):
        self.path, self.line, self.code = path, line, code
        words = info.split()
        self.language = LANGUAGES.get(words[0].lower()) if words else None
        self.markers = [w for w in words[1:] if w in MARKERS]
        self.options = dict(w.split("=", 1) for w in words[1:] if "=" in w)
        self.unknown = [w for w in words[1:] if w not in MARKERS and "=" not in w]

    @property
    def where(self):
        return f"{self.path}:{self.line}"

    @property
    def ranks(self):
        return int(self.options.get("ranks", "0"))

    @property
    def needs(self):
        return [n for n in self.options.get("needs", "").split(",") if n]


def blocks_of(path):
    """Every fenced block of a Markdown file, with the line of its fence."""
    out, inside, info, start, code = [], False, "", 0, []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            m = FENCE.match(line.rstrip("\n"))
            if not inside and m:
                inside, info, start, code = True, m.group(2), n, []
            elif inside and m and not m.group(2).strip():
                out.append(Block(path, start, info, "".join(code)))
                inside = False
            elif inside:
                code.append(line)
    if inside:
        raise SystemExit(f"{path}:{start}: fenced block never closed")
    return out


def problems(blocks):
    """What is wrong with the markers; empty when every block is classified."""
    found = []
    for b in blocks:
        if b.language is None:
            continue
        if len(b.markers) != 1:
            found.append(f"{b.where}: a {b.language} block needs exactly one of {', '.join(MARKERS)} "
                         f"after the language (```{b.language} runnable), got {b.markers or 'none'}")
        if b.unknown:
            found.append(f"{b.where}: unknown words {b.unknown} in the info string")
        if "runnable" in b.markers and b.language not in RUNNERS:
            found.append(f"{b.where}: no runner for {b.language} blocks; mark it fragment or untested "
                         "and test the full program elsewhere")
        if b.needs and b.language != "python":
            found.append(f"{b.where}: needs= is read for Python blocks only")
        if b.language == "python":
            try:
                compile(b.code, b.where, "exec")
            except SyntaxError as e:
                found.append(f"{b.path}:{b.line + (e.lineno or 0)}: Python syntax error: {e.msg}")
    return found


def call_problems(blocks, python_src):
    """Calls of the moe_ep API in Python blocks that do not bind to its real signatures."""
    sys.path.insert(0, python_src)
    import moe_ep  # the package only; the library is loaded on first use
    functions = {name: getattr(moe_ep, name) for name in moe_ep.__all__ if callable(getattr(moe_ep, name))}
    methods = {name: getattr(moe_ep.MoeEp, name) for name in ("dispatch", "combine")}
    found = []
    for b in blocks:
        if b.language != "python":
            continue
        for node in ast.walk(ast.parse(b.code)):
            if not isinstance(node, ast.Call):
                continue
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
            if isinstance(f, ast.Attribute) and name in methods:
                target, first = methods[name], [None]  # self
            elif name in functions and (isinstance(f, ast.Name) or
                                        (isinstance(f.value, ast.Name) and f.value.id == "moe_ep")):
                target, first = functions[name], []
            else:
                continue
            if any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords):
                continue  # *args / **kwargs: not checkable here
            try:
                inspect.signature(target).bind(*first, *[None] * len(node.args),
                                               **{k.arg: None for k in node.keywords})
            except TypeError as e:
                found.append(f"{b.path}:{b.line + node.lineno}: {name}(...) does not match "
                             f"moe_ep's {name}{inspect.signature(target)}: {e}")
    return found


def launcher(block, mpiexec):
    if block.ranks <= 0:
        return []
    return [mpiexec, "-n", str(block.ranks), "--oversubscribe"]


def missing_needs(block, python, env):
    """What of the block's needs the interpreter lacks ('' when nothing)."""
    modules = [n for n in block.needs if n != "cuda"]
    probe = "".join(f"import {m}\n" for m in modules)
    if "cuda" in block.needs:
        gpus = max(block.ranks, 1)
        probe += ("import torch, sys\n"
                  f"sys.exit(0 if torch.cuda.is_available() and torch.cuda.device_count() >= {gpus} else 3)\n")
    if not probe:
        return ""
    p = subprocess.run([python, "-c", probe], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if p.returncode == 3:
        return f"{max(block.ranks, 1)} CUDA devices (one per rank)"
    if p.returncode != 0:
        last = p.stdout.strip().splitlines()[-1] if p.stdout.strip() else "failed"
        return f"{', '.join(block.needs)} ({last})"
    return ""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def clean_env():
    """The environment of a user who set nothing: no path into the build tree."""
    env = dict(os.environ)
    for var in ("LD_LIBRARY_PATH", "PYTHONPATH", "MOE_EP_LIBRARY", "MOE_EP_MPI_LIBRARY",
                "PKG_CONFIG_PATH", "CMAKE_PREFIX_PATH"):
        env.pop(var, None)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def run(cmd, env, cwd, timeout=300):
    print("+", " ".join(cmd), flush=True)
    p = subprocess.run(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=timeout)
    sys.stdout.write(p.stdout)
    return p.returncode


def pkg_config(env, *args):
    return subprocess.run(["pkg-config", *args], env=env, check=True, stdout=subprocess.PIPE,
                          text=True).stdout.split()


def run_c(blocks, prefix, work, mpiexec):
    if shutil.which("pkg-config") is None:
        print("SKIP: pkg-config is not installed")
        return SKIP
    pcfiles = [os.path.join(d, f) for d, _, fs in os.walk(prefix) for f in fs if f == "moe_ep_mpi.pc"]
    if not pcfiles:
        print(f"FAIL: no moe_ep_mpi.pc under {prefix}")
        return 1
    env = clean_env()
    env["PKG_CONFIG_PATH"] = os.path.dirname(pcfiles[0])
    flags = pkg_config(env, "--cflags", "--libs", "moe_ep_mpi")
    libdir = pkg_config(env, "--variable=libdir", "moe_ep")[0]
    cc = os.environ.get("CC", "cc")
    failed = 0
    for i, b in enumerate(blocks):
        src = os.path.join(work, f"example_{i}.c")
        exe = os.path.join(work, f"example_{i}")
        with open(src, "w") as f:
            f.write(b.code)
        print(f"== {b.where}", flush=True)
        # The README's command line, plus warnings as errors.
        build = [cc, "-std=c99", "-Wall", "-Wextra", "-Werror", src, "-o", exe, *flags,
                 f"-Wl,-rpath,{libdir}"]
        env_run = dict(env)
        env_run.pop("PKG_CONFIG_PATH")
        if run(build, env, work) != 0 or run(launcher(b, mpiexec) + [exe], env_run, work) != 0:
            print(f"FAIL: {b.where}")
            failed += 1
    return 1 if failed else 0


def run_python(blocks, python, work, mpiexec, source=None):
    env = clean_env()
    if source:  # the package from the source tree, the libraries from the build
        env["PYTHONPATH"], env["MOE_EP_LIBRARY"] = source["python_src"], source["library"]
        if source.get("mpi_library"):
            env["MOE_EP_MPI_LIBRARY"] = source["mpi_library"]
    prelude = os.path.join(work, "torchrun_prelude.py")
    with open(prelude, "w") as f:
        f.write(TORCHRUN_PRELUDE)
    failed, skipped = 0, 0
    for i, b in enumerate(blocks):
        src = os.path.join(work, f"example_{i}.py")
        with open(src, "w") as f:
            f.write(b.code)
        print(f"== {b.where}", flush=True)
        missing = missing_needs(b, python, env)
        if missing:
            print(f"SKIP: {b.where} needs {missing}")
            skipped += 1
            continue
        cmd, env_run = [python, src], dict(env)
        if "torch" in b.needs:
            cmd = [python, prelude, src]
            env_run["MASTER_PORT"] = str(free_port())
        if run(launcher(b, mpiexec) + cmd, env_run, work) != 0:
            print(f"FAIL: {b.where}")
            failed += 1
    print(f"{len(blocks)} blocks: {len(blocks) - failed - skipped} passed, {failed} failed, {skipped} skipped")
    return 1 if failed else SKIP if skipped else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=("check", "run-c", "run-python"))
    ap.add_argument("files", nargs="+")
    ap.add_argument("--prefix")
    ap.add_argument("--python")
    ap.add_argument("--work")
    ap.add_argument("--mpiexec", default="mpiexec")
    ap.add_argument("--gpu", action="store_true", help="run-python: the blocks that need cuda, not the others")
    ap.add_argument("--python-src", help="the bindings' source directory (bindings/python/src)")
    ap.add_argument("--library", help="run-python: libmoe_ep.so to use with --python-src")
    ap.add_argument("--mpi-library", help="run-python: libmoe_ep_mpi.so to use with --python-src")
    a = ap.parse_args()
    blocks = [b for path in a.files for b in blocks_of(path)]
    found = problems(blocks)
    if not found and a.mode == "check" and a.python_src:
        found = call_problems(blocks, a.python_src)
    if found:
        print("\n".join(found))
        return 1
    if a.mode == "check":
        n = {m: sum(1 for b in blocks if m in b.markers) for m in MARKERS}
        print(f"{len(blocks)} blocks in {len(a.files)} files: " + ", ".join(f"{v} {k}" for k, v in n.items()))
        return 0
    language = "c" if a.mode == "run-c" else "python"
    chosen = [b for b in blocks if b.language == language and "runnable" in b.markers]
    if language == "python":
        chosen = [b for b in chosen if ("cuda" in b.needs) == a.gpu]
    if not chosen:
        print(f"FAIL: no runnable {language} block{' that needs cuda' if a.gpu else ''} in {a.files}")
        return 1
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    if a.mode == "run-c":
        return run_c(chosen, a.prefix, a.work, a.mpiexec)
    if a.python_src:
        if not a.library:
            print("FAIL: --python-src needs --library")
            return 1
        source = {"python_src": a.python_src, "library": a.library, "mpi_library": a.mpi_library}
        return run_python(chosen, a.python or sys.executable, a.work, a.mpiexec, source)
    if not a.python or not os.path.exists(a.python):
        print(f"SKIP: no Python environment with moe_ep installed ({a.python}); "
              "see python_bindings_pip_install's output")
        return SKIP
    return run_python(chosen, a.python, a.work, a.mpiexec)


if __name__ == "__main__":
    sys.exit(main())
