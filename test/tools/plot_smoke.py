"""Turns the bench smoke test's JSON into a PNG with tools/plot_bench.py and
checks that a PNG came out.  Exit 77 (skipped) where matplotlib is missing."""
import importlib.util
import os
import subprocess
import sys

if importlib.util.find_spec("matplotlib") is None:
    print("matplotlib is not installed: skipped")
    sys.exit(77)
plot, json_path, png = sys.argv[1:4]
if os.path.exists(png):
    os.remove(png)
subprocess.run([sys.executable, plot, json_path, "-o", png], check=True)
with open(png, "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n", "not a PNG"
print("plot ok:", png)
