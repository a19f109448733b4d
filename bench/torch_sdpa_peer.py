#!/usr/bin/env python3
"""PyTorch's decode attention on the GPU at bench_attention_cuda's shapes: the peer kvq's kernels
are measured against in scripts/device-check.sh (issue 46).

Per (shape, context, batch): torch.nn.functional.scaled_dot_product_attention over a bf16 cache,
one query token per sequence, every sequence at the full context, asked two ways (32 query heads
with enable_gqa=True, or each kv head's GQA group as that many query rows) under each of the
flash / efficient / cuDNN backends that accepts the call; the fastest is the case's "best" row.
Timing as bench_attention_cuda: before every timed call the L2 is flushed by a memset of
max(4 x L2, 64 MB), CUDA events around the call, the median of --reps runs after --warmup.
Bytes read = K and V (2 x batch x kv_heads x ctx x head_dim x 2 bytes); GB/s = 10^9 bytes/s.

Shapes are KVxDxG (kv heads x head_dim x GQA ratio): 8x128x4 (bench_attention_cuda's default)
and 3x64x3 (SmolLM2-135M) by default.

Without PyTorch, or without a CUDA device visible to it, prints one line saying so, writes
{"skipped": reason} to OUT.json and exits 2 (device-check.sh reports it as skipped).

Usage: python3 bench/torch_sdpa_peer.py OUT.json [--shapes 8x128x4,3x64x3]
           [--contexts 1024,8192,32768,131072] [--batches 1,16,64] [--reps 7] [--warmup 2]
           [--budget-s 120]
"""
import argparse
import json
import statistics
import sys
import time

NO_DEVICE_EXIT = 2
BAD_ARGS_EXIT = 64  # (argparse's own 2 would read as "skipped")


class Parser(argparse.ArgumentParser):
    def error(self, message):
        print(f"torch_sdpa_peer: {message}", file=sys.stderr)
        sys.exit(BAD_ARGS_EXIT)


def positive_list(text):
    out = []
    for item in text.split(","):
        if not item:
            continue
        if not item.isdigit() or int(item) <= 0:
            raise argparse.ArgumentTypeError(f"'{item}' is not a positive integer")
        out.append(int(item))
    if not out:
        raise argparse.ArgumentTypeError("empty list")
    return out


def shape_list(text):
    out = []
    for item in text.split(","):
        parts = item.split("x")
        if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
            raise argparse.ArgumentTypeError(f"'{item}' is not KVxDxG (e.g. 8x128x4)")
        out.append(tuple(int(p) for p in parts))
    return out


def parse_args(argv):
    p = Parser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", help="JSON output path")
    p.add_argument("--shapes", type=shape_list, default=[(8, 128, 4), (3, 64, 3)])
    p.add_argument("--contexts", type=positive_list, default=[1024, 8192, 32768, 131072])
    p.add_argument("--batches", type=positive_list, default=[1, 16, 64])
    p.add_argument("--reps", type=positive_list, default=[7])
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--budget-s", type=float, default=120.0,
                   help="stop starting new cases after this many seconds (the rest: skipped)")
    a = p.parse_args(argv)
    a.reps = a.reps[0]
    if a.warmup < 0:
        p.error("--warmup must be >= 0")
    return a


def skip(out_path, reason):
    print(f"torch_sdpa_peer: {reason}; skipped", file=sys.stderr)
    with open(out_path, "w") as f:
        json.dump({"bench": "torch_sdpa_peer", "skipped": reason}, f)
        f.write("\n")
    return NO_DEVICE_EXIT


