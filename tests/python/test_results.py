"""kvq.read_results on a real `kvq run` directory: the same rows as its CSV."""
import csv

import pandas as pd
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
    df = kvq.read_results(out)
    # Issue 50: a DataFrame (pandas is in the venv), nested objects as the CSV's dotted columns.
    assert isinstance(df, pd.DataFrame)
    with open(out / "synthetic.csv") as f:
        want = list(csv.DictReader(f))
    assert len(df) == len(want) > 0
    assert set(df["task"]) == {"synthetic"}
    assert df["settings.tokens"].tolist() == [256] * len(want)
    for (_, r), w in zip(df.iterrows(), want):
        assert r["scheme"] == w["scheme"]
        for key in ("bits", "nmse", "settings.heads"):
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
    (tmp_path / "synthetic.jsonl").write_text('{"scheme": "bf16"}\n[1, 2]\n')
    with pytest.raises(kvq.Error, match="synthetic.jsonl:2: not a JSON object"):
        kvq.read_results(tmp_path)
