// Tests for core/half.h: IEEE binary16 and bfloat16 conversions.
//
// Where expected values come from: the formats' definitions, decoded here in double with
// std::ldexp from sign / exponent / mantissa fields (binary16: 5/10, bias 15; bfloat16: 8/7,
// bias 127), and a reference encoder that picks the nearest value of that table with ties to
// the even mantissa and overflow to inf at (max + next) / 2. Nothing expected comes from half.h.
#include "core/half.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace kvq {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

/// A 16-bit float format by its definition.
struct Def16 {
  const char* name;
  int exp_bits, mant_bits, bias;
};
void PrintTo(const Def16& f, std::ostream* os) { *os << f.name; }
constexpr Def16 kHalf{"fp16", 5, 10, 15};
constexpr Def16 kBf16{"bf16", 8, 7, 127};

bool ref_is_nan(const Def16& f, uint16_t b) {
  const int e = (b >> f.mant_bits) & ((1 << f.exp_bits) - 1);
  const int m = b & ((1 << f.mant_bits) - 1);
  return e == (1 << f.exp_bits) - 1 && m != 0;
}

/// Value of bits b: +-inf for the all-ones exponent with m == 0, subnormal m * 2^(1-bias-M),
/// normal (1 + m/2^M) * 2^(e-bias). NaN patterns are excluded by the callers.
double ref_decode(const Def16& f, uint16_t b) {
  const bool neg = (b & 0x8000) != 0;
  const int e = (b >> f.mant_bits) & ((1 << f.exp_bits) - 1);
  const int m = b & ((1 << f.mant_bits) - 1);
  double mag;
  if (e == (1 << f.exp_bits) - 1)
    mag = HUGE_VAL;
  else if (e == 0)
    mag = std::ldexp(static_cast<double>(m), 1 - f.bias - f.mant_bits);
  else
    mag = std::ldexp(1.0 + std::ldexp(static_cast<double>(m), -f.mant_bits), e - f.bias);
  return neg ? -mag : mag;
}

/// Nearest-even encoder over the definition's table of non-negative finite values; a value at
/// or above max + ulp(max)/2 (the tie with the next power of two, whose mantissa is even)
/// becomes inf.
class RefEncoder16 {
 public:
  explicit RefEncoder16(const Def16& f) {
    const uint16_t inf_bits = static_cast<uint16_t>(((1 << f.exp_bits) - 1) << f.mant_bits);
    for (uint32_t b = 0; b < inf_bits; ++b)
      mags_.push_back(ref_decode(f, static_cast<uint16_t>(b)));
    const double max = mags_.back();
    overflow_ = max + std::ldexp(1.0, std::ilogb(max) - f.mant_bits - 1);
    inf_bits_ = inf_bits;
  }
  uint16_t operator()(float x) const {
    const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
    const double a = std::fabs(static_cast<double>(x));
    if (a >= overflow_) return static_cast<uint16_t>(sign | inf_bits_);
    const size_t hi =
        static_cast<size_t>(std::upper_bound(mags_.begin(), mags_.end(), a) - mags_.begin());
    uint16_t mag;
    if (hi == mags_.size()) {
      mag = static_cast<uint16_t>(hi - 1);  // between max and the overflow threshold
    } else {
      const double lo_d = a - mags_[hi - 1], hi_d = mags_[hi] - a;
      const size_t pick = lo_d < hi_d   ? hi - 1
                          : hi_d < lo_d ? hi
                                        : ((hi - 1) % 2 == 0 ? hi - 1 : hi);
      mag = static_cast<uint16_t>(pick);
    }
    return static_cast<uint16_t>(sign | mag);
  }
  double overflow() const { return overflow_; }

 private:
  std::vector<double> mags_;  // index == bit pattern of the non-negative finite value
  double overflow_ = 0;
  uint16_t inf_bits_ = 0;
};

uint16_t enc(const Def16& f, float x) {
  return f.exp_bits == 5 ? float_to_half_bits(x) : float_to_bf16_bits(x);
}
float dec(const Def16& f, uint16_t b) {
  return f.exp_bits == 5 ? half_bits_to_float(b) : bf16_bits_to_float(b);
}

