"""kvq.quantize and kvq.compare: bit-equal to `kvq quant` on the same npy; error bounds and
roundings from their definitions; bad inputs."""
import json

import numpy as np
import pytest

import kvq
from conftest import outlier_keys

SPECS = ["bf16", "fp16", "fp8_e4m3:gran=head", "fp8_e5m2:gran=token", "fp8_e4m3:gran=channel",
         "kivi2", "kivi4:g=32,r=64", "int3:k=token,v=channel,g=32,r=0", "int8:k=channel,v=token,sym"]


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("role", ["key", "value"])
def test_bit_equal_to_cli(cli, tmp_path, rng, spec, role):
    x = outlier_keys(rng)
    np.save(tmp_path / "x.npy", x)
    cli("quant", "--kv", spec, "--role", role, tmp_path / "x.npy", tmp_path / "y.npy",
        "--json", tmp_path / "s.json")
    y_cli = np.load(tmp_path / "y.npy")
    y, stats = kvq.quantize(x, spec, role=role)
    assert y.dtype == np.float32 and y.shape == x.shape
    assert np.array_equal(y.view(np.uint32), y_cli.view(np.uint32))  # bit for bit
    assert stats == json.loads((tmp_path / "s.json").read_text())


def test_bf16_is_round_to_nearest_even(rng):
    # Independent implementation: bf16 keeps the top 16 bits of the float32, rounded to nearest
    # even on the dropped 16 (finite inputs).
    x = outlier_keys(rng, tokens=64)
    u = x.view(np.uint32).astype(np.uint64)
    want = (((u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000).astype(np.uint32)).view(np.float32)
    y, stats = kvq.quantize(x, "bf16")
    assert np.array_equal(y.view(np.uint32), want.view(np.uint32))
    assert stats["effective_bits"] == 16.0


def test_per_token_int_error_bound(rng):
    # Per-token asymmetric B-bit groups (KIVI values): each element is within half a step of the
    # group's (max - min) / (2^B - 1), plus the fp16 storage of scale and minimum (tolerance).
    x = outlier_keys(rng, tokens=40, heads=2, dim=64)
    y, _ = kvq.quantize(x, "int2:k=token,v=token,g=32,r=0", role="value")
    g = x.reshape(40, 2, 2, 32)
    step = (g.max(-1) - g.min(-1)) / 3.0
    err = np.abs(y - x).reshape(40, 2, 2, 32).max(-1)
    assert np.all(err <= step / 2 * (1 + 4e-3) + 1e-3 * np.abs(g).max(-1))


def test_window_tokens_stay_exact(rng):
    x = outlier_keys(rng, tokens=100)
    y, stats = kvq.quantize(x, "kivi2:g=32,r=64", role="value")  # per-token: last 64 exact
    assert stats["residual_tokens"] == 64
    assert np.array_equal(y[36:], x[36:])
    assert not np.array_equal(y[:36], x[:36])


def test_float16_and_two_dimensional_input(rng):
    x = outlier_keys(rng, tokens=64, heads=1)
    y32, s32 = kvq.quantize(x.astype(np.float16).astype(np.float32), "kivi4")
    y16, s16 = kvq.quantize(x.astype(np.float16), "kivi4")
    assert np.array_equal(y16, y32) and s16 == s32
    y2, _ = kvq.quantize(np.ascontiguousarray(x[:, 0, :]), "kivi4")  # [T, D]: one head
    assert y2.shape == (64, 64)
    assert np.array_equal(y2, kvq.quantize(x, "kivi4")[0][:, 0, :])


def test_compare_rows_are_quantize_reports(rng):
    x = outlier_keys(rng)
    rows = kvq.compare(x, ["fp8", "kivi4", kvq.parse_spec("kivi2")], role="key")
    assert [r["scheme"] for r in rows] == [
        "fp8_e4m3:gran=tensor,scale=dynamic", "kivi4:g=32,r=128", "kivi2:g=32,r=128"]
    for r in rows:
        assert r == kvq.quantize(x, r["scheme"], role="key")[1]
    assert rows[1]["snr_db"] > rows[2]["snr_db"]  # 4 bits beat 2


@pytest.mark.parametrize("bad,match", [
    ([[1.0, 2.0]], "expected a numpy array"),
    (np.full((4, 2, 8), 1e39), "beyond float32.s range"),  # float64 is read; this overflows
    (np.zeros((4, 2, 8), dtype=np.int32), "dtype int32"),
    (np.zeros((8, 2, 4), dtype=np.float32).transpose(2, 1, 0), "not in C order"),
    (np.zeros((2, 2, 2, 8), dtype=np.float32), "2-D or 3-D"),
    (np.zeros((0, 2, 8), dtype=np.float32), "0"),
])
def test_bad_arrays(bad, match):
    with pytest.raises(kvq.Error, match=match):
        kvq.quantize(bad, "kivi2")


def test_non_finite_input_names_the_position():
    x = np.ones((4, 2, 8), dtype=np.float32)
    x[2, 1, 5] = np.nan
    with pytest.raises(kvq.Error, match="token 2, head 1, channel 5"):
        kvq.quantize(x, "kivi2")


def test_bad_role_and_spec(rng):
    x = outlier_keys(rng, tokens=8)
    with pytest.raises(kvq.Error, match="'query'"):
        kvq.quantize(x, "kivi2", role="query")
    with pytest.raises(kvq.Error, match="bits"):
        kvq.compare(x, ["kivi4", "kivi7"])
    with pytest.raises(kvq.Error, match="at least one"):
        kvq.compare(x, [])
