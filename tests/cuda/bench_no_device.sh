#!/usr/bin/env bash
# usage: tests/cuda/bench_no_device.sh BENCH_BINARY
# A CUDA bench that sees no device (CUDA_VISIBLE_DEVICES="" hides any GPU, so this holds on a GPU
# machine too) prints exactly one line naming the missing device and exits 2, the status
# scripts/device-check.sh reads as "no device" (before issue 46 it printed and exited 0).
set -u
bin=$1
out=$(CUDA_VISIBLE_DEVICES="" "$bin" 2>&1)
rc=$?
lines=$(printf '%s\n' "$out" | grep -c .)
if [[ $rc -ne 2 || $lines -ne 1 || "$out" != *"no CUDA device"* ]]; then
  echo "FAIL: $(basename "$bin") without a device: exit $rc (want 2), $lines lines (want 1): $out"
  exit 1
fi
echo "ok: $out"
