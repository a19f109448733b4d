#!/usr/bin/env python3
"""The issue-15 studies: rotation before quantization, exact attention sinks, per-layer precision.

    .venv/bin/python experiments/plots/plot_options.py rotation results/rotation
    .venv/bin/python experiments/plots/plot_options.py sinks results/sinks
    .venv/bin/python experiments/plots/plot_options.py allocate results/layer_sensitivity \\
        > experiments/configs/layer_allocation.toml
    .venv/bin/python experiments/plots/plot_options.py layers results/layer_sensitivity \\
        results/layer_allocation

Each figure goes beside its results (the allocation folder for `layers`) unless --out DIR says
otherwise (scripts/make-figures.sh gives --out docs/img).

`allocate` turns the one-layer-at-a-time kivi2 rows into kivi2/kivi4 mixes: for each budget of k
layers in kivi4, the k layers whose kivi2 hurt most (greedy by measured sensitivity; every layer
costs the same bytes, so greedy is the optimum of the additive model), against the first k layers
and the k least sensitive ones at exactly the same bytes, and uniform kivi2/kivi3/kivi4.
"""
import argparse
import re
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from figures import footer, legend_right, log_axis, results_table, save  # noqa: E402

BUDGETS = [3, 6, 10, 15, 20]
KIVI2 = "kivi2:g=32,r=128"
KIVI4 = "kivi4:g=32,r=128"


def short(s):
    return s.replace(",scale=dynamic", "").replace(":g=32,r=128", "")


def rotation(a):
    path, rows = results_table(a.results, "model", "experiments/configs/rotation.toml")
    _, syn = results_table(a.results, "synthetic", "experiments/configs/rotation.toml")
    variants = [("none", ""), ("rot=hadamard", ",rot=hadamard"), ("rot=hadamard:1", ",rot=hadamard:1")]
    bases = []
    for r in rows:
        if r["scheme"].startswith("k="):  # the one-side rows: in docs/results.md's table only
            continue
        b = re.sub(r",rot=hadamard(:\d+)?", "", r["scheme"])
        if b not in bases:
            bases.append(b)
    model = {r["scheme"]: float(r["kld"]) for r in rows}
    synth = {r["scheme"]: float(r["attn_kl"]) for r in syn}
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.2))
    width = 0.27
    for ax, table, title in [(axes[0], model, "SmolLM2 on KJV: mean KL(fp32 || scheme), nats"),
                             (axes[1], synth, "synthetic K/V (x12 outlier channels): attention KL")]:
        for j, (label, suffix) in enumerate(variants):
            xs, ys = [], []
            for i, b in enumerate(bases):
                if b + suffix in table:
                    xs.append(i + (j - 1) * width)
                    ys.append(table[b + suffix])
            ax.bar(xs, ys, width, label=label, color=str(0.15 + 0.3 * j), edgecolor="black", lw=0.4)
        ax.set_xticks(range(len(bases)))
        ax.set_xticklabels([short(b) for b in bases], rotation=25, ha="right", fontsize=7)
        ax.set_yscale("log")
        ax.set_title(title, fontsize=9)
        ax.grid(alpha=0.3, axis="y")
    legend_right(axes[1])
    ctx = rows[0].get("settings.ctx", "?")
    fig.suptitle(f"Rotation before quantization (window {ctx} tokens): the same scheme without and "
                 "with a Walsh-Hadamard rotation", fontsize=10)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    footer(fig, f"{path}; experiments/plots/plot_options.py rotation", rows)
    save(fig, a.out, "rotation")