def main(argv):
    a = parse_args(argv)
    try:
        import torch
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except Exception as e:  # ImportError, or a broken install
        return skip(a.out, f"PyTorch is not available ({type(e).__name__}: {e})")
    if not torch.cuda.is_available():
        return skip(a.out, f"no CUDA device visible to PyTorch {torch.__version__}")

    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(dev)
    l2 = int(getattr(props, "L2_cache_size", 0) or (60 << 20))
    flush_bytes = max(4 * l2, 64 << 20)
    flush = torch.empty(flush_bytes, dtype=torch.uint8, device=dev)
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def median_us(fn):
        ts = []
        for r in range(a.warmup + a.reps):
            flush.fill_(r & 0xFF)
            start.record()
            fn()
            stop.record()
            stop.synchronize()
            if r >= a.warmup:
                ts.append(start.elapsed_time(stop) * 1e3)
        return statistics.median(ts)

    backends = {
        "flash": SDPBackend.FLASH_ATTENTION,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
        "cudnn": SDPBackend.CUDNN_ATTENTION,
    }
    t_end = time.time() + a.budget_s
    print(f"# PyTorch {torch.__version__} SDPA, bf16 cache, {torch.cuda.get_device_name(dev)}\n")
    print("| shape | ctx | batch | time (us) | GB/s | best backend |")
    print("|---|---:|---:|---:|---:|---|", flush=True)
    rows, best, skipped = [], [], []
    free_bytes = torch.cuda.mem_get_info()[0]
    for kv, d, g in a.shapes:
        for ctx in a.contexts:
            for batch in a.batches:
                case = {"shape": f"{kv}x{d}x{g}", "kv_heads": kv, "head_dim": d, "gqa": g,
                        "ctx": ctx, "batch": batch}
                nbytes = 2 * batch * kv * ctx * d * 2
                if time.time() > t_end:
                    skipped.append(dict(case, reason=f"--budget-s {a.budget_s:g} spent"))
                    continue
                if nbytes * 1.1 + (256 << 20) > free_bytes:
                    skipped.append(dict(case, reason=f"needs {nbytes / 1e9:.1f} GB, "
                                                     f"{free_bytes / 1e9:.1f} GB free"))
                    continue
                gen = torch.Generator(device=dev).manual_seed(ctx * 131 + batch)
                q = torch.randn(batch, kv * g, 1, d, dtype=torch.bfloat16, device=dev, generator=gen)
                k = torch.randn(batch, kv, ctx, d, dtype=torch.bfloat16, device=dev, generator=gen)
                v = torch.randn(batch, kv, ctx, d, dtype=torch.bfloat16, device=dev, generator=gen)
                qg = q.reshape(batch, kv, g, d)  # each kv head's group as g query rows
                calls = {
                    "gqa": lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True),
                    "rows": lambda: F.scaled_dot_product_attention(qg, k, v),
                }
                fastest = None
                for bname, be in backends.items():
                    for how, fn in calls.items():
                        row = dict(case, backend=bname, how=how)
                        try:
                            with sdpa_kernel([be]):
                                fn()
                                torch.cuda.synchronize()
                                t = median_us(fn)
                        except Exception as e:  # a backend that refuses the shape
                            row["error"] = (str(e).splitlines() or [type(e).__name__])[0][:200]
                            rows.append(row)
                            continue
                        row.update(time_us=t, bytes=nbytes, gbps=nbytes / (t * 1e-6) / 1e9)
                        rows.append(row)
                        if fastest is None or t < fastest["time_us"]:
                            fastest = row
                if fastest is None:
                    skipped.append(dict(case, reason="no SDPA backend accepted the call"))
                else:
                    best.append(fastest)
                    print(f"| {case['shape']} | {ctx} | {batch} | {fastest['time_us']:.1f} | "
                          f"{fastest['gbps']:.0f} | {fastest['backend']}/{fastest['how']} |",
                          flush=True)
                del q, k, v, qg
                torch.cuda.empty_cache()

    out = {
        "bench": "torch_sdpa_peer",
        "device": torch.cuda.get_device_name(dev),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "l2_bytes": l2,
        "l2_flush_bytes": flush_bytes,
        "reps": a.reps,
        "warmup": a.warmup,
        "best": best,
        "rows": rows,
        "skipped": skipped,
    }
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
