#!/usr/bin/env bash
# The library unit tests under AddressSanitizer + UndefinedBehaviorSanitizer (preset `asan`, GCC,
# Debug): formats, parsers, quantizers, caches and both attention backends - the code every
# command runs on - without the model and CLI tests (those run in the quick tier of the default
# build; under ASan they would take most of CI's budget), and the device KIVI cache's host-side
# planning (cuda_kivi_cache_plan_test: its "device" buffers are heap memory here, so a job
# writing past a buffer is an ASan report). Any sanitizer report fails the test.
#   scripts/sanitize.sh          (scripts/run-tests.sh runs it after the quick tier)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
TARGETS=(npy_test safetensors_test spec_test footprint_test core_half_test gguf_test core_error_test
         fp8_format_test fp8_scale_test kivi_minmax_test kivi_pack_test kivi_cache_test
         kivi_arith_fp16_test attention_test cpu_fp8_test cpu_kivi_test cpu_attention_test
         cpu_causal_attention_test cpu_side_kernels_test cuda_kivi_cache_plan_test)
cmake --preset asan > /dev/null
cmake --build --preset asan -j "${KVQ_JOBS:-$(nproc)}" --target "${TARGETS[@]}"
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
cases=0
for t in "${TARGETS[@]}"; do
  bin=$(find build/asan/tests -type f -name "$t" -perm -u+x | head -1)
  [[ -n "$bin" ]] || { echo "sanitize.sh: $t was not built" >&2; exit 1; }
  out=$("$bin" --gtest_brief=1 2>&1) || { echo "$out" | tail -40 >&2; echo "sanitize.sh: $t FAILED under ASan/UBSan" >&2; exit 1; }
  n=$(echo "$out" | grep -o '\[==========\] [0-9]* tests' | grep -o '[0-9]*' | tail -1)
  cases=$((cases + ${n:-0}))
done
echo "sanitize.sh: ${#TARGETS[@]} test programs, $cases cases, no ASan/UBSan report"