def sinks(a):
    path, rows = results_table(a.results, "model", "experiments/configs/sinks.toml")
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    series = {}
    for r in rows:
        m = re.match(r"(.*?)(?:,sink=(\d+))?$", r["scheme"])
        base, s = m.group(1), int(m.group(2) or 0)
        series.setdefault((base, int(r["settings.ctx"])), []).append((s, float(r["kld"])))
    for i, ((base, ctx), pts) in enumerate(sorted(series.items())):
        pts.sort()
        ax.plot([p[0] + 0.5 for p in pts], [p[1] for p in pts], marker="os^d"[i % 4],
                linestyle=["-", "--"][ctx > 4096], color=str(0.1 + 0.25 * (i // 2)),
                label=f"{short(base)}, window {ctx}")
    ax.set_xscale("log", base=2)
    ax.set_xticks([0.5, 1.5, 4.5, 16.5])
    ax.set_xticklabels(["0", "1", "4", "16"])
    ax.set_xlabel("sink tokens kept exact (S)")
    ax.set_ylabel("mean KL(fp32 || scheme), nats")
    log_axis(ax)
    ax.grid(alpha=0.3)
    legend_right(ax)
    ax.set_title("Exact attention sinks with KIVI-2 on SmolLM2 / KJV", fontsize=10)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    footer(fig, f"{path}; experiments/plots/plot_options.py sinks", rows)
    save(fig, a.out, "sinks")


def sensitivity(results):
    """{scheme family: [(layer, kld)]} from fp32@L=SPEC rows."""
    path, rows = results_table(results, "model", "experiments/configs/layer_sensitivity.toml")
    out = {}
    for r in rows:
        m = re.match(r"fp32@(\d+)=(.*)$", r["scheme"])
        if m:
            out.setdefault(m.group(2), []).append((int(m.group(1)), float(r["kld"])))
    if KIVI2 not in out:
        raise SystemExit(f"{path}: no fp32@L={KIVI2} rows")
    for v in out.values():
        v.sort()
    return path, rows, out


def layer_list(ls):
    ls = sorted(ls)
    parts, i = [], 0
    while i < len(ls):
        j = i
        while j + 1 < len(ls) and ls[j + 1] == ls[j] + 1:
            j += 1
        parts.append(str(ls[i]) if i == j else f"{ls[i]}-{ls[j]}")
        i = j + 1
    return ",".join(parts)


def mixes(sens):
    """(strategy, k, spec) for every budget: greedy, first-k, least-sensitive-k."""
    by_kld = [l for l, _ in sorted(sens, key=lambda p: -p[1])]
    layers = sorted(l for l, _ in sens)
    out = []
    for k in BUDGETS:
        for name, pick in [("greedy", by_kld[:k]), ("first", layers[:k]),
                           ("least", by_kld[::-1][:k])]:
            out.append((name, k, f"{KIVI2}@{layer_list(pick)}={KIVI4}"))
    return out


def allocate(a):
    path, rows, s = sensitivity(a.results)
    r0 = rows[0]
    schemes = ["kivi2", "kivi3", "kivi4"] + [spec for _, _, spec in mixes(s[KIVI2])]
    print("# Generated by: .venv/bin/python experiments/plots/plot_options.py allocate "
          f"{a.results}")
    print("# kivi2/kivi4 per-layer mixes from the measured one-layer sensitivities: for k layers in")
    print("# kivi4, the k most sensitive (greedy), the first k, and the k least sensitive, all at the")
    print("# same bytes; with uniform kivi2 / kivi3 / kivi4. Results: docs/results.md, \"Per-layer")
    print("# precision\". Run: kvq run experiments/configs/layer_allocation.toml (about 2 minutes).")
    print('name = "layer_allocation"')
    print('out = "results/layer_allocation"')
    print("schemes = [")
    for sp in schemes:
        print(f'  "{sp}",')
    print("]\n\n[model]")
    print(f'text = "{r0.get("settings.text", "kjv")}"')
    print(f'ctx = {r0["settings.ctx"]}')
    print(f'max_tokens = {r0["settings.max_tokens"]}')
    print(f'backend = "{r0.get("settings.backend", "cpu")}"')


def layers(a):
    path, _, s = sensitivity(a.results)
    apath, arows = results_table(a.allocation, "model", "experiments/configs/layer_allocation.toml")
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.2))
    for i, (fam, pts) in enumerate(sorted(s.items())):
        axes[0].plot([p[0] for p in pts], [p[1] for p in pts], marker="os"[i % 2],
                     color=str(0.1 + 0.4 * i), label=f"{short(fam)} in that layer only")
    axes[0].set_yscale("log")
    axes[0].set_xlabel("layer")
    axes[0].set_ylabel("mean KL(fp32 || scheme), nats")
    axes[0].set_title("One layer quantized at a time, the rest fp32", fontsize=9)
    axes[0].grid(alpha=0.3)
    axes[0].legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2,
                   frameon=False)
    kld = {r["scheme"]: (float(r["bytes_per_token"]), float(r["kld"])) for r in arows}
    for name, marker in [("greedy", "o"), ("first", "s"), ("least", "^")]:
        pts = [kld[sp] for n, _, sp in mixes(s[KIVI2]) if n == name and sp in kld]
        pts.sort()
        label = {"greedy": "kivi4 on the most sensitive k layers (greedy)",
                 "first": "kivi4 on the first k layers",
                 "least": "kivi4 on the least sensitive k layers"}[name]
        axes[1].plot([p[0] / 1024 for p in pts], [p[1] for p in pts], marker=marker, label=label)
    for u in ["kivi2:g=32,r=128", "kivi3:g=32,r=128", "kivi4:g=32,r=128"]:
        if u in kld:
            axes[1].scatter([kld[u][0] / 1024], [kld[u][1]], marker="*", s=120, color="black", zorder=5)
            axes[1].annotate("uniform " + short(u), (kld[u][0] / 1024, kld[u][1]), fontsize=7,
                             xytext=(-6, 0), textcoords="offset points", ha="right",
                             va="center")  # left of the star: inside the axes
    axes[1].set_yscale("log")
    axes[1].set_xlabel("KV bytes per token, all layers (KiB)")
    axes[1].set_ylabel("mean KL(fp32 || scheme), nats")
    axes[1].set_title(f"kivi2/kivi4 mixes at k = {', '.join(map(str, BUDGETS))} layers", fontsize=9)
    axes[1].grid(alpha=0.3)
    axes[1].margins(x=0.12, y=0.1)
    axes[1].legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2,
                   frameon=False)
    fig.suptitle("Per-layer precision on SmolLM2 (30 layers) over KJV", fontsize=10)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    footer(fig, f"{path}, {apath}; experiments/plots/plot_options.py layers", arows)
    save(fig, a.out, "per_layer")
    print("| k layers in kivi4 | bytes/token | greedy KLD | first-k KLD | least-sensitive-k KLD |")
    print("|---:|---:|---:|---:|---:|")
    for k in BUDGETS:
        row = {n: kld.get(sp) for n, kk, sp in mixes(s[KIVI2]) if kk == k}
        if all(row.values()):
            print(f"| {k} | {row['greedy'][0]:.0f} | {row['greedy'][1]:.4f} | {row['first'][1]:.4f} | "
                  f"{row['least'][1]:.4f} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name, fn in [("rotation", rotation), ("sinks", sinks), ("allocate", allocate)]:
        p = sub.add_parser(name)
        p.add_argument("results", help="a kvq run output folder")
        p.add_argument("--out", help="output folder (PNG and PDF; default: the results folder)")
        p.set_defaults(fn=fn)
    p = sub.add_parser("layers")
    p.add_argument("results", help="the layer_sensitivity.toml run's folder")
    p.add_argument("allocation", help="the layer_allocation.toml run's folder")
    p.add_argument("--out", help="output folder (PNG and PDF; default: the allocation folder)")
    p.set_defaults(fn=layers)
    a = ap.parse_args()
    if a.out is None:
        a.out = getattr(a, "allocation", a.results)
    a.fn(a)


if __name__ == "__main__":
    sys.exit(main())
