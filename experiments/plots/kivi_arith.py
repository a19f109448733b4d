#!/usr/bin/env python3
"""KIVI's own arithmetic (arith=fp16) against kvq's exact definition on SmolLM2's real K/V.

For every layer's keys (post-RoPE, per channel) and values (per token), rounded to fp16 as
KIVI's fp16 model holds them, it quantizes with `int<B>:k=channel,v=token,g=32,r=0` and the same
spec with `arith=fp16`, then reports the share of elements that read back bit-identical, and
the mean squared error of each against the fp16 input. Prints a markdown table (the one in
docs/results.md, "KIVI's own arithmetic").

Run (after scripts/setup.sh):
    .venv/bin/python experiments/plots/kivi_arith.py [--tokens 1024] [--bits 2 4]
"""

import argparse

import numpy as np

import kvq


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=1024, help="KJV tokens to run (default 1024)")
    ap.add_argument("--bits", type=int, nargs="+", default=[2, 4], help="bit widths (2 4)")
    ap.add_argument("--model", default=None, help="GGUF (default: kvq.model_path())")
    args = ap.parse_args()
    if args.tokens < 32:
        ap.error("--tokens must be >= 32 (one key group)")
    m = kvq.Model(args.model)
    layers = m.dump_kv(kvq.read_text("kjv"), max_tokens=args.tokens)
    print(f"SmolLM2, {args.tokens} KJV tokens, {len(layers)} layers, g=32, r=0, fp16 input\n")
    print("| bits | side | elements equal (min / mean / max over layers) | MSE fp16 / exact |")
    print("|---|---|---|---|")
    for bits in args.bits:
        base = f"int{bits}:k=channel,v=token,g=32,r=0"
        for role, name in (("key", "k"), ("value", "v")):
            equal, ratio = [], []
            for lay in layers:
                x = lay[name].astype(np.float16).astype(np.float32)
                t = x.shape[0] // 32 * 32  # whole key groups only (r=0 keeps the rest exact)
                x = x[:t]
                exact, se = kvq.quantize(x, base, role=role)
                kivi, sk = kvq.quantize(x, base + ",arith=fp16", role=role)
                equal.append(float(np.mean(exact.view(np.uint32) == kivi.view(np.uint32))))
                ratio.append(sk["mse"] / se["mse"])
            e = np.array(equal) * 100
            print(f"| {bits} | {role} | {e.min():.1f}% / {e.mean():.1f}% / {e.max():.1f}% | "
                  f"{min(ratio):.4f} .. {max(ratio):.4f} |")


if __name__ == "__main__":
    main()
