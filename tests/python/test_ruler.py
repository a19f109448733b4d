"""Model.ruler_case and Model.ruler (issue 49, the RULER-style suite from Python): a case fits
its length and holds its answers, is a function of (task, length, seed, sample) alone, and the
suite's rows equal `kvq run`'s [ruler] rows for the same case (the same C++ runs behind both)."""
import json

import pytest

import kvq


@pytest.mark.parametrize("task", ["niah_single_2", "niah_multivalue", "vt"])
def test_ruler_case_fits_its_length_and_holds_its_answers(model, task):
    c = model.ruler_case(task, 1024, sample=1, seed=3)
    # RULER's definition (evaluation/ruler.h): prompt + generation budget == length exactly
    assert len(c["prompt"]) + c["gen_tokens"] == 1024
    text = model.decode(c["prompt"])
    assert c["answers"] and all(a in text for a in c["answers"])
    assert model.ruler_case(task, 1024, sample=1, seed=3) == c
    assert model.ruler_case(task, 1024, sample=2, seed=3)["prompt"] != c["prompt"]
    assert model.ruler_case(task, 1024, sample=1, seed=4)["prompt"] != c["prompt"]


def test_ruler_case_errors_name_what_to_fix(model):
    with pytest.raises(kvq.Error, match='no task "nope"'):
        model.ruler_case("nope", 512)
    with pytest.raises(kvq.Error, match=r"length 100000 outside \[1, 8192\]"):
        model.ruler_case("vt", 100000)
    with pytest.raises(kvq.Error, match="leaves no room for a prompt"):
        model.ruler_case("niah_single_1", 100)
    with pytest.raises(kvq.Error, match="samples must be at least 1"):
        model.ruler(task="vt", length=512, samples=0)


def test_ruler_rows_equal_kvq_run_rows(model, cli, tmp_path):
    (tmp_path / "c.toml").write_text(f"""name = "r"
out = "{tmp_path / 'out'}"
schemes = ["kivi2:g=16,r=16"]
[ruler]
tasks = ["niah_single_2"]
lengths = [1024]
samples = 1
seed = 5
""")
    cli("run", tmp_path / "c.toml", "--smoke", "--out", tmp_path / "out")
    want = [json.loads(l) for l in (tmp_path / "out" / "ruler.jsonl").read_text().splitlines()]
    assert len(want) == 1
    got = model.ruler(kv="kivi2:g=16,r=16", task="niah_single_2", length=1024, samples=1, seed=5,
                      max_new=4)  # --smoke: 4 generated tokens
    assert len(got) == 1
    g, w = got[0], want[0]
    assert (g["length"], g["task"], g["sample"]) == (1024, "niah_single_2", 0)
    for key in ("score", "fp32_score", "output", "fp32_output", "prompt_tokens", "generated"):
        assert g[key] == w[key], key
    assert ", ".join(g["answers"]) == w["answers"]
    assert g["answers"] == model.ruler_case("niah_single_2", 1024, seed=5)["answers"]
