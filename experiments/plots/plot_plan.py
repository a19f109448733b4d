#!/usr/bin/env python3
"""Plots a `kvq plan --sweep-csv` sweep: decode tokens/s against the batch, one line per KV format,
one panel per decode context (the batch is capped by what fits in the KV memory, so a line stops
rising where its format runs out of memory).

Usage: .venv/bin/python experiments/plots/plot_plan.py SWEEP.csv [--out DIR/NAME.png]
(default: plan_sweep.png, and .pdf, beside SWEEP.csv)
"""
import argparse
import csv
import os
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from figures import footer, pow2_axis, save  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sweep", help="a CSV written by kvq plan --sweep-csv")
    ap.add_argument("--out",
                    help="output PNG (a PDF beside it; default: plan_sweep.png beside the CSV)")
    a = ap.parse_args()
    out = a.out or os.path.join(os.path.dirname(a.sweep), "plan_sweep.png")
    with open(a.sweep) as f:
        rows = list(csv.DictReader(f))
    if not rows:
        raise SystemExit(f"plot_plan: no rows in {a.sweep}")
    ctxs = sorted({int(r["decode_ctx"]) for r in rows})
    fig, axes = plt.subplots(1, len(ctxs), figsize=(4.2 * len(ctxs), 3.8), squeeze=False)
    for ax, c in zip(axes[0], ctxs):
        lines = defaultdict(list)
        for r in rows:
            if int(r["decode_ctx"]) == c:
                lines[r["kv"]].append((int(r["batch"]), float(r["tokens_per_s"])))
        for kv, pts in lines.items():
            pts.sort()
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3, label=kv)
        pow2_axis(ax, [int(r["batch"]) for r in rows])
        ax.set_xlabel("decode batch (requested)")
        ax.set_title(f"context {c:,} tokens", fontsize=9)
        ax.grid(alpha=0.3, which="both")
    axes[0][0].set_ylabel("decode tokens/s (memory-read bound)")
    axes[0][0].legend(fontsize=7)
    r0 = rows[0]
    fig.suptitle(f"kvq plan sweep: KV memory {float(r0['mem_bytes']) / 1e9:.1f} GB, weights "
                 f"{float(r0['weight_bytes']) / 1e9:.2f} GB ({a.sweep})", fontsize=9)
    fig.tight_layout(rect=(0, 0.02, 1, 1))
    # a model of a GPU, not a measurement: the host line says where it was drawn
    footer(fig, f"{a.sweep}; experiments/plots/plot_plan.py")
    root, _ = os.path.splitext(out)
    save(fig, os.path.dirname(root) or ".", os.path.basename(root))  # PNG and PDF


if __name__ == "__main__":
    main()
