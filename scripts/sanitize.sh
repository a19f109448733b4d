#!/usr/bin/env bash
# The library unit tests under AddressSanitizer + UndefinedBehaviorSanitizer (preset `asan`, clang
# 14, -O1 with line tables; one build with scripts/fuzz.sh's targets, so the code also carries
# libFuzzer's coverage instrumentation, which these programs never read): formats, parsers,
# quantizers, caches and both attention backends - the code every command runs on - without the
# model and CLI tests (those run in the quick tier of the default build; under ASan they would take
# most of CI's budget), and the device KIVI cache's host-side planning (cuda_kivi_cache_plan_test:
# its "device" buffers are heap memory here, so a job writing past a buffer is an ASan report).
# Any sanitizer report fails the test. It builds only these programs (their kvq_test NO_CLI: no CLI
# command code) and, from the preset (KVQ_CPU_PATHS=host), only backend cpu's portable path and
# the widest this machine runs, the one the programs take.
#   scripts/sanitize.sh          (scripts/run-tests.sh runs it after the quick tier)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# The longest first (they run side by side, KVQ_JOBS at a time): under ASan the causal attention
# test takes about half of the programs' CPU time, the cache-plan test about a sixth.
TARGETS=(cpu_causal_attention_test cuda_kivi_cache_plan_test cpu_attention_test attention_test
         npy_test safetensors_test spec_test footprint_test core_half_test gguf_test core_error_test
         fp8_format_test fp8_scale_test kivi_minmax_test kivi_pack_test kivi_cache_test
         kivi_arith_fp16_test cpu_fp8_test cpu_kivi_test cpu_side_kernels_test)
command -v clang++-14 > /dev/null || { echo "sanitize.sh: clang++-14 is missing (apt-get install clang-14)" >&2; exit 1; }
command -v ninja > /dev/null || { echo "sanitize.sh: ninja is missing (apt-get install ninja-build)" >&2; exit 1; }
# The preset's generator is Ninja, which builds the programs in parallel (make built one at a
# time); a build/asan of another generator or compiler (before the presets were one: Make, GCC) is
# configured afresh.
fresh=$( (grep -qs '^CMAKE_GENERATOR:INTERNAL=Ninja$' build/asan/CMakeCache.txt &&
          grep -qs '^KVQ_FUZZ:BOOL=ON$' build/asan/CMakeCache.txt) || echo --fresh)
cmake --preset asan $fresh > /dev/null
cmake --build --preset asan -j "${KVQ_JOBS:-$(nproc)}" --target "${TARGETS[@]}"
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
# Idle OpenMP workers sleep instead of spinning: the programs run side by side on few cores, and
# a spinning team takes the other program's core (as in the test preset, CMakePresets.json).
export OMP_WAIT_POLICY=passive
logs=build/asan/sanitize-logs   # each program's output and exit status
rm -rf "$logs" && mkdir -p "$logs"
for t in "${TARGETS[@]}"; do
  [[ -n "$(find build/asan/tests -type f -name "$t" -perm -u+x)" ]] ||
    { echo "sanitize.sh: $t was not built" >&2; exit 1; }
done
# The causal attention test, about 60% of the programs' CPU time, runs as two gtest shards (each
# case in one of them), so it no longer runs alone on one core after the rest have finished.
JOBS=("cpu_causal_attention_test:0" "cpu_causal_attention_test:1")
for t in "${TARGETS[@]}"; do [[ $t == cpu_causal_attention_test ]] || JOBS+=("$t"); done
run_one() {  # NAME or NAME:SHARD (of 2)
  local bin rc=0 t0=$SECONDS shard=()
  [[ $1 == *:* ]] && shard=(GTEST_TOTAL_SHARDS=2 "GTEST_SHARD_INDEX=${1#*:}")
  bin=$(find build/asan/tests -type f -name "${1%:*}" -perm -u+x | head -1)
  env "${shard[@]}" "$bin" --gtest_brief=1 > "$logs/$1.log" 2>&1 || rc=$?
  echo "$rc" > "$logs/$1.rc"
  echo "$((SECONDS - t0)) s $1" > "$logs/$1.time"
}
export -f run_one && export logs
printf '%s\n' "${JOBS[@]}" | xargs -P "${KVQ_JOBS:-$(nproc)}" -I{} bash -c 'run_one {}'
cases=0 failed=0
for t in "${JOBS[@]}"; do
  if [[ "$(cat "$logs/$t.rc" 2>/dev/null)" != 0 ]]; then
    tail -40 "$logs/$t.log" >&2
    echo "sanitize.sh: $t FAILED under ASan/UBSan (exit $(cat "$logs/$t.rc" 2>/dev/null); $logs/$t.log)" >&2
    failed=1
    continue
  fi
  n=$(grep -o '\[==========\] [0-9]* tests' "$logs/$t.log" | grep -o '[0-9]*' | tail -1)
  cases=$((cases + ${n:-0}))
done
((failed == 0)) || exit 1
echo "sanitize.sh: ${#TARGETS[@]} test programs, $cases cases, no ASan/UBSan report (slowest:" \
     "$(cat "$logs"/*.time | sort -rn | head -3 | paste -sd, | sed 's/,/, /g'))"
