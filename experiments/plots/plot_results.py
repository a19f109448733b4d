#!/usr/bin/env python3
"""Plots a `kvq run` results directory: error against storage cost for every scheme.

Usage (from the repository root, with the plot venv that `KVQ_WITH_PY=1 scripts/setup.sh` makes):
    .venv/bin/python experiments/plots/plot_results.py results/default [--out docs/img]

Reads RESULTS/synthetic.jsonl and RESULTS/model.jsonl (whichever exist) and writes
    synthetic_snr.png       key and value reconstruction SNR (dB) vs bytes per token
    synthetic_attention.png attention KL(p_fp32 || p_scheme) vs K + V bytes per token (log scale)
    model_kld.png           real-model next-token KLD vs the fp32 cache, and delta perplexity, vs
                            KV bytes per token
    ablation.png            when the model rows are an ablation of the integer layout (one layout
                            at several windows R or groups G, as kivi_ablation.toml): KLD and
                            top-1 against R (a line per key/value axis pair) and against G
The x axis is what a token costs in memory (codes, scales, zeros and the exact recent window, the
one footprint formula), so kivi2 with and without its window land apart; rows written before the
bytes were recorded fall back to effective bits, and the axis says so. Colours come from each
spec's axes (KIVI layout = keys per channel and values per token, whether spelled kivi2 or
int2:k=channel,v=token), labels are placed so they do not overlap, and every figure states the
settings its rows were made with. Every figure is drawn from the rows alone.
"""
import argparse
import json
import math
import os
import re

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FuncFormatter, LogLocator  # noqa: E402
from figures import commit, host, interval, legend_below, log_axis, save  # noqa: E402

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
    """A point's label: the canonical spec without its defaults, a calibration file's path, or
    long axis names (k=ch,v=tok: keys per channel, values per token)."""
    s = re.sub(r"scale=calib:[^,;@]*", "calib", s.replace(",scale=dynamic", ""))
    s = re.sub(r"\b([kv])=channel", r"\1=ch", re.sub(r"\b([kv])=token", r"\1=tok", s))
    return s.replace("fp8_e4m3:gran=", "e4m3 ").replace("fp8_e5m2:gran=", "e5m2 ")


