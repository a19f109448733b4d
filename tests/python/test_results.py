"""kvq.read_results on a real `kvq run` directory: the same rows as its CSV."""
import csv

import pytest

import kvq

CONFIG = """
name = "py"
out = "{out}"
schemes = ["bf16", "fp8_e4m3:gran=token", "kivi2"]
[synthetic]
tokens = 256
heads = 2
head_dim = 64
queries = 2
"""


def test_rows_of_a_run(cli, tmp_path):
    out = tmp_path / "res"
    (tmp_path / "c.toml").write_text(CONFIG.format(out=out))
    cli("run", tmp_path / "c.toml")
    rows = kvq.read_results(out)
    if not isinstance(rows, list):  # a DataFrame when pandas is installed
        rows = rows.to_dict("records")
    with open(out / "synthetic.csv") as f:
        want = list(csv.DictReader(f))
    assert len(rows) == len(want) > 0
    assert {r["task"] for r in rows} == {"synthetic"}
    for r, w in zip(rows, want):
        assert r["scheme"] == w["scheme"]
        for key in ("bits", "nmse"):
            if key in w:
                assert float(w[key]) == pytest.approx(float(r[key]), rel=1e-9)


def test_bad_directories(tmp_path):
    with pytest.raises(kvq.Error, match="not a directory"):
        kvq.read_results(tmp_path / "none")
    with pytest.raises(kvq.Error, match="no result rows"):
        kvq.read_results(tmp_path)
    (tmp_path / "synthetic.jsonl").write_text('{"scheme": "bf16"}\n{broken\n')
    with pytest.raises(kvq.Error, match="synthetic.jsonl:2"):
        kvq.read_results(tmp_path)
