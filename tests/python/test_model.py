"""kvq.Model on the real model (skips without it, as the C++ model tests do): the CLI's numbers,
properties from definitions, Ctrl-C, the GIL released."""
import json
import os
import signal
import struct
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import kvq

TEXT_TOKENS = 192


@pytest.fixture(scope="module")
def text():
    try:
        return kvq.read_text("kjv")
    except kvq.Error as e:
        pytest.skip(f"no text: {e}")


def test_config(model):
    c = model.config
    assert (c["layers"], c["kv_heads"], c["head_dim"], c["heads"]) == (30, 3, 64, 9)  # SmolLM2-135M
    assert "Q4_1" in c["weights"]


def test_encode_decode_round_trip(model):
    s = "In the beginning God created the heaven and the earth."
    ids = model.encode(s)
    assert model.decode(ids) == s
    assert model.encode(s, max_tokens=3) == ids[:3]


def test_first_tokens_of_a_long_text(model, text):
    # encode(max_tokens=n) encodes a prefix cut at a newline: the same ids as the whole text's.
    head = text[:20000]
    assert model.encode(text, max_tokens=700) == model.encode(head)[:700]


def test_ppl_equals_cli(model, cli, tmp_path, text):
    spec = "kivi2:g=16,r=16"
    r = model.ppl(text, kv=["fp32", spec], ctx=64, max_tokens=TEXT_TOKENS, chunk=32)
    # The fp32 cache is the reference itself: no divergence (definition of KL(p || p) = 0).
    assert r[0]["kld"] == 0.0 and r[0]["ppl"] == r[0]["ppl_fp32"] and r[0]["top1"] == 1.0
    assert r[1]["kld"] > 0 and r[1]["scored"] == 3 * 63
    cli("model", "ppl", "--kv", spec, "--text", "kjv", "--ctx", 64, "--max-tokens",
        TEXT_TOKENS, "--chunk", 32, "--json", tmp_path / "p.json")
    want = json.loads((tmp_path / "p.json").read_text())
    for key in ("kv", "ppl", "ppl_fp32", "kld", "kld_p99", "top1", "windows", "scored"):
        assert r[1][key] == want[key], key


def test_layer_preset_row_is_named_and_equals_explicit_layers(model, text):
    # Issue 49 item 5: on SmolLM2's 30 layers @first=1,last=1 is @0,29=fp32 under another name:
    # the same caches, so the same numbers bit for bit; the row keeps the preset's name.
    r = model.ppl(text, kv=["kivi2:g=16,r=16@first=1,last=1", "kivi2:g=16,r=16@0,29=fp32"],
                  ctx=64, max_tokens=TEXT_TOKENS, chunk=32)
    assert r[0]["kv"] == "kivi2:g=16,r=16@first=1,last=1"
    assert r[1]["kv"] == "kivi2:g=16,r=16@0,29=fp32"
    assert r[0]["kld"] > 0
    for key in ("ppl", "kld", "kld_p99", "top1", "quantized"):
        assert r[0][key] == r[1][key], key


def test_generate_equals_cli(model, cli):
    prompt = "The capital of France is"
    out = cli("model", "generate", "--prompt", prompt, "-n", 6, "--kv", "kivi2").stdout
    got = model.generate(prompt, n=6, kv="kivi2")
    assert got and out.rstrip("\n") == got
    assert model.generate(prompt, n=6, kv="kivi2") == got  # greedy: deterministic


