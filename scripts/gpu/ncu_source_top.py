#!/usr/bin/env python3
"""Reads `ncu --import R --page source --csv --print-source sass` from stdin and
prints the SASS lines with the most warp-stall samples, with their share and
the sampled stall reasons' columns that are nonzero (what a kernel waits on,
instruction by instruction)."""
import csv
import sys

rows = list(csv.reader(sys.stdin))
head = next((i for i, r in enumerate(rows) if any("Warp Stall Sampling (All" in c for c in r)), None)
if head is None:
    print("no stall-sampling column; first lines:")
    for r in rows[:5]:
        print(r)
    sys.exit(0)
names = rows[head]
col = next(i for i, c in enumerate(names) if "Warp Stall Sampling (All" in c)
src = next((i for i, c in enumerate(names) if c.strip() in ("Source", "# Source")), 1)
addr = next((i for i, c in enumerate(names) if "Address" in c), 0)
stall_cols = [i for i, c in enumerate(names) if c.startswith("stall_") or "Stall" in c and i != col]


def num(v):
    try:
        return float(v.replace(",", ""))
    except ValueError:
        return 0.0


data = [r for r in rows[head + 1:] if len(r) == len(names)]
total = sum(num(r[col]) for r in data) or 1.0
print(f"{len(data)} SASS lines, {total:.0f} stall samples")
for r in sorted(data, key=lambda r: -num(r[col]))[:40]:
    extra = ", ".join(f"{names[i]}={r[i]}" for i in stall_cols if num(r[i]) > 0.05 * num(r[col]) and num(r[i]) > 0)
    print(f"{100 * num(r[col]) / total:5.1f}%  {r[addr]:>8}  {r[src][:70]:70}  {extra[:200]}")
