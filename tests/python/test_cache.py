"""kvq.Cache: streaming appends, attention over the stored codes (decode and causal, GQA) against
numpy written here, chunked == token by token, footprints by hand."""
import numpy as np
import pytest

import kvq
from conftest import attention_numpy, outlier_keys

T, H, D, QH = 200, 2, 64, 8  # GQA 4


def kv(rng, tokens=T):
    return outlier_keys(rng, tokens, H, D), rng.standard_normal((tokens, H, D), dtype=np.float32)


@pytest.mark.parametrize("backend", ["cpu", "ref"])
def test_decode_fp32_matches_numpy(rng, backend):
    k, v = kv(rng)
    c = kvq.Cache("fp32", H, D, backend=backend)
    c.append(k, v)
    q = rng.standard_normal((QH, D), dtype=np.float32)
    o = c.attend(q)
    assert o.shape == (QH, D) and o.dtype == np.float32
    # Outputs are convex combinations of V rows: float32 rounding, well below 1e-5 of max |V|.
    assert np.abs(o - attention_numpy(q, k, v)).max() <= 1e-5 * np.abs(v).max()


@pytest.mark.parametrize("spec", ["kivi2", "kivi4:g=32,r=64", "fp8_e4m3:gran=token", "bf16",
                                  "k=kivi2;v=fp8_e4m3:gran=token", "kivi2:rot=hadamard:3,sink=4",
                                  "fp8_e4m3:gran=token,rot=hadamard"])
@pytest.mark.parametrize("backend", ["cpu", "ref"])
def test_decode_reads_what_dequantize_returns(rng, spec, backend):
    # Attention over the codes equals numpy attention over the values the cache reads back.
    k, v = kv(rng)
    c = kvq.Cache(spec, H, D, backend=backend)
    c.append(k, v)
    kd, vd = c.dequantize()
    assert kd.shape == vd.shape == (T, H, D)
    q = rng.standard_normal((QH, D), dtype=np.float32)
    assert np.abs(c.attend(q) - attention_numpy(q, kd, vd)).max() <= 2e-5 * np.abs(vd).max()


@pytest.mark.parametrize("spec", ["kivi2", "kivi4:g=32,r=64", "fp8_e4m3:gran=tensor", "int2",
                                  "kivi2:sink=5,rot=hadamard"])
def test_streaming_equals_one_append(rng, spec):
    k, v = kv(rng)
    whole = kvq.Cache(spec, H, D)
    whole.append(k, v)
    parts = kvq.Cache(spec, H, D)
    for a, b in [(0, 1), (1, 8), (8, 45), (45, 130), (130, T)]:
        parts.append(k[a:b], v[a:b])
    assert parts.tokens == whole.tokens == T
    for x, y in zip(parts.dequantize(), whole.dequantize()):
        assert np.array_equal(x.view(np.uint32), y.view(np.uint32))
    assert parts.footprint() == whole.footprint()


@pytest.mark.parametrize("spec", ["kivi2", "fp8_e4m3:gran=head", "fp32", "k=fp8;v=kivi4:g=32,r=64",
                                  "kivi2:rot=hadamard:2,sink=3"])
@pytest.mark.parametrize("backend", ["cpu", "ref"])
def test_causal_equals_token_by_token_decode(rng, spec, backend):
    # Position t of a causal call sees the cache a decode holding t + 1 tokens has: within one
    # backend the two are bit-identical (kernels/cpu/attention.h; reference_cpu/attention.h).
    n = 150
    k, v = kv(rng, n)
    q = rng.standard_normal((n, QH, D), dtype=np.float32)
    c = kvq.Cache(spec, H, D, backend=backend)
    c.append(k, v)
    causal = c.attend(q)
    assert causal.shape == (n, QH, D)
    d = kvq.Cache(spec, H, D, backend=backend)
    for t in range(n):
        d.append(k[t:t + 1], v[t:t + 1])
        assert np.array_equal(d.attend(q[t]), causal[t]), f"position {t}"


def test_causal_fp32_matches_numpy(rng):
    n = 64
    k, v = kv(rng, n)
    q = rng.standard_normal((n, QH, D), dtype=np.float32)
    c = kvq.Cache("fp32", H, D)
    c.append(k, v)
    o = c.attend(q)
    for t in range(n):
        ref = attention_numpy(q[t], k[:t + 1], v[:t + 1])
        assert np.abs(o[t] - ref).max() <= 1e-5 * np.abs(v).max()


def test_causal_over_part_of_the_last_append(rng):
    k, v = kv(rng, 96)
    q = rng.standard_normal((96, QH, D), dtype=np.float32)
    c = kvq.Cache("kivi2", H, D)
    c.append(k[:40], v[:40])
    c.append(k[40:], v[40:])
    full = kvq.Cache("kivi2", H, D)
    full.append(k, v)
    # The last 16 positions, asked of a cache built in two appends and of one built at once.
    assert np.array_equal(c.attend(np.ascontiguousarray(q[80:])), full.attend(q)[80:])


