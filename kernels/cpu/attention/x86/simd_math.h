// Backend `cpu`, x86 attention blocks: the SIMD arithmetic they share: e^x on 8 and 16 lanes, the
// horizontal sums and maxima, unaligned word reads, and the online-softmax step (one query head,
// or NQ heads interleaved).
#pragma once

#include "kernels/cpu/attention/x86/common.h"

namespace kvq::cpu::KVQ_CPU_PATH_NS::attn {
// Internal to this path's attention sources: each file that includes it has its own copy (internal
// linkage), as when they were one translation unit, so the compiler inlines them as it did.
namespace {

// e^x (Cephes expf: range reduction by ln 2 in two parts, degree-6 polynomial); x clamped to
// [-87, 88] (e^-87 ~ 1.6e-38 is zero next to the block's largest weight, 1). The same steps on 8
// lanes (exp8) and 16 (exp16), so the same values.
constexpr float kExpLo = -87.0f, kExpHi = 88.0f, kLog2e = 1.44269504088896341f;
constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
constexpr float kExpP[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                            4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};

inline __m256 exp8(__m256 x) {
  // the clamp's operands in this order pass a NaN through (max / min return their second operand
  // when either is NaN): a NaN score gives a NaN weight, as std::exp and the reference do
  x = _mm256_min_ps(_mm256_set1_ps(kExpHi), _mm256_max_ps(_mm256_set1_ps(kExpLo), x));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(kLog2e)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  x = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Hi), x);
  x = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Lo), x);
  __m256 y = _mm256_set1_ps(kExpP[0]);
  for (int k = 1; k < 6; ++k) y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(kExpP[k]));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
  const __m256i e =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

#if KVQ_CPU_AVX512
inline __m512 exp16(__m512 x) {
  x = _mm512_maskz_min_ps(kAll16, _mm512_set1_ps(kExpHi),
                          _mm512_maskz_max_ps(kAll16, _mm512_set1_ps(kExpLo), x));  // as exp8
  const __m512 n = _mm512_maskz_roundscale_ps(kAll16, _mm512_mul_ps(x, _mm512_set1_ps(kLog2e)),
                                              _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  x = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Hi), x);
  x = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Lo), x);
  __m512 y = _mm512_set1_ps(kExpP[0]);
  for (int k = 1; k < 6; ++k) y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(kExpP[k]));
  y = _mm512_fmadd_ps(y, _mm512_mul_ps(x, x), _mm512_add_ps(x, _mm512_set1_ps(1.0f)));
  const __m512i e = _mm512_maskz_slli_epi32(
      kAll16, _mm512_add_epi32(_mm512_maskz_cvtps_epi32(kAll16, n), _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(y, _mm512_castsi512_ps(e));
}
#endif

inline float hmax8(__m256 v) { return _mm256_cvtss_f32(lanes_max(v)); }

/// Unaligned 32- and 64-bit reads of packed bytes.
inline uint32_t load_u32(const void* p) {
  uint32_t x;
  std::memcpy(&x, p, 4);
  return x;
}
inline uint64_t load_u64(const void* p) {
  uint64_t x;
  std::memcpy(&x, p, 8);
  return x;
}

/// Lane sums of four vectors: {sum a, sum b, sum c, sum d}.
inline __m128 hsum4(__m256 a, __m256 b, __m256 c, __m256 d) {
  const __m256 t = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
  return _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
}

/// softmax_step's first pass: s *= scale in place; returns the largest.
[[maybe_unused]] float softmax_scale(float* s, int64_t n, float scale) {
  const __m256 sc = _mm256_set1_ps(scale);
  __m256 mx = _mm256_set1_ps(-INFINITY);
  int64_t t = 0;
#if KVQ_CPU_AVX512
  __m512 mx16 = _mm512_set1_ps(-INFINITY);
  for (; t + 16 <= n; t += 16) {
    const __m512 v = _mm512_mul_ps(_mm512_loadu_ps(s + t), _mm512_set1_ps(scale));
    _mm512_storeu_ps(s + t, v);
    mx16 = _mm512_maskz_max_ps(kAll16, mx16, v);
  }
  mx = _mm256_max_ps(_mm512_maskz_extractf32x8_ps(0xff, mx16, 0),
                     _mm512_maskz_extractf32x8_ps(0xff, mx16, 1));
#endif
  for (; t + 8 <= n; t += 8) {
    const __m256 v = _mm256_mul_ps(_mm256_loadu_ps(s + t), sc);
    _mm256_storeu_ps(s + t, v);
    mx = _mm256_max_ps(mx, v);
  }
  float mb = hmax8(mx);
  for (; t < n; ++t) mb = std::max(mb, s[t] *= scale);
  return mb;
}

/// The rest of softmax_step, from the first pass's largest score mb.
[[maybe_unused]] void softmax_finish(float* s, int64_t n, float mb, float& m, float& l, float* o,
                                     int64_t D) {
  const float mn = std::max(m, mb);
  if (all_minus_inf_step(s, n, mn, l, o, D)) return;
  const float alpha = m == -INFINITY ? 0.0f : std::exp(m - mn);
  const __m256 mv = _mm256_set1_ps(mn);
  __m256 sum = _mm256_setzero_ps();
  int64_t t = 0;
#if KVQ_CPU_AVX512
  __m512 sum16 = _mm512_setzero_ps();
  for (; t + 16 <= n; t += 16) {
    const __m512 p = exp16(_mm512_sub_ps(_mm512_loadu_ps(s + t), _mm512_set1_ps(mn)));
    _mm512_storeu_ps(s + t, p);
    sum16 = _mm512_add_ps(sum16, p);
  }
  sum = _mm256_add_ps(_mm512_maskz_extractf32x8_ps(0xff, sum16, 0),
                      _mm512_maskz_extractf32x8_ps(0xff, sum16, 1));
#endif
  for (; t + 8 <= n; t += 8) {
    const __m256 p = exp8(_mm256_sub_ps(_mm256_loadu_ps(s + t), mv));
    _mm256_storeu_ps(s + t, p);
    sum = _mm256_add_ps(sum, p);
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, sum);
  float total = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) +
                ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
  for (; t < n; ++t) total += s[t] = std::exp(s[t] - mn);
  l = l * alpha + total;
  if (alpha != 1.0f) {
    const __m256 a = _mm256_set1_ps(alpha);
    for (int64_t d = 0; d < D; d += 8)
      _mm256_storeu_ps(o + d, _mm256_mul_ps(_mm256_loadu_ps(o + d), a));
  }
  m = mn;
}

