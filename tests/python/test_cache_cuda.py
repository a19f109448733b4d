"""kvq.Cache(..., backend="cuda") and kvq.backends(): the support table's refusals (no device
needed), the missing device in one line, and on a device the stored footprint and decode attention
against backend ref over the same appends (tests/cuda/attention_kernel_test.cu's tolerance: float32
in another order, int caches folding scales differently: max |error| <= 1e-4 x max |V|)."""
import numpy as np
import pytest

import kvq
from conftest import outlier_keys

T, H, D, QH = 300, 2, 64, 6  # GQA 3


def _cuda():
    return next(b for b in kvq.backends() if b["name"] == "cuda")


def test_backends_table_in_order():
    table = kvq.backends()
    assert [b["name"] for b in table] == ["ref", "cpu", "cpu-int8", "cuda"]
    for b in table[:3]:
        assert b["host_memory"] and b["decode"] and b["causal"] and b["model"] and b["sink"]
        assert b["unavailable"] == ""
    c = _cuda()
    # the model runs on it (model/llama_cuda.cpp, prompts in chunks), not with pre-RoPE keys
    assert c["decode"] and c["causal"] and c["model"] and not c["pre_rope"]
    assert not c["sink"] and c["rot"]
    assert not c["host_memory"]
    assert c["unavailable"] == "" or c["unavailable"].startswith("backend cuda: ")


@pytest.mark.parametrize("spec,why", [
    ("kivi2:sink=4", "sink=S"), ("fp32", "fp32 caches"), ("fp8_e4m3", "dynamic fp8 scales"),
    ("k=kivi2;v=kivi4", "different kinds, bits"),
])
def test_cuda_refuses_what_its_table_does_not_run(spec, why):
    # checked before any device is touched: the same line with or without a GPU
    with pytest.raises(kvq.Error, match=why + r".*\(backends that can: ref, cpu, cpu-int8\)"):
        kvq.Cache(spec, H, D, backend="cuda")


def test_cuda_without_device_is_one_line():
    line = _cuda()["unavailable"]
    if not line:
        pytest.skip("a CUDA device is present")
    with pytest.raises(kvq.Error) as e:
        kvq.Cache("kivi2", H, D, backend="cuda")
    assert str(e.value) == line and "\n" not in line


@pytest.mark.parametrize("spec", ["kivi2", "kivi4:g=32,r=64", "bf16", "fp8_e4m3:gran=token",
                                  "kivi2:rot=hadamard:3"])
def test_cuda_decode_and_causal_match_ref(rng, spec):
    line = _cuda()["unavailable"]
    if line:
        pytest.skip(line)
    k = outlier_keys(rng, T, H, D)
    v = rng.standard_normal((T, H, D), dtype=np.float32)
    q = rng.standard_normal((QH, D), dtype=np.float32)
    ref, dev = kvq.Cache(spec, H, D, backend="ref"), kvq.Cache(spec, H, D, backend="cuda")
    for n0, n1 in [(0, 1), (1, 120), (120, 121), (121, T)]:  # ragged appends
        for c in (ref, dev):
            c.append(k[n0:n1], v[n0:n1])
        o = dev.attend(q)
        assert o.shape == (QH, D) and o.dtype == np.float32 and np.isfinite(o).all()
        assert np.abs(o - ref.attend(q)).max() <= 1e-4 * np.abs(v).max()
        assert dev.footprint() == ref.footprint() and dev.tokens == n1
        # causal over the latest append's positions (chunked prefill on cuda), same tolerance
        qc = rng.standard_normal((n1 - n0, QH, D), dtype=np.float32)
        oc = dev.attend(qc)
        assert oc.shape == (n1 - n0, QH, D) and np.isfinite(oc).all()
        assert np.abs(oc - ref.attend(qc)).max() <= 1e-4 * np.abs(v).max()
    with pytest.raises(kvq.Error, match="device memory"):
        dev.dequantize()
