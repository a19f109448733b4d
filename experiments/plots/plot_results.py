#!/usr/bin/env python3
"""Plots a `kvq run` results directory: error against storage cost for every scheme.

Usage (from the repository root, with the plot venv that `KVQ_WITH_PY=1 scripts/setup.sh` makes):
    .venv/bin/python experiments/plots/plot_results.py results/default [--out docs/img]

Reads RESULTS/synthetic.jsonl and RESULTS/model.jsonl (whichever exist) and writes
    synthetic_snr.png       key and value reconstruction SNR (dB) vs bytes per token
    synthetic_attention.png attention KL(p_fp32 || p_scheme) vs K + V bytes per token (log scale)
    model_kld.png           real-model next-token KLD vs the fp32 cache, and delta perplexity, vs
                            KV bytes per token
The x axis is what a token costs in memory (codes, scales, zeros and the exact recent window, the
one footprint formula), so kivi2 with and without its window land apart; rows written before the
bytes were recorded fall back to effective bits, and the axis says so. Colours come from each
spec's axes (KIVI layout = keys per channel and values per token, whether spelled kivi2 or
int2:k=channel,v=token), labels are placed so they do not overlap, and every figure states the
settings its rows were made with. Every figure is drawn from the rows alone.
"""
import argparse
import json
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FuncFormatter  # noqa: E402
from figures import interval, save  # noqa: E402

FONT = 6.5


def rows(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def family(scheme):
    """The family from the canonical spec's axes, not its spelling."""
    if scheme.startswith("k="):  # keys and values in different schemes: k=KEY;v=VALUE
        k, _, v = scheme[2:].partition(";v=")
        return f"K {k.partition(':')[0]}, V {v.partition(':')[0]}"
    name, _, params = scheme.partition(":")
    if name.startswith("fp8"):
        return "FP8"
    if name.startswith("kivi"):
        return "KIVI layout (K per channel, V per token)"
    if name.startswith("int"):
        kv = dict(p.split("=", 1) for p in params.split(",") if "=" in p)
        k, v = kv.get("k", "channel"), kv.get("v", "token")
        if k == "channel" and v == "token":
            return "KIVI layout (K per channel, V per token)"
        return f"int, other axes (k={k}, v={v})"
    return "16-bit"


PALETTE = ["tab:red", "tab:blue", "tab:orange", "tab:green", "tab:purple", "tab:brown", "tab:gray"]
FIXED = {"FP8": "tab:blue", "KIVI layout (K per channel, V per token)": "tab:red", "16-bit": "tab:gray"}


def colours(rs):
    out = dict(FIXED)
    extra = [c for c in PALETTE if c not in FIXED.values()]
    for r in rs:
        f = family(r["scheme"])
        if f not in out:
            out[f] = extra[len([k for k in out if k not in FIXED]) % len(extra)]
    return out


def short(s):
    return (s.replace(",scale=dynamic", "").replace("fp8_e4m3:gran=", "e4m3 ")
            .replace("fp8_e5m2:gran=", "e5m2 "))


def place_labels(ax, pts):
    """Greedy placement: each label takes the first of a few offsets whose box (estimated in
    points) overlaps no label placed before it and no point; else the least-overlapping one."""
    fig = ax.figure
    fig.canvas.draw()
    to_disp = ax.transData.transform
    scale = fig.dpi / 72.0
    placed = []
    pix = [to_disp((x, y)) for x, y, _ in pts]

    def box(px, py, dx, dy, text):
        w, h = 0.55 * FONT * len(text) * scale, FONT * 1.2 * scale
        x0 = px + dx * scale - (w if dx < 0 else 0)
        y0 = py + dy * scale - (h if dy < 0 else 0)
        return (x0, y0, x0 + w, y0 + h)

    def overlap(a, b):
        return max(0, min(a[2], b[2]) - max(a[0], b[0])) * max(0, min(a[3], b[3]) - max(a[1], b[1]))

    offsets = [(4, 2), (4, -2), (-4, 2), (-4, -2), (4, 9), (4, -9), (-4, 9), (-4, -9), (4, 16), (4, -16)]
    order = sorted(range(len(pts)), key=lambda i: (pix[i][0], pix[i][1]))
    for i in order:
        x, y, text = pts[i]
        px, py = pix[i]
        best, best_cost = None, None
        for dx, dy in offsets:
            b = box(px, py, dx, dy, text)
            cost = sum(overlap(b, p) for p in placed)
            cost += sum(overlap(b, (qx - 3, qy - 3, qx + 3, qy + 3)) for qx, qy in pix)
            if best_cost is None or cost < best_cost:
                best, best_cost = (dx, dy, b), cost
            if cost == 0:
                break
        dx, dy, b = best
        placed.append(b)
        ax.annotate(text, (x, y), xytext=(dx, dy), textcoords="offset points", fontsize=FONT,
                    ha="right" if dx < 0 else "left", va="top" if dy < 0 else "bottom")


def x_of(r, side=None):
    """Bytes per token (per layer, all kv heads) of one side or of K + V, else bits."""
    if side:
        b = r.get(f"{side}_bytes_per_token")
        return (b, True) if b is not None else (r[f"{side}_bits"], False)
    if "key_bytes_per_token" in r:
        return r["key_bytes_per_token"] + r["value_bytes_per_token"], True
    if "bytes_per_token" in r:
        return r["bytes_per_token"], True
    return (r["key_bits"] if "key_bits" in r else r["bits"]), False


def scatter(ax, rs, col, get_x, get_y):
    pts, all_bytes = [], True
    for fam, c in col.items():
        sel = [r for r in rs if family(r["scheme"]) == fam]
        xs, ys, names = [], [], []
        for r in sel:
            y = get_y(r)
            if y is None:
                continue
            x, is_bytes = get_x(r)
            all_bytes = all_bytes and is_bytes
            xs.append(x)
            ys.append(y)
            names.append(short(r["scheme"]))
        if xs:
            ax.scatter(xs, ys, c=c, label=fam, s=18)
            pts += list(zip(xs, ys, names))
    return pts, all_bytes


def bytes_axis(ax, by_bytes):
    ax.set_xscale("log", base=2)
    ax.margins(x=0.18)  # room for the labels of the first and last points
    if by_bytes:
        ax.xaxis.set_major_formatter(
            FuncFormatter(lambda v, _: f"{v / 1024:g} KiB" if v >= 1024 else f"{v:g} B"))


def settings_line(r, keys):
    s = r.get("settings", {})
    return ", ".join(f"{k} {s[k]}" for k in keys if k in s)


def plot_synthetic(rs, out, where):
    col = colours(rs)
    cfg = settings_line(rs[0], ["tokens", "heads", "head_dim", "outliers", "outlier_scale", "gqa"])
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.6))
    for ax, side in zip(axes, ["key", "value"]):
        pts, by_bytes = scatter(ax, rs, col, lambda r: x_of(r, side),
                                lambda r: r[f"{side}_snr_db"])
        bytes_axis(ax, by_bytes)
        ax.set_xlabel(f"{side} bytes per token (all heads: codes, scales, zeros, window)" if by_bytes
                      else f"{side} effective bits per element (rows without bytes)")
        ax.set_ylabel(f"{side} reconstruction SNR (dB)")
        ax.set_title(f"{side}s")
        ax.grid(alpha=0.3, which="both")
        place_labels(ax, pts)
    axes[0].legend(fontsize=7)
    fig.suptitle(f"synthetic K/V ({cfg}) - {where}", fontsize=9)
    fig.tight_layout()
    save(fig, out, "synthetic_snr")
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(8.5, 5.0))
    pts, by_bytes = scatter(ax, rs, col, lambda r: x_of(r),
                            lambda r: r["attn_kl"] if r["attn_kl"] > 0 else None)
    ax.set_yscale("log")
    bytes_axis(ax, by_bytes)
    ax.set_xlabel("K + V bytes per token (all heads)" if by_bytes
                  else "key bits per element (rows without bytes)")
    ax.set_ylabel("attention KL(p_fp32 || p_scheme)")
    ax.set_title(f"decode attention error, synthetic K/V\n{cfg}\n{where}", fontsize=8)
    ax.grid(alpha=0.3, which="both")
    place_labels(ax, pts)
    ax.legend(fontsize=7)
    fig.tight_layout()
    save(fig, out, "synthetic_attention")
    plt.close(fig)


