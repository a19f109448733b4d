#!/usr/bin/env python3
"""Writes tests/fixtures/kivi_fp16_arith.json: fp16 K/V groups and the codes, scales and minima
KIVI's own reference quantizers give them, for kvq's `arith=fp16` option (kivi/minmax.h
minmax_params_fp16 / encode_fp16).

What it re-states. KIVI's pure-torch quantizers, `quant_and_pack_kcache` (keys: groups of G
consecutive tokens of one channel) and `quant_and_pack_vcache` (values: groups of G consecutive
channels of one token) in quant/new_pack.py of github.com/jy-yuan/KIVI (commit 150def81), run
on fp16 tensors, compute per group

    mn = min(x); mx = max(x)               # exact
    scale = (mx - mn) / (2**bits - 1)      # two fp16 ops: the range is rounded first
    q = ((x - mn) / scale)                 # two fp16 ops
    code = q.clamp(0, 2**bits - 1).round().to(int32)

Here the same four lines run on numpy float16 arrays. numpy's float16 ufuncs compute each
operation in float32 and round the result once to float16; for +, - and / of float16 operands
that equals the correctly rounded float16 result (24 >= 2 * 11 + 2 bits), which is what torch's
fp16 kernels return on CPU and CUDA. (torch itself is not used: its PyPI wheel brings the CUDA
stack, gigabytes, for four elementwise operations.) round() is round-half-to-even in both. The
one place torch's result depends on the device is a 0/0 quotient (a constant group): clamp keeps
the NaN and the int32 cast gives 0 on CUDA (what KIVI runs on) and INT_MIN on x86; this script
writes CUDA's 0.

The inputs are deterministic: Gaussian channels with KIVI-style outliers, and groups chosen to
hit every rule: a constant group (scale 0), a range so small that the scale rounds to 0 in fp16,
values on a half-step lattice (quotients that land exactly on k + 1/2), subnormal values, and
ranges near fp16's top. Negative zeros are avoided: torch.min's choice between -0 and +0 is not
specified, and kvq takes zeros as +0.

Run (from the repository root; numpy is pinned in experiments/plots/requirements.txt):
    .venv/bin/python experiments/plots/make_kivi_fixtures.py
Option: --out PATH (default tests/fixtures/kivi_fp16_arith.json).
"""

import argparse
import json

import numpy as np

G = 32


def kivi_quant(groups, bits):
    """groups: float16 [n_groups, G]. Returns codes int [n_groups, G], scale, mn (float16 [n])."""
    max_int = 2**bits - 1
    mn = groups.min(axis=-1, keepdims=True)
    mx = groups.max(axis=-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        scale = (mx - mn) / max_int
        q = (groups - mn) / scale
    assert q.dtype == np.float16 and scale.dtype == np.float16
    q = np.clip(q, 0, max_int)
    q = np.round(q)
    q = np.where(np.isnan(q), np.float16(0), q)  # CUDA's float -> int32 cast of NaN
    return q.astype(np.int32), scale[:, 0], mn[:, 0]


def inputs(rng, tokens, heads, dim):
    """A float16 [tokens, heads, dim] tensor (kvq's order) with every special case."""
    x = rng.standard_normal((tokens, heads, dim)).astype(np.float32)
    x[:, :, 3] *= 20.0  # an outlier channel, as keys have
    x[:, :, 7] = 40.0 + 8.0 * x[:, :, 7]
    x[:, 0, 5] = 1.25  # constant channel (per-channel groups: scale 0)
    x[:, 1, 5] = 1.0 + rng.integers(0, 2, tokens) * 2.0**-10  # range one ulp of 1
    x[:, 0, 9] = rng.integers(0, 7, tokens) * 2.0**-24  # subnormals; range/15 and range/255 round to 0
    x[:, 1, 9] = rng.integers(0, 31, tokens) * 0.125  # half-step lattice: exact ties
    x[:, 0, 11] = rng.uniform(-30000.0, 30000.0, tokens)  # near fp16's top
    x[:, 1, 11] = rng.integers(-8, 9, tokens) * 0.5 - 0.25
    x[2, :, :] = 0.75  # constant token (per-token groups: scale 0)
    x[3, 0, :] = rng.integers(0, 7, dim) * 2.0**-24
    x[4, 1, :] = rng.integers(0, 61, dim) * 0.25
    h = x.astype(np.float16)
    h[h == 0] = np.float16(0.0)  # no negative zeros
    return h


def case(h, bits, axis):
    """Codes [T, H, D] and params per group of the kvq tensor h under KIVI's quantizer."""
    T, H, D = h.shape
    if axis == "channel":  # KIVI k: (B, nh, T, D), groups of G tokens per channel
        g = h.transpose(1, 2, 0).reshape(H, D, T // G, G)  # [h][d][group][i]
        codes, scale, mn = kivi_quant(g.reshape(-1, G), bits)
        codes = codes.reshape(H, D, T // G, G).transpose(2, 3, 0, 1).reshape(T, H, D)
        scale = scale.reshape(H, D, T // G).transpose(2, 0, 1)  # [group][h][d]
        mn = mn.reshape(H, D, T // G).transpose(2, 0, 1)
    else:  # KIVI v: (B, nh, T, D), groups of G channels per token
        codes, scale, mn = kivi_quant(h.reshape(-1, G), bits)
        codes = codes.reshape(T, H, D)
        scale = scale.reshape(T, H, D // G)  # [t][h][group]
        mn = mn.reshape(T, H, D // G)
    bits16 = lambda a: a.astype(np.float16).view(np.uint16).ravel().tolist()
    return {
        "bits": bits,
        "axis": axis,
        "group": G,
        "shape": [T, H, D],
        "x_fp16_bits": bits16(h),
        "codes": codes.ravel().tolist(),
        "scale_fp16_bits": bits16(scale),
        "min_fp16_bits": bits16(mn),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="tests/fixtures/kivi_fp16_arith.json")
    args = ap.parse_args()
    rng = np.random.default_rng(20261201)
    cases = []
    for bits in (2, 4, 8):
        cases.append(case(inputs(rng, 64, 2, 32), bits, "channel"))
        cases.append(case(inputs(rng, 16, 2, 64), bits, "token"))
    doc = {
        "generator": "experiments/plots/make_kivi_fixtures.py",
        "numpy": np.__version__,
        "what": "KIVI quant_and_pack_kcache / quant_and_pack_vcache arithmetic on fp16 input; "
        "arrays in kvq's [tokens, heads, dim] order; scale/min per kvq layout group "
        "(channel: [token_group][head][dim], token: [token][head][channel_group])",
        "cases": cases,
    }
    with open(args.out, "w") as f:
        json.dump(doc, f, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {args.out}: {len(cases)} cases")


if __name__ == "__main__":
    main()