def place_labels(ax, pts):
    """Greedy placement: each label takes the first of a few offsets whose box (estimated in
    points) overlaps no label placed before it, no point and nothing outside the axes; else the
    least-overlapping one. Points drawn on top of each other (within 2 pixels) share one label,
    a line per scheme."""
    fig = ax.figure
    fig.tight_layout()  # the panels' final size first: the labels are placed in pixels
    fig.canvas.draw()
    to_disp = ax.transData.transform
    scale = fig.dpi / 72.0
    placed = []
    merged = []  # [x, y, px, py, [names]]
    for x, y, text in pts:
        px, py = to_disp((x, y))
        same = [m for m in merged if abs(m[2] - px) <= 2 and abs(m[3] - py) <= 2]
        if same:
            same[0][4].append(text)
        else:
            merged.append([x, y, px, py, [text]])
    pts = [(m[0], m[1], "\n".join(m[4])) for m in merged]
    pix = [(m[2], m[3]) for m in merged]

    renderer = fig.canvas.get_renderer()

    def size(text):  # the label's extent in pixels, measured as drawn
        t = ax.text(0, 0, text, fontsize=FONT)
        e = t.get_window_extent(renderer)
        t.remove()
        return e.width + 2, e.height + 1

    def box(px, py, dx, dy, text):
        w, h = size(text)
        x0 = px + dx * scale - (w if dx < 0 else 0)
        y0 = py + dy * scale - (h if dy < 0 else 0)
        return (x0, y0, x0 + w, y0 + h)

    def overlap(a, b):
        return max(0, min(a[2], b[2]) - max(a[0], b[0])) * max(0, min(a[3], b[3]) - max(a[1], b[1]))

    offsets = [(4, 2), (4, -2), (-4, 2), (-4, -2), (4, 9), (4, -9), (-4, 9), (-4, -9), (8, 16),
               (8, -16), (-8, 16), (-8, -16), (10, 26), (10, -26), (-10, 26), (-10, -26),
               (12, 38), (12, -38), (-12, 38), (-12, -38)]
    frame = ax.get_window_extent()  # a label outside the axes is clipped or covers another panel

    def outside(b):
        inside = overlap(b, (frame.x0, frame.y0, frame.x1, frame.y1))
        return (b[2] - b[0]) * (b[3] - b[1]) - inside

    order = sorted(range(len(pts)), key=lambda i: (pix[i][0], pix[i][1]))
    for i in order:
        x, y, text = pts[i]
        px, py = pix[i]
        best, best_cost = None, None
        for dx, dy in offsets:
            b = box(px, py, dx, dy, text)
            cost = sum(overlap(b, p) for p in placed) + 4 * outside(b)
            cost += 20 * sum(overlap(b, (qx - 4, qy - 4, qx + 4, qy + 4)) for qx, qy in pix)
            if best_cost is None or cost < best_cost:
                best, best_cost = (dx, dy, b), cost
            if cost == 0:
                break
        dx, dy, b = best
        placed.append(b)
        far = abs(dy) > 9  # a label set off from its point gets a thin line to it
        ax.annotate(text, (x, y), xytext=(dx, dy), textcoords="offset points", fontsize=FONT,
                    ha="right" if dx < 0 else "left", va="top" if dy < 0 else "bottom",
                    arrowprops=dict(arrowstyle="-", lw=0.4, color="0.45", shrinkA=0, shrinkB=2)
                    if far else None).set_in_layout(False)  # the layout stays as placed


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
    ax.margins(x=0.18, y=0.15)  # room for the labels of the outermost points
    fmt = (lambda v: f"{v / 1024:g} KiB" if v >= 1024 else f"{v:g} B") if by_bytes else (
        lambda v: f"{v:g}")
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: fmt(v)))
    lo, hi = ax.get_xlim()
    if lo > 0 and math.log2(hi / lo) < 4:  # few powers of two in view: ticks between them too
        subs = (1.5,) if math.log2(hi / lo) > 1.5 else (1.25, 1.5, 1.75)
        ax.xaxis.set_minor_locator(LogLocator(base=2, subs=subs))
        ax.xaxis.set_minor_formatter(FuncFormatter(lambda v, _: fmt(v)))
        ax.tick_params(axis="x", which="minor", length=3.5, labelsize=10)  # as the major ones


def settings_line(r, keys):
    s = r.get("settings", {})
    return ", ".join(f"{k} {s[k]}" for k in keys if k in s)


def plot_synthetic(rs, out, where):
    col = colours(rs)
    cfg = settings_line(rs[0], ["tokens", "heads", "head_dim", "outliers", "outlier_scale", "gqa"])
    fig, axes = plt.subplots(1, 2, figsize=(12, 5.4))
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
    fig.suptitle(f"synthetic K/V ({cfg}) - {where}", fontsize=9)
    fig.tight_layout()
    legend_below(fig, axes[0])
    save(fig, out, "synthetic_snr")
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(8.5, 5.0))
    pts, by_bytes = scatter(ax, rs, col, lambda r: x_of(r),
                            lambda r: r["attn_kl"] if r["attn_kl"] > 0 else None)
    log_axis(ax)
    bytes_axis(ax, by_bytes)
    ax.set_xlabel("K + V bytes per token (all heads)" if by_bytes
                  else "key bits per element (rows without bytes)")
    ax.set_ylabel("attention KL(p_fp32 || p_scheme)")
    ax.set_title(f"decode attention error, synthetic K/V\n{cfg}\n{where}", fontsize=8)
    ax.grid(alpha=0.3, which="both")
    place_labels(ax, pts)
    fig.tight_layout()
    legend_below(fig, ax, ncol=2)
    save(fig, out, "synthetic_attention")
    plt.close(fig)


