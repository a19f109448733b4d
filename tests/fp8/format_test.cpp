// Tests for fp8/format.h: the three FP8 codecs against the format DEFINITIONS.
//
// Where expected values come from: tests/fp8/fp8_ref.h decodes every code from its sign,
// exponent and mantissa bits with std::ldexp in double (REFERENCE.md section 2), and encodes by
// searching that table for the nearest value with ties to even and saturation. Nothing expected
// is computed by fp8/format.h itself.
#include "fp8/format.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "tests/fp8/fp8_ref.h"

namespace kvq::fp8 {
namespace {

using test::CodeKind;
using test::Fp8Def;

constexpr float kInf = std::numeric_limits<float>::infinity();

/// The template codec for a runtime format (the tests exercise the templates, not dispatch).
uint8_t enc(Fp8Format f, float x) {
  switch (f) {
    case Fp8Format::E4M3:
      return encode<Fp8Format::E4M3>(x);
    case Fp8Format::E4M3FNUZ:
      return encode<Fp8Format::E4M3FNUZ>(x);
    case Fp8Format::E5M2:
      return encode<Fp8Format::E5M2>(x);
  }
  return 0;
}
float dec(Fp8Format f, uint8_t c) {
  switch (f) {
    case Fp8Format::E4M3:
      return decode<Fp8Format::E4M3>(c);
    case Fp8Format::E4M3FNUZ:
      return decode<Fp8Format::E4M3FNUZ>(c);
    case Fp8Format::E5M2:
      return decode<Fp8Format::E5M2>(c);
  }
  return 0;
}

uint32_t bits(float f) { return float_bits(f); }

class Fp8Codec : public ::testing::TestWithParam<Fp8Def> {};

// Expected: ref_decode (definition, double). Finite values must match bit for bit, including
// the sign of zero; the special codes are the ones the REFERENCE table lists.
TEST_P(Fp8Codec, DecodesAll256CodesAsDefined) {
  const Fp8Def& f = GetParam();
  int n_nan = 0, n_inf = 0, n_finite = 0;
  for (int i = 0; i < 256; ++i) {
    const uint8_t c = static_cast<uint8_t>(i);
    const double want = test::ref_decode(f, c);
    const float got = dec(f.format, c);
    if (std::isnan(want)) {
      ++n_nan;
      EXPECT_TRUE(std::isnan(got)) << "code 0x" << std::hex << i << " should be NaN";
      continue;
    }
    if (std::isinf(want))
      ++n_inf;
    else
      ++n_finite;
    ASSERT_EQ(static_cast<double>(static_cast<float>(want)), want) << "fp8 value not a float";
    EXPECT_EQ(bits(got), bits(static_cast<float>(want)))
        << "code 0x" << std::hex << i << ": got " << got << " want " << want;
  }
  // Special-code counts and codes from the REFERENCE table.
  switch (f.format) {
    case Fp8Format::E4M3:
      EXPECT_EQ(n_nan, 2);
      EXPECT_EQ(n_inf, 0);
      EXPECT_TRUE(std::isnan(dec(f.format, 0x7F)));
      EXPECT_TRUE(std::isnan(dec(f.format, 0xFF)));
      EXPECT_EQ(dec(f.format, 0x7E), 448.0f);
      EXPECT_EQ(bits(dec(f.format, 0x80)), bits(-0.0f));
      break;
    case Fp8Format::E4M3FNUZ:
      EXPECT_EQ(n_nan, 1);
      EXPECT_EQ(n_inf, 0);
      EXPECT_TRUE(std::isnan(dec(f.format, 0x80)));
      EXPECT_EQ(dec(f.format, 0x7F), 240.0f);
      EXPECT_EQ(dec(f.format, 0xFF), -240.0f);
      break;
    case Fp8Format::E5M2:
      EXPECT_EQ(n_nan, 6);
      EXPECT_EQ(n_inf, 2);
      EXPECT_EQ(dec(f.format, 0x7C), kInf);
      EXPECT_EQ(dec(f.format, 0xFC), -kInf);
      for (int c : {0x7D, 0x7E, 0x7F, 0xFD, 0xFE, 0xFF})
        EXPECT_TRUE(std::isnan(dec(f.format, static_cast<uint8_t>(c)))) << c;
      EXPECT_EQ(dec(f.format, 0x7B), 57344.0f);
      EXPECT_EQ(bits(dec(f.format, 0x80)), bits(-0.0f));
      break;
  }
  EXPECT_EQ(n_nan + n_inf + n_finite, 256);
  EXPECT_EQ(dec(f.format, 0x01), static_cast<float>(f.min_subnormal));
  EXPECT_EQ(bits(dec(f.format, 0x00)), bits(0.0f));
}

// Expected: the code itself; every finite code must survive encode(decode(c)). fnuz: 0x00 is the
// only zero, so it is the only code for 0.
TEST_P(Fp8Codec, RoundTripsEveryFiniteCode) {
  const Fp8Def& f = GetParam();
  int checked = 0;
  for (int i = 0; i < 256; ++i) {
    const uint8_t c = static_cast<uint8_t>(i);
    if (test::code_kind(f, c) != CodeKind::Finite) continue;
    EXPECT_EQ(enc(f.format, dec(f.format, c)), c) << "code 0x" << std::hex << i;
    ++checked;
  }
  // 256 minus NaN/inf codes (REFERENCE table): e4m3 2 NaN, fnuz 1 NaN, e5m2 2 inf + 6 NaN.
  const int want = f.format == Fp8Format::E4M3 ? 254 : f.format == Fp8Format::E4M3FNUZ ? 255 : 248;
  EXPECT_EQ(checked, want);
}

// Expected: the midpoint of two adjacent finite values (exact in double, and a float) rounds to
// the code with the even mantissa LSB; one float ulp above or below rounds to the nearer one.
TEST_P(Fp8Codec, MidpointsRoundToEvenAndNeighboursToNearer) {
  const Fp8Def& f = GetParam();
  int checked = 0;
  for (bool negative : {false, true}) {
    const std::vector<uint8_t> codes = test::ordered_codes(f, negative);
    for (size_t k = 0; k + 1 < codes.size(); ++k) {
      const uint8_t lo = codes[k], hi = codes[k + 1];
      const double mid = (test::ref_decode(f, lo) + test::ref_decode(f, hi)) / 2;
      const float midf = static_cast<float>(mid);
      ASSERT_EQ(static_cast<double>(midf), mid) << "midpoint not a float";
      const uint8_t even = (lo & 1) == 0 ? lo : hi;
      ASSERT_NE(lo & 1, hi & 1);  // adjacent codes: exactly one has an even mantissa
      EXPECT_EQ(enc(f.format, midf), even) << "midpoint " << mid;
      // Towards zero -> lo, away from zero -> hi.
      const float toward0 = std::nextafter(midf, 0.0f);
      const float away = std::nextafter(midf, negative ? -kInf : kInf);
      EXPECT_EQ(enc(f.format, toward0), lo) << "just inside midpoint " << mid;
      EXPECT_EQ(enc(f.format, away), hi) << "just outside midpoint " << mid;
      ++checked;
    }
  }
  // Adjacent pairs per sign: finite codes of one sign (with zero) minus one.
  const int want = f.format == Fp8Format::E4M3       ? 2 * 126
                   : f.format == Fp8Format::E4M3FNUZ ? 2 * 127
                                                     : 2 * 123;
  EXPECT_EQ(checked, want);
}

// Expected: every value at or beyond max finite saturates to +-max (SATFINITE). The "next" step
// above max is max + ulp(max), ulp(max) = 2^(floor(log2 max) - mant_bits), from the definition.
TEST_P(Fp8Codec, SaturatesToMaxFinite) {
  const Fp8Def& f = GetParam();
  const std::vector<uint8_t> pos = test::ordered_codes(f, false),
                             neg = test::ordered_codes(f, true);
  const uint8_t pmax = pos.back(), nmax = neg.back();
  ASSERT_EQ(test::ref_decode(f, pmax), f.max_finite);
  ASSERT_EQ(test::ref_decode(f, nmax), -f.max_finite);
  const double ulp = std::ldexp(1.0, std::ilogb(f.max_finite) - f.mant_bits);
  const std::vector<double> beyond = {f.max_finite,
                                      f.max_finite + ulp / 4,
                                      f.max_finite + ulp / 2,  // tie to "next" (odd) step
                                      f.max_finite + ulp * 3 / 4,
                                      f.max_finite + ulp,
                                      f.max_finite * 2,
                                      std::ldexp(1.0, 100),
                                      std::numeric_limits<float>::max(),
                                      HUGE_VAL};
  int checked = 0;
  for (double v : beyond) {
    const float x = static_cast<float>(v);
    ASSERT_EQ(static_cast<double>(x), v);
    EXPECT_EQ(enc(f.format, x), pmax) << v;
    EXPECT_EQ(enc(f.format, -x), nmax) << -v;
    checked += 2;
  }
  // One float ulp below max is still nearest to max.
  const float below = std::nextafter(static_cast<float>(f.max_finite), 0.0f);
  EXPECT_EQ(enc(f.format, below), pmax);
  EXPECT_EQ(checked, 18);
}

// Expected: subnormal values from the definition (m * min_subnormal): the smallest one, half of
// it (a tie between 0 and code 1 -> 0, even), values below, and ties between subnormals.
TEST_P(Fp8Codec, Subnormals) {
  const Fp8Def& f = GetParam();
  const float s = static_cast<float>(f.min_subnormal);
  const uint8_t nzero = f.fnuz ? 0x00 : 0x80;
  EXPECT_EQ(enc(f.format, s), 0x01);
  EXPECT_EQ(enc(f.format, -s), 0x81);
  EXPECT_EQ(enc(f.format, s / 2), 0x00);  // tie 0 vs 1 -> even 0
  EXPECT_EQ(enc(f.format, -s / 2), nzero);
  EXPECT_EQ(enc(f.format, std::nextafter(s / 2, kInf)), 0x01);
  EXPECT_EQ(enc(f.format, std::nextafter(-s / 2, -kInf)), 0x81);
  EXPECT_EQ(enc(f.format, s / 4), 0x00);
  EXPECT_EQ(enc(f.format, -s / 4), nzero);
  EXPECT_EQ(enc(f.format, 1e-30f), 0x00);
  EXPECT_EQ(enc(f.format, std::numeric_limits<float>::denorm_min()), 0x00);
  EXPECT_EQ(enc(f.format, -std::numeric_limits<float>::denorm_min()), nzero);
  EXPECT_EQ(enc(f.format, 1.5f * s), 0x02);  // tie 1 vs 2 -> even 2
  EXPECT_EQ(enc(f.format, 2.5f * s), 0x02);  // tie 2 vs 3 -> even 2
  // Largest subnormal (2^M - 1) * s and the smallest normal 2^M * s (exponent field 1).
  const int m_all = (1 << f.mant_bits) - 1;
  EXPECT_EQ(enc(f.format, static_cast<float>(m_all) * s), m_all);
  EXPECT_EQ(enc(f.format, static_cast<float>(m_all + 1) * s), m_all + 1);
  EXPECT_EQ(enc(f.format, (static_cast<float>(m_all) + 0.5f) * s), m_all + 1);  // tie -> even
  for (int m = 1; m <= m_all; ++m) {
    EXPECT_EQ(bits(dec(f.format, static_cast<uint8_t>(m))), bits(static_cast<float>(m) * s)) << m;
    EXPECT_EQ(enc(f.format, static_cast<float>(m) * s), m) << m;
  }
}

// Expected: REFERENCE section 2; +0 -> 0x00, -0 -> 0x80 (fnuz: 0x00, it has no -0).
TEST_P(Fp8Codec, SignedZero) {
  const Fp8Def& f = GetParam();
  EXPECT_EQ(enc(f.format, 0.0f), 0x00);
  EXPECT_EQ(enc(f.format, -0.0f), f.fnuz ? 0x00 : 0x80);
}

// Expected: the format's NaN code (cuda_fp8.h returns 0x7F for e4m3/e5m2; fnuz's only NaN is
// 0x80), for quiet, signalling and negative NaNs.
TEST_P(Fp8Codec, NaNEncodesToNaNCode) {
  const Fp8Def& f = GetParam();
  int checked = 0;
  for (uint32_t b : {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff800001u, 0x7fffffffu}) {
    const uint8_t c = enc(f.format, bits_float(b));
    EXPECT_EQ(c, f.nan_code) << std::hex << b;
    EXPECT_TRUE(std::isnan(dec(f.format, c)));
    ++checked;
  }
  EXPECT_EQ(checked, 5);
}

// Expected: RefEncoder (nearest value of the definition's table, ties to even, saturating).
// A sweep over float bit patterns with a prime stride covers every exponent and both signs.
TEST_P(Fp8Codec, MatchesReferenceEncoderOnFloatSweep) {
  const Fp8Def& f = GetParam();
  const test::RefEncoder ref(f);
  constexpr uint64_t kStride = 4099;
  int64_t checked = 0, nonzero = 0, failures = 0;
  for (uint64_t b = 0; b <= 0xffffffffull; b += kStride) {
    const float x = bits_float(static_cast<uint32_t>(b));
    const uint8_t want = ref(x);
    const uint8_t got = enc(f.format, x);
    if (got != want && ++failures <= 20)
      ADD_FAILURE() << "x=" << x << " (bits 0x" << std::hex << b << "): got 0x" << int(got)
                    << " want 0x" << int(want);
    if (want != 0x00 && want != 0x80) ++nonzero;
    ++checked;
  }
  EXPECT_EQ(failures, 0);
  EXPECT_EQ(checked, static_cast<int64_t>(0xffffffffull / kStride) + 1);
  EXPECT_GT(nonzero, checked / 10);  // not a sweep of zeros
}

// Expected: the templates (this checks only the runtime switch in encode(f, x) / decode(f, c)).
TEST_P(Fp8Codec, RuntimeDispatchEqualsTemplates) {
  const Fp8Def& f = GetParam();
  int checked = 0;
  for (int i = 0; i < 256; ++i) {
    const uint8_t c = static_cast<uint8_t>(i);
    EXPECT_EQ(bits(decode(f.format, c)), bits(dec(f.format, c))) << i;
    ++checked;
  }
  for (uint64_t b = 0; b <= 0xffffffffull; b += 65537) {
    const float x = bits_float(static_cast<uint32_t>(b));
    EXPECT_EQ(encode(f.format, x), enc(f.format, x)) << std::hex << b;
    ++checked;
  }
  EXPECT_EQ(max_finite(f.format), static_cast<float>(f.max_finite));
  EXPECT_EQ(checked, 256 + 65536);
}

// Expected: ref_decode (the definition, independent of fp8/format.h) is NaN exactly for the codes
// any_nan_code reports, one code at a time and as one NaN code among finite ones at every
// position of a 37-byte run (past a 32-byte vector and its tail).
TEST_P(Fp8Codec, AnyNanCode_findsExactlyTheNaNCodes) {
  const Fp8Def& f = GetParam();
  int n_nan = 0;
  for (int i = 0; i < 256; ++i) {
    const uint8_t c = static_cast<uint8_t>(i);
    const bool want = std::isnan(test::ref_decode(f, c));
    n_nan += want;
    EXPECT_EQ(any_nan_code(f.format, &c, 1), want) << "code 0x" << std::hex << i;
  }
  EXPECT_GT(n_nan, 0);
  std::vector<uint8_t> run(37, 0x01);  // a small positive subnormal in every format
  EXPECT_FALSE(any_nan_code(f.format, run.data(), static_cast<int64_t>(run.size())));
  EXPECT_FALSE(any_nan_code(f.format, run.data(), 0));
  for (size_t at = 0; at < run.size(); ++at) {
    run[at] = f.nan_code;
    EXPECT_TRUE(any_nan_code(f.format, run.data(), static_cast<int64_t>(run.size()))) << at;
    EXPECT_FALSE(any_nan_code(f.format, run.data(), static_cast<int64_t>(at))) << at;
    run[at] = 0x01;
  }
  // every code at every byte of the 8-byte steps and of the tail, among the largest finite codes
  // (0x7e / 0xfe, 0x7f / 0xff for fnuz, 0x7b / 0xfb for e5m2: the bytes next to the NaN codes)
  const uint8_t big = f.format == Fp8Format::E4M3FNUZ ? 0x7f
                      : f.format == Fp8Format::E5M2   ? 0x7b
                                                      : 0x7e;
  for (int i = 0; i < 256; ++i) {
    const uint8_t c = static_cast<uint8_t>(i);
    const bool want = std::isnan(test::ref_decode(f, c));
    for (size_t at = 0; at < run.size(); ++at) {
      for (size_t j = 0; j < run.size(); ++j) run[j] = static_cast<uint8_t>(big | (j % 2) << 7);
      run[at] = c;
      EXPECT_EQ(any_nan_code(f.format, run.data(), static_cast<int64_t>(run.size())), want)
          << "code 0x" << std::hex << i << " at " << std::dec << at;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fp8Format, Fp8Codec, ::testing::ValuesIn(test::fp8_defs()),
                         [](const ::testing::TestParamInfo<Fp8Def>& p) {
                           return std::string(p.param.name);
                         });

}  // namespace
}  // namespace kvq::fp8
