#!/usr/bin/env bash
# Set up, build (CUDA kernels too when nvcc is present), and run the quick test tier.
# The full tier: ctest --preset default -L full   (after this script has built once).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
scripts/setup.sh
ctest --preset "${KVQ_PRESET:-default}" -j "${KVQ_JOBS:-$(nproc)}"
