#!/usr/bin/env python3
"""The layering check (issue 48; ../shared/ARCHITECTURE.md): every #include "..." between kvq's
folders, and every import of the Python package, must point down the folder graph

    core  <-  fp8, kivi (schemes)  <-  reference_cpu, kernels/cpu, kernels/cuda (backends)
          <-  the backend interface (kernels/backend.h, .cpp: kernels/'s own files)
          <-  model  <-  evaluation library (experiments/: the kvq_eval sources and defaults.h)
          <-  the kvq CLI (the rest of experiments/)  and  python/ (never the CLI)
    tests/, bench/, fuzz/, examples/ may include anything.

Fails (exit 1, one line per arrow: FILE:LINE, the two layers) on an arrow up the graph, between two
layers of the same rank (schemes never include each other, nor do backends), or on two folders that
include each other. Prints the folder graph with --graph. --root DIR checks another tree (the test).
"""
import argparse
import collections
import pathlib
import re
import sys

RANK = {"core": 0, "fp8": 1, "kivi": 1, "reference_cpu": 2, "kernels/cpu": 2, "kernels/cuda": 2,
        "backend": 3, "model": 4, "eval": 5, "cli": 6, "python": 6}
TOP = ("tests", "bench", "fuzz", "examples")  # may include anything
SOURCES = (".h", ".hpp", ".cpp", ".cu", ".cuh")
INCLUDE = re.compile(r'\s*#\s*include\s+"([^"]+)"')
IMPORT = re.compile(r"\s*(?:from|import)\s+(experiments|tests|bench)\b")


def eval_names(root):
    """Basenames (no extension) of the evaluation library: kvq_eval's sources, and defaults.h."""
    text = (root / "experiments" / "CMakeLists.txt").read_text()
    m = re.search(r"add_library\(kvq_eval\s+STATIC([^)]*)\)", text)
    if not m:
        sys.exit("check-layers: experiments/CMakeLists.txt has no add_library(kvq_eval STATIC ...)")
    return {pathlib.Path(s).stem for s in m.group(1).split()} | {"defaults"}


def layer(rel, evals):
    """The layer of a repo-relative path, None outside the graph."""
    parts = rel.split("/")
    if parts[0] in TOP:
        return "top"
    if parts[0] == "kernels":
        return "kernels/" + parts[1] if len(parts) > 2 else "backend"
    if parts[0] == "experiments":
        return "eval" if len(parts) == 2 and pathlib.Path(parts[1]).stem in evals else "cli"
    return parts[0] if parts[0] in RANK else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=pathlib.Path(__file__).resolve().parent.parent, type=pathlib.Path)
    ap.add_argument("--graph", action="store_true", help="print every folder arrow and its count")
    a = ap.parse_args()
    root = a.root.resolve()
    evals = eval_names(root)
    arrows, bad = collections.Counter(), []
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith(("build/", ".venv/", ".git/")) or not path.is_file():
            continue
        src = layer(rel, evals)
        if src in (None, "top"):
            continue
        is_py = path.suffix == ".py" and src == "python"
        if path.suffix not in SOURCES and not is_py:
            continue
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            m = INCLUDE.match(line) if not is_py else IMPORT.match(line)
            if not m:
                continue
            dst = layer(m.group(1) + ("/x.py" if is_py else ""), evals)
            if dst is None or dst == src:
                continue
            arrows[(src, dst)] += 1
            if dst == "top" or RANK[dst] >= RANK[src]:
                bad.append(f"{rel}:{n}: {src} includes {dst} ({m.group(1)}): arrows point down "
                           f"the graph only (scripts/check-layers.py)")
    for (s, d) in arrows:
        if (d, s) in arrows and s < d:
            bad.append(f"{s} and {d} include each other ({arrows[(s, d)]} and {arrows[(d, s)]} "
                       f"includes)")
    if a.graph:
        for (s, d), c in sorted(arrows.items()):
            print(f"{s} -> {d}: {c}")
    for b in bad:
        print(b, file=sys.stderr)
    if not bad:
        print(f"check-layers: {sum(arrows.values())} includes across {len(arrows)} folder arrows, "
              f"all pointing down")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
