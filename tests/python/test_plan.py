"""kvq.plan: the CLI's planner, checked by hand and against `kvq plan --json`."""
import json

import pytest

import kvq


def test_bytes_per_token_by_hand():
    # Llama 3.1 8B: 32 layers x 8 kv heads x 128 channels x (K and V) x 2 bytes = 131,072.
    rows = kvq.plan(model="llama-3.1-8b", gpu="h100-sxm", kv=["bf16", "kivi2"])
    assert [r["kv"] for r in rows] == ["bf16", "kivi2"]
    assert rows[0]["bytes_per_token"] == 131072.0
    assert rows[0]["speedup_vs_bf16"] == 1.0
    assert rows[1]["bytes_per_token"] < rows[0]["bytes_per_token"] / 4


@pytest.mark.parametrize("kwargs,flags", [
    ({}, []),  # the design note's scenario
    ({"model": "llama-3.1-70b", "gpu": "h200", "ctx": 32768, "mem": "60GB"},
     ["--model", "llama-3.1-70b", "--gpu", "h200", "--ctx", "32768", "--mem", "60GB"]),
    ({"layers": 30, "kv_heads": 3, "head_dim": 64, "params": 0.135, "bandwidth": 0.3, "mem": 8,
      "kv": ["fp32", "kivi4", "fp8_e4m3:gran=token"], "weights_dtype": "fp8"},
     ["--layers", "30", "--kv-heads", "3", "--head-dim", "64", "--params", "0.135",
      "--bandwidth", "0.3", "--mem", "8", "--kv", "fp32", "kivi4", "fp8_e4m3:gran=token",
      "--weights-dtype", "fp8"]),
])
def test_same_report_as_cli(cli, kwargs, flags):
    want = json.loads(cli("plan", *flags, "--json").stdout)
    got = kvq.plan(**kwargs, full=True)
    assert got == want
    assert kvq.plan(**kwargs) == want["rows"]


@pytest.mark.parametrize("kwargs,match", [
    ({"model": "llama-9"}, "llama-3.1-8b"),  # lists the presets
    ({"ctx": "4096"}, "whole number"),
    ({"ctx": 0}, "ctx"),
    ({"kv": ["kivi9"]}, "bits"),
    ({"mem": "lots"}, "mem"),
])
def test_bad_arguments(kwargs, match):
    with pytest.raises(kvq.Error, match=match):
        kvq.plan(**kwargs)