def plot_model(rs, out, where):
    """One row of panels (KLD, delta ppl) per window length the rows were measured at. The
    perplexity change is signed, on a symmetric log axis (linear within the smallest change
    measured), so that a negative change and an interval that crosses zero read as they are."""
    col = colours(rs)
    ctxs = sorted({r.get("settings", {}).get("ctx") for r in rs}, key=lambda c: c or 0)
    fig, grid = plt.subplots(len(ctxs), 2, figsize=(12, 4.8 * len(ctxs)), squeeze=False)
    by_bytes = True
    deltas = [abs(r["delta_ppl"]) for r in rs if r["delta_ppl"]]
    linthresh = 10 ** math.floor(math.log10(min(deltas))) if deltas else 1e-3
    for axes, ctx in zip(grid, ctxs):
        sub = [r for r in rs if r.get("settings", {}).get("ctx") == ctx]
        for ax, key in zip(axes, ["kld", "delta_ppl"]):
            floor = 1e-6 if key == "kld" else None  # KLD on a log axis; delta ppl signed
            pts, b = scatter(ax, sub, col, lambda r: x_of(r),
                             lambda r: max(r[key], floor) if floor else r[key])
            # Error bars: each row's 95% interval (block bootstrap over the scored positions); a
            # KLD bar stops at the axis floor.
            for r in sub:
                fam = family(r["scheme"])
                if fam not in col:
                    continue
                y = max(r[key], floor) if floor else r[key]
                below, above = interval(r, key)
                if floor:
                    below = min(below, y - floor)
                if below or above:
                    ax.errorbar([x_of(r)[0]], [y], yerr=[[below], [above]], fmt="none",
                                ecolor=col[fam], elinewidth=0.8, capsize=2)
            by_bytes = by_bytes and b
            if floor:
                log_axis(ax)
            else:
                ax.set_yscale("symlog", linthresh=linthresh)
                ax.axhline(0, color="0.3", lw=0.6)
            bytes_axis(ax, b)
            ax.grid(alpha=0.3, which="major" if not floor else "both")
            place_labels(ax, pts)
            ax.set_title(f"{ctx}-token windows, {sub[0]['scored']} tokens scored", fontsize=9)
        axes[0].set_ylabel("mean KLD vs fp32 cache (nats/token)")
        axes[1].set_ylabel("perplexity - fp32-cache perplexity (symlog)")
    for ax in grid[-1]:
        ax.set_xlabel("KV bytes per token (all layers, K + V)" if by_bytes
                      else "KV bits per element (mean of K and V)")
    cfg = settings_line(rs[0], ["text", "stride", "max_tokens", "backend", "pre_rope"])
    fig.suptitle(f"SmolLM2-135M ({cfg}) - {where}", fontsize=9)
    fig.tight_layout()
    legend_below(fig, grid[0][0])
    save(fig, out, "model_kld")
    plt.close(fig)


def int_params(scheme):
    """bits, key axis, value axis, group, window and arithmetic of a one-scheme int/kivi spec;
    None for anything else (FP8, 16-bit, split, per-layer, rotated or sink specs)."""
    m = re.fullmatch(r"(int|kivi)(\d+):([^;@]*)", scheme)
    if not m:
        return None
    kv = dict(p.split("=", 1) for p in m.group(3).split(",") if "=" in p)
    if "rot" in kv or "sink" in kv:
        return None
    kivi = m.group(1) == "kivi"
    return {"bits": int(m.group(2)), "k": "channel" if kivi else kv.get("k", "channel"),
            "v": "token" if kivi else kv.get("v", "token"), "g": kv.get("g", "32"),
            "r": int(kv.get("r", "0")), "arith": kv.get("arith", "exact"),
            "sym": "sym" in m.group(3).split(",")}


def ablation_rows(rs):
    """The model rows of an ablation of the integer layout (axes x window x group), when there is
    one: at some bit width, one layout measured at two or more windows or groups, and at least
    four layout x group x window cells in all."""
    ctx = sorted({r.get("settings", {}).get("ctx") or 0 for r in rs})[0]
    out = []
    for r in rs:
        p = int_params(r["scheme"])
        if p and (r.get("settings", {}).get("ctx") or 0) == ctx:
            out.append((p, r))
    seen = {}
    for p, _ in out:
        layout = (p["bits"], p["k"], p["v"], p["arith"], p["sym"])
        seen.setdefault(layout, set()).add((p["g"], p["r"]))
    # (two windows of one scheme alone, as the default config's kivi2 with and without its
    # window, are no ablation: the KLD figure shows them)
    varied = any(len(v) > 1 for v in seen.values()) and sum(len(v) for v in seen.values()) >= 4
    return out if varied else []


