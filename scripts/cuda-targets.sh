# shellcheck shell=bash
# The CUDA test and bench targets, one list for scripts/device-check.sh and scripts/device-pack.sh
# (sourced; run from the repo root). A test is each kvq_test(cuda_...) in tests/cuda/CMakeLists.txt;
# a bench is each bench/bench_*_cuda.cu.
cuda_test_targets() {
  grep -oE 'kvq_test\((cuda_[A-Za-z0-9_]+)' tests/cuda/CMakeLists.txt | sed 's/kvq_test(//' | sort -u
}
cuda_bench_targets() {
  local f
  for f in bench/bench_*_cuda.cu; do [[ -e "$f" ]] && basename "$f" .cu; done
  return 0
}
