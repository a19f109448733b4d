#!/usr/bin/env bash
# Backend cpu's kernel tests, built and run twice more: preset avx2 (the 256-bit forms a CPU
# without AVX-512 runs: -mavx2 -mfma -mf16c instead of -march=native) and preset portable
# (KVQ_CPU_PORTABLE: the scalar fallback). The default build takes the widest forms the host
# has; these keep the others compiling and correct on a host that would not run them otherwise.
# The avx2 build runs only on a CPU with AVX2, FMA and F16C.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
mkdir -p build
targets=(cpu_attention_test cpu_simd_decode_test cpu_fp8_test cpu_kivi_test
         cpu_causal_attention_test cpu_side_kernels_test)
jobs="${KVQ_JOBS:-$(nproc)}"
for preset in avx2 portable; do
  if [[ $preset == avx2 ]]; then
    flags=$(grep -m1 '^flags' /proc/cpuinfo || true)
    if ! [[ " $flags " == *" avx2 "* && " $flags " == *" fma "* && " $flags " == *" f16c "* ]]; then
      echo "isa-builds.sh: this CPU lacks AVX2, FMA or F16C; preset avx2 skipped"
      continue
    fi
  fi
  cmake --preset "$preset" > "build/isa-$preset-configure.log" 2>&1 ||
    { cat "build/isa-$preset-configure.log"; exit 1; }
  cmake --build --preset "$preset" -j "$jobs" --target "${targets[@]}"
  for t in "${targets[@]}"; do
    "build/$preset/tests/kernels/cpu/$t" --gtest_brief=1 > "build/isa-$preset-$t.log" 2>&1 ||
      { tail -40 "build/isa-$preset-$t.log"; echo "isa-builds.sh: $t failed in preset $preset"; exit 1; }
  done
  echo "isa-builds.sh: preset $preset: ${#targets[@]} kernel test programs passed"
done
