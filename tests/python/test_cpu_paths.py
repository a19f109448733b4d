"""kvq.cpu_paths(): backend cpu's CPU paths as the module runs them (README, "CPU paths").

Checked against two independent sources: the kvq CLI's `--version` line (another binary of the
same checkout, which may be built with other flags) and the CPU's features as Linux reports them
in /proc/cpuinfo (the kernel's reading of cpuid, not kvq's). A forced path (KVQ_CPU_PATH) and a
bad one run in a fresh interpreter, since the path is chosen once per process.
"""
import os
import re
import subprocess
import sys

import pytest

import kvq

# What each x86-64 path needs (kernels/cpu/dispatch.cpp), by /proc/cpuinfo's flag names.
NEEDS = {
    "avx2": {"avx", "avx2", "fma", "f16c"},
    "avx512": {"avx2", "fma", "f16c", "bmi1", "bmi2", "avx512f", "avx512dq", "avx512cd",
               "avx512bw", "avx512vl", "avx512_vnni"},
    "avx512bf16": {"avx2", "fma", "f16c", "bmi1", "bmi2", "avx512f", "avx512dq", "avx512cd",
                   "avx512bw", "avx512vl", "avx512_vnni", "avx512vbmi", "avx512_bf16"},
}


def cpu_flags():
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return None


def fresh(env_path):
    """kvq.cpu_paths() in a new interpreter with KVQ_CPU_PATH=env_path: (returncode, out, err)."""
    env = dict(os.environ, KVQ_CPU_PATH=env_path)
    r = subprocess.run([sys.executable, "-c", "import kvq; print(kvq.cpu_paths())"], env=env,
                       capture_output=True, text=True)
    return r.returncode, r.stdout, r.stderr


def test_lists_paths_and_runs_the_widest_supported():
    p = kvq.cpu_paths()
    assert set(p) == {"compiled", "supported", "running", "isa"}
    assert p["compiled"][0] == "portable"
    assert set(p["supported"]) <= set(p["compiled"])
    assert "portable" in p["supported"]
    if not os.environ.get("KVQ_CPU_PATH"):
        assert p["running"] == p["supported"][-1]
    assert p["running"] in p["supported"]
    assert (p["isa"] == "portable") == (p["running"] == "portable")


def test_supported_paths_match_the_cpu_features():
    flags = cpu_flags()
    p = kvq.cpu_paths()
    if flags is None or p["compiled"] != ["portable", "avx2", "avx512", "avx512bf16"]:
        pytest.skip("not an x86-64 Linux build with /proc/cpuinfo")
    for path, needs in NEEDS.items():
        assert (path in p["supported"]) == needs.issubset(flags), (path, needs - flags)


def test_same_as_the_cli_version_line(cli):
    line = cli("--version").stdout.splitlines()[1]
    m = re.fullmatch(r"backend cpu: paths ([a-z0-9, ]+); this machine runs (\S+) \((\S+)\)", line)
    assert m, line
    p = kvq.cpu_paths()
    assert (m.group(1).split(", "), m.group(2), m.group(3)) == (p["compiled"], p["running"],
                                                                  p["isa"])


def test_forced_path_and_bad_name():
    rc, out, err = fresh("portable")
    assert rc == 0, err
    assert "'running': 'portable', 'isa': 'portable'" in out
    rc, out, err = fresh("neon9")
    assert rc != 0
    assert "KVQ_CPU_PATH=neon9 is not a CPU path of this build; set it to one of portable" in err
