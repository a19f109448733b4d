#!/usr/bin/env python3
"""Plots a `kvq run` results directory: error against storage cost for every scheme.

Usage (from the repository root, with the plot venv that `KVQ_WITH_PY=1 scripts/setup.sh` makes):
    .venv/bin/python experiments/plots/plot_results.py results/default [--out docs/img]

Reads RESULTS/synthetic.jsonl and RESULTS/model.jsonl (whichever exist) and writes
    synthetic_snr.png       key and value reconstruction SNR (dB) vs effective bits per element
    synthetic_attention.png attention KL(p_fp32 || p_scheme) vs key bits (log scale)
    model_kld.png           real-model next-token KLD vs the fp32 cache, and delta perplexity, vs bits
Every figure is drawn from the rows alone; nothing is typed in by hand.
"""
import argparse
import json
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def rows(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def family(scheme):
    if scheme.startswith("fp8"):
        return "FP8"
    if scheme.startswith("kivi"):
        return "KIVI"
    if scheme.startswith("int"):
        return "int (ablation)"
    return "16-bit"


COLORS = {"FP8": "tab:blue", "KIVI": "tab:red", "int (ablation)": "tab:orange", "16-bit": "tab:gray"}


def label_points(ax, xs, ys, names):
    for x, y, n in zip(xs, ys, names):
        ax.annotate(n, (x, y), fontsize=6, xytext=(3, 3), textcoords="offset points")


def short(s):
    return s.replace(",scale=dynamic", "").replace("fp8_e4m3:gran=", "e4m3 ").replace("fp8_e5m2:gran=", "e5m2 ")


def plot_synthetic(rs, out):
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, side in zip(axes, ["key", "value"]):
        for fam in COLORS:
            sel = [r for r in rs if family(r["scheme"]) == fam and r[f"{side}_snr_db"] is not None]
            if not sel:
                continue
            xs = [r[f"{side}_bits"] for r in sel]
            ys = [r[f"{side}_snr_db"] for r in sel]
            ax.scatter(xs, ys, c=COLORS[fam], label=fam, s=18)
            label_points(ax, xs, ys, [short(r["scheme"]) for r in sel])
        ax.set_xlabel("effective bits per element (codes + scales + zeros)")
        ax.set_ylabel(f"{side} reconstruction SNR (dB)")
        ax.set_title(f"{side}s (synthetic, outlier channels in keys)")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "synthetic_snr.png"), dpi=130)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for fam in COLORS:
        sel = [r for r in rs if family(r["scheme"]) == fam and r["attn_kl"] > 0]
        if not sel:
            continue
        xs = [r["key_bits"] for r in sel]
        ys = [r["attn_kl"] for r in sel]
        ax.scatter(xs, ys, c=COLORS[fam], label=fam, s=18)
        label_points(ax, xs, ys, [short(r["scheme"]) for r in sel])
    ax.set_yscale("log")
    ax.set_xlabel("key bits per element")
    ax.set_ylabel("attention KL(p_fp32 || p_scheme)")
    ax.set_title("decode attention error (synthetic K/V)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "synthetic_attention.png"), dpi=130)
    plt.close(fig)


def plot_model(rs, out):
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for fam in COLORS:
        sel = [r for r in rs if family(r["scheme"]) == fam]
        if not sel:
            continue
        xs = [r["bits"] for r in sel]
        for ax, key in zip(axes, ["kld", "delta_ppl"]):
            ys = [max(abs(r[key]), 1e-6) for r in sel]
            ax.scatter(xs, ys, c=COLORS[fam], label=fam, s=18)
            label_points(ax, xs, ys, [short(r["scheme"]) for r in sel])
    axes[0].set_ylabel("mean KLD vs fp32 cache (nats/token)")
    axes[1].set_ylabel("|perplexity - fp32-cache perplexity|")
    s = rs[0]["settings"]
    for ax in axes:
        ax.set_yscale("log")
        ax.set_xlabel("KV bits per element (mean of K and V)")
        ax.grid(alpha=0.3, which="both")
    axes[0].set_title(f"SmolLM2-135M on {s['text']}, ctx {s['ctx']}, {rs[0]['scored']} tokens")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "model_kld.png"), dpi=130)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", help="a `kvq run` output directory")
    ap.add_argument("--out", help="where the PNGs go (default: the results directory)")
    a = ap.parse_args()
    out = a.out or a.results
    os.makedirs(out, exist_ok=True)
    syn = rows(os.path.join(a.results, "synthetic.jsonl"))
    mod = rows(os.path.join(a.results, "model.jsonl"))
    if not syn and not mod:
        raise SystemExit(f"plot_results: no synthetic.jsonl or model.jsonl in {a.results}")
    if syn:
        plot_synthetic(syn, out)
    if mod:
        plot_model(mod, out)
    print(f"plots in {out}")


if __name__ == "__main__":
    main()