class Half16 : public ::testing::TestWithParam<Def16> {};

// Expected: ref_decode (definition). All 65536 patterns; NaN patterns decode to NaN; the rest bit
// for bit (signed zeros included).
TEST_P(Half16, DecodesEveryPatternAsDefined) {
  const Def16& f = GetParam();
  int nan = 0, other = 0;
  for (uint32_t i = 0; i < 65536; ++i) {
    const uint16_t b = static_cast<uint16_t>(i);
    const float got = dec(f, b);
    if (ref_is_nan(f, b)) {
      ++nan;
      EXPECT_TRUE(std::isnan(got)) << std::hex << i;
      continue;
    }
    ++other;
    const double want = ref_decode(f, b);
    ASSERT_EQ(float_bits(got), float_bits(static_cast<float>(want)))
        << std::hex << i << " got " << got << " want " << want;
  }
  // NaN patterns: 2 signs x (2^M - 1) mantissas.
  EXPECT_EQ(nan, 2 * ((1 << f.mant_bits) - 1));
  EXPECT_EQ(nan + other, 65536);
}

// Expected: the pattern itself (every non-NaN pattern is a float exactly; encode must restore it).
TEST_P(Half16, RoundTripsEveryNonNaNPattern) {
  const Def16& f = GetParam();
  int checked = 0;
  for (uint32_t i = 0; i < 65536; ++i) {
    const uint16_t b = static_cast<uint16_t>(i);
    if (ref_is_nan(f, b)) {
      EXPECT_TRUE(ref_is_nan(f, enc(f, dec(f, b)))) << std::hex << i;  // NaN stays NaN
      continue;
    }
    ASSERT_EQ(enc(f, dec(f, b)), b) << std::hex << i;
    ++checked;
  }
  EXPECT_EQ(checked, 65536 - 2 * ((1 << f.mant_bits) - 1));
}

// Expected: the midpoint (double, exactly a float) of each pair of adjacent finite values of one
// sign rounds to the even pattern; one float ulp towards zero / away from zero -> lo / hi.
TEST_P(Half16, MidpointsTieToEven) {
  const Def16& f = GetParam();
  const uint32_t inf_bits = ((1u << f.exp_bits) - 1) << f.mant_bits;
  int checked = 0;
  for (uint32_t sign : {0u, 0x8000u}) {
    for (uint32_t m = 0; m + 1 < inf_bits; ++m) {
      const uint16_t lo = static_cast<uint16_t>(sign | m),
                     hi = static_cast<uint16_t>(sign | (m + 1));
      const double mid = (ref_decode(f, lo) + ref_decode(f, hi)) / 2;
      const float midf = static_cast<float>(mid);
      ASSERT_EQ(static_cast<double>(midf), mid);
      ASSERT_EQ(enc(f, midf), (m % 2 == 0) ? lo : hi) << "midpoint " << mid;
      const float away = std::nextafter(midf, sign ? -kInf : kInf);
      ASSERT_EQ(enc(f, std::nextafter(midf, 0.0f)), lo) << mid;
      ASSERT_EQ(enc(f, away), hi) << mid;
      ++checked;
    }
  }
  EXPECT_EQ(checked, 2 * static_cast<int>(inf_bits - 1));
}

// Expected: the reference encoder over a prime-stride sweep of all float bit patterns.
TEST_P(Half16, MatchesReferenceEncoderOnFloatSweep) {
  const Def16& f = GetParam();
  const RefEncoder16 ref(f);
  constexpr uint64_t kStride = 4099;
  int64_t checked = 0, failures = 0;
  for (uint64_t b = 0; b <= 0xffffffffull; b += kStride) {
    const float x = bits_float(static_cast<uint32_t>(b));
    if (std::isnan(x)) {
      EXPECT_TRUE(ref_is_nan(f, enc(f, x)));
      continue;
    }
    const uint16_t want = ref(x), got = enc(f, x);
    if (got != want && ++failures <= 20)
      ADD_FAILURE() << "x=" << x << " bits 0x" << std::hex << b << " got 0x" << got << " want 0x"
                    << want;
    ++checked;
  }
  EXPECT_EQ(failures, 0);
  EXPECT_GT(checked, 1000000);
}

