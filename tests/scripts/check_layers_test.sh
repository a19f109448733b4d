#!/usr/bin/env bash
# scripts/check-layers.py on small made-up trees: a clean one passes (the plot scripts importing the
# Python package included); a planted bad include or import fails with a line naming the file, the
# line, the two folders and the script's graph: an include up the layers, one between two schemes,
# one half of a two-way pair, the evaluation library or Python reaching into the CLI, a backend
# including the backend interface, a library including tests/, a new arrow down that the graph does
# not hold, and a source folder the graph does not know; in schemes/, a family's params.h
# including a scheme, one family including another, and a family's file that is none of its parts.
# Given a list of files, only those are read.
set -euo pipefail
check="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/scripts/check-layers.py"
t="$(mktemp -d)"
trap 'rm -rf "$t"' EXIT
tree() {  # a fresh tree with one file per layer, each including the one below
  rm -rf "$t/r" && mkdir -p "$t/r"/{core,fp8,kivi,kernels/cpu,model,evaluation,experiments/plots}
  mkdir -p "$t/r"/{python/kvq,tests/support,bench}
  printf '#pragma once\n' > "$t/r/core/a.h"
  printf '#include "core/a.h"\n' > "$t/r/fp8/f.h"
  printf '#include "core/a.h"\n' > "$t/r/kivi/k.h"
  printf '#include "fp8/f.h"\n#include "kivi/k.h"\n' > "$t/r/kernels/cpu/c.h"
  printf '#include "kernels/cpu/c.h"\n' > "$t/r/kernels/backend.h"
  printf '#include "fp8/f.h"\n#include "core/a.h"\n#include "kernels/backend.h"\n' > "$t/r/model/m.h"
  printf '#include "model/m.h"\n#include <vector>\n#include "fmt/format.h"\n' \
    > "$t/r/evaluation/planner.h"
  printf '#include "evaluation/planner.h"\n' > "$t/r/experiments/cmd_plan.cpp"
  printf '#include "evaluation/planner.h"\n' > "$t/r/python/kvq_ext.cpp"
  printf 'from . import _kvq\nimport numpy\n' > "$t/r/python/kvq/__init__.py"
  printf 'import kvq\nfrom figures import save\n' > "$t/r/experiments/plots/p.py"
  printf '#include "experiments/cmd_plan.cpp"\n#include "core/a.h"\n' > "$t/r/tests/support/s.h"
  printf '#include "tests/support/s.h"\n' > "$t/r/bench/b.cpp"
  mkdir -p "$t/r"/schemes/{a,b}  # families: params.h, traits.cpp core's; reads.cpp a backend's
  printf '#include "schemes/%s/params.h"\n' a b > "$t/r/schemes/families.def"
  printf '#include "core/a.h"\n' | tee "$t/r/schemes/a/params.h" > "$t/r/schemes/b/params.h"
  printf '#include "schemes/a/params.h"\n' > "$t/r/schemes/a/traits.cpp"
  printf '#include "schemes/families.def"\n' > "$t/r/core/spec.h"
  printf '#include "schemes/b/params.h"\n#include "kivi/k.h"\n' > "$t/r/schemes/b/reads.cpp"
}
expect_fail() {  # $1: a line the output must hold; the rest: extra arguments (files)
  local want="$1"
  shift
  if out="$(python3 "$check" --root "$t/r" "$@" 2>&1)"; then
    echo "FAIL: check-layers passed a tree that should fail with: $want"; exit 1
  fi
  grep -qF -- "$want" <<<"$out" || { echo "FAIL: no line '$want' in: $out"; exit 1; }
  [[ "$(wc -l <<<"$out")" == 1 ]] || { echo "FAIL: more than one line for one arrow: $out"; exit 1; }
}
G="is not in the allowed graph in scripts/check-layers.py"
tree
python3 "$check" --root "$t/r" >/dev/null || { echo "FAIL: a clean tree was refused"; exit 1; }
tree; printf '#include "model/m.h"\n' >> "$t/r/core/a.h"
expect_fail "core/a.h:2: core -> model (\"model/m.h\") $G (points up the layers)"
tree; printf '#include "kivi/k.h"\n' >> "$t/r/fp8/f.h"
expect_fail "fp8/f.h:2: fp8 -> kivi (\"kivi/k.h\") $G (points up the layers)"
tree; printf '#include "fp8/f.h"\n' >> "$t/r/core/a.h"  # the two-way pair core <-> fp8
expect_fail "core/a.h:2: core -> fp8"
tree; printf '#include "experiments/commands.h"\n' >> "$t/r/evaluation/planner.h"
expect_fail "evaluation/planner.h:4: evaluation -> experiments"
tree; printf '#include "experiments/commands.h"\n' >> "$t/r/python/kvq_ext.cpp"
expect_fail "python/kvq_ext.cpp:2: python -> experiments"
tree; printf 'from experiments.plots import figures\n' >> "$t/r/python/kvq/__init__.py"
expect_fail "python/kvq/__init__.py:3: python -> experiments (\"experiments\") $G"
tree; printf '#include "kernels/backend.h"\n' >> "$t/r/kernels/cpu/c.h"
expect_fail "kernels/cpu/c.h:3: kernels/cpu -> kernels (\"kernels/backend.h\")"
tree; printf '#include "model/m.h"\n' >> "$t/r/kernels/backend.h"
expect_fail "kernels/backend.h:2: kernels -> model"
tree; printf '#include "tests/support/s.h"\n' >> "$t/r/model/m.h"
expect_fail "model/m.h:4: model -> top (\"tests/support/s.h\") $G (points up the layers)"
tree; printf '#include "kivi/k.h"\n' >> "$t/r/evaluation/planner.h"
expect_fail "evaluation/planner.h:4: evaluation -> kivi (\"kivi/k.h\") $G (a new arrow down: add"
tree; printf '#include "kivi/k.h"\n' >> "$t/r/schemes/a/params.h"
expect_fail "schemes/a/params.h:2: core -> kivi (\"kivi/k.h\") $G (points up the layers)"
tree; printf '#include "schemes/a/params.h"\n' >> "$t/r/schemes/b/reads.cpp"
expect_fail "schemes/b/reads.cpp:3: schemes/b -> schemes/a (\"schemes/a/params.h\"): a scheme family"
tree; printf '#include "core/a.h"\n' > "$t/r/schemes/a/helpers.h"
expect_fail "schemes/a/helpers.h: a scheme family's file is one of params, traits, storage, reads"
tree; mkdir "$t/r/serving" && printf '#include "core/a.h"\n' > "$t/r/serving/s.cpp"
expect_fail "serving/s.cpp: folder serving/ is in no layer of the allowed graph"
# a list of files: the bad one named alone fails; the others alone pass though it is in the tree
tree; printf '#include "model/m.h"\n' >> "$t/r/core/a.h"
expect_fail "core/a.h:2: core -> model" core/a.h
python3 "$check" --root "$t/r" fp8/f.h model/m.h evaluation/planner.h >/dev/null ||
  { echo "FAIL: the listed clean files were refused for a file not listed"; exit 1; }
echo "check-layers: 15 planted arrows refused, the clean tree and the clean file list passed"
