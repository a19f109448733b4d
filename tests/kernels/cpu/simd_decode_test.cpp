// Tests for kernels/cpu/simd_decode.h: backend cpu's SIMD decoders of stored elements against the
// reference decoders, on every input. Expected values: fp8::decode<F> (fp8/format.h, the
// definition of each FP8 format) and half_bits_to_float (core/half.h); bf16 against its
// definition (the 16 bits on top of a float32's). Compared bit for bit, except that a NaN only has
// to decode to a NaN (the formats define no NaN payloads).
#include "kernels/cpu/simd_decode.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "core/half.h"

namespace kvq::cpu {
namespace {

#if KVQ_CPU_AVX2
// Counts lanes where got differs from want (NaN matches NaN); the first few go to `why`.
int64_t mismatches(const std::vector<float>& want, const std::vector<float>& got,
                   std::string& why) {
  int64_t bad = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const bool same =
        (std::isnan(want[i]) && std::isnan(got[i])) || float_bits(want[i]) == float_bits(got[i]);
    if (!same && bad++ < 5)
      why += " input " + std::to_string(i) + ": want " + std::to_string(want[i]) + " got " +
             std::to_string(got[i]) + ";";
  }
  return bad;
}

// The attention kernels' form, fp8_raw8 / fp8_raw16: decode<F>(code) * 2^(kBias - 15) (a power
// of two from the formats' definitions, not from fp8_restore). kNaN false (the form for caches
// that hold no NaN code): the same bits on every code that is not a NaN code.
template <Fp8Format F, bool kNaN>
void check_fp8_raw_every_code() {
  const float down = std::ldexp(1.0f, fp8::Traits<F>::kBias - 15);
  std::vector<uint8_t> codes(256);
  std::vector<float> want(256), got8(256);
  for (int c = 0; c < 256; ++c)
    codes[c] = static_cast<uint8_t>(c), want[c] = fp8::decode<F>(codes[c]) * down;
  for (int i = 0; i < 256; i += 8)
    _mm256_storeu_ps(got8.data() + i, fp8_raw8<F, kNaN>(codes.data() + i));
  // kNaN false: the NaN codes are not this form's inputs, so their lanes are not compared
  auto skip_nan = [&](std::vector<float>& got) {
    int n = 0;
    if constexpr (!kNaN)
      for (int c = 0; c < 256; ++c)
        if (std::isnan(want[c])) got[c] = want[c], ++n;
    return n;
  };
  EXPECT_EQ(skip_nan(got8), kNaN ? 0 : F == Fp8Format::E4M3FNUZ ? 1 : F == Fp8Format::E4M3 ? 2 : 6);
  std::string why;
  EXPECT_EQ(mismatches(want, got8, why), 0) << "fp8_raw8, format " << static_cast<int>(F) << why;
#if KVQ_CPU_AVX512
  std::vector<float> got16(256);
  for (int i = 0; i < 256; i += 16)
    _mm512_storeu_ps(got16.data() + i, fp8_raw16<F, kNaN>(codes.data() + i));
  skip_nan(got16);
  why.clear();
  EXPECT_EQ(mismatches(want, got16, why), 0) << "fp8_raw16, format " << static_cast<int>(F) << why;
#endif
}

TEST(cpuSimdDecode, fp8Raw_every256Codes_everyFormat_equalsFp8DecodeTimesPowerOfTwo) {
  check_fp8_raw_every_code<Fp8Format::E4M3, true>();
  check_fp8_raw_every_code<Fp8Format::E4M3FNUZ, true>();
  check_fp8_raw_every_code<Fp8Format::E5M2, true>();
}

TEST(cpuSimdDecode, fp8RawNoNaN_everyOtherCode_everyFormat_equalsFp8DecodeTimesPowerOfTwo) {
  check_fp8_raw_every_code<Fp8Format::E4M3, false>();
  check_fp8_raw_every_code<Fp8Format::E4M3FNUZ, false>();
  check_fp8_raw_every_code<Fp8Format::E5M2, false>();
}

#if KVQ_CPU_AVX512
// fp8_bf16x32 (the int8 mode's fp8 keys): the bf16 bits times 2^(127 - kBias) equal fp8::decode
// bit for bit on every finite code (subnormal codes included: bf16 subnormals, exact); the
// non-finite codes must come out finite (the mode reads them as numbers, kernels/cpu/attention.h).
template <Fp8Format F>
void check_bf16_every_code() {
  std::vector<uint8_t> codes(256);
  for (int c = 0; c < 256; ++c) codes[c] = static_cast<uint8_t>(c);
  std::vector<uint16_t> bits(256);
  for (int i = 0; i < 256; i += 32)
    _mm512_storeu_si512(bits.data() + i, fp8_bf16x32<F>(codes.data() + i));
  const float back = std::ldexp(1.0f, 127 - fp8::Traits<F>::kBias);  // exact power of two
  std::vector<float> want, got;
  int64_t non_finite = 0;
  for (int c = 0; c < 256; ++c) {
    const float w = fp8::decode<F>(static_cast<uint8_t>(c));
    const float g = bits_float(static_cast<uint32_t>(bits[c]) << 16) * back;
    if (!std::isfinite(w)) {
      ++non_finite;
      EXPECT_TRUE(std::isfinite(g)) << "code " << c;
      continue;
    }
    want.push_back(w), got.push_back(g);
  }
  std::string why;
  EXPECT_EQ(mismatches(want, got, why), 0) << "fp8_bf16x32, format " << static_cast<int>(F) << why;
  EXPECT_GT(non_finite, 0);
}

TEST(cpuSimdDecode, fp8Bf16x32_every256Codes_everyFormat_equalsFp8Decode) {
  check_bf16_every_code<Fp8Format::E4M3>();
  check_bf16_every_code<Fp8Format::E4M3FNUZ>();
  check_bf16_every_code<Fp8Format::E5M2>();
}
#endif

#if KVQ_CPU_AVX512 && defined(__AVX512VBMI__)
// fp8_bf16x64 (the exact mode's AMX kernels): every code's bf16 equals fp8::decode bit for bit
// (NaN for NaN), in the documented word order, which the test spells out from vpunpcklbw /
// vpunpckhbw's definition (each 128-bit lane interleaves the low / high 8 bytes of the lane's 16
// codes): word e of the first register is code 16 (e / 8) + e % 8, of the second that + 8. One
// exception, documented: e4m3fnuz's NaN code 0x80 reads as -0 (the kernels send sides that hold
// a NaN code elsewhere).
template <Fp8Format F>
void check_bf16x64_every_code() {
  std::vector<uint8_t> codes(256);
  for (int c = 0; c < 256; ++c) codes[c] = static_cast<uint8_t>(c);
  std::vector<float> want(256), got(256);
  for (int c = 0; c < 256; ++c) want[c] = fp8::decode<F>(codes[c]);
  for (int v = 0; v < 256; v += 64) {
    __m512i a, b;
    fp8_bf16x64(fp8_bf16_table<F>(), _mm512_loadu_si512(codes.data() + v), a, b);
    uint16_t wa[32], wb[32];
    _mm512_storeu_si512(wa, a);
    _mm512_storeu_si512(wb, b);
    for (int e = 0; e < 32; ++e) {
      got[v + 16 * (e / 8) + e % 8] = bits_float(static_cast<uint32_t>(wa[e]) << 16);
      got[v + 16 * (e / 8) + 8 + e % 8] = bits_float(static_cast<uint32_t>(wb[e]) << 16);
    }
  }
  if constexpr (F == Fp8Format::E4M3FNUZ) {
    EXPECT_TRUE(std::isnan(want[0x80]));
    EXPECT_EQ(float_bits(got[0x80]), float_bits(-0.0f));
    got[0x80] = want[0x80];
  }
  std::string why;
  EXPECT_EQ(mismatches(want, got, why), 0) << "fp8_bf16x64, format " << static_cast<int>(F) << why;
}

TEST(cpuSimdDecode, fp8Bf16x64_every256Codes_everyFormat_equalsFp8Decode) {
  check_bf16x64_every_code<Fp8Format::E4M3>();
  check_bf16x64_every_code<Fp8Format::E4M3FNUZ>();
  check_bf16x64_every_code<Fp8Format::E5M2>();
}
#endif

TEST(cpuSimdDecode, bf16x8_every65536Patterns_equalsTheDefinition) {
  std::vector<uint16_t> bits(65536);
  std::vector<float> want(65536), got(65536);
  for (int i = 0; i < 65536; ++i) {
    bits[i] = static_cast<uint16_t>(i);
    want[i] = bits_float(static_cast<uint32_t>(i) << 16);
  }
  for (int i = 0; i < 65536; i += 8)
    _mm256_storeu_ps(
        got.data() + i,
        bf16_to_f32x8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(bits.data() + i))));
  std::string why;
  EXPECT_EQ(mismatches(want, got, why), 0) << "bf16_to_f32x8" << why;
}
#else
TEST(cpuSimdDecode, fp8Raw_every256Codes_everyFormat_equalsFp8DecodeTimesPowerOfTwo) {
  GTEST_SKIP() << "the SIMD decoders are compiled only where the AVX2 path is";
}

