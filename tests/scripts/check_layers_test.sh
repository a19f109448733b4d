#!/usr/bin/env bash
# scripts/check-layers.py on small made-up trees: a clean one passes; an include up the graph, one
# between two schemes, a two-way folder pair and Python importing the CLI's plots each fail with a
# line naming the file and the layers (what the check exists to catch, so it can fail).
set -euo pipefail
check="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/scripts/check-layers.py"
t="$(mktemp -d)"
trap 'rm -rf "$t"' EXIT
tree() {  # a fresh tree: core, fp8, backend cpu, the backend interface, model and the evaluation
  # library (planner) beside the CLI
  rm -rf "$t/r" && mkdir -p "$t/r"/{core,fp8,kivi,kernels/cpu,model,experiments,python/kvq}
  echo 'add_library(kvq_eval STATIC planner.cpp)' > "$t/r/experiments/CMakeLists.txt"
  printf '#pragma once\n' > "$t/r/core/a.h"
  printf '#include "core/a.h"\n' > "$t/r/fp8/f.h"
  printf '#include "fp8/f.h"\n' > "$t/r/kernels/cpu/c.h"
  printf '#include "kernels/cpu/c.h"\n' > "$t/r/kernels/backend.h"
  printf '#include "fp8/f.h"\n#include "core/a.h"\n#include "kernels/backend.h"\n' > "$t/r/model/m.h"
  printf '#include "model/m.h"\n' > "$t/r/experiments/planner.h"
  printf '#include "experiments/planner.h"\n' > "$t/r/experiments/cmd_plan.cpp"
  printf 'import numpy\n' > "$t/r/python/kvq/__init__.py"
}
expect_fail() {  # $1: what must be named in the output
  if out="$(python3 "$check" --root "$t/r" 2>&1)"; then
    echo "FAIL: check-layers passed a tree with $1"; exit 1
  fi
  grep -qF -- "$1" <<<"$out" || { echo "FAIL: no line naming '$1' in: $out"; exit 1; }
}
tree
python3 "$check" --root "$t/r" >/dev/null || { echo "FAIL: a clean tree was refused"; exit 1; }
tree; printf '#include "model/m.h"\n' >> "$t/r/core/a.h"
expect_fail "core/a.h:2: core includes model (model/m.h)"
tree; printf '#include "kivi/k.h"\n' >> "$t/r/fp8/f.h"
expect_fail "fp8/f.h:2: fp8 includes kivi"
tree; printf '#include "experiments/cmd_plan.h"\n' >> "$t/r/experiments/planner.h"
expect_fail "eval includes cli"
tree; printf 'from experiments.plots import figures\n' >> "$t/r/python/kvq/__init__.py"
expect_fail "python/kvq/__init__.py:2: python includes cli"
tree; printf '#include "fp8/f.h"\n' >> "$t/r/core/a.h"
expect_fail "core and fp8 include each other"
tree; printf '#include "kernels/backend.h"\n' >> "$t/r/kernels/cpu/c.h"
expect_fail "kernels/cpu/c.h:2: kernels/cpu includes backend (kernels/backend.h)"
tree; printf '#include "model/m.h"\n' >> "$t/r/kernels/backend.h"
expect_fail "kernels/backend.h:2: backend includes model (model/m.h)"
echo "check-layers: 7 bad trees refused, the clean one passed"
