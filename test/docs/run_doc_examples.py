#!/usr/bin/env python3
"""Keeps the code blocks of README.md and docs/*.md honest.

A fenced block's info string is its language followed by a marker:

    ```c runnable ranks=2      a complete program: compiled and run by a test
    ```python fragment         deliberately partial: shows a few calls, not run
    ```julia untested          complete, but no toolchain here to run it

Every block in a programming language (c, cpp, python, rust, julia) must carry
exactly one marker, so that a new example cannot silently go untested.
Shell, CMake and TOML blocks show commands and are not checked here.
`ranks=N` runs the program under mpiexec with N ranks.

    run_doc_examples.py check FILE...
    run_doc_examples.py run-c --prefix PREFIX --work DIR [--mpiexec M] FILE...
    run_doc_examples.py run-python --python PY --work DIR [--mpiexec M] FILE...

run-c builds each runnable C block the way the README says, against an
installed prefix: `cc -std=c99 $(pkg-config --cflags --libs moe_ep_mpi)
-Wl,-rpath,<libdir>`, and runs it with nothing from the build tree in the
environment.  run-python runs each runnable Python block with PY (a venv
where the wheel is installed).  Exit status 0 = all passed, 1 = a failure,
77 = nothing could run here (CTest's skip code), saying why.
"""

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
    return found


def launcher(block, mpiexec):
    if block.ranks <= 0:
        return []
    return [mpiexec, "-n", str(block.ranks), "--oversubscribe"]


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


def run_python(blocks, python, work, mpiexec):
    env = clean_env()
    failed = 0
    for i, b in enumerate(blocks):
        src = os.path.join(work, f"example_{i}.py")
        with open(src, "w") as f:
            f.write(b.code)
        print(f"== {b.where}", flush=True)
        if run(launcher(b, mpiexec) + [python, src], env, work) != 0:
            print(f"FAIL: {b.where}")
            failed += 1
    return 1 if failed else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=("check", "run-c", "run-python"))
    ap.add_argument("files", nargs="+")
    ap.add_argument("--prefix")
    ap.add_argument("--python")
    ap.add_argument("--work")
    ap.add_argument("--mpiexec", default="mpiexec")
    a = ap.parse_args()
    blocks = [b for path in a.files for b in blocks_of(path)]
    found = problems(blocks)
    if found:
        print("\n".join(found))
        return 1
    if a.mode == "check":
        n = {m: sum(1 for b in blocks if m in b.markers) for m in MARKERS}
        print(f"{len(blocks)} blocks in {len(a.files)} files: " + ", ".join(f"{v} {k}" for k, v in n.items()))
        return 0
    language = "c" if a.mode == "run-c" else "python"
    chosen = [b for b in blocks if b.language == language and "runnable" in b.markers]
    if not chosen:
        print(f"FAIL: no runnable {language} block in {a.files}")
        return 1
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    if a.mode == "run-c":
        return run_c(chosen, a.prefix, a.work, a.mpiexec)
    if not a.python or not os.path.exists(a.python):
        print(f"SKIP: no Python environment with moe_ep installed ({a.python}); "
              "see python_wheel_venv's output")
        return SKIP
    return run_python(chosen, a.python, a.work, a.mpiexec)


if __name__ == "__main__":
    sys.exit(main())