TEST(cpuSimdDecode, fp8RawNoNaN_everyOtherCode_everyFormat_equalsFp8DecodeTimesPowerOfTwo) {
  GTEST_SKIP() << "the SIMD decoders are compiled only where the AVX2 path is";
}
#endif

#if KVQ_CPU_AVX512
TEST(cpuSimdDecode, halfAndBf16_every65536Patterns_equalTheDefinitions) {
  std::vector<uint16_t> bits(65536);
  for (int i = 0; i < 65536; ++i) bits[i] = static_cast<uint16_t>(i);
  std::vector<float> want_h(65536), want_b(65536), got_h(65536), got_b(65536);
  for (int i = 0; i < 65536; ++i) {
    want_h[i] = half_bits_to_float(bits[i]);
    want_b[i] = bits_float(static_cast<uint32_t>(bits[i]) << 16);
  }
  for (int i = 0; i < 65536; i += 16) {
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bits.data() + i));
    _mm512_storeu_ps(got_h.data() + i, cvtph16(x));
    _mm512_storeu_ps(got_b.data() + i, bf16_to_f32x16(x));
  }
  std::string why;
  EXPECT_EQ(mismatches(want_h, got_h, why), 0) << "cvtph16" << why;
  why.clear();
  EXPECT_EQ(mismatches(want_b, got_b, why), 0) << "bf16_to_f32x16" << why;
}
#else
TEST(cpuSimdDecode, halfAndBf16_every65536Patterns_equalTheDefinitions) {
  GTEST_SKIP() << "the 512-bit decoders are compiled only where the compiler targets AVX-512";
}
#endif

}  // namespace
}  // namespace kvq::cpu
