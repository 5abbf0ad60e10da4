#!/usr/bin/env python3
"""Plots `moe_ep_conformance bench --json` output: bus bandwidth and latency
against tokens per rank, for dispatch and combine, with moe_ep, NCCL moving the
same routing and the copy-engine ceiling side by side.

    plot_bench.py RUN.json [MORE.json ...] [-o out.png] [--title TEXT]

Several files (say an eager run, a CUDA-graph run and a --num-sms 16 run)
are overlaid; each moe_ep series is labelled by its mode and SM count, and the
baselines are drawn once, from the first file that has them.  Works without a
display (the Agg backend).
"""
import argparse
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)
import matplotlib.ticker  # noqa: E402

PHASES = ("dispatch", "combine")


def load(path):
    with open(path) as f:
        doc = json.load(f)
    if not doc.get("results"):
        sys.exit(f"{path}: no results")
    return doc


def run_label(doc):
    cfg = doc["config"]
    sms = cfg.get("num_sms") or "auto"
    mode = "graph" if cfg.get("graph") else "eager"
    if cfg.get("launch_gate") is False:
        mode += ", host-driven"
    if cfg.get("zero_copy_combine"):
        mode += ", zero-copy pull combine"
    return f"moe_ep ({mode}, {sms} SMs)"


def series(doc, source, phase, field):
    """(tokens, values) of results that have `source` (moe_ep, nccl, ceiling)."""
    xs, ys = [], []
    for r in doc["results"]:
        entry = r.get(source, {}).get(phase)
        if entry is not None and entry.get(field) is not None:
            xs.append(r["tokens_per_rank"])
            ys.append(entry[field])
    return xs, ys


def minor_label(value, _position):
    leading = f"{value:.0e}"[0]
    return f"{value:g}" if leading in "25" else ""


def draw(docs, out, title):
    fig, axes = plt.subplots(2, 2, figsize=(12, 8.5), sharex=True)
    baseline_doc = next((d for d in docs if any("nccl" in r or "ceiling" in r for r in d["results"])), None)
    for col, phase in enumerate(PHASES):
        bw, lat = axes[0][col], axes[1][col]
        for doc in docs:
            label = run_label(doc)
            xs, ys = series(doc, "moe_ep", phase, "busbw_GBps")
            bw.plot(xs, ys, "o-", label=label)
            xs, ys = series(doc, "moe_ep", phase, "avg_us")
            _, p99 = series(doc, "moe_ep", phase, "p99_us")
            line, = lat.plot(xs, ys, "o-", label=label + " avg")
            lat.plot(xs, p99, ":", color=line.get_color(), label=label + " p99")
        if baseline_doc is not None:
            for source, style, name in (("nccl", "s--", "NCCL send/recv"), ("ceiling", "^--", "copy-engine ceiling")):
                xs, ys = series(baseline_doc, source, phase, "busbw_GBps")
                if xs:
                    bw.plot(xs, ys, style, label=name)
                xs, ys = series(baseline_doc, source, phase, "avg_us")
                if xs:
                    lat.plot(xs, ys, style, label=name)
        crossing = docs[0]["config"].get("remote_bytes", "bytes that cross NVLink")
        bw.set_title(f"{phase}: bus bandwidth ({crossing} / time)")
        bw.set_ylabel("busbw (GB/s, each direction)")
        lat.set_title(f"{phase}: latency (slowest rank per iteration)")
        lat.set_ylabel("time (us)")
        lat.set_yscale("log")
        lat.set_xlabel("tokens per rank")
        tokens = sorted({r["tokens_per_rank"] for d in docs for r in d["results"]})
        for ax in (bw, lat):
            ax.set_xscale("log", base=2)
            ax.set_xticks(tokens, [str(t) for t in tokens])
            ax.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=7)
        # Plain numbers on the log axis, with minor labels at 2x and 5x only.
        lat.yaxis.set_minor_formatter(matplotlib.ticker.FuncFormatter(minor_label))
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


def default_title(doc):
    cfg, machine = doc["config"], doc.get("machine", {})
    gpus = sorted({r.get("name", "?") for r in machine.get("per_rank", [])})
    return (f"{machine.get('ranks', '?')} x {', '.join(gpus)}, backend {cfg['backend']}: hidden {cfg['hidden']} "
            f"{cfg['payload_dtype']}, top-{cfg['top_k']} of {cfg['experts']} experts, routing {cfg['routing']} "
            f"({machine.get('moe_ep', '')}, NCCL {machine.get('nccl', '?')})")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("json", nargs="+", help="files written by moe_ep_conformance bench --json")
    parser.add_argument("-o", "--output", help="PNG to write (default: the first JSON with .png)")
    parser.add_argument("--title", help="figure title (default: from the first file)")
    args = parser.parse_args()
    docs = [load(p) for p in args.json]
    out = args.output or os.path.splitext(args.json[0])[0] + ".png"
    draw(docs, out, args.title or default_title(docs[0]))


if __name__ == "__main__":
    main()
