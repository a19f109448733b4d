#!/usr/bin/env python3
"""Issue 46's decode-attention goals from one device run: kvq's kernels (bench_attention_cuda's
JSON) against PyTorch's SDPA over a bf16 cache (bench/torch_sdpa_peer.py's JSON) timed in the same
run. A ratio is PyTorch's time / kvq's time (above 1.00x: kvq is faster); kvq's time at a case is
its fastest split kernel (baseline, tiled, mma), named in the value. Goals against PyTorch say
"vs PyTorch SDPA bf16" in their names; the others are fractions of peak.

Usage: python3 bench/attention_goals.py BENCH.json PEER.json [--json OUT.json]
Prints a markdown table (| goal | value | met |). A missing or skipped peer leaves the goals
against PyTorch "not measured" (exit 0); an unreadable file is one line and exit 1.
The peer JSON may also be the first run's format (rows {"what": "sdpa_bf16/<backend>/<how>",
"s": seconds}, shape 8x128x4 only; docs/device-runs/2026-12-04-h200/torch-sdpa-peer.json).
"""
import json
import sys

MAIN_SHAPE = "8x128x4"
SMOLLM2_SHAPE = "3x64x3"


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise SystemExit(f"attention_goals: cannot read {path}: {e}")


def peer_times(peer):
    """{(shape, ctx, batch): (time_us, "backend/how")}: PyTorch's fastest backend per case."""
    out = {}
    if not peer or peer.get("skipped"):
        return out
    for r in peer.get("best", []):
        key = (r["shape"], int(r["ctx"]), int(r["batch"]))
        out[key] = (float(r["time_us"]), f"{r['backend']}/{r['how']}")
    for r in peer.get("rows", []):  # the first run's format
        what = r.get("what", "")
        if not what.startswith("sdpa_bf16/") or "s" not in r:
            continue
        key = (MAIN_SHAPE, int(r["ctx"]), int(r["batch"]))
        t = float(r["s"]) * 1e6
        if key not in out or t < out[key][0]:
            out[key] = (t, what[len("sdpa_bf16/"):])
    return out


def kvq_times(bench):
    """{(shape, kind, ctx, batch): (time_us, kernel, pct_peak)}: kvq's fastest kernel per case."""
    out = {}
    for r in bench.get("results", []):
        key = (r.get("shape", MAIN_SHAPE), r["kind"], int(r["ctx"]), int(r["batch"]))
        t = float(r["time_us"])
        if key not in out or t < out[key][0]:
            out[key] = (t, r.get("kernel", "baseline"), float(r["pct_peak"]))
    return out


def ctx_name(ctx):
    return f"{ctx // 1024}k" if ctx % 1024 == 0 else str(ctx)


class Goals:
    def __init__(self, bench, peer):
        self.kvq = kvq_times(bench)
        self.torch = peer_times(peer)
        self.rows = []  # (name, value text, met text, record)

    def worst(self, name, target, cases, metric):
        """One goal over `cases` [(shape, kind, ctx, batch)]: the worst value must reach target.
        metric "vs_torch": PyTorch time / kvq time; "pct_peak": kvq's % of peak."""
        vals, missing = [], []
        for shape, kind, ctx, batch in cases:
            k = self.kvq.get((shape, kind, ctx, batch))
            where = f"{kind} {ctx_name(ctx)} b{batch}"
            if k is None:
                missing.append(where)
                continue
            if metric == "pct_peak":
                vals.append((k[2], f"{k[1]}, {where}"))
                continue
            p = self.torch.get((shape, ctx, batch))
            if p is None:
                missing.append(where + " (no PyTorch time)")
                continue
            vals.append((p[0] / k[0], f"{k[1]}, {where}"))
        rec = {"goal": name, "metric": metric, "target": target, "cases": len(cases)}
        if not vals:
            rec.update(value=None, met=None, missing=missing)
            self.rows.append((name, "not measured", "-", rec))
            return
        v, at = min(vals)
        met = v >= target and not missing
        unit = "%" if metric == "pct_peak" else "x"
        text = f"{v:.2f}{unit} (worst: {at})"
        if missing:
            text += f"; {len(missing)} of {len(cases)} cases not measured"
        rec.update(value=v, worst=at, met=met, missing=missing)
        self.rows.append((name, text, "met" if met else "missed", rec))


def evaluate(bench, peer):
    g = Goals(bench, peer)
    vs = "vs PyTorch SDPA bf16 (same run)"
    for shape in (MAIN_SHAPE, SMOLLM2_SHAPE):
        s = f"{shape}: "
        g.worst(s + f"kvq bf16 >= 0.95x {vs}, ctx >= 8k, batch 1/16/64", 0.95,
                [(shape, "bf16", c, b) for c in (8192, 32768, 131072) for b in (1, 16, 64)],
                "vs_torch")
        g.worst(s + "kvq bf16 >= 85% of peak, ctx 32k/128k, batch 16/64", 85.0,
                [(shape, "bf16", c, b) for c in (32768, 131072) for b in (16, 64)], "pct_peak")
        for kind, big, one in (("kivi2", 4.0, 2.5), ("kivi4", 2.6, 2.0),
                               ("fp8_e4m3_tensor", 1.8, 1.5), ("fp8_e4m3_token", 1.8, 1.5)):
            g.worst(s + f"{kind} >= {big}x {vs}, ctx 32k/128k, batch 16/64", big,
                    [(shape, kind, c, b) for c in (32768, 131072) for b in (16, 64)], "vs_torch")
            g.worst(s + f"{kind} >= {one}x {vs}, ctx 32k/128k, batch 1", one,
                    [(shape, kind, c, 1) for c in (32768, 131072)], "vs_torch")
        g.worst(s + f"every kvq kind >= 1.0x {vs}, ctx 1k-4k, batch 1", 1.0,
                [(shape, kind, c, 1) for kind in ("bf16", "fp8_e4m3_tensor", "fp8_e4m3_token",
                                                  "kivi4", "kivi2") for c in (1024, 4096)],
                "vs_torch")
    return g


def main(argv):
    args = [a for a in argv if not a.startswith("--")]
    out_json = None
    if "--json" in argv:
        i = argv.index("--json")
        if i + 1 >= len(argv):
            print("attention_goals: --json needs a path", file=sys.stderr)
            return 1
        out_json = argv[i + 1]
        args = [a for a in args if a != out_json]
    if len(args) != 2:
        print("usage: attention_goals.py BENCH.json PEER.json [--json OUT.json]", file=sys.stderr)
        return 64
    try:
        bench = load(args[0])
        peer = load(args[1]) if args[1] != "-" else None
    except SystemExit as e:
        print(e, file=sys.stderr)
        return 1
    g = evaluate(bench, peer)
    if peer is None or peer.get("skipped") or not g.torch:
        why = (peer or {}).get("skipped", "no PyTorch peer timings")
        print(f"PyTorch peer: {why}; the goals against it are not measured.\n")
    else:
        print(f"PyTorch {peer.get('torch', '?')} on {peer.get('device', '?')}, same run.\n")
    print("| goal | value | met |")
    print("|---|---|---|")
    for name, text, met, _ in g.rows:
        print(f"| {name} | {text} | {met} |")
    if out_json:
        with open(out_json, "w") as f:
            json.dump({"torch": (peer or {}).get("torch"), "goals": [r[3] for r in g.rows]}, f,
                      indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
