#!/usr/bin/env bash
# scripts/device-check.sh --plan, without a GPU: the plan of a device run (the pack that
# scripts/device-pack.sh builds) lists every step with its cap; the caps add up to the printed total,
# which fits the run's budget and the device's 8 minutes (480 s); every binary it names is one the
# pack holds (scripts/device-pack.sh --list) and every test and bench binary of the pack runs (the
# full-tier test only with KVQ_DC_FULL=1); every repo file it names exists. A budget below the caps
# and one above 480 s are refused, and a planted binary the pack lacks fails the check (so the
# check can fail). The scripts parse (bash -n) and are shellcheck-clean where shellcheck is
# installed; device-check.sh has no bare `wait` (under `exec > >(tee LOG)` one hangs: it waits for
# the process substitution too).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
fail() { echo "FAIL: $*"; exit 1; }
scripts=(scripts/device-check.sh scripts/device-pack.sh scripts/cuda-targets.sh)
for s in "${scripts[@]}"; do bash -n "$s" || fail "bash -n $s"; done
if command -v shellcheck >/dev/null 2>&1; then
  shellcheck -x "${scripts[@]}" || fail "shellcheck -x ${scripts[*]}"
fi
grep -nE '(^|[;&|({[:space:]])wait[[:space:]]*($|[;&|#)])' scripts/device-check.sh &&
  fail "a bare 'wait' in scripts/device-check.sh (wait for the ids instead)"

plan="$(scripts/device-check.sh --plan)" || fail "--plan exited nonzero: $plan"
pack="$(scripts/device-pack.sh --list)"
[[ -n "$pack" ]] || fail "scripts/device-pack.sh --list printed nothing"

# check PLAN: the caps' sum, the total line, the binaries and files the plan names
check() {
  local text=$1 sum=0 total c w
  while read -r c; do sum=$((sum + c)); done < <(grep -oE '^ *[0-9]+ s  ' <<<"$text" | grep -oE '[0-9]+')
  total=$(grep -oE '^total [0-9]+ s of caps' <<<"$text" | grep -oE '[0-9]+') || { echo "no total line"; return 1; }
  ((sum == total)) || { echo "the caps add up to $sum, the plan says $total"; return 1; }
  ((total <= 480)) || { echo "caps $total s > 480 s"; return 1; }
  grep -qE '^total .*: fits$' <<<"$text" || { echo "the plan does not say it fits"; return 1; }
  for w in $(grep -E '^ *[0-9]+ s  ' <<<"$text" | tr ' ' '\n' | grep -E '^(tests/cuda|bench|bin)/[A-Za-z0-9_]+$' | sort -u); do
    grep -qxF "$w" <<<"$pack" || { echo "the plan runs $w, which the pack does not hold"; return 1; }
  done
  for w in $(grep -E '^ *[0-9]+ s  ' <<<"$text" | tr ' ' '\n' | grep -E '\.(py|toml)$' | grep -v '^OUT/' | sort -u); do
    [[ -f "$w" ]] || { echo "the plan names $w, which is not in the repo"; return 1; }
  done
}
why=$(check "$plan") || fail "$why; plan: $plan"
# every binary the pack holds runs (the full tier only when asked)
for b in $pack; do
  [[ "$b" == *_full_test ]] && continue
  grep -qE "(^| )$b( |$)" <<<"$plan" || fail "the pack holds $b but the plan never runs it: $plan"
done
full="$(KVQ_DC_FULL=1 scripts/device-check.sh --plan)" || fail "--plan with KVQ_DC_FULL=1 exited nonzero"
grep -q 'tests/cuda/cuda_kivi_kernel_full_test' <<<"$full" || fail "KVQ_DC_FULL=1 does not run the full tier"

# the checks can fail
planted=$(sed -E 's|^( *[0-9]+ s  bench_attention_cuda +)|\1bench/bench_nope_cuda |' <<<"$plan")
grep -q bench/bench_nope_cuda <<<"$planted" || fail "could not plant a binary"
why=$(check "$planted") && fail "a binary the pack lacks passed"
grep -q 'bench/bench_nope_cuda' <<<"$why" || fail "the planted binary's line does not name it: $why"
if out=$(KVQ_DC_BUDGET_S=100 scripts/device-check.sh --plan); then fail "a 100 s budget passed"; fi
grep -q 'DOES NOT FIT' <<<"$out" || fail "a 100 s budget: no DOES NOT FIT line: $out"
if out=$(KVQ_DC_BUDGET_S=500 scripts/device-check.sh --plan); then fail "a budget over 480 s passed"; fi
echo "device-check plan: $(grep -c '^ *[0-9]* s  ' <<<"$plan") steps, $(grep -oE '^total [0-9]+ s' <<<"$plan")"
