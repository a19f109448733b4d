"""Shared fixtures for kvq's Python tests (run by ctest as `python.pytest`, from the README's test
command, against the package scripts/setup.sh installs into .venv)."""
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

import kvq

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def cli():
    """Runs the `kvq` binary of the same checkout (ctest passes its path as KVQ_CLI)."""
    path = os.environ.get("KVQ_CLI") or str(REPO / "build/default/experiments/kvq")
    if not os.access(path, os.X_OK):
        pytest.fail(f"the kvq CLI is not built at {path}; run scripts/setup.sh (or set KVQ_CLI)")

    def run(*args, check=True):
        r = subprocess.run([path, *map(str, args)], capture_output=True, text=True)
        if check and r.returncode != 0:
            raise AssertionError(f"kvq {' '.join(map(str, args))} failed: {r.stderr}")
        return r

    return run


@pytest.fixture(scope="session")
def model():
    """The real model, loaded once; the model tests skip (as the C++ ones do) without it."""
    try:
        path = kvq.model_path()
    except kvq.Error as e:
        pytest.skip(f"no model: {e}")
    return kvq.Model(path)


@pytest.fixture
def rng():
    return np.random.default_rng(20261130)


def outlier_keys(rng, tokens=300, heads=4, dim=64):
    """K-like tensor: N(0, 1) with two outlier channels per head (x12), as `kvq synth` makes."""
    x = rng.standard_normal((tokens, heads, dim), dtype=np.float32)
    x[:, :, 3] *= 12.0
    x[:, :, 17] *= 12.0
    return x


def attention_numpy(q, k, v):
    """Definition (float64): softmax(q k^T / sqrt(d)) v per query head, GQA by head // group;
    q [q_heads, d], k and v [T, kv_heads, d]."""
    qh, d = q.shape
    g = qh // k.shape[1]
    out = np.empty((qh, d))
    for j in range(qh):
        s = k[:, j // g, :].astype(np.float64) @ q[j].astype(np.float64) / np.sqrt(d)
        p = np.exp(s - s.max())
        out[j] = (p / p.sum()) @ v[:, j // g, :].astype(np.float64)
    return out
