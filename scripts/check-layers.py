#!/usr/bin/env python3
"""The layering check (issue 48; README "Architecture"): every #include "..." of a C++/CUDA source
and every import of a Python file, read as an arrow between kvq's folders, must be an arrow of the
allowed folder graph (GRAPH below, written once, here). The graph is layered, lowest first:

    core  <-  fp8, kivi (the schemes)  <-  cache (the cache sides' storage, every backend's)
          <-  reference_cpu, kernels/cpu, kernels/cuda (the backends: their reads of the stored
          bytes)  <-  kernels (the backend interface: kernels/backend.h, .cpp)  <-  model
          <-  evaluation (the evaluation library, kvq_eval)  <-  python  <-  experiments (the kvq
          CLI, its configs, and the plot scripts, which import the Python package)
    tests/, bench/, fuzz/, examples/, scripts/, docs/ may include anything; nothing includes them.

The scheme families' folder schemes/ spans three layers (SCHEME_PARTS): schemes/families.def,
schemes/kinds.h and each family's params.h and traits.* are core's, its storage.* cache's, its
reads.* reference_cpu's; a family's folder (schemes/<family>/) never includes another family's.

No arrow points up, none joins two folders of one rank (schemes never include each other, nor do
backends), so no two folders include each other: the script refuses a GRAPH that breaks this.

Fails (exit 1) with one line per arrow that is not in GRAPH: FILE:LINE: FROM -> TO ("include"),
and why (up the graph, or a new arrow down to add to GRAPH if it is meant). A source file in a folder
the graph does not know fails too. --graph prints the arrows found and their counts.

    scripts/check-layers.py                    # the whole tree (ctest layers.check)
    scripts/check-layers.py --root DIR         # another tree (the check's own test)
    scripts/check-layers.py [--root DIR] FILE  # just these files (paths under the root)
"""
import argparse
import collections
import pathlib
import re
import sys

ME = "scripts/check-layers.py"
# The allowed folder graph: each folder, lowest first, and the folders its files may include or
# import. An arrow goes only to a folder on an earlier line (checked at start).
GRAPH = {
    "core": [],
    "fp8": ["core"],
    "kivi": ["core"],
    "cache": ["core", "fp8", "kivi"],
    "reference_cpu": ["core", "fp8", "kivi", "cache"],
    "kernels/cpu": ["core", "fp8", "kivi", "cache"],
    "kernels/cuda": ["core", "fp8", "kivi", "cache"],
    "kernels": ["core", "cache", "reference_cpu", "kernels/cpu", "kernels/cuda"],
    "model": ["core", "fp8", "cache", "reference_cpu", "kernels/cpu", "kernels/cuda", "kernels"],
    "evaluation": ["core", "fp8", "cache", "reference_cpu", "kernels", "model"],
    "python": ["core", "fp8", "cache", "reference_cpu", "kernels/cpu", "kernels", "model",
               "evaluation"],
    "experiments": ["core", "fp8", "kivi", "cache", "reference_cpu", "kernels/cpu", "kernels",
                    "model", "evaluation", "python"],
}
# The layer of each part of a scheme family, schemes/<family>/<part>[_*].<ext> (README
# "Architecture"); the files directly under schemes/ (families.def, kinds.h) are core's.
SCHEME_PARTS = {"params": "core", "traits": "core", "storage": "cache", "reads": "reference_cpu"}
BAD_PART = "schemes/?"  # a file of a scheme family that is none of SCHEME_PARTS
# Folders of one rank: no arrow between them (the schemes; the backends).
PEERS = [{"fp8", "kivi"}, {"reference_cpu", "kernels/cpu", "kernels/cuda"}]
TOP = ("tests", "bench", "fuzz", "examples", "scripts", "docs")  # may include anything
SKIP = ("build", ".venv", ".git", ".pytest_cache")
SOURCES = (".h", ".hpp", ".cpp", ".cu", ".cuh", ".def")
INCLUDE = re.compile(r'\s*#\s*include\s+"([^"]+)"')
IMPORT = re.compile(r"\s*(?:from|import)\s+([A-Za-z_]\w*)")
PACKAGE = {"kvq": "python"}  # Python package name -> the folder that holds it


