#include "kernels/cpu/fp8.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "fp8/scale.h"
#include "kernels/cpu/isa.h"

namespace kvq::cpu::KVQ_CPU_PATH_NS {
namespace {

#if KVQ_CPU_AVX2
// fp8::encode<F> on 8 lanes, in integer arithmetic on the float's bits (equal to fp8/format.h's
// definition on every float; the full tier checks all 2^32). |x| is clamped to the largest finite
// code as an integer (positive floats order as their bits; +inf included). In the normal range the
// code is the rebiased exponent and top mantissa bits, rounded to nearest even by adding half an
// ulp minus one plus the kept LSB (a mantissa carry rolls into the exponent, as it must). Below the
// smallest normal the quantum is fixed: adding 2^(kMinExp - M + 23) puts round(|x| / quantum),
// rounded to nearest even by the FPU, in the low bits (2^M there is the smallest normal's code).
// Returns one code per 32-bit lane.
template <Fp8Format F>
inline __m256i encode8(__m256 x) {
  using T = fp8::Traits<F>;
  constexpr int kMinExp = 1 - T::kBias;
  constexpr int kShift = 23 - T::kMantBits;
  const __m256i bits = _mm256_castps_si256(x);
  const __m256i abits = _mm256_and_si256(bits, _mm256_set1_epi32(0x7fffffff));
  const __m256i nan = _mm256_cmpgt_epi32(abits, _mm256_set1_epi32(0x7f800000));
  const __m256i a =
      _mm256_min_epi32(abits, _mm256_set1_epi32(static_cast<int>(float_bits(T::kMax))));
  const __m256i rebiased = _mm256_sub_epi32(a, _mm256_set1_epi32((127 - T::kBias) << 23));
  const __m256i half =
      _mm256_add_epi32(_mm256_set1_epi32((1 << (kShift - 1)) - 1),
                       _mm256_and_si256(_mm256_srli_epi32(a, kShift), _mm256_set1_epi32(1)));
  const __m256i normal = _mm256_srli_epi32(_mm256_add_epi32(rebiased, half), kShift);
  const __m256 magic =
      _mm256_set1_ps(pow2(kMinExp - T::kMantBits + 23));
  const __m256i sub =
      _mm256_sub_epi32(_mm256_castps_si256(_mm256_add_ps(_mm256_castsi256_ps(a), magic)),
                       _mm256_castps_si256(magic));
  const __m256i min_normal = _mm256_set1_epi32((127 + kMinExp) << 23);
  const __m256i mag = _mm256_blendv_epi8(normal, sub, _mm256_cmpgt_epi32(min_normal, a));
  __m256i code =
      _mm256_or_si256(mag, _mm256_and_si256(_mm256_srli_epi32(bits, 24), _mm256_set1_epi32(0x80)));
  if constexpr (T::kFnuz)  // no -0: 0x80 is the NaN
    code = _mm256_andnot_si256(_mm256_cmpeq_epi32(mag, _mm256_setzero_si256()), code);
  return _mm256_blendv_epi8(code, _mm256_set1_epi32(T::kNaN), nan);
}

#if KVQ_CPU_AVX512
// encode8 on 16 lanes (the same integer steps; mask registers instead of blends), returning the
// 16 codes as bytes. Zero-masking forms with every lane on (kAll16, kernels/cpu/isa.h) where
// GCC 12's unmasked ones trip -Wmaybe-uninitialized.
template <Fp8Format F>
inline __m128i encode16(__m512 x) {
  using T = fp8::Traits<F>;
  constexpr int kMinExp = 1 - T::kBias;
  constexpr int kShift = 23 - T::kMantBits;
  const __m512i bits = _mm512_castps_si512(x);
  const __m512i abits = _mm512_and_si512(bits, _mm512_set1_epi32(0x7fffffff));
  const __mmask16 nan = _mm512_cmpgt_epi32_mask(abits, _mm512_set1_epi32(0x7f800000));
  const __m512i a = _mm512_maskz_min_epi32(
      kAll16, abits, _mm512_set1_epi32(static_cast<int>(float_bits(T::kMax))));
  const __m512i rebiased =
      _mm512_maskz_sub_epi32(kAll16, a, _mm512_set1_epi32((127 - T::kBias) << 23));
  const __m512i half = _mm512_maskz_add_epi32(
      kAll16, _mm512_set1_epi32((1 << (kShift - 1)) - 1),
      _mm512_and_si512(_mm512_maskz_srli_epi32(kAll16, a, kShift), _mm512_set1_epi32(1)));
  const __m512i normal =
      _mm512_maskz_srli_epi32(kAll16, _mm512_maskz_add_epi32(kAll16, rebiased, half), kShift);
  const __m512 magic =
      _mm512_set1_ps(pow2(kMinExp - T::kMantBits + 23));
  const __m512i sub = _mm512_maskz_sub_epi32(
      kAll16, _mm512_castps_si512(_mm512_maskz_add_ps(kAll16, _mm512_castsi512_ps(a), magic)),
      _mm512_castps_si512(magic));
  const __mmask16 is_sub = _mm512_cmpgt_epi32_mask(_mm512_set1_epi32((127 + kMinExp) << 23), a);
  const __m512i mag = _mm512_mask_mov_epi32(normal, is_sub, sub);
  __m512i code = _mm512_or_si512(
      mag, _mm512_and_si512(_mm512_maskz_srli_epi32(kAll16, bits, 24), _mm512_set1_epi32(0x80)));
  if constexpr (T::kFnuz)  // no -0: 0x80 is the NaN
    code = _mm512_maskz_mov_epi32(_mm512_test_epi32_mask(mag, mag), code);
  code = _mm512_mask_mov_epi32(code, nan, _mm512_set1_epi32(T::kNaN));
  return _mm512_maskz_cvtepi32_epi8(kAll16, code);
}
#endif

// Four vectors of 8 codes (one per 32-bit lane) -> 32 bytes in order.
inline __m256i pack32(__m256i c0, __m256i c1, __m256i c2, __m256i c3) {
  const __m256i b = _mm256_packus_epi16(_mm256_packus_epi32(c0, c1), _mm256_packus_epi32(c2, c3));
  return _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

template <Fp8Format F, bool kPerElement>
void quantize_row_t(const float* x, int64_t n, const float* s, uint8_t* codes) {
  if (n <= 0) return;  // s may be empty then (UBSan: s[0] below read a null pointer)
  int64_t i = 0;
#if KVQ_CPU_AVX512
  const __m512 z1 = _mm512_set1_ps(s[0]);
  for (; i + 16 <= n; i += 16) {
    const __m512 sz = kPerElement ? _mm512_loadu_ps(s + i) : z1;
    _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + i),
                     encode16<F>(_mm512_div_ps(_mm512_loadu_ps(x + i), sz)));
  }
#else
  const __m256 s1 = _mm256_set1_ps(s[0]);
  auto scale = [&](int64_t j) { return kPerElement ? _mm256_loadu_ps(s + j) : s1; };
  for (; i + 32 <= n; i += 32) {
    __m256i c[4];
    for (int k = 0; k < 4; ++k)
      c[k] = encode8<F>(_mm256_div_ps(_mm256_loadu_ps(x + i + 8 * k), scale(i + 8 * k)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes + i), pack32(c[0], c[1], c[2], c[3]));
  }
#endif
  for (; i < n; ++i) codes[i] = fp8::quantize_value<F>(x[i], kPerElement ? s[i] : s[0]);
}
#else
template <Fp8Format F, bool kPerElement>
void quantize_row_t(const float* x, int64_t n, const float* s, uint8_t* codes) {
  for (int64_t i = 0; i < n; ++i)
    codes[i] = fp8::quantize_value<F>(x[i], kPerElement ? s[i] : s[0]);
}
#endif

template <bool kPerElement>
void quantize_row(Fp8Format f, const float* x, int64_t n, const float* s, uint8_t* codes) {
  switch (f) {
    case Fp8Format::E4M3:
      return quantize_row_t<Fp8Format::E4M3, kPerElement>(x, n, s, codes);
    case Fp8Format::E4M3FNUZ:
      return quantize_row_t<Fp8Format::E4M3FNUZ, kPerElement>(x, n, s, codes);
    case Fp8Format::E5M2:
      return quantize_row_t<Fp8Format::E5M2, kPerElement>(x, n, s, codes);
  }
}

// max |x[i]| over a row into a (a running amax >= 0); returns whether the row holds a NaN.
bool amax_row(const float* x, int64_t n, float& a) {
  int64_t i = 0;
  bool nan = false;
#if KVQ_CPU_AVX2
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 m0 = _mm256_set1_ps(a), m1 = m0, bad = _mm256_setzero_ps();
  for (; i + 16 <= n; i += 16) {
    const __m256 v0 = _mm256_and_ps(_mm256_loadu_ps(x + i), abs_mask);
    const __m256 v1 = _mm256_and_ps(_mm256_loadu_ps(x + i + 8), abs_mask);
    m0 = _mm256_max_ps(m0, v0);
    m1 = _mm256_max_ps(m1, v1);
    bad = _mm256_or_ps(bad, _mm256_cmp_ps(v0, v1, _CMP_UNORD_Q));
  }
  a = _mm256_cvtss_f32(lanes_max(_mm256_max_ps(m0, m1)));  // a was in every lane of m0
  nan = _mm256_movemask_ps(bad) != 0;
#endif
  for (; i < n; ++i) {
    const float v = std::fabs(x[i]);
    nan = nan || std::isnan(v);
    a = v > a ? v : a;
  }
  return nan;
}

// Element-wise a[d] = max(a[d], |x[d]|); returns whether x holds a NaN.
bool amax_elementwise(const float* x, int64_t n, float* a) {
  int64_t i = 0;
  bool nan = false;
#if KVQ_CPU_AVX2
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 bad = _mm256_setzero_ps();
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_and_ps(_mm256_loadu_ps(x + i), abs_mask);
    _mm256_storeu_ps(a + i, _mm256_max_ps(_mm256_loadu_ps(a + i), v));
    bad = _mm256_or_ps(bad, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  }
  nan = _mm256_movemask_ps(bad) != 0;
#endif
  for (; i < n; ++i) {
    const float v = std::fabs(x[i]);
    nan = nan || std::isnan(v);
    a[i] = v > a[i] ? v : a[i];
  }
  return nan;
}

}  // namespace