def read_safetensors(path):
    """A minimal independent reader: u64 header length, JSON header, raw little-endian data."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        a, b = t["data_offsets"]
        out[name] = np.frombuffer(data[a:b], dtype="<f4").reshape(t["shape"])
    return out


def test_dump_kv_equals_cli_dump(model, cli, tmp_path):
    prompt = "And God said, Let there be light: and there was light."
    layers = model.dump_kv(prompt)
    assert len(layers) == 30
    T = len(model.encode(prompt))
    for d in layers:
        assert d["k"].shape == d["k_pre"].shape == d["v"].shape == (T, 3, 64)
        assert np.array_equal(d["k"][0], d["k_pre"][0])  # RoPE at position 0 is the identity
        assert not np.array_equal(d["k"][1:], d["k_pre"][1:])
    (tmp_path / "p.txt").write_text(prompt)
    cli("model", "dump", "--text", tmp_path / "p.txt", "--out", tmp_path / "kv.safetensors")
    ts = read_safetensors(tmp_path / "kv.safetensors")
    for l in (0, 29):
        for name in ("k", "k_pre", "v"):
            assert np.array_equal(ts[f"layer.{l}.{name}"], layers[l][name])
    # and quantize takes them as they come
    k_hat, stats = kvq.quantize(layers[3]["k"], "kivi2:g=8,r=0")
    assert stats["shape"] == [T, 3, 64] and 0 < stats["nmse"] < 1


def test_calibrate_skip_tokens_equals_amax_of_those_tokens(model, cli, tmp_path, text):
    # `kvq model calibrate --skip-tokens S --max-tokens N` records, per layer and head, the amax of
    # K (post-RoPE) and V over tokens S .. S+N-1 run as one window: the same as the amax of
    # dump_kv on those token ids, computed here in numpy.
    S, N = 40, 24
    cli("model", "calibrate", "--text", "kjv", "--skip-tokens", S, "--max-tokens", N, "--ctx", 64,
        "--out", tmp_path / "c.json")
    cal = json.loads((tmp_path / "c.json").read_text())
    layers = model.dump_kv(model.encode(text, max_tokens=S + N)[S:])
    for l, (entry, d) in enumerate(zip(cal["layers"], layers)):
        assert entry["k_amax"] == np.abs(d["k"]).max(axis=(0, 2)).tolist(), l
        assert entry["v_amax"] == np.abs(d["v"]).max(axis=(0, 2)).tolist(), l
    assert "after the first 40" in cal["source"]


def test_gil_is_released_during_long_calls(model, text):
    ids = model.encode(text, max_tokens=512)
    done = threading.Event()

    def work():
        model.ppl(ids, kv="kivi2", ctx=256, max_tokens=512)
        done.set()

    t = threading.Thread(target=work)
    t.start()
    time.sleep(0.3)
    ran_while_busy = sum(range(1000)) == 499500 and not done.is_set()
    t.join()
    # Python ran in this thread while ppl was still computing: the call does not hold the GIL.
    assert ran_while_busy


def test_ctrl_c_interrupts_ppl():
    code = """
import os, signal, threading, time, kvq
m = kvq.Model()
ids = m.encode(kvq.read_text("kjv"), max_tokens=4096)
threading.Timer(1.5, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
t0 = time.time()
try:
    m.ppl(ids, kv=["kivi2", "kivi4", "fp8"], ctx=512, chunk=64)
    print("finished")
except KeyboardInterrupt:
    print(f"interrupted after {time.time() - t0:.1f} s")
"""
    try:
        kvq.model_path()
        kvq.read_text("kjv")
    except kvq.Error as e:
        pytest.skip(str(e))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("interrupted after"), r.stdout
    assert float(r.stdout.split()[2]) < 15  # a whole run is ~60 s; a chunk is well under a second


@pytest.mark.parametrize("call,match", [
    (lambda m: m.ppl("short text", ctx=64), "fewer than --ctx"),
    (lambda m: m.ppl("x" * 100, kv="kivi7"), "bits"),
    (lambda m: m.ppl("x" * 100, kv=[]), "at least one"),
    (lambda m: m.ppl("x " * 200, ctx=64, kv="kivi2@first=15,last=15"), "none would be quantized"),
    (lambda m: m.generate("hello", n=0), "at least 1"),
    (lambda m: m.generate("hello", backend="gpu"), "gpu"),
    (lambda m: m.dump_kv(""), "empty"),
])
def test_bad_calls(model, call, match):
    with pytest.raises(kvq.Error, match=match):
        call(model)


def test_missing_model_file(tmp_path):
    with pytest.raises(kvq.Error, match="fetch-model"):
        kvq.Model(str(tmp_path / "none.gguf"))


def test_weights_stores_give_the_same_logits_on_a_checkpoint_folder():
    """weights= (kvq run's `weights`, --weights): a folder's bf16 weights mapped (default),
    copied into panels or the fp32 reference product give the same logits bit for bit (as
    tests/model/hf_weight_store_test checks in C++); an unknown name is a one-line error."""
    folder = os.path.join(os.path.dirname(__file__), "..", "fixtures", "hf", "qwen2")
    ids = [1, 5, 9, 33, 2, 17, 39, 0, 8, 8, 21, 30]
    mapped = kvq.Model(folder)
    assert "mapped rows" in mapped.config["weights"]
    want = mapped.logits(ids, kv="fp32")
    assert np.abs(want).max() > 0
    for weights in ("packed", "fp32"):
        got = kvq.Model(folder, weights=weights).logits(ids, kv="fp32")
        assert got.tobytes() == want.tobytes(), weights
    with pytest.raises(kvq.Error, match="weights 'copy' is not one of mapped, packed, fp32"):
        kvq.Model(folder, weights="copy")