def check_graph():
    """GRAPH itself: every arrow to an earlier line, none between peers (so no cycle, no pair)."""
    order = list(GRAPH)
    for src, dsts in GRAPH.items():
        for d in dsts:
            if d not in GRAPH or order.index(d) >= order.index(src) or any(
                    {src, d} <= p for p in PEERS):
                sys.exit(f"{ME}: GRAPH's arrow {src} -> {d} does not point down the layers")


def folder(rel):
    """The graph folder of a repo-relative path; 'top' for TOP; None outside kvq's folders."""
    parts = rel.split("/")
    if len(parts) < 2 or parts[0] in SKIP:
        return None
    if parts[0] in TOP:
        return "top"
    if parts[0] == "kernels" and len(parts) > 2:
        return "kernels/" + parts[1]
    if parts[0] == "schemes":
        if len(parts) == 2:
            return "core"
        part = parts[-1].split(".")[0].split("_")[0]
        return SCHEME_PARTS.get(part, BAD_PART) if len(parts) == 3 else BAD_PART
    return parts[0]


def family(rel):
    """The scheme family folder of a repo-relative path (schemes/<family>/...), else None."""
    parts = rel.split("/")
    return parts[1] if len(parts) > 2 and parts[0] == "schemes" else None


def target(name, is_py):
    """The folder an include path or imported module names; None for one outside kvq."""
    if is_py:
        if name in PACKAGE:
            return PACKAGE[name]
        name += "/x.py"
    f = folder(name)
    return f if f == "top" or f in GRAPH else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=pathlib.Path,
                    default=pathlib.Path(__file__).resolve().parent.parent)
    ap.add_argument("--graph", action="store_true", help="print every folder arrow and its count")
    ap.add_argument("files", nargs="*", type=pathlib.Path, help="only these files (default: all)")
    a = ap.parse_args()
    check_graph()
    root = a.root.resolve()
    paths = [(root / f).resolve() for f in a.files] if a.files else sorted(root.rglob("*"))
    arrows, bad = collections.Counter(), []
    for path in paths:
        try:
            rel = path.relative_to(root).as_posix()
        except ValueError:
            sys.exit(f"{ME}: {path} is not under the root {root}")
        if not path.is_file() or (path.suffix not in SOURCES and path.suffix != ".py"):
            continue
        src = folder(rel)
        if src in (None, "top"):
            continue
        if src == BAD_PART:
            bad.append(f"{rel}: a scheme family's file is one of {', '.join(SCHEME_PARTS)} "
                       f"(its layer: SCHEME_PARTS in {ME})")
            continue
        if src not in GRAPH:
            bad.append(f"{rel}: folder {src}/ is in no layer of the allowed graph in {ME}")
            continue
        is_py = path.suffix == ".py"
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            m = (IMPORT if is_py else INCLUDE).match(line)
            dst = m and target(m.group(1), is_py)
            if dst and not is_py and family(rel) and family(m.group(1)) not in (None,
                                                                                 family(rel)):
                bad.append(f'{rel}:{n}: schemes/{family(rel)} -> schemes/{family(m.group(1))} '
                           f'("{m.group(1)}"): a scheme family never includes another ({ME})')
                continue
            if not dst or dst == src:
                continue
            arrows[(src, dst)] += 1
            if dst in GRAPH[src]:
                continue
            order = list(GRAPH)
            why = ("points up the layers" if dst == "top" or order.index(dst) > order.index(src)
                   or any({src, dst} <= p for p in PEERS)
                   else "a new arrow down: add it to GRAPH if it is meant")
            bad.append(f'{rel}:{n}: {src} -> {dst} ("{m.group(1)}") is not in the allowed graph '
                       f"in {ME} ({why})")
    if a.graph:
        for (s, d), c in sorted(arrows.items()):
            print(f"{s} -> {d}: {c}")
    for b in bad:
        print(b, file=sys.stderr)
    if not bad:
        print(f"check-layers: {sum(arrows.values())} includes and imports across {len(arrows)} "
              f"folder arrows, all in the allowed graph")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