def test_cpu_and_ref_agree(rng):
    k, v = kv(rng)
    q = rng.standard_normal((QH, D), dtype=np.float32)
    outs = []
    for b in ["cpu", "ref"]:
        c = kvq.Cache("kivi2", H, D, backend=b)
        c.append(k, v)
        outs.append(c.attend(q))
    # Same codes, float arithmetic in another order (tolerance of kernels/cpu/attention.h).
    assert np.abs(outs[0] - outs[1]).max() <= 2e-5 * np.abs(v).max()


def test_int8_mode_close_to_exact(rng):
    # Keys without outlier channels: the int8 rounding of q * scale is the only difference.
    k = rng.standard_normal((T, H, D), dtype=np.float32)
    v = rng.standard_normal((T, H, D), dtype=np.float32)
    q = rng.standard_normal((QH, D), dtype=np.float32)
    exact, int8 = kvq.Cache("kivi2", H, D), kvq.Cache("kivi2", H, D, int_mode="int8")
    for c in (exact, int8):
        c.append(k, v)
    # int8-rounded q * scale: 0.7-4% of max |V| on real keys (docs/benchmarks.md)
    diff = np.abs(exact.attend(q) - int8.attend(q)).max()
    assert 0 < diff <= 0.04 * np.abs(v).max()


def test_footprint_by_hand(rng):
    # kivi2 on [256, 8, 128]: 2-bit codes 256*8*128/4 = 65,536 bytes; per-channel key groups of
    # 32 tokens: 256/32 * 8 * 128 fp16 scales = 16,384 bytes, the same for minima: 3.0 bits.
    x = rng.standard_normal((256, 8, 128), dtype=np.float32)
    c = kvq.Cache("kivi2:g=32,r=0", 8, 128)
    c.append(x, x)
    f = c.footprint()["key"]
    assert (f["code_bytes"], f["scale_bytes"], f["zero_bytes"], f["residual_bytes"]) == (
        65536, 16384, 16384, 0)
    assert f["effective_bits"] == 3.0
    assert kvq.Cache("bf16", 8, 128).footprint()["value"]["total_bytes"] == 0


def test_split_cache_stores_each_side_as_its_scheme(rng):
    # Keys as kivi2 and values as fp8 per token: each side reads back what a one-scheme cache of
    # that scheme reads back, bit for bit.
    k, v = kv(rng)
    split = kvq.Cache("k=kivi2;v=fp8_e4m3:gran=token", H, D)
    split.append(k, v)
    kd, vd = split.dequantize()
    kk, vv = kvq.Cache("kivi2", H, D), kvq.Cache("fp8_e4m3:gran=token", H, D)
    kk.append(k, v)
    vv.append(k, v)
    assert np.array_equal(kd, kk.dequantize()[0]) and np.array_equal(vd, vv.dequantize()[1])
    f = split.footprint()
    assert f["key"] == kk.footprint()["key"] and f["value"] == vv.footprint()["value"]


def test_one_head_takes_two_dimensional_rows(rng):
    x = rng.standard_normal((10, D), dtype=np.float32)
    c = kvq.Cache("fp32", 1, D)
    c.append(x, x)
    assert c.tokens == len(c) == 10


@pytest.mark.parametrize("call,match", [
    (lambda c, r: c.attend(r.standard_normal((QH, D), dtype=np.float32)), "empty"),
    (lambda c, r: c.append(np.zeros((3, H + 1, D), np.float32), np.zeros((3, H + 1, D), np.float32)),
     r"\[n, 2, 64\]"),
    (lambda c, r: c.append(np.zeros((3, H, D), np.float32), np.zeros((4, H, D), np.float32)),
     "3 tokens but v has 4"),
    (lambda c, r: c.append(np.zeros((3, D), np.float32), np.zeros((3, D), np.float32)),
     "one-head cache"),
])
def test_bad_calls(rng, call, match):
    with pytest.raises(kvq.Error, match=match):
        call(kvq.Cache("kivi2", H, D), rng)


def test_bad_queries(rng):
    k, v = kv(rng, 20)
    c = kvq.Cache("kivi2", H, D)
    c.append(k, v)
    with pytest.raises(kvq.Error, match="not a multiple"):
        c.attend(np.zeros((3, D), np.float32))
    with pytest.raises(kvq.Error, match="head_dim 32"):
        c.attend(np.zeros((QH, 32), np.float32))
    with pytest.raises(kvq.Error, match="latest append"):
        c.attend(np.zeros((21, QH, D), np.float32))


@pytest.mark.parametrize("kwargs,match", [
    ({"backend": "gpu"}, "backend 'gpu'"),
    ({"int_mode": "int4"}, "int_mode"), ({"backend": "ref", "int_mode": "int8"}, "backend cpu"),
])
def test_bad_options(kwargs, match):
    with pytest.raises(kvq.Error, match=match):
        kvq.Cache("kivi2", H, D, **kwargs)
