#!/usr/bin/env bash
# Builds the CUDA test and bench binaries on this machine (which has the packages) for a GPU
# machine that has a driver but none of the packages (the device tool's bare image), and gathers
# them with the shared libraries they need in one folder:
#
#   scripts/device-pack.sh [DIR] [ARCH]      # DIR defaults to .device-pack, ARCH to 90
#   scripts/device-pack.sh --list            # the files the pack holds (DIR-relative), one a line;
#                                            # builds nothing (device-check's plan test reads it)
#
# and compresses the folder into DIR.tar.xz, the file a device run carries (64 MiB at most). Then, on
# the GPU machine, from the repo root with DIR.tar.xz (or DIR) beside it:
#
#   LD_LIBRARY_PATH=$PWD/DIR/lib KVQ_DC_PREBUILT=DIR scripts/device-check.sh OUTDIR
#
# Host code is the portable build (KVQ_NATIVE=OFF, the default): baseline x86-64, with backend
# cpu's kernels and the model's packed products compiled for every CPU path and the GPU machine's
# own chosen at run time (README "CPU paths"), since its CPU is not this one. CMAKE_CXX_FLAGS is
# emptied so that a build folder from before (which added -mavx2 -mfma -mf16c) drops them.
# DIR and DIR.tar.xz should be ignored by git (.gitignore has the default's) so that they travel
# only when asked for.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# shellcheck source=scripts/cuda-targets.sh
source scripts/cuda-targets.sh
# What the pack holds: "BUILD-PATH PACK-PATH" a line (the target is BUILD-PATH's file name): every
# CUDA test and bench binary, and kvq (its model, [throughput] and [model] runs on backend cuda).
pack_files() {
  local t
  for t in $(cuda_test_targets); do echo "tests/cuda/$t tests/cuda/$t"; done
  for t in $(cuda_bench_targets); do echo "bench/$t bench/$t"; done
  echo "experiments/kvq bin/kvq"
}
if [[ "${1:-}" == --list ]]; then
  pack_files | cut -d' ' -f2
  exit 0
fi
DIR=${1:-.device-pack}
ARCH=${2:-90}
BUILD=build/device-pack
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DKVQ_CUDA=ON "-DCMAKE_CUDA_ARCHITECTURES=$ARCH" \
  -DKVQ_NATIVE=OFF -DCMAKE_CXX_FLAGS= >/dev/null
# shellcheck disable=SC2046
cmake --build "$BUILD" -j "$(nproc)" --target $(pack_files | cut -d' ' -f1 | xargs -n1 basename)
rm -rf "$DIR"
mkdir -p "$DIR/tests/cuda" "$DIR/bench" "$DIR/bin" "$DIR/lib"
pack_files | while read -r from to; do cp "$BUILD/$from" "$DIR/$to"; done
# Every shared library the binaries load except the C library's own and the driver's.
for f in "$DIR"/tests/cuda/* "$DIR"/bench/* "$DIR"/bin/*; do
  ldd "$f" | awk '$3 ~ /^\// {print $3}'
done | sort -u | grep -vE '/(libc|libm|libdl|libpthread|librt|ld-linux[^/]*)\.so|/libcuda\.so' |
  while read -r l; do cp -L "$l" "$DIR/lib/"; done
du -sh "$DIR"
# The folder (~190 MB: every binary links the same ~20 MB of kernels and cudart) does not fit the
# 64 MiB a device run carries; xz with its 64 MiB dictionary (-9, one thread) finds the copies
# across files: ~16 MB, ~1 min of one core. device-check.sh unpacks DIR.tar.xz itself when DIR is
# absent (Python's tarfile: the device image need not have xz).
tar -C "$(dirname "$DIR")" -cf - "$(basename "$DIR")" | xz -9 -T1 >"$DIR.tar.xz"
du -sh "$DIR.tar.xz"
echo "device-pack: carry $DIR.tar.xz (git ignores it); on the GPU machine run:"
echo "  LD_LIBRARY_PATH=\$PWD/$DIR/lib KVQ_DC_PREBUILT=$DIR scripts/device-check.sh OUTDIR"
