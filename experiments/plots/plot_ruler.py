#!/usr/bin/env python3
"""RULER-style accuracy against context length: per task, each scheme's mean score (RULER's
string_match_all recall of the expected values in the greedy answer) over the samples, with the
fp32 cache's on the same prompts drawn beside it, from a `kvq run` with a [ruler] table
(experiments/configs/ruler.toml). Also writes ruler_accuracy.csv (scheme x task x length:
accuracy, its 95% interval, the fp32 cache's) beside the figure and prints it as a Markdown table.

    .venv/bin/python experiments/plots/plot_ruler.py results/ruler

The figures go beside the results (--out DIR elsewhere; scripts/make-figures.sh gives docs/img).
Intervals: 95% percentile bootstrap over the samples of a cell (2,000 resamples, seed 0x6b7671);
with a handful of samples they are wide, and they say so.
"""
import argparse
import csv
import os
import random

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from figures import footer, legend_below, pow2_axis, results_table, save  # noqa: E402

MARKERS = ["o", "s", "^", "d", "v", "x", "*"]
RESAMPLES, SEED = 2000, 0x6B7671
FP32 = "fp32 cache (exact)"


def bootstrap(scores):
    """(mean, lo, hi): the mean of SCORES and its 95% percentile-bootstrap interval."""
    n = len(scores)
    mean = sum(scores) / n
    if n < 2:
        return mean, float("nan"), float("nan")
    rng = random.Random(SEED)
    means = sorted(sum(rng.choice(scores) for _ in range(n)) / n for _ in range(RESAMPLES))
    return mean, means[int(0.025 * (RESAMPLES - 1))], means[int(0.975 * (RESAMPLES - 1))]


def cells(rows):
    """{(scheme, task, length): [scores by sample]}, the fp32 cache's under FP32 (once per case)."""
    out, seen = {}, set()
    for r in rows:
        task, length, sample = r["settings.task"], int(r["settings.length"]), r["settings.sample"]
        out.setdefault((r["scheme"], task, length), []).append(float(r["score"]))
        if (task, length, sample) not in seen:
            seen.add((task, length, sample))
            out.setdefault((FP32, task, length), []).append(float(r["fp32_score"]))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", help="a kvq run output folder holding ruler.csv")
    ap.add_argument("--out", help="output folder (PNG, PDF and ruler_accuracy.csv; default: the "
                    "results folder)")
    a = ap.parse_args()
    out = a.out or a.results
    path, rows = results_table(a.results, "ruler", "experiments/configs/ruler.toml")
    if "settings.task" not in rows[0]:
        raise SystemExit(f"{path}: no settings.task column; is it a kvq run ruler table?")
    tasks = list(dict.fromkeys(r["settings.task"] for r in rows))
    lengths = sorted({int(r["settings.length"]) for r in rows})
    schemes = [FP32] + list(dict.fromkeys(r["scheme"] for r in rows))
    acc = {k: bootstrap(v) + (len(v),) for k, v in cells(rows).items()}

    cols = min(4, len(tasks))
    nrow = (len(tasks) + cols - 1) // cols
    fig, axes = plt.subplots(nrow, cols, figsize=(3.3 * cols + 0.5, 2.9 * nrow), squeeze=False)
    for ax, task in zip(axes.flat, tasks):
        for i, s in enumerate(schemes):
            pts = [(n, acc[(s, task, n)]) for n in lengths if (s, task, n) in acc]
            if not pts:
                continue
            x = [p[0] for p in pts]
            y = [p[1][0] for p in pts]
            err = [[max(p[1][0] - p[1][1], 0) if p[1][1] == p[1][1] else 0 for p in pts],
                   [max(p[1][2] - p[1][0], 0) if p[1][2] == p[1][2] else 0 for p in pts]]
            style = (dict(color="black", linestyle="--", marker="o", markerfacecolor="none",
                          linewidth=1.6, zorder=5) if s == FP32 else
                     dict(color=f"C{(i - 1) % 10}", marker=MARKERS[(i - 1) % len(MARKERS)],
                          linestyle="-", linewidth=1))
            ax.errorbar(x, y, yerr=err, capsize=2, label=s.replace(",scale=dynamic", ""),
                        **style)
        pow2_axis(ax, lengths)
        ax.set_ylim(-0.05, 1.05)
        ax.set_title(task, fontsize=9)
        ax.set_xlabel("context length (tokens)", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    for ax in axes[:, 0]:
        ax.set_ylabel("accuracy (recall)", fontsize=8)
    for ax in list(axes.flat)[len(tasks):]:
        ax.axis("off")
    n = max(v[3] for v in acc.values())
    fig.suptitle(f"RULER-style tasks on SmolLM2-135M: mean string_match_all over {n} sample(s) "
                 "per point, 95% bootstrap intervals", fontsize=9)
    legend_below(fig, axes.flat[0], ncol=len(schemes))
    footer(fig, f"{path}; experiments/plots/plot_ruler.py", rows)
    fig.tight_layout(rect=(0, 0.03, 1, 0.95))
    save(fig, out, "ruler")

    table = os.path.join(out, "ruler_accuracy.csv")
    with open(table, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["scheme", "task", "length", "samples", "accuracy", "accuracy_lo",
                    "accuracy_hi", "fp32_accuracy"])
        for s in schemes[1:]:
            for task in tasks:
                for n in lengths:
                    if (s, task, n) in acc:
                        m, lo, hi, k = acc[(s, task, n)]
                        w.writerow([s, task, n, k, f"{m:.4f}", f"{lo:.4f}", f"{hi:.4f}",
                                    f"{acc[(FP32, task, n)][0]:.4f}"])
    print("wrote", table)
    # The Markdown table docs/results.md shows: accuracy per task x length, the exact cache first.
    print("\n| task | length | " + " | ".join(s.replace(",scale=dynamic", "") for s in schemes)
          + " |")
    print("|" + "---|" * (len(schemes) + 2))
    for task in tasks:
        for n in lengths:
            cells_ = [f"{acc[(s, task, n)][0]:.2f}" if (s, task, n) in acc else "-"
                      for s in schemes]
            print(f"| {task} | {n} | " + " | ".join(cells_) + " |")


if __name__ == "__main__":
    main()
