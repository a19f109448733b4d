// Backend `cpu`, x86 attention blocks (kernels/cpu/attention/x86/): the headers every block file
// includes, and what fp8 sides need beside their loaders (their per-token factors, whether the
// int8 mode's bf16 dot products take them). Included where the build targets AVX2 (KVQ_CPU_AVX2).
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "fp8/format.h"
#include "fp8/scale.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/attention/portable.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/segment.h"
#include "kernels/cpu/simd_decode.h"
#include "kivi/group.h"
#include "kivi/layout.h"
#include "kivi/minmax.h"

namespace kvq::cpu::KVQ_CPU_PATH_NS::attn {
// Internal to this path's attention sources: each file that includes it has its own copy (internal
// linkage), as when they were one translation unit, so the compiler inlines them as it did.
namespace {

/// Whether an fp8 side takes the int8 mode's bf16 dot products.
[[maybe_unused]] bool fp8_bf16(IntMode mode, const StoredSide& s) {
  return KVQ_CPU_BF16DOT && fp8_bf16_side(mode, s);
}

/// Per-(token, head) factor of an fp8 side's scale (tensor / head / token; 1 for channel).
[[maybe_unused]] float fp8_token_factor(const StoredSide& s, int64_t t, int64_t h) {
  if (s.gran == Granularity::Channel) return 1.0f;
  return s.fp8_scales[fp8::scale_index(s.gran, t, h, 0, s.heads, s.dim)];
}

#if KVQ_CPU_BF16DOT
/// f[h * ld + t - t0] = fp8_token_factor(s, t, h) * mul for tokens [t0, t1) of every head: the
/// same products, one loop per granularity instead of an index per element (a gather of 16 tokens'
/// scales per token measured the same as this loop, session 28).
[[maybe_unused]] void fp8_row_factors(const StoredSide& s, int64_t t0, int64_t t1, float mul,
                                      float* f, int64_t ld) {
  const int64_t H = s.heads, n = t1 - t0;
  for (int64_t h = 0; h < H; ++h) {
    float* fh = f + h * ld;
    if (s.gran == Granularity::Token) {
      const float* sc = s.fp8_scales + t0 * H + h;  // scale_index: t * heads + h
      for (int64_t u = 0; u < n; ++u) fh[u] = sc[u * H] * mul;
    } else {
      std::fill(fh, fh + n, fp8_token_factor(s, t0, h) * mul);  // one factor a head
    }
  }
}
#endif

}  // namespace
}  // namespace kvq::cpu::KVQ_CPU_PATH_NS::attn