void fp8_quantize_row(Fp8Format f, const float* x, int64_t n, float s, uint8_t* codes) {
  quantize_row<false>(f, x, n, &s, codes);
}

void fp8_quantize_row(Fp8Format f, const float* x, int64_t n, const float* s, uint8_t* codes) {
  quantize_row<true>(f, x, n, s, codes);
}

std::vector<float> fp8_compute_scales(const Fp8Spec& spec, Role role, const Tensor3& x, int layer) {
  if (spec.source != ScaleSource::Dynamic) return fp8::compute_scales(spec, role, x, layer);
  const Shape3 s = x.shape;
  std::vector<float> amax(static_cast<size_t>(fp8::scale_count(spec.gran, s)), 0.0f);
  bool nan = false;
  if (spec.gran == Granularity::Tensor) {  // one reduction over the whole tensor
    nan = amax_row(x.data.data(), static_cast<int64_t>(x.data.size()), amax[0]);
  } else {
    for (int64_t t = 0; t < s.tokens; ++t)
      for (int64_t h = 0; h < s.heads; ++h) {
        const float* xr = x.data.data() + (t * s.heads + h) * s.dim;
        const int64_t i = fp8::scale_index(spec.gran, t, h, 0, s.heads, s.dim);
        nan |= spec.gran == Granularity::Channel
                   ? amax_elementwise(xr, s.dim, amax.data() + i)
                   : amax_row(xr, s.dim, amax[static_cast<size_t>(i)]);
      }
  }
  // A NaN reaches its scale with its own payload: which NaN is the reference's business.
  if (nan) return fp8::compute_scales(spec, role, x, layer);
  for (float& a : amax) a = fp8::scale_from_amax(a, spec.format);
  return amax;
}

