#!/usr/bin/env python3
"""Serving-style batches per scheme (KIVI's throughput and memory against batch size): decode
tokens/s and the requests held at once against the KV memory cap (or, when the run has one cap,
against the batch limit), from a `kvq run` with a [serve] table (experiments/configs/serve.toml).
Where the rows carry the planner's bound (backend cuda: each decode call reads the weights and its
caches once at the GPU's peak bandwidth), it is drawn dashed in the scheme's colour.

    .venv/bin/python experiments/plots/plot_serve.py results/serve

The figures go beside the results (--out DIR elsewhere).
"""
import argparse

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from figures import footer, legend_right, results_table, save  # noqa: E402

MARKERS = ["o", "s", "^", "d", "v", "x", "*"]


def num(v):
    """A CSV cell as a float; None for an empty or non-numeric one."""
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", help="a kvq run output folder holding serve.csv")
    ap.add_argument("--out", help="output folder (PNG and PDF; default: the results folder)")
    a = ap.parse_args()
    out = a.out or a.results
    path, rows = results_table(a.results, "serve", "experiments/configs/serve.toml")
    for col in ("settings.mem", "settings.max_batch", "decode_tokens_per_s", "max_held"):
        if col not in rows[0]:
            raise SystemExit(f"{path}: no {col} column; is it a kvq run serve table?")
    mems = sorted({float(r["settings.mem"]) for r in rows})
    batches = sorted({int(r["settings.max_batch"]) for r in rows})
    # x: the cap when the run sweeps it, else the batch limit; the other setting: one line each
    by_mem = len(mems) > 1 or len(batches) == 1
    xcol, other = ("settings.mem", "settings.max_batch") if by_mem else \
        ("settings.max_batch", "settings.mem")
    others = sorted({float(r[other]) for r in rows})
    schemes = list(dict.fromkeys(r["scheme"] for r in rows))
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    bound = False
    for i, s in enumerate(schemes):
        for k, o in enumerate(others):
            pts = sorted((float(r[xcol]), r) for r in rows
                         if r["scheme"] == s and float(r[other]) == o)
            if not pts:
                continue
            x = [p[0] for p in pts]
            style = dict(color=f"C{i}", marker=MARKERS[k % len(MARKERS)], markersize=4)
            axes[0].plot(x, [float(p[1]["decode_tokens_per_s"]) for p in pts], **style)
            axes[1].plot(x, [int(p[1]["max_held"]) for p in pts], **style)
            b = [(xx, num(p[1].get("bound_decode_tokens_per_s"))) for xx, p in zip(x, pts)]
            b = [q for q in b if q[1]]
            if b:
                bound = True
                axes[0].plot([q[0] for q in b], [q[1] for q in b], color=f"C{i}",
                             linestyle="--", linewidth=1)
    xlabel = "KV memory cap (GB)" if by_mem else "batch limit (max_batch; 0: the cap alone)"
    axes[0].set_title("decode tokens/s (wall)", fontsize=9)
    axes[1].set_title("requests held at once (most)", fontsize=9)
    for ax in axes:
        ax.set_xlabel(xlabel)
        if by_mem and len(mems) > 1 and mems[-1] / mems[0] >= 4:
            ax.set_xscale("log", base=2)
            ax.set_xticks(mems, [f"{m:g}" for m in mems])
            ax.minorticks_off()
        ax.grid(True, alpha=0.3)
    axes[1].set_ylim(bottom=0)
    axes[1].yaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    handles = [Line2D([], [], color=f"C{i}", marker="o", markersize=4,
                      label=s.replace(",scale=dynamic", "")) for i, s in enumerate(schemes)]
    if len(others) > 1:
        name = "max_batch" if by_mem else "mem"
        handles += [Line2D([], [], color="0.3", marker=MARKERS[k % len(MARKERS)], linestyle="",
                           label=f"{name} {o:g}") for k, o in enumerate(others)]
    if bound:
        handles.append(Line2D([], [], color="0.3", linestyle="--",
                              label="planner's bound (peak bandwidth)"))
    legend_right(axes[1], handles, [h.get_label() for h in handles])
    first = rows[0]
    fig.suptitle(f"Serving-style batches, backend {first.get('backend', '?')}: "
                 f"{first.get('settings.requests', '?')} requests of up to "
                 f"{first.get('settings.prompt_tokens', '?')} prompt and "
                 f"{first.get('settings.gen', '?')} output tokens", fontsize=10)
    fig.tight_layout(rect=(0, 0.02, 1, 0.95))
    footer(fig, f"{path}; experiments/plots/plot_serve.py", rows)
    save(fig, out, "serve")


if __name__ == "__main__":
    main()
