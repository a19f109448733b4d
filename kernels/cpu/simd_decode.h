// Backend `cpu`: exact SIMD decoders of stored elements, shared by the attention kernels
// (kernels/cpu/attention/x86/) and tested against the reference decoders on every code
// (tests/kernels/cpu/simd_decode_test.cpp). Internal to the backend: compiled only where the
// AVX2 forms are (kernels/cpu/isa.h), in each path's own namespace.
#pragma once

#include "kernels/cpu/isa.h"

#if KVQ_CPU_AVX2
#include <cstdint>

#include "core/half.h"
#include "core/spec.h"
#include "fp8/format.h"

namespace kvq::cpu {
inline namespace KVQ_CPU_PATH_NS {

#if KVQ_CPU_AVX512
// The 512-bit conversions in their zero-masking form with every lane on (kAll16, isa.h).
inline __m512 cvtph16(__m256i h) { return _mm512_maskz_cvtph_ps(kAll16, h); }
inline __m512 bf16_to_f32x16(__m256i h) {
  return _mm512_castsi512_ps(
      _mm512_maskz_slli_epi32(kAll16, _mm512_maskz_cvtepu16_epi32(kAll16, h), 16));
}
#endif

/// An fp8 code's value times 2^(kBias - 15), exact, through binary16: the code's sign, exponent
/// and mantissa bits placed in a binary16 (bias 15, 10 mantissa bits) give that, normals and
/// subnormals alike (e5m2 is the top byte of a binary16, inf and NaN included), and vcvtph2ps is
/// exact. The NaN codes of the 4-bit-exponent formats are set to a binary16 NaN first. The
/// attention kernels read fp8 this way and fold fp8_restore<F>() (a power of two, so the same
/// products) into the query or the weights.
template <Fp8Format F>
inline float fp8_restore() {
  return pow2(15 - fp8::Traits<F>::kBias);
}

/// fp8 codes p[0 .. 7] in binary16 as above. kNaN false: the caller knows no code is a NaN code,
/// and the NaN fixup is skipped (a NaN code would read as a finite number).
template <Fp8Format F, bool kNaN = true>
inline __m128i fp8_half_bits8(const uint8_t* p) {
  using T = fp8::Traits<F>;
  const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  if constexpr (T::kExpBits == 4) {
    // sign-extended and shifted by 7: the sign at bits 14 and 15, exponent and mantissa at bits
    // 7 .. 13; bit 14 cleared
    const __m128i h = _mm_and_si128(_mm_slli_epi16(_mm_cvtepi8_epi16(b), 7),
                                    _mm_set1_epi16(static_cast<int16_t>(0xbfff)));
    if constexpr (!kNaN) return h;
    const __m128i nan =
        T::kFnuz ? _mm_cmpeq_epi8(b, _mm_set1_epi8(static_cast<char>(0x80)))
                 : _mm_cmpeq_epi8(_mm_or_si128(b, _mm_set1_epi8(static_cast<char>(0x80))),
                                  _mm_set1_epi8(static_cast<char>(0xff)));
    return _mm_blendv_epi8(h, _mm_set1_epi16(0x7e00), _mm_cvtepi8_epi16(nan));
  } else {
    return _mm_slli_epi16(_mm_cvtepu8_epi16(b), 8);  // the code in the high byte
  }
}
/// fp8 codes p[0 .. 7]: their values times 2^(kBias - 15) (fp8_restore<F>() restores them).
template <Fp8Format F, bool kNaN = true>
inline __m256 fp8_raw8(const uint8_t* p) {
  return _mm256_cvtph_ps(fp8_half_bits8<F, kNaN>(p));
}
/// bf16 bits -> float32 on 8 lanes (the 16 bits on top of a float32's).
inline __m256 bf16_to_f32x8(__m128i h) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
#if KVQ_CPU_AVX512
/// fp8_raw8 on 16 codes (the NaN codes found with a mask register).
template <Fp8Format F, bool kNaN = true>
inline __m512 fp8_raw16(const uint8_t* p) {
  using T = fp8::Traits<F>;
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  if constexpr (T::kExpBits == 4) {
    // as in fp8_half_bits8
    const __m256i h = _mm256_and_si256(_mm256_slli_epi16(_mm256_cvtepi8_epi16(b), 7),
                                       _mm256_set1_epi16(static_cast<int16_t>(0xbfff)));
    if constexpr (!kNaN) return cvtph16(h);
    const __mmask16 nan =
        T::kFnuz ? _mm_cmpeq_epi8_mask(b, _mm_set1_epi8(static_cast<char>(0x80)))
                 : _mm_cmpeq_epi8_mask(_mm_or_si128(b, _mm_set1_epi8(static_cast<char>(0x80))),
                                       _mm_set1_epi8(static_cast<char>(0xff)));
    return cvtph16(_mm256_mask_mov_epi16(h, nan, _mm256_set1_epi16(0x7e00)));
  } else {
    return cvtph16(_mm256_slli_epi16(_mm256_cvtepu8_epi16(b), 8));
  }
}

/// The left shift that puts an fp8 code's exponent and mantissa under bf16's (7 - its mantissa
/// bits), and the mask of the bf16's sign, exponent and mantissa bits those land on.
template <Fp8Format F>
constexpr int kBf16Shift = 7 - fp8::Traits<F>::kMantBits;
template <Fp8Format F>
constexpr int16_t kBf16Mask = static_cast<int16_t>(0x8000 | (0x7f << kBf16Shift<F>));

/// 32 fp8 codes as bf16 bits: each code's sign at bf16's and its exponent and mantissa bits under
/// bf16's (sign-extend, shift, mask) give its value times 2^(kBias - 127), exact for every finite
/// code (subnormal codes as bf16 subnormals); the NaN / inf codes become finite numbers. The int8
/// mode's bf16 dot products read fp8 keys this way (kernels/cpu/attention/x86/fp8_bf16dot.h).
template <Fp8Format F>
inline __m512i fp8_bf16x32(const uint8_t* p) {
  const __m512i x = _mm512_maskz_cvtepi8_epi16(
      kAll32, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));  // sign in bits 7 .. 15
  return _mm512_and_si512(_mm512_maskz_slli_epi16(kAll32, x, kBf16Shift<F>),
                          _mm512_set1_epi16(kBf16Mask<F>));
}
#endif

#if KVQ_CPU_AVX512 && defined(__AVX512VBMI__)
/// fp8 codes as their values exactly in bf16 (the exact mode's AMX kernels, which read bf16
/// subnormals as 0): every finite fp8 value of these formats is zero or a normal bf16 (at most 3
/// mantissa bits, exponents far inside bf16's), infinities and NaNs are bf16's. A byte table
/// (vpermi2b: 128 entries in two registers, indexed by a code's low 7 bits) gives each code's low
/// and high bf16 byte; the code's sign bit is then set on the high byte, so code c >= 128 reads
/// as -(code c - 128), which every format defines except e4m3fnuz's 0x80 (its NaN; -0 here: the
/// kernels take this path only where the side holds no NaN code).
struct Fp8Bf16Table {
  __m512i lo0, lo1, hi0, hi1;  // bytes of codes 0..63 and 64..127
};
template <Fp8Format F>
const Fp8Bf16Table& fp8_bf16_table() {
  static const Fp8Bf16Table t = [] {
    alignas(64) uint8_t lo[128], hi[128];
    for (int c = 0; c < 128; ++c) {
      const uint16_t b = float_to_bf16_bits(fp8::decode<F>(static_cast<uint8_t>(c)));
      lo[c] = static_cast<uint8_t>(b & 0xff);
      hi[c] = static_cast<uint8_t>(b >> 8);
    }
    return Fp8Bf16Table{_mm512_load_si512(lo), _mm512_load_si512(lo + 64), _mm512_load_si512(hi),
                        _mm512_load_si512(hi + 64)};
  }();
  return t;
}
/// 64 fp8 codes (c: byte e is code e) as bf16 in two registers, in the order of vpunpck's
/// 128-bit lanes: word e of a is code 16 (e / 8) + e % 8, word e of b is code 16 (e / 8) + 8 +
/// e % 8.
inline void fp8_bf16x64(const Fp8Bf16Table& t, __m512i c, __m512i& a, __m512i& b) {
  const __m512i lo = _mm512_permutex2var_epi8(t.lo0, c, t.lo1);
  const __m512i hi = _mm512_ternarylogic_epi32(  // hi | (c & 0x80)
      _mm512_permutex2var_epi8(t.hi0, c, t.hi1), c, _mm512_set1_epi8(static_cast<char>(0x80)),
      0xf8);
  a = _mm512_unpacklo_epi8(lo, hi);
  b = _mm512_unpackhi_epi8(lo, hi);
}
/// The code (of the 64) whose value fp8_bf16x64 puts in word e of a (w = 0) or b (w = 1).
constexpr int fp8_bf16x64_code(int w, int e) { return 16 * (e / 8) + 8 * w + e % 8; }
#endif

}  // namespace KVQ_CPU_PATH_NS
}  // namespace kvq::cpu

#endif  // KVQ_CPU_AVX2