/// softmax_step_scalar on 16 lanes (AVX-512) or 8 (softmax_scale, then softmax_finish); s has
/// room for n rounded up to 8.
[[maybe_unused]] void softmax_step(float* s, int64_t n, float scale, float& m, float& l, float* o,
                                   int64_t D) {
  softmax_finish(s, n, softmax_scale(s, n, scale), m, l, o, D);
}

/// softmax_step for NQ query heads (rows of s lds apart; m, l, o: the heads' in order, o rows D
/// apart). With AVX-512 and n a multiple of 16, the heads' passes run interleaved, each head's
/// arithmetic exactly softmax_step's (the same values, bits included): the heads' chains of
/// reductions and their scalar exps overlap instead of following one another.
template <int NQ>
void softmax_rows(float* s, int64_t lds, int64_t n, float scale, float* m, float* l, float* o,
                  int64_t D) {
#if KVQ_CPU_AVX512
  if (n > 0 && n % 16 == 0) {
    __m512 acc[NQ];
    float mb[NQ], mn[NQ], alpha[NQ];
    for (auto& x : acc) x = _mm512_set1_ps(-INFINITY);
    for (int64_t t = 0; t < n; t += 16)
      for (int i = 0; i < NQ; ++i) {
        float* si = s + i * lds + t;
        const __m512 v = _mm512_mul_ps(_mm512_loadu_ps(si), _mm512_set1_ps(scale));
        _mm512_storeu_ps(si, v);
        acc[i] = _mm512_maskz_max_ps(kAll16, acc[i], v);
      }
    bool all_finite = true;
    for (int i = 0; i < NQ; ++i) {
      mb[i] = hmax8(_mm256_max_ps(_mm512_maskz_extractf32x8_ps(0xff, acc[i], 0),
                                  _mm512_maskz_extractf32x8_ps(0xff, acc[i], 1)));
      mn[i] = std::max(m[i], mb[i]);
      all_finite = all_finite && mn[i] != -INFINITY;
    }
    if (!all_finite) {  // a head whose scores are all -inf so far: softmax_finish handles it
      for (int i = 0; i < NQ; ++i) softmax_finish(s + i * lds, n, mb[i], m[i], l[i], o + i * D, D);
      return;
    }
    for (int i = 0; i < NQ; ++i) {
      alpha[i] = m[i] == -INFINITY ? 0.0f : std::exp(m[i] - mn[i]);
      acc[i] = _mm512_setzero_ps();
    }
    for (int64_t t = 0; t < n; t += 16)
      for (int i = 0; i < NQ; ++i) {
        float* si = s + i * lds + t;
        const __m512 p = exp16(_mm512_sub_ps(_mm512_loadu_ps(si), _mm512_set1_ps(mn[i])));
        _mm512_storeu_ps(si, p);
        acc[i] = _mm512_add_ps(acc[i], p);
      }
    for (int i = 0; i < NQ; ++i) {
      alignas(32) float lanes[8];
      _mm256_store_ps(lanes, _mm256_add_ps(_mm512_maskz_extractf32x8_ps(0xff, acc[i], 0),
                                           _mm512_maskz_extractf32x8_ps(0xff, acc[i], 1)));
      const float total = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) +
                          ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
      l[i] = l[i] * alpha[i] + total;
      if (alpha[i] != 1.0f) {
        const __m256 a = _mm256_set1_ps(alpha[i]);
        float* oi = o + i * D;
        for (int64_t d = 0; d < D; d += 8)
          _mm256_storeu_ps(oi + d, _mm256_mul_ps(_mm256_loadu_ps(oi + d), a));
      }
      m[i] = mn[i];
    }
    return;
  }
#endif
  for (int i = 0; i < NQ; ++i) softmax_step(s + i * lds, n, scale, m[i], l[i], o + i * D, D);
}

inline float hsum8(__m256 v) {
  const __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 y = _mm_add_ps(x, _mm_movehl_ps(x, x));
  return _mm_cvtss_f32(_mm_add_ss(y, _mm_movehdup_ps(y)));
}

#if KVQ_CPU_AVX512
inline float hsum16(__m512 v) {
  return hsum8(_mm256_add_ps(_mm512_maskz_extractf32x8_ps(0xff, v, 0),
                             _mm512_maskz_extractf32x8_ps(0xff, v, 1)));
}
inline float hmax16(__m512 v) {
  return hmax8(_mm256_max_ps(_mm512_maskz_extractf32x8_ps(0xff, v, 0),
                             _mm512_maskz_extractf32x8_ps(0xff, v, 1)));
}
#endif

}  // namespace
}  // namespace kvq::cpu::KVQ_CPU_PATH_NS::attn
