#!/usr/bin/env python3
"""Passkey retrieval heatmaps: for each scheme (and the fp32 cache), the fraction of trials whose
greedy answer reproduces the pass key, per context length and needle depth, from a `kvq run`
with a [needle] table (experiments/configs/needle.toml).

    .venv/bin/python experiments/plots/plot_needle.py results/needle

The figures go beside the results (--out DIR elsewhere; scripts/make-figures.sh gives docs/img).
"""
import argparse

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from figures import footer, results_table, save  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", help="a kvq run output folder holding needle.csv")
    ap.add_argument("--out", help="output folder (PNG and PDF; default: the results folder)")
    a = ap.parse_args()
    out = a.out or a.results
    path, rows = results_table(a.results, "needle", "experiments/configs/needle.toml")
    ctxs = sorted({int(r["settings.ctx"]) for r in rows})
    depths = sorted({float(r["settings.depth"]) for r in rows})
    schemes = list(dict.fromkeys(r["scheme"] for r in rows))
    panels = [("fp32 cache", "fp32_correct", schemes[0])] + [(s, "correct", s) for s in schemes]
    fig, axes = plt.subplots(1, len(panels), figsize=(2.6 * len(panels) + 1, 2.9), squeeze=False)
    trials = 0
    for ax, (title, col, scheme) in zip(axes[0], panels):
        grid = [[0.0] * len(ctxs) for _ in depths]
        for i, d in enumerate(depths):
            for j, c in enumerate(ctxs):
                hits = [r[col] == "true" for r in rows if r["scheme"] == scheme
                        and int(r["settings.ctx"]) == c and float(r["settings.depth"]) == d]
                trials = max(trials, len(hits))
                grid[i][j] = sum(hits) / len(hits) if hits else float("nan")
                ax.text(j, i, f"{sum(hits)}/{len(hits)}", ha="center", va="center", fontsize=8,
                        color="white" if grid[i][j] < 0.5 else "black")
        ax.imshow(grid, cmap="gray", vmin=0, vmax=1, aspect="auto")
        ax.set_xticks(range(len(ctxs)), [str(c) for c in ctxs], fontsize=7)
        ax.set_yticks(range(len(depths)), [f"{d:g}" for d in depths], fontsize=7)
        ax.set_xlabel("context (tokens)", fontsize=8)
        ax.set_title(title.replace(",scale=dynamic", ""), fontsize=8)
    axes[0][0].set_ylabel("needle depth", fontsize=8)
    fig.suptitle(f"Passkey retrieval on SmolLM2-135M: found / trials ({trials} per cell, greedy)",
                 fontsize=9)
    footer(fig, f"{path}; experiments/plots/plot_needle.py", rows)
    fig.tight_layout(rect=(0, 0.03, 1, 0.93))
    save(fig, out, "needle")


if __name__ == "__main__":
    main()
