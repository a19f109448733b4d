"""docs/python.md runs as written: every ```python block, in order, in one namespace."""
import contextlib
import io
import os
import re

import pytest

import kvq
from conftest import REPO


def test_python_md_runs(cli, monkeypatch):
    try:
        kvq.model_path()
        kvq.read_text("kjv")
    except kvq.Error as e:
        pytest.skip(f"the tour uses the model: {e}")
    text = (REPO / "docs/python.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert len(blocks) >= 4
    monkeypatch.chdir(REPO)
    ns = {}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        for i, b in enumerate(blocks):
            exec(compile(b, f"docs/python.md block {i + 1}", "exec"), ns)
    printed = out.getvalue()
    assert "kivi2:g=32,r=128" in printed and "rows" in printed
    # What the prose says of the output: per-token 2-bit keys are the worst of the compare table.
    table = [l.split() for l in printed.splitlines() if " dB" in l and "bits" in l]
    worst = min(table, key=lambda t: float(t[-2]))
    assert worst[0].startswith("int2:k=token")