def plot_ablation(rs, out, where):
    """KIVI's ablation as grouped lines: KLD and top-1 against the full-precision window R (one line
    per key/value axis pair, at the most common group size) and against the group size G (at the
    largest window), each point with its 95% interval."""
    rows_ = ablation_rows(rs)
    col = colours(rs)
    gs = [p["g"] for p, _ in rows_]
    g0 = max(set(gs), key=gs.count)  # the group most rows share
    r_max = max(p["r"] for p, _ in rows_)
    windows = sorted({p["r"] for p, _ in rows_ if p["g"] == g0})
    groups = sorted({p["g"] for p, _ in rows_ if p["r"] == r_max},
                    key=lambda g: (not g.isdigit(), int(g) if g.isdigit() else 0))  # "dim" last
    bits = sorted({p["bits"] for p, _ in rows_})
    fig, axes = plt.subplots(2, 2, figsize=(10, 6.4), sharey="row",
                             gridspec_kw={"width_ratios": [max(len(windows), 2),
                                                           max(len(groups), 2)]})
    axes[0][0].set_title(f"full-precision window R (groups of {g0})", fontsize=9)
    axes[0][1].set_title(f"group size G (window R = {r_max})", fontsize=9)

    def series_of(p):
        layout = family(f"int{p['bits']}:k={p['k']},v={p['v']}")
        name = layout if len(bits) == 1 else f"{layout}, {p['bits']}-bit"
        return (name + (", sym" if p["sym"] else "")
                + (", arith=fp16" if p["arith"] != "exact" else ""))

    series = list(dict.fromkeys(series_of(p) for p, _ in rows_))
    for j, (xs_of, xs) in enumerate([(lambda p: p["r"] if p["g"] == g0 else None, windows),
                                     (lambda p: p["g"] if p["r"] == r_max else None, groups)]):
        for i, name in enumerate(series):
            pts = sorted(((xs.index(xs_of(p)), p, r) for p, r in rows_
                          if series_of(p) == name and xs_of(p) in xs), key=lambda t: t[0])
            if not pts:
                continue
            layout = family(f"int{pts[0][1]['bits']}:k={pts[0][1]['k']},v={pts[0][1]['v']}")
            fp16 = pts[0][1]["arith"] != "exact"
            style = dict(color=col.get(layout, "black"), marker="os^dv"[i % 5], ms=5 if fp16 else 4,
                         mfc="white" if fp16 else None, linestyle=":" if fp16 else "-",
                         capsize=2, elinewidth=0.8, lw=1.2, label=name if j == 0 else None)
            # a point of each series is offset a little so that the intervals do not overlap
            dx = (i - (len(series) - 1) / 2) * 0.06
            x = [t[0] + dx for t in pts]
            for ax, key, scale in [(axes[0][j], "kld", 1.0), (axes[1][j], "top1", 100.0)]:
                y = [scale * t[2][key] for t in pts]
                err = list(zip(*[interval(t[2], key, scale=scale) for t in pts]))
                ax.errorbar(x, y, yerr=err, **style)
        for ax in (axes[0][j], axes[1][j]):
            ax.set_xticks(range(len(xs)), [str(v) for v in xs])
            ax.set_xlim(-0.5, len(xs) - 0.5)
            ax.grid(alpha=0.3, which="both")
        axes[1][j].set_xlabel("R (tokens kept exact)" if j == 0 else "G (elements per group)")
    log_axis(axes[0][0])
    axes[0][0].set_ylabel("mean KLD vs fp32 cache (nats/token)")
    axes[1][0].set_ylabel("top-1 agreement with fp32 (%)")
    r0 = rows_[0][1]
    ctx = r0.get("settings", {}).get("ctx")
    fig.suptitle(f"Integer layout ablation on SmolLM2-135M: {ctx}-token windows, "
                 f"{r0['scored']} tokens scored, 95% intervals - {where}", fontsize=9)
    fig.tight_layout()
    legend_below(fig, axes[0][0], ncol=2)
    save(fig, out, "ablation")
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
    where = f"{where}; kvq {commit()}, {host(syn + mod)}"  # the commit and host on every figure
    if syn:
        plot_synthetic(syn, out, where)
    if mod:
        plot_model(mod, out, where)
        if ablation_rows(mod):
            plot_ablation(mod, out, where)
    print(f"plots in {out}")


if __name__ == "__main__":
    main()
