#!/usr/bin/env python3
"""Summarises the dispatch kernel's per-block phase times.

Input: the lines "dtrace RANK EPOCH BLOCK START SETUP FIRST_ROUND ROUTED SENT
PADDED PUBLISHED WAITED DONE" that a -DMOE_EP_DIAGNOSTICS build prints with
MOE_EP_DISPATCH_DIAGNOSTIC=4 (global timer, ns; PUBLISHED, WAITED and DONE
are block 0's publication, end of its waits and end, 0 on other blocks;
builds before the tenth session print DONE alone after PADDED).  For each rank's last call, all times in us from the first
block's start on either rank (both ranks of the one-GPU proxy share the
timer): when each rank's blocks started, the median and largest block time of
each phase (set-up: to the routing's first barrier; first round: the first
round of routing, its ids loaded; rest of routing; sends: the block's rows
and metadata, as seen by its warp 0; padding), when the blocks' publications
began (median, last, which block), and block 0's publication (fence and
adds), its waits for every rank's arrivals and its end (the counts).
  usage: dispatch_trace.py LOG...
"""
import statistics
import sys

PHASES = ("set-up", "first round", "rest of routing", "sends", "padding")


def summarise(calls):
    last = {}
    for (rank, epoch), blocks in calls.items():
        if rank not in last or epoch > last[rank][0]:
            last[rank] = (epoch, blocks)
    if not last:
        return []
    origin = min(b[0] for _, blocks in last.values() for b in blocks.values())
    us = lambda ns: (ns - origin) / 1000.0
    lines = []
    for rank, (epoch, blocks) in sorted(last.items()):
        parts = [f"rank {rank} call {epoch} blocks {len(blocks)}: starts {us(min(b[0] for b in blocks.values())):.2f}"
                 f"-{us(max(b[0] for b in blocks.values())):.2f}"]
        for i, name in enumerate(PHASES):
            values = [(b[i + 1] - b[i]) / 1000.0 for b in blocks.values()]
            parts.append(f"{name} {statistics.median(values):.2f} (max {max(values):.2f})")
        ends = {k: us(b[5]) for k, b in blocks.items()}
        slowest = max(ends, key=ends.get)
        parts.append(f"padded median {statistics.median(ends.values()):.2f} last {ends[slowest]:.2f} (block {slowest})")
        if 0 in blocks:
            published, waited, done = blocks[0][6:9]
            if published and waited:
                parts.append(f"block 0 padded {ends[0]:.2f} published {us(published):.2f} waited {us(waited):.2f}"
                             f" done {us(done):.2f}")
            else:
                parts.append(f"block 0 padded {ends[0]:.2f} done {us(done):.2f}")
        lines.append("; ".join(parts))
    return lines


def main(paths):
    calls = {}
    for path in paths:
        with open(path, errors="replace") as f:
            for line in f:
                fields = line.split()
                if len(fields) not in (11, 13) or fields[0] != "dtrace":
                    continue
                rank, epoch, block = int(fields[1]), int(fields[2]), int(fields[3])
                stamps = [int(x) for x in fields[4:]]
                if len(fields) == 11:  # no publication and wait stamps
                    stamps = stamps[:6] + [0, 0] + stamps[6:]
                calls.setdefault((rank, epoch), {})[block] = stamps
    for line in summarise(calls):
        print(line)
    return 0 if calls else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
