// Backend `cpu`: what every CPU path's attention blocks share (kernels/cpu/attention.h states
// what they compute; kernels/cpu/attention/segment.cpp runs them): the portable row-at-a-time
// path, which every path compiles and runs for the members its SIMD blocks do not take, and the
// helpers the SIMD blocks (kernels/cpu/attention/x86/) read too. Internal to the backend.
#pragma once

#include <cmath>
#include <cstdint>

#include "core/stored_side.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/segment.h"

namespace kvq::cpu::KVQ_CPU_PATH_NS::attn {

/// A dense side may read its tokens from quantized_tokens on from `residual` (a causal position's
/// exact tail, kernels/cpu/attention.h); the end of its own rows within [.., t1).
inline int64_t dense_end(const StoredSide& s, int64_t t1) {
  return s.residual ? std::min(t1, s.quantized_tokens) : t1;
}

/// Every score so far -inf (or NaN): the weights are 0 (a NaN stays NaN), as the reference's
/// softmax gives -inf scores beside any finite one; where all are -inf, l stays 0 and the output
/// is 0 / 0, NaN, as the reference's. (exp(s - mn) would be exp(NaN) here.)
inline bool all_minus_inf_step(float* s, int64_t n, float mn, float& l, float* o, int64_t D) {
  if (mn != -INFINITY) return false;
  float sum = 0;
  for (int64_t t = 0; t < n; ++t) sum += s[t] = s[t] == -INFINITY ? 0.0f : s[t];
  l = l * 0.0f + sum;  // the running max was -inf too: alpha = 0 (a NaN in l or o stays)
  for (int64_t d = 0; d < D; ++d) o[d] *= 0.0f;
  return true;
}

/// Tokens [a, b) of one call on the portable path: each row dequantized as the reference reads it
/// back (fetch_row), the scores, softmax step and values in float, into P.
void portable_range(const Call& c, int64_t a, int64_t b, Partial& P, Scratch& w);

}  // namespace kvq::cpu::KVQ_CPU_PATH_NS::attn
