#!/usr/bin/env python3
"""Throughput against context length per scheme and backend (the papers' throughput figure):
decode-step time and speed-up over bf16 for each batch, and prefill-quantize bandwidth as a
share of memcpy, from a `kvq run` with a [throughput] table (experiments/configs/throughput.toml).

    .venv/bin/python experiments/plots/plot_throughput.py results/throughput \
        [results/throughput_int8]

Several results folders (one per int_mode: throughput.toml runs "exact", throughput_int8.toml
"int8") are drawn side by side: one column per backend and mode (backend ref has no int mode; its
rows are taken from the first folder that has them). The figures go beside the first results
folder (--out DIR elsewhere; scripts/make-figures.sh gives docs/img).
"""
import argparse

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from figures import footer, legend_right, pow2_axis, results_table, save  # noqa: E402

MARKERS = ["o", "s", "^", "d", "v", "x", "*"]
DASHES = ["-", "--", ":", "-."]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", nargs="+", help="kvq run output folders holding throughput.csv")
    ap.add_argument("--out", help="output folder (PNG and PDF; default: the results folder)")
    a = ap.parse_args()
    out = a.out or a.results[0]
    paths, rows = [], []
    for res in a.results:
        path, part = results_table(res, "throughput", "experiments/configs/throughput.toml")
        for col in ("op", "backend", "context", "batch", "time_us", "of_memcpy"):
            if col not in part[0]:
                raise SystemExit(f"{path}: no {col} column; is it a kvq run throughput table?")
        have = {r["backend"] for r in rows}
        for r in part:
            # backend cpu's column names its int mode; ref has none (one set of ref rows)
            mode = r.get("settings.int_mode", "exact")
            if r["backend"] == "ref":
                if "ref" in have:
                    continue
            else:
                r["backend"] = f'{r["backend"]}, {mode} mode'
            rows.append(r)
        paths.append(path)
    path = ", ".join(paths)
    backends = list(dict.fromkeys(r["backend"] for r in rows))
    schemes = list(dict.fromkeys(r["scheme"] for r in rows))
    batches = sorted({int(r["batch"]) for r in rows if r["op"] == "decode"})
    fig, axes = plt.subplots(3, len(backends), figsize=(6.2 * len(backends), 11), squeeze=False)
    for j, b in enumerate(backends):
        for i, s in enumerate(schemes):
            label = s.replace(",scale=dynamic", "")
            color = f"C{i}"
            for k, n in enumerate(batches):
                pts = sorted((int(r["context"]), r) for r in rows if r["op"] == "decode"
                             and r["backend"] == b and r["scheme"] == s and int(r["batch"]) == n)
                if not pts:
                    continue
                x = [p[0] for p in pts]
                style = dict(color=color, marker=MARKERS[i % len(MARKERS)],
                             linestyle=DASHES[k % len(DASHES)], markersize=4,
                             label=f"{label}" if k == 0 else None)
                axes[0][j].plot(x, [float(p[1]["time_us"]) / 1e3 for p in pts], **style)
                sp = [(xx, float(p[1]["speedup_vs_bf16"])) for xx, p in zip(x, pts)
                      if p[1].get("speedup_vs_bf16")]
                if sp:
                    axes[1][j].plot([q[0] for q in sp], [q[1] for q in sp], **style)
            pts = sorted((int(r["context"]), r) for r in rows
                         if r["op"] == "quantize" and r["backend"] == b and r["scheme"] == s)
            if pts:
                axes[2][j].plot([p[0] for p in pts], [100 * float(p[1]["of_memcpy"]) for p in pts],
                                color=color, marker=MARKERS[i % len(MARKERS)], label=label)
        axes[0][j].set_yscale("log")
        axes[0][j].set_title(f"backend {b}: decode step time (ms)")
        axes[1][j].axhline(1.0, color="0.5", linewidth=0.8)
        axes[1][j].set_title(f"backend {b}: decode speed-up over bf16")
        axes[2][j].set_title(f"backend {b}: prefill quantize, % of memcpy")
        for ax in axes[:, j]:
            pow2_axis(ax, [r["context"] for r in rows])
            ax.set_xlabel("context (tokens)")
            ax.grid(True, alpha=0.3)
    # One legend, outside the panels: the schemes by colour, the decode batch by line style.
    handles = [Line2D([], [], color=f"C{i}", marker=MARKERS[i % len(MARKERS)], markersize=4,
                      label=s.replace(",scale=dynamic", "")) for i, s in enumerate(schemes)]
    handles += [Line2D([], [], color="0.3", linestyle=DASHES[k % len(DASHES)],
                       label=f"decode batch {n}") for k, n in enumerate(batches)]
    legend_right(axes[0][-1], handles, [h.get_label() for h in handles])
    first = rows[0]
    fig.suptitle(f"Cache throughput, {first.get('settings.heads', '?')} kv heads x "
                 f"{first.get('settings.head_dim', '?')}, GQA {first.get('settings.gqa', '?')}, "
                 f"{first.get('settings.threads', '?')} thread(s), cold caches", fontsize=10)
    fig.tight_layout(rect=(0, 0.01, 1, 0.97))
    footer(fig, path, rows)
    save(fig, out, "throughput")


if __name__ == "__main__":
    main()
