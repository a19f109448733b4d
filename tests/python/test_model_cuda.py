"""kvq.Model(..., backend="cuda") (issue 47): the backend names go through kernels/backend.h's one
parser (the error lists kvq.backends()), the model's default backend and the per-call backend= are
the same path, a scheme backend cuda does not run the model with is refused from the table before
any device is asked, and without a device (or a CUDA build) every entry point raises the one line
kvq.backends() gives as cuda's ``unavailable`` (the same as kvq.Cache's). On a device: the logits
on backend cuda against backend cpu's on the same bf16 cache (tests/cuda/model_cuda_test.cpp's
rule: within 2 D + 1e-4 max |logit|, D = the bf16 cache's whole rounding measured on the CPU), and
the quality rows' ``reference`` (bf16: backend cuda stores no fp32 cache).

The model is the tiny qwen2 checkpoint of tests/fixtures/hf/ (its weights are bf16, so the
device's bf16 weights are the same values)."""
import os

import numpy as np
import pytest

import kvq

FOLDER = os.path.join(os.path.dirname(__file__), "..", "fixtures", "hf", "qwen2")
IDS = [1, 5, 9, 33, 2, 17, 39, 0, 8, 8, 21, 30, 7, 44, 3, 12]


def _unavailable():
    return next(b for b in kvq.backends() if b["name"] == "cuda")["unavailable"]


@pytest.fixture(scope="module")
def cpu_model():
    return kvq.Model(FOLDER)


def test_unknown_backend_is_the_parsers_one_line_listing_every_backend(cpu_model):
    want = "unknown backend 'gpu' (choices: " + "; ".join(
        f"{b['name']}, {b['what']}" for b in kvq.backends()) + ")"
    with pytest.raises(kvq.Error) as e:
        kvq.Model(FOLDER, backend="gpu")
    assert str(e.value) == want
    with pytest.raises(kvq.Error) as e:  # a call's backend=: the same parser, the same line
        cpu_model.logits(IDS, kv="fp32", backend="gpu")
    assert str(e.value) == want
    with pytest.raises(kvq.Error, match="backend: expected a name such as 'cpu' or 'cuda', "
                                        "got int"):
        kvq.Model(FOLDER, backend=3)


def test_model_backend_is_every_calls_default(cpu_model):
    assert cpu_model.backend == "cpu"
    ref = kvq.Model(FOLDER, backend="ref")
    assert ref.backend == "ref"
    # backend=None is the Model's: the same logits bit for bit as naming it in the call
    got = ref.logits(IDS, kv="kivi2:g=8,r=8", threads=1)
    want = cpu_model.logits(IDS, kv="kivi2:g=8,r=8", threads=1, backend="ref")
    assert got.tobytes() == want.tobytes()
    # and not backend cpu's (a test that could not tell the two apart would prove nothing)
    assert got.tobytes() != cpu_model.logits(IDS, kv="kivi2:g=8,r=8", threads=1).tobytes()


def test_cuda_refuses_what_its_table_does_not_run_the_model_with(cpu_model):
    # from kernels/backend.h's table, before any device is asked: the same with or without a GPU
    with pytest.raises(kvq.Error) as e:
        cpu_model.ppl(IDS, kv=["kivi2:g=8,r=8", "kivi2:sink=4"], ctx=16, max_tokens=16,
                      backend="cuda")
    assert str(e.value) == (
        "backend cuda cannot run the model with the cache 'kivi2:g=32,r=128,sink=4': it does not "
        "run sink=S (exact sink tokens) (backends that can: ref, cpu, cpu-int8)")


def test_cuda_without_a_device_is_its_one_line_everywhere(cpu_model):
    line = _unavailable()
    if not line:
        pytest.skip("a CUDA device is present (the device tests below run)")
    assert line.startswith("backend cuda: ") and "\n" not in line
    calls = {
        "Model(backend=)": lambda: kvq.Model(FOLDER, backend="cuda"),
        "ppl": lambda: cpu_model.ppl(IDS, kv="kivi2:g=8,r=8", ctx=16, max_tokens=16,
                                     backend="cuda"),
        "generate": lambda: cpu_model.generate("hello", n=2, kv="kivi2", backend="cuda"),
        "logits": lambda: cpu_model.logits(IDS, kv="kivi2", backend="cuda"),
        "Cache": lambda: kvq.Cache("kivi2", 1, 64, backend="cuda"),
    }
    for name, call in calls.items():
        with pytest.raises(kvq.Error) as e:
            call()
        assert str(e.value) == line, name
    assert cpu_model.backend == "cpu"  # a refused call leaves the Model as it was
    assert np.isfinite(cpu_model.logits(IDS, kv="kivi2")).all()


def _max_abs(a):
    return float(np.abs(a).max())


@pytest.mark.parametrize("spec", ["bf16", "kivi4:g=8,r=8", "kivi2:g=8,r=8"])
def test_cuda_logits_match_backend_cpu(cpu_model, spec):
    line = _unavailable()
    if line:
        pytest.skip(line)
    gpu = kvq.Model(FOLDER, backend="cuda")
    cpu = cpu_model.logits(IDS, kv=spec)
    d = _max_abs(cpu_model.logits(IDS, kv="fp32") - cpu)  # the cache's whole rounding, on the CPU
    tol = 2 * d + 1e-4 * _max_abs(cpu)
    got = gpu.logits(IDS, kv=spec)
    assert got.shape == cpu.shape and np.isfinite(got).all()
    assert _max_abs(got - cpu) <= tol, (spec, _max_abs(got - cpu), tol)


def test_cuda_ppl_rows_say_their_reference_is_bf16():
    line = _unavailable()
    if line:
        pytest.skip(line)
    gpu = kvq.Model(FOLDER, backend="cuda")
    r = gpu.ppl(IDS, kv=["bf16", "kivi2:g=8,r=8"], ctx=16, max_tokens=16)
    assert [x["reference"] for x in r] == ["bf16", "bf16"]
    # the bf16 cache is the reference itself there: KL(p || p) = 0 by definition
    assert r[0]["kld"] == 0.0 and r[0]["ppl"] == r[0]["ppl_fp32"]
    assert r[1]["kld"] > 0
    assert "reference" not in kvq.Model(FOLDER).ppl(IDS, kv="kivi2:g=8,r=8", ctx=16, max_tokens=16)
