#!/usr/bin/env bash
# Set up, build (CUDA kernels too when nvcc is present), and run the quick test tier:
#   1. ctest: every quick C++ test and the Python tests (pytest) on the default build;
#   2. scripts/sanitize.sh: the library unit tests again under ASan + UBSan (preset asan);
#   3. scripts/fuzz.sh 10: every libFuzzer target for 10 s from its committed seeds (preset fuzz);
#   4. scripts/isa-builds.sh: backend cpu's kernel tests again with its 256-bit forms (preset
#      avx2) and its portable path (preset portable), which a host with AVX-512 does not run.
# KVQ_QUICK_ONLY=1 runs step 1 alone. The full tier (after this script has built once):
#   ctest --test-dir build/default -L full && scripts/fuzz.sh 600   (the preset excludes label full)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
scripts/setup.sh
ctest --preset "${KVQ_PRESET:-default}" -j "${KVQ_JOBS:-$(nproc)}"
if [[ -z "${KVQ_QUICK_ONLY:-}" ]]; then
  scripts/sanitize.sh
  scripts/fuzz.sh 10
  scripts/isa-builds.sh
fi
