"""Model.logits, diverge, needle and calibrate (issue 50): each equals its `kvq model` command's
output bit for bit (the same C++ runs behind both), and float64 arrays are read as the CLI reads
a float64 npy."""
import json

import numpy as np
import pytest

import kvq
from conftest import outlier_keys


@pytest.fixture(scope="module")
def text():
    try:
        return kvq.read_text("kjv")
    except kvq.Error as e:
        pytest.skip(f"no text: {e}")


def test_logits_equal_the_cli_npy(model, cli, tmp_path, text):
    cli("model", "logits", "--text", "kjv", "--max-tokens", 48, "--kv", "kivi2:g=16,r=16",
        "--out", tmp_path / "l.npy", "--ids-out", tmp_path / "ids.json")
    want = np.load(tmp_path / "l.npy")
    got = model.logits(text, kv="kivi2:g=16,r=16", max_tokens=48)
    assert got.dtype == np.float32 and got.shape == (48, model.config["vocab"])
    assert np.array_equal(got, want)
    # token ids as input give the same pass
    ids = json.loads((tmp_path / "ids.json").read_text())
    assert ids == model.encode(text, max_tokens=48)
    assert np.array_equal(model.logits(ids, kv="kivi2:g=16,r=16"), want)
    # the default scheme is the CLI's default (kvq.DEFAULT_KV)
    cli("model", "logits", "--text", "kjv", "--max-tokens", 8, "--out", tmp_path / "d.npy")
    assert np.array_equal(model.logits(text, max_tokens=8), np.load(tmp_path / "d.npy"))
    with pytest.raises(kvq.Error, match="exceed the model's context"):
        model.logits(list(range(10)) * 1000, kv="fp32", max_tokens=0)


def test_diverge_equals_the_cli_json(model, cli, tmp_path):
    prompt = "The capital of France is"
    cli("model", "diverge", "--kv", "kivi2:g=8,r=0", "--prompt", prompt, "-n", 12, "--json",
        tmp_path / "d.json")
    want = json.loads((tmp_path / "d.json").read_text())
    got = model.diverge(prompt, kv="kivi2:g=8,r=0", n=12)
    for key in ("kv", "vs", "prompt_tokens", "ref", "test", "first_diff", "top1"):
        assert got[key] == want[key], key
    assert len(got["ref"]) == 12
    # fp32 against itself never diverges
    same = model.diverge(prompt, kv="fp32", n=4)
    assert same["first_diff"] == -1 and same["top1"] == 1.0 and same["ref"] == same["test"]
    with pytest.raises(kvq.Error, match="n must be at least 1"):
        model.diverge(prompt, n=0)


def test_needle_equals_the_cli_rows(model, cli, tmp_path):
    cli("model", "needle", "--kv", "kivi2", "--ctx", 256, "--depth", "0.2,0.8", "--trials", 2,
        "--seed", 7, "--json", tmp_path / "n.json")
    want = json.loads((tmp_path / "n.json").read_text())["rows"]
    got = model.needle(kv="kivi2", ctx=256, depth=[0.2, 0.8], trials=2, seed=7)
    assert got == want
    assert [(r["ctx"], r["depth"]) for r in got] == [(256, 0.2)] * 2 + [(256, 0.8)] * 2
    assert len({r["key"] for r in got}) == 4  # a fresh key per case
    with pytest.raises(kvq.Error, match=r"depth 1.5 outside \[0, 1\]"):
        model.needle(ctx=256, depth=1.5)
    with pytest.raises(kvq.Error, match=r"ctx 100 outside \[256, "):
        model.needle(ctx=100)


def test_calibrate_writes_the_cli_file_byte_for_byte(model, cli, tmp_path, text):
    cli("model", "calibrate", "--text", "kjv", "--skip-tokens", 40, "--max-tokens", 100, "--ctx",
        64, "--out", tmp_path / "cli.json")
    c = model.calibrate(skip_tokens=40, max_tokens=100, ctx=64, out=tmp_path / "py.json")
    assert (tmp_path / "py.json").read_bytes() == (tmp_path / "cli.json").read_bytes()
    file = json.loads((tmp_path / "cli.json").read_text())
    layers, heads = model.config["layers"], model.config["kv_heads"]
    assert c["k_amax"].shape == c["v_amax"].shape == (layers, heads)
    assert c["k_amax"].tolist() == [entry["k_amax"] for entry in file["layers"]]
    assert c["v_amax"].tolist() == [entry["v_amax"] for entry in file["layers"]]
    assert c["source"] == file["source"] and "after the first 40" in c["source"]
    # the text given as a string, one window of 64: the amax of dump_kv over those tokens
    ids = model.encode(text, max_tokens=64)
    d = model.calibrate(text, max_tokens=64, ctx=64)
    layers_kv = model.dump_kv(ids)
    assert np.array_equal(d["k_amax"][5], np.abs(layers_kv[5]["k"]).max(axis=(0, 2)))
    assert d["source"].startswith("text: 64 tokens")
    with pytest.raises(kvq.Error, match="leaves none"):
        model.calibrate("In the beginning", skip_tokens=50)


def test_float64_is_read_as_the_cli_reads_a_float64_npy(cli, tmp_path, rng):
    x = outlier_keys(rng, tokens=96, heads=2, dim=64).astype(np.float64)
    x += 1e-9  # not exactly representable: the conversion rounds
    np.save(tmp_path / "x.npy", x)
    cli("quant", "--kv", "kivi2:g=32,r=0", "--role", "key", tmp_path / "x.npy",
        tmp_path / "out.npy", "--json", tmp_path / "s.json")
    got, stats = kvq.quantize(x, "kivi2:g=32,r=0", role="key")
    assert np.array_equal(got, np.load(tmp_path / "out.npy"))
    assert stats["nmse"] == json.loads((tmp_path / "s.json").read_text())["nmse"]
    # the same as converting to float32 first (nearest, as numpy's astype and a C++ cast)
    assert np.array_equal(got, kvq.quantize(x.astype(np.float32), "kivi2:g=32,r=0")[0])
    rows = kvq.compare(x, ["kivi4", "fp8"])
    assert [r["scheme"] for r in rows] == ["kivi4:g=32,r=128", "fp8_e4m3:gran=tensor,scale=dynamic"]
    c = kvq.Cache("kivi2", heads=2, head_dim=64)
    c.append(x, x)
    q = rng.standard_normal((4, 64))  # float64 query
    assert np.array_equal(c.attend(q), c.attend(q.astype(np.float32)))
    big = x.copy()
    big[3, 1, 5] = 1e39  # finite in float64, inf in float32: refused, naming the place
    with pytest.raises(kvq.Error, match=r"x: float64 value 1e\+39 at index \(3, 1, 5\) is beyond"):
        kvq.quantize(big, "kivi2")
    with pytest.raises(kvq.Error, match="dtype int64 is not supported"):
        kvq.quantize(np.zeros((4, 8), dtype=np.int64), "kivi2")
