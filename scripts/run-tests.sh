#!/usr/bin/env bash
# Check the layering, set up, build (CUDA kernels too when nvcc is present), and run the quick tier:
#   0. scripts/check-layers.py: every include and import against the allowed folder graph (<1 s);
#   1. ctest: every quick C++ test and the Python tests (pytest) on the default build, backend
#      cpu's kernel tests also under each CPU path this host runs (KVQ_CPU_PATH, label cpu_path);
#      the test preset sets OMP_WAIT_POLICY=passive: tests run side by side, and an OpenMP team
#      spinning between parallel regions took the other test's core (cpu_causal_attention_test
#      spent 62% of its CPU time spinning in libgomp; passive: half the wall time);
#   2. scripts/sanitize.sh: the library unit tests again under ASan + UBSan (preset asan, clang 14:
#      only those programs, without the CLI's code, backend cpu's portable and widest host paths
#      only, KVQ_CPU_PATHS=host; they run KVQ_JOBS at a time);
#   3. scripts/fuzz.sh 10: every libFuzzer target for 10 s from its committed seeds (the same
#      build, preset asan: step 2 built the libraries, this adds the targets; KVQ_JOBS at a time).
# What each step costs from a fresh clone with ccache empty (Intel Xeon (AVX-512, AMX), 2 cores;
# README's CI-time paragraph): setup and the default build 723 s wall (980c07b; the build alone
# 1,114 CPU-seconds at 313b265: library sources 299, backend cpu's four paths 292, test sources
# 273, every .cu 229 (attention_kernels.cu 106, the longest), links 15); ctest about 550
# test-seconds, 265 s wall; steps 2 and 3 one clang build, 825 CPU-seconds together (sanitize.sh
# 600: the libraries, the 20 programs and their run; fuzz.sh 225: kvq_run, the targets, 100 s of
# fuzzing), 1,120 when each had a build of its own.
# KVQ_QUICK_ONLY=1 runs steps 0 and 1 alone. The full tier (after this script has built once):
#   ctest --test-dir build/default -L full && scripts/fuzz.sh 600   (the preset excludes label full)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# Each step's wall time goes to stderr ("run-tests: <step> took N s"), so a slow CI run says where.
step() {
  local t0=$SECONDS
  "$@"
  echo "run-tests: $* took $((SECONDS - t0)) s" >&2
}
step python3 scripts/check-layers.py
step scripts/setup.sh
step ctest --preset "${KVQ_PRESET:-default}" -j "${KVQ_JOBS:-$(nproc)}"
if [[ -z "${KVQ_QUICK_ONLY:-}" ]]; then
  step scripts/sanitize.sh
  step scripts/fuzz.sh 10
fi
echo "run-tests: all steps took ${SECONDS} s" >&2