INSTANTIATE_TEST_SUITE_P(Float16, Half16, ::testing::Values(kHalf, kBf16),
                         [](const ::testing::TestParamInfo<Def16>& p) {
                           return std::string(p.param.name);
                         });

// Expected: binary16 max finite 65504 = (2 - 2^-10) * 2^15; the tie with 65536 is 65520 and goes
// to the even 65536, which overflows to inf; just below stays 65504 (0x7BFF).
TEST(Fp16, OverflowsToInfAt65520) {
  EXPECT_EQ(float_to_half_bits(65504.0f), 0x7BFF);
  EXPECT_EQ(float_to_half_bits(65520.0f), 0x7C00);
  EXPECT_EQ(float_to_half_bits(-65520.0f), 0xFC00);
  EXPECT_EQ(float_to_half_bits(std::nextafter(65520.0f, 0.0f)), 0x7BFF);
  EXPECT_EQ(float_to_half_bits(1e6f), 0x7C00);
  EXPECT_EQ(float_to_half_bits(kInf), 0x7C00);
  EXPECT_EQ(float_to_half_bits(-kInf), 0xFC00);
  EXPECT_EQ(half_bits_to_float(0x7C00), kInf);
}

// Expected: binary16 subnormals m * 2^-24 (definition); 2^-25 ties 0 vs 1 -> 0; 3 * 2^-25 ties
// 1 vs 2 -> 2; the smallest normal 2^-14 is 0x0400; signed zeros keep their sign.
TEST(Fp16, Subnormals) {
  const float q = std::ldexp(1.0f, -24);
  EXPECT_EQ(float_to_half_bits(q), 0x0001);
  EXPECT_EQ(float_to_half_bits(-q), 0x8001);
  EXPECT_EQ(float_to_half_bits(q / 2), 0x0000);
  EXPECT_EQ(float_to_half_bits(-q / 2), 0x8000);
  EXPECT_EQ(float_to_half_bits(std::nextafter(q / 2, 1.0f)), 0x0001);
  EXPECT_EQ(float_to_half_bits(3 * q / 2), 0x0002);
  EXPECT_EQ(float_to_half_bits(1023 * q), 0x03FF);
  EXPECT_EQ(float_to_half_bits(std::ldexp(1.0f, -14)), 0x0400);
  EXPECT_EQ(float_to_half_bits(1023.5f * q), 0x0400);  // tie 0x3FF vs 0x400 -> even
  EXPECT_EQ(float_to_half_bits(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(float_to_half_bits(-0.0f), 0x8000);
  EXPECT_EQ(float_to_half_bits(0.0f), 0x0000);
  EXPECT_EQ(half_bits_to_float(0x0001), q);
  EXPECT_EQ(float_bits(half_bits_to_float(0x8000)), float_bits(-0.0f));
}

// Expected: bfloat16 max finite (2 - 2^-7) * 2^127 (0x7F7F); the tie with 2^128 overflows to inf;
// FLT_MAX rounds up to inf; the smallest bf16 subnormal is 2^-133.
TEST(Bf16, OverflowAndSubnormals) {
  const float max = std::ldexp(2.0f - std::ldexp(1.0f, -7), 127);
  EXPECT_EQ(float_to_bf16_bits(max), 0x7F7F);
  EXPECT_EQ(float_to_bf16_bits(std::numeric_limits<float>::max()), 0x7F80);
  EXPECT_EQ(float_to_bf16_bits(-kInf), 0xFF80);
  EXPECT_EQ(float_to_bf16_bits(std::ldexp(1.0f, -133)), 0x0001);
  EXPECT_EQ(float_to_bf16_bits(std::ldexp(1.0f, -134)), 0x0000);  // tie -> even
  EXPECT_EQ(float_to_bf16_bits(-0.0f), 0x8000);
  EXPECT_EQ(round_to_bf16(1.0f + std::ldexp(1.0f, -8)), 1.0f);   // tie 1 vs 1+2^-7 -> even 1
  EXPECT_EQ(round_to_half(1.0f + std::ldexp(1.0f, -11)), 1.0f);  // tie 1 vs 1+2^-10 -> even 1
}

}  // namespace
}  // namespace kvq