def plot_model(rs, out, where):
    """One row of panels (KLD, |delta ppl|) per window length the rows were measured at."""
    col = colours(rs)
    ctxs = sorted({r.get("settings", {}).get("ctx") for r in rs}, key=lambda c: c or 0)
    fig, grid = plt.subplots(len(ctxs), 2, figsize=(12, 4.6 * len(ctxs)), squeeze=False)
    by_bytes = True
    for axes, ctx in zip(grid, ctxs):
        sub = [r for r in rs if r.get("settings", {}).get("ctx") == ctx]
        for ax, key in zip(axes, ["kld", "delta_ppl"]):
            pts, b = scatter(ax, sub, col, lambda r: x_of(r), lambda r: max(abs(r[key]), 1e-6))
            # Error bars: each row's 95% interval (block bootstrap over the scored positions), of
            # |delta ppl| for a negative delta; a bar stops at the axis floor.
            for r in sub:
                fam = family(r["scheme"])
                if fam not in col:
                    continue
                y = max(abs(r[key]), 1e-6)
                below, above = interval(r, key)
                if r[key] < 0:
                    below, above = above, below
                below = min(below, y - 1e-6)
                if below or above:
                    ax.errorbar([x_of(r)[0]], [y], yerr=[[below], [above]], fmt="none",
                                ecolor=col[fam], elinewidth=0.8, capsize=2)
            by_bytes = by_bytes and b
            ax.set_yscale("log")
            bytes_axis(ax, b)
            ax.grid(alpha=0.3, which="both")
            place_labels(ax, pts)
            ax.set_title(f"{ctx}-token windows, {sub[0]['scored']} tokens scored", fontsize=9)
        axes[0].set_ylabel("mean KLD vs fp32 cache (nats/token)")
        axes[1].set_ylabel("|perplexity - fp32-cache perplexity|")
        axes[0].legend(fontsize=7)
    for ax in grid[-1]:
        ax.set_xlabel("KV bytes per token (all layers, K + V)" if by_bytes
                      else "KV bits per element (mean of K and V)")
    cfg = settings_line(rs[0], ["text", "stride", "max_tokens", "backend", "pre_rope"])
    fig.suptitle(f"SmolLM2-135M ({cfg}) - {where}", fontsize=9)
    fig.tight_layout()
    save(fig, out, "model_kld")
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
    where = os.path.basename(os.path.normpath(a.results))
    cfg = os.path.join(a.results, "config.toml")
    if os.path.exists(cfg):
        where = f"config {os.path.join(where, 'config.toml')}"
    if syn:
        plot_synthetic(syn, out, where)
    if mod:
        plot_model(mod, out, where)
    print(f"plots in {out}")


if __name__ == "__main__":
    main()
