#!/usr/bin/env bash
# Fuzzes kvq's parsers and quantizers with libFuzzer (fuzz/README.md).
#   scripts/fuzz.sh [SECONDS] [TARGET...]    default: 60 seconds each, every target
# Builds the targets it runs in the `asan` preset, the build scripts/sanitize.sh's unit tests come
# from too (clang 14, ASan + UBSan + libFuzzer's coverage, Ninja; -O1 with line tables only, as
# OSS-Fuzz builds: reports name file and line, and the build takes about half the CPU time of full
# -g, e.g. backend cpu's KIVI quantizers 90 s instead of 169 s), seeds each
# target's corpus from fuzz/corpus/<target>/ (make_seeds writes it when missing), runs each target
# for SECONDS with a 2 GiB RSS limit, a 1 GiB single-allocation limit and a 10 s per-input
# timeout, and prints one line per target: executions, seconds, new corpus entries, and FAILED
# with the crash file when libFuzzer found something. Exit status 1 when any target failed.
# Run from anywhere.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
secs=${1:-60}
shift || true
all=(npy safetensors gguf tokenizer spec calibration config roundtrip hf_config tokenizer_json)
targets=("${@:-${all[@]}}")
for t in "${targets[@]}"; do
  [[ " ${all[*]} " == *" $t "* ]] || { echo "fuzz.sh: unknown target '$t' (targets: ${all[*]})" >&2; exit 2; }
done
[[ "$secs" =~ ^[0-9]+$ && "$secs" -ge 1 ]] || { echo "fuzz.sh: SECONDS must be a whole number >= 1, got '$secs'" >&2; exit 2; }
command -v clang++-14 > /dev/null || { echo "fuzz.sh: clang++-14 is missing (apt-get install clang-14)" >&2; exit 1; }
command -v ninja > /dev/null || { echo "fuzz.sh: ninja is missing (apt-get install ninja-build)" >&2; exit 1; }
mkdir -p build
# A build/asan of another generator or compiler (before the presets were one: Make, GCC) is
# configured afresh.
fresh=$( (grep -qs '^CMAKE_GENERATOR:INTERNAL=Ninja$' build/asan/CMakeCache.txt &&
          grep -qs '^KVQ_FUZZ:BOOL=ON$' build/asan/CMakeCache.txt) || echo --fresh)
cmake --preset asan $fresh > build/fuzz-configure.log 2>&1 || { cat build/fuzz-configure.log >&2; exit 1; }
# Only the targets this run fuzzes (and make_seeds when the seeds are missing), not the kvq CLI.
build=("${targets[@]/#/fuzz_}")
[[ -d fuzz/corpus/npy ]] || build+=(make_seeds)
cmake --build --preset asan -j"${KVQ_JOBS:-$(nproc)}" --target "${build[@]}" > build/fuzz-build.log 2>&1 ||
  { tail -30 build/fuzz-build.log >&2; echo "fuzz.sh: the fuzz build failed (build/fuzz-build.log)" >&2; exit 1; }
model="${KVQ_MODEL_DIR:-$HOME/.cache/kvq}/SmolLM2-135M-Instruct.Q4_1.gguf"
B=build/asan/fuzz   # the targets, and each run's log, result, new inputs and crash files
[[ -d fuzz/corpus/npy ]] || "$B/make_seeds" fuzz/corpus
mkdir -p fuzz/corpus/config  # its seeds are the shipped configs, read from experiments/configs/
# The targets run KVQ_JOBS at a time (each libFuzzer process is one thread, so each still gets its
# SECONDS on a core of its own); their lines print in the order asked.
fuzz_one() {
  local t=$1 work log rc=0 runs entries
  if [[ $t == tokenizer && ! -f "$model" ]]; then
    echo "fuzz_tokenizer: skipped (no model at $model; scripts/fetch-model.sh)" \
      > "$B/$t.result"
    return
  fi
  work=$B/corpus/$t   # new inputs land here, not in the committed seeds
  mkdir -p "$work" "$B/artifacts"
  log=$B/$t.log
  "$B/fuzz_$t" -max_total_time="$secs" -rss_limit_mb=2048 -malloc_limit_mb=1024 -timeout=10 \
    -close_fd_mask=1 -artifact_prefix="$B/artifacts/$t-" -print_final_stats=1 \
    "$work" "fuzz/corpus/$t" $([[ $t == config ]] && echo experiments/configs) > "$log" 2>&1 ||
    rc=$?
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo "?")
  entries=$(find "$work" -type f | wc -l)
  if [[ $rc -eq 0 ]]; then
    echo "fuzz_$t: $runs executions in ${secs} s, corpus $entries, no finding"
  else
    echo "fuzz_$t: FAILED (exit $rc) after $runs executions: $(ls -t "$B"/artifacts/$t-* 2>/dev/null | head -1); log $log"
  fi > "$B/$t.result"
}
export -f fuzz_one && export model B secs
rm -f "$B"/*.result
printf '%s\n' "${targets[@]}" | xargs -P "${KVQ_JOBS:-$(nproc)}" -I{} bash -c 'fuzz_one {}' || true
failed=0
for t in "${targets[@]}"; do
  cat "$B/$t.result" 2>/dev/null ||
    { echo "fuzz_$t: FAILED (no result)"; failed=1; continue; }
  grep -q ': FAILED' "$B/$t.result" && failed=1
done
exit $failed
