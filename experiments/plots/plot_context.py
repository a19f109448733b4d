#!/usr/bin/env python3
"""Quality against context length: KLD, top-1 agreement and perplexity increase against the
fp32 cache, per scheme, from a `kvq run` whose [model] has a list of window lengths
(experiments/configs/context.toml).

    .venv/bin/python experiments/plots/plot_context.py results/context

The figures go beside the results (--out DIR elsewhere; scripts/make-figures.sh gives docs/img).
"""
import argparse

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from figures import footer, interval, legend_right, pow2_axis, results_table, save  # noqa: E402

MARKERS = ["o", "s", "^", "d", "v", "x", "*"]

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", help="a kvq run output folder holding model.csv")
    ap.add_argument("--out", help="output folder (PNG and PDF; default: the results folder)")
    a = ap.parse_args()
    out = a.out or a.results
    path, rows = results_table(a.results, "model", "experiments/configs/context.toml")
    if "settings.ctx" not in rows[0]:
        raise SystemExit(f"{path}: no settings.ctx column; is it a kvq run model table?")
    schemes = list(dict.fromkeys(r["scheme"] for r in rows))
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    for i, s in enumerate(schemes):
        pts = sorted((int(r["settings.ctx"]), r) for r in rows if r["scheme"] == s)
        x = [p[0] for p in pts]
        label = s.replace(",scale=dynamic", "")
        style = dict(marker=MARKERS[i % len(MARKERS)], color=f"C{i % 10}",
                     linestyle=["-", "--", ":", "-."][i % 4], label=label)
        # Error bars: each row's 95% interval (block bootstrap over the scored positions).
        for ax, key, scale in [(axes[0], "kld", 1), (axes[1], "top1", 100), (axes[2], "delta_ppl", 1)]:
            err = list(zip(*[interval(p[1], key, scale=scale) for p in pts]))
            ax.errorbar(x, [scale * float(p[1][key]) for p in pts], yerr=err, capsize=2,
                        elinewidth=0.8, **style)
    for ax, (title, unit) in zip(axes, [("mean KL(fp32 || scheme)", "nats"),
                                        ("top-1 agreement with fp32", "%"),
                                        ("perplexity - fp32 perplexity", "")]):
        pow2_axis(ax, [int(r["settings.ctx"]) for r in rows])
        ax.set_xlabel("window length (tokens)")
        ax.set_title(title, fontsize=10)
        ax.set_ylabel(unit)
        ax.grid(alpha=0.3)
    axes[0].set_yscale("log")
    legend_right(axes[2])
    text = rows[0].get("settings.text", "?")
    tokens = rows[0].get("settings.max_tokens", "?")
    fig.suptitle(f"SmolLM2-135M on {tokens} tokens of {text}: damage against window length", fontsize=10)
    footer(fig, f"{path}; experiments/plots/plot_context.py", rows)
    fig.tight_layout(rect=(0, 0.02, 1, 0.95))
    save(fig, out, "context")

if __name__ == "__main__":
    main()
