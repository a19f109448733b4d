#!/usr/bin/env python3
"""Which granularity wins, layer by layer, on the model's own K/V: every layer's keys and values
of a text (kvq.Model.dump_kv) quantized under each scheme (kvq.compare), SNR per layer, one line
per scheme, keys left and values right. Uses the kvq Python package.

    .venv/bin/python experiments/plots/granularity_layers.py   # ~30 s

The CSV and figures go into results/granularity_layers/ (--out DIR elsewhere).
"""
import argparse
import csv
import os
import re

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from figures import footer, legend_below, save  # noqa: E402

import kvq  # noqa: E402

SCHEMES = ["fp8_e4m3:gran=tensor", "fp8_e4m3:gran=head", "fp8_e4m3:gran=token",
           "fp8_e4m3:gran=channel", "int4:k=token,v=token,g=32,r=0",
           "int4:k=channel,v=channel,g=32,r=0"]
STYLES = ["-", "--", "-", ":", "-.", "--"]
MARKERS = ["o", "s", "^", "x", "d", "v"]




def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--text", default="kjv", help="text file, or 'kjv' (default)")
    ap.add_argument("--max-tokens", type=int, default=kvq.DEFAULT_MAX_TOKENS)
    ap.add_argument("--kv", nargs="+", default=SCHEMES, help="schemes, one line each")
    ap.add_argument("--out", default="results/granularity_layers",
                    help="output folder (PNG, PDF and a CSV; default: results/granularity_layers)")
    a = ap.parse_args()
    specs = [kvq.parse_spec(s) for s in a.kv]  # every spec checked before the model loads
    model = kvq.Model()
    layers = model.dump_kv(kvq.read_text(a.text), max_tokens=a.max_tokens)
    rows = []
    for l, d in enumerate(layers):
        for role, x in (("key", d["k"]), ("value", d["v"])):
            # quantize with the layer (not compare): a calib:FILE scale is this layer's
            for r in (kvq.quantize(x, sp, role=role, layer=l)[1] for sp in specs):
                rows.append({"layer": l, "role": role, "scheme": r["scheme"],
                             "bits": r["effective_bits"], "snr_db": r["snr_db"]})
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "granularity_layers.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for ax, role in zip(axes, ("key", "value")):
        for i, s in enumerate(specs):
            pts = [(r["layer"], r["snr_db"]) for r in rows
                   if r["role"] == role and r["scheme"] == s.canonical]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], STYLES[i % len(STYLES)],
                    marker=MARKERS[i % len(MARKERS)], markersize=3, color=f"C{i % 10}",
                    label=re.sub(r"calib:([^,;@]*)", lambda m: "calib:" + os.path.basename(
                        m.group(1)), s.canonical.replace(",scale=dynamic", "")))  # file, not path
        ax.set_title(f"{role}s", fontsize=10)
        ax.set_xlabel("layer")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("reconstruction SNR (dB)")
    tokens = layers[0]["k"].shape[0]
    fig.suptitle(f"SmolLM2-135M, every layer's K/V over {tokens} tokens of {a.text}: SNR per scheme",
                 fontsize=10)
    footer(fig, "experiments/plots/granularity_layers.py")
    fig.tight_layout(rect=(0, 0.02, 1, 0.95))
    legend_below(fig, axes[0])
    save(fig, a.out, "granularity_layers")
    # The answer per role: which scheme has the best SNR in how many layers.
    for role in ("key", "value"):
        wins = {}
        for l in range(len(layers)):
            best = max((r for r in rows if r["role"] == role and r["layer"] == l),
                       key=lambda r: r["snr_db"] if r["snr_db"] is not None else float("inf"))
            wins[best["scheme"]] = wins.get(best["scheme"], 0) + 1
        print(f"{role}s: best SNR in " + ", ".join(f"{s}: {n} layers" for s, n in
                                                   sorted(wins.items(), key=lambda t: -t[1])))


if __name__ == "__main__":
    main()