void fp8_quantize(const Fp8Spec& spec, const std::vector<float>& scales, const Tensor3& x,
                  std::vector<uint8_t>& codes) {
  const Shape3 s = x.shape;
  const Granularity g = spec.source == ScaleSource::Constant ? Granularity::Tensor : spec.gran;
  KVQ_CHECK(static_cast<int64_t>(scales.size()) == fp8::scale_count(g, s),
            "fp8: {} scales given, gran={} needs {} for shape [{}, {}, {}]", scales.size(),
            to_string(g), fp8::scale_count(g, s), s.tokens, s.heads, s.dim);
  codes.resize(x.data.size());
  for (int64_t t = 0; t < s.tokens; ++t)
    for (int64_t h = 0; h < s.heads; ++h) {
      const int64_t r = (t * s.heads + h) * s.dim;
      const float* sr = scales.data() + fp8::scale_index(g, t, h, 0, s.heads, s.dim);
      if (g == Granularity::Channel)
        fp8_quantize_row(spec.format, x.data.data() + r, s.dim, sr, codes.data() + r);
      else
        fp8_quantize_row(spec.format, x.data.data() + r, s.dim, sr[0], codes.data() + r);
    }
}

void fp8_quantize_dynamic(const Fp8Spec& spec, Role role, const Tensor3& x,
                          std::vector<float>& scales, std::vector<uint8_t>& codes, int layer) {
  if (spec.source != ScaleSource::Dynamic || spec.gran != Granularity::Token) {
    scales = fp8_compute_scales(spec, role, x, layer);
    fp8_quantize(spec, scales, x, codes);
    return;
  }
  const Shape3 s = x.shape;
  scales.resize(static_cast<size_t>(s.tokens * s.heads));
  codes.resize(x.data.size());
  // Rows in blocks: the scales of a block first, then its codes, so that one row's chain (amax,
  // lane reduction, scale) overlaps the others' instead of waiting in front of its own encode.
  constexpr int64_t kBlock = 16;
  const int64_t rows = s.tokens * s.heads;
  for (int64_t r0 = 0; r0 < rows; r0 += kBlock) {
    const int64_t r1 = std::min(rows, r0 + kBlock);
    for (int64_t r = r0; r < r1; ++r) {
      float a = 0.0f;
      if (amax_row(x.data.data() + r * s.dim, s.dim, a)) {  // a NaN: the reference's business
        scales = fp8::compute_scales(spec, role, x, layer);
        fp8_quantize(spec, scales, x, codes);
        return;
      }
      scales[static_cast<size_t>(r)] = fp8::scale_from_amax(a, spec.format);
    }
    for (int64_t r = r0; r < r1; ++r)
      fp8_quantize_row(spec.format, x.data.data() + r * s.dim, s.dim,
                       scales[static_cast<size_t>(r)], codes.data() + r * s.dim);
  }
}

}  // namespace kvq::cpu::KVQ_CPU_PATH_NS
