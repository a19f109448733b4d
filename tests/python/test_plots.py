"""The figure scripts in experiments/plots/ (issue 50): each writes beside the results it draws
(or, for the ones that compute from the model, into its own results/ folder), never into
docs/img unless --out says so, and every figure of one small `kvq run` with every task draws."""
import subprocess
import sys

import pytest

import kvq
from conftest import REPO

PLOTS = REPO / "experiments" / "plots"


def snapshot(folder):
    """{name: (size, mtime)} of a folder's files: what "left untouched" compares."""
    return {p.name: (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.iterdir()}


def plot(script, *args, cwd):
    """Runs one plot script with this venv's Python from `cwd`; returns its stdout."""
    r = subprocess.run([sys.executable, str(PLOTS / script), *map(str, args)], cwd=cwd,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"{script} {args}: {r.stderr}"
    return r.stdout


@pytest.fixture(scope="module")
def run_dir(cli, tmp_path_factory):
    """One small `kvq run` with every task: synthetic, model rows at two window lengths (with a
    one-layer spec, as layer_sensitivity.toml has), needle, throughput, ruler and serve."""
    try:
        kvq.model_path()
    except kvq.Error as e:
        pytest.skip(f"no model: {e}")
    d = tmp_path_factory.mktemp("plots")
    (d / "c.toml").write_text(f"""name = "plots"
out = "{d / 'out'}"
schemes = ["kivi2:g=16,r=16", "kivi4:g=16,r=16"]
[synthetic]
tokens = 96
heads = 2
head_dim = 64
queries = 2
[model]
ctx = [32, 64]
max_tokens = 128
schemes = ["kivi2:g=16,r=16", "kivi4:g=16,r=16", "fp32@1=kivi2"]
[needle]
ctx = [256]
depth = [0.5]
trials = 1
[throughput]
contexts = [64]
batch = [1]
backends = ["ref"]
heads = 2
head_dim = 32
gqa = 2
repeats = 1
[ruler]
tasks = ["vt"]
lengths = [1024]
samples = 1
[serve]
requests = 3
prompt_tokens = 16
gen = 4
mem = [0.001, 0.002]
""")
    r = cli("run", d / "c.toml")
    assert "plot: " in r.stdout, r.stdout
    return d


def test_each_figure_lands_beside_its_results_and_docs_img_is_untouched(run_dir, cli, tmp_path):
    docs = snapshot(REPO / "docs" / "img")
    out = run_dir / "out"
    # From another folder, so that a relative default (docs/img) would show up there too.
    plot("plot_results.py", out, cwd=tmp_path)
    plot("plot_context.py", out, cwd=tmp_path)
    plot("plot_needle.py", out, cwd=tmp_path)
    plot("plot_throughput.py", out, cwd=tmp_path)
    plot("plot_ruler.py", out, cwd=tmp_path)
    plot("plot_serve.py", out, cwd=tmp_path)
    plot("plot_options.py", "rotation", out, cwd=tmp_path)
    plot("plot_options.py", "sinks", out, cwd=tmp_path)
    plot("plot_options.py", "layers", out, out, cwd=tmp_path)
    for name in ("synthetic_snr", "synthetic_attention", "model_kld", "context", "needle",
                 "throughput", "rotation", "sinks", "per_layer", "ruler", "serve"):
        for ext in ("png", "pdf"):
            assert (out / f"{name}.{ext}").stat().st_size > 0, f"{name}.{ext} not beside results"
    sweep = run_dir / "plan" / "sweep.csv"
    sweep.parent.mkdir()
    cli("plan", "--kv", "bf16", "kivi2", "--sweep-csv", sweep, "--sweep-batch", 1, 8,
        "--sweep-ctx", 4096)
    plot("plot_plan.py", sweep, cwd=tmp_path)
    assert (sweep.parent / "plan_sweep.png").exists()
    assert list(tmp_path.iterdir()) == [], "a script wrote into the folder it was run from"
    # --out still sends a figure where it is asked to (what scripts/make-figures.sh does).
    plot("plot_needle.py", out, "--out", tmp_path / "elsewhere", cwd=tmp_path)
    assert (tmp_path / "elsewhere" / "needle.png").exists()
    assert snapshot(REPO / "docs" / "img") == docs, "a plot script changed docs/img"


def test_model_scripts_write_into_their_own_results_folder(tmp_path):
    try:
        kvq.model_path()
    except kvq.Error as e:
        pytest.skip(f"no model: {e}")
    docs = snapshot(REPO / "docs" / "img")
    plot("channel_magnitudes.py", "--max-tokens", 64, cwd=tmp_path)
    plot("granularity_layers.py", "--max-tokens", 64, "--kv", "fp8", "kivi4", cwd=tmp_path)
    assert (tmp_path / "results" / "channel_magnitudes" / "channel_magnitudes.png").exists()
    for name in ("granularity_layers.png", "granularity_layers.csv"):
        assert (tmp_path / "results" / "granularity_layers" / name).exists()
    assert not (tmp_path / "docs").exists()
    assert snapshot(REPO / "docs" / "img") == docs, "a plot script changed docs/img"


def test_ablation_figure_only_for_an_ablation():
    # plot_results draws ablation.png for KIVI's ablation (a layout at several windows and groups),
    # not for a config that has kivi2 with and without its window beside other schemes.
    sys.path.insert(0, str(PLOTS))
    try:
        import plot_results as pr
    finally:
        sys.path.remove(str(PLOTS))

    def rows(*schemes):
        return [{"scheme": s, "settings": {"ctx": 512}} for s in schemes]

    assert pr.int_params("int2:k=token,v=channel,g=32,r=128") == {
        "bits": 2, "k": "token", "v": "channel", "g": "32", "r": 128, "arith": "exact",
        "sym": False}
    assert pr.int_params("kivi2:g=32,r=128,arith=fp16")["arith"] == "fp16"
    for not_one in ("fp8_e4m3:gran=token,scale=dynamic", "kivi2:g=32,r=128,rot=hadamard",
                    "k=kivi2:g=32,r=128;v=fp8_e4m3:gran=tensor,scale=dynamic",
                    "kivi2:g=32,r=128@3=kivi4:g=32,r=128"):
        assert pr.int_params(not_one) is None, not_one
    ablation = rows("int2:k=channel,v=token,g=32,r=128", "int2:k=token,v=token,g=32,r=128",
                    "int2:k=channel,v=token,g=32,r=0", "int2:k=token,v=token,g=32,r=0",
                    "kivi2:g=32,r=32", "kivi2:g=64,r=128")
    assert len(pr.ablation_rows(ablation)) == 6
    default = rows("bf16", "fp8_e4m3:gran=tensor,scale=dynamic", "kivi4:g=32,r=128",
                   "kivi2:g=32,r=128", "kivi2:g=32,r=0")
    assert pr.ablation_rows(default) == []


def test_footer_names_where_the_numbers_were_measured(run_dir, tmp_path):
    # Each figure's footer carries the commit and the host (issue 50 item 9): the `machine` of the
    # rows it draws, or, for rows without one, this machine marked as where the plot was drawn.
    sys.path.insert(0, str(PLOTS))
    try:
        import figures
    finally:
        sys.path.remove(str(PLOTS))
    rows = [{"machine": "a: X x 2"}, {"machine": "a: X x 2"}, {"machine": "b: Y x 8"}]
    assert figures.host(rows) == "a: X x 2; b: Y x 8"
    assert figures.host([{"scheme": "bf16"}]).startswith("plotted on ")
    # plot_throughput draws several results folders (one per int mode) side by side; the ref rows
    # of the second folder are not drawn twice.
    out = run_dir / "out"
    plot("plot_throughput.py", out, out, "--out", tmp_path, cwd=tmp_path)
    assert (tmp_path / "throughput.png").stat().st_size > 0


def test_serve_plot_against_the_batch_limit_with_the_planners_bound_dashed(tmp_path):
    """plot_serve.py on rows of one cap and a max_batch sweep, as backend cuda writes them (with
    bound_decode_tokens_per_s): the batch limit is the x axis, the bound a dashed line. The rows
    are written here by hand: the script's branches, not a measurement."""
    res = tmp_path / "res"
    res.mkdir()
    lines = ["key,scheme,backend,max_held,decode_tokens_per_s,bound_decode_tokens_per_s,"
             "settings.requests,settings.prompt_tokens,settings.gen,settings.mem,"
             "settings.max_batch"]
    for s, scale in (("bf16", 1.0), ("kivi2:g=32,r=128", 2.0)):
        for b in (1, 4, 16):
            lines.append(f'"{s}","{s}","cuda",{b},{100 * b * scale},{150 * b * scale},'
                         f'16,8064,128,20.0,{b}')
    (res / "serve.csv").write_text("\n".join(lines) + "\n")
    out = plot("plot_serve.py", res, "--out", tmp_path / "fig", cwd=tmp_path)
    assert "serve.png" in out
    assert (tmp_path / "fig" / "serve.png").stat().st_size > 0
