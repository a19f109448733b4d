#!/usr/bin/env python3
"""Per-channel |K| and |V| of the real model (KIVI's figure 2): for chosen layers and heads, the
largest magnitude each channel reaches over the tokens of a text, keys (post-RoPE) above, values
below. Keys have a few outlier channels; values have none, which is why KIVI quantizes keys per
channel and values per token. Uses the kvq Python package (kvq.Model.dump_kv).

    .venv/bin/python experiments/plots/channel_magnitudes.py   # ~10 s

The figures go into results/channel_magnitudes/ (--out DIR elsewhere).
"""
import argparse

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from figures import footer, save  # noqa: E402
import numpy as np  # noqa: E402

import kvq  # noqa: E402




def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--text", default="kjv", help="text file, or 'kjv' (default)")
    ap.add_argument("--max-tokens", type=int, default=kvq.DEFAULT_MAX_TOKENS)
    ap.add_argument("--layers", type=int, nargs="+", default=[2, 15, 28])
    ap.add_argument("--head", type=int, default=0)
    ap.add_argument("--out", default="results/channel_magnitudes",
                    help="output folder (PNG and PDF; default: results/channel_magnitudes)")
    a = ap.parse_args()
    model = kvq.Model()
    layers = model.dump_kv(kvq.read_text(a.text), max_tokens=a.max_tokens)
    n = len(a.layers)
    fig, axes = plt.subplots(2, n, figsize=(4.2 * n, 5.2), sharex=True, squeeze=False)
    for j, l in enumerate(a.layers):
        if not 0 <= l < len(layers):
            raise SystemExit(f"--layers: layer {l} is outside 0..{len(layers) - 1}")
        for i, (name, label) in enumerate([("k", "keys (post-RoPE)"), ("v", "values")]):
            x = layers[l][name][:, a.head, :]  # [tokens, head_dim]
            amax = np.abs(x).max(axis=0)
            med = np.median(amax)
            ax = axes[i][j]
            ax.bar(np.arange(amax.size), amax, color="0.25" if i == 0 else "0.55", width=0.9)
            ax.axhline(4 * med, color="k", linestyle=":", linewidth=1)
            ax.set_title(f"layer {l}, head {a.head}: {label}", fontsize=9)
            ax.set_ylabel("max |x| over tokens")
            if i == 1:
                ax.set_xlabel("channel")
            out = np.flatnonzero(amax > 4 * med)
            ax.text(0.98, 0.95, f"{out.size} channel{'' if out.size == 1 else 's'} > 4x median",
                    transform=ax.transAxes, ha="right", va="top", fontsize=8,
                    bbox=dict(facecolor="white", edgecolor="none", pad=1.5))  # over the 4x line
            ax.set_ylim(0, 1.3 * max(amax.max(), 4 * med))  # room for the note above the 4x line
    tokens = layers[0]["k"].shape[0]
    fig.suptitle(f"SmolLM2-135M per-channel magnitudes over {tokens} tokens of {a.text}", fontsize=10)
    footer(fig, "experiments/plots/channel_magnitudes.py")
    fig.tight_layout(rect=(0, 0.02, 1, 0.96))
    save(fig, a.out, "channel_magnitudes")


if __name__ == "__main__":
    main()
