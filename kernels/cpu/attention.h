// Backend `cpu`: decode attention over the stored codes (one query token), the same operation as
// reference_cpu/attention.h's decode_attention: o = softmax(q K^T / sqrt(D)) V per query head,
// query head j reading kv head j / (q_heads / kv_heads).
//
// One pass over the context in token blocks with an online softmax (running max m, sum l and
// unnormalized output per query head; no T-long score row), token-major so each block of every
// head is read from contiguous memory, every code unpacked once for the whole GQA group. Threads
// take contiguous slices of the context and their partials are merged:
//   M = max m_s,  o = sum_s e^(m_s - M) o_s / sum_s e^(m_s - M) l_s.
//
// Paths (AVX2+FMA+F16C; anything else takes the portable path, same results within tolerance):
//   fp32 / bf16 / fp16   rows widened in registers, several tokens x query heads of accumulators
//   fp8 (all formats, every granularity)   codes decoded arithmetically (exact: fp8::decode)
//   int (KIVI axes): keys per-channel (2/3/4/8 bits), values per-token (2/4/8 bits, G a multiple
//     of 8), the exact residual window as fp32; head_dim a multiple of 8 and GQA 1-8 throughout
//     IntMode::Exact   codes widened to float; per-channel scales folded into q per group
//     IntMode::Int8    keys of 2 and 4 bits, head_dim a multiple of 32: q * scale quantized to
//                      int8 per (key group, query head), scores as integer dot products on the
//                      codes (vpmaddubsw + vpmaddwd); values as Exact
//
// Tolerances against the reference (tests/kernels/cpu/attention_test.cpp): Exact mode is float
// arithmetic in another order (and a polynomial exp), max |o - o_ref| <= 2e-5 * max |V| (outputs
// are convex combinations of V rows; observed <= 1.5e-6). Int8 mode equals its own definition
// (the int8-rounded q * scale, integer sums) within the same tolerance; its distance to the exact
// reference is the int8 rounding of q * scale, 0.7-4% of max |V| on keys with outlier channels
// (docs/benchmarks.md).
#pragma once

#include <cstdint>

#include "core/stored_side.h"

namespace kvq::cpu {

/// \brief How int keys are read: exact float products, or int8 query x code integer dots.
enum class IntMode { Exact, Int8 };

struct DecodeOptions {
  int threads = 1;  ///< 0: all cores
  IntMode int_mode = IntMode::Exact;
};

/// \brief o = softmax(q K^T / sqrt(d)) V over all tokens of k and v; q and out are
/// [q_heads, dim]. Throws kvq::Error on mismatched sides, an empty cache, or q_heads that is not a
/// multiple of the kv heads.
void decode_attention(const float* q, int64_t q_heads, const StoredSide& k, const StoredSide& v,
                      float* out, const DecodeOptions& opt = {});

/// \brief Whether decode_attention takes a SIMD path for this pair of sides (else portable).
bool has_fast_path(const StoredSide& k, const StoredSide& v, int64_t q_heads);

}  // namespace kvq::cpu
