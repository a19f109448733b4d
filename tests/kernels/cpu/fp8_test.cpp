// Tests for kernels/cpu/fp8.h: backend cpu's FP8 quantize against the reference (fp8/format.h,
// fp8/scale.h), bit for bit: codes and scales. Expected values come only from the reference.
//
// Quick tier: a dense sample of float bit patterns (every 4099th pattern, plus every exponent and
// sign with the mantissa patterns that decide rounding), every format; whole tensors of ragged
// shapes with NaN, +-inf, subnormal, huge and constant rows at every granularity and scale source.
// Full tier (KVQ_FP8_FULL, label full): all 2^32 float bit patterns for every format.
#include "kernels/cpu/fp8.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "fp8/scale.h"

namespace kvq::cpu {
namespace {

constexpr Fp8Format kFormats[] = {Fp8Format::E4M3, Fp8Format::E4M3FNUZ, Fp8Format::E5M2};

uint8_t ref_code(Fp8Format f, float x, float s) {
  switch (f) {
    case Fp8Format::E4M3:
      return fp8::quantize_value<Fp8Format::E4M3>(x, s);
    case Fp8Format::E4M3FNUZ:
      return fp8::quantize_value<Fp8Format::E4M3FNUZ>(x, s);
    case Fp8Format::E5M2:
      return fp8::quantize_value<Fp8Format::E5M2>(x, s);
  }
  return 0;
}

// Quantizes the floats with these bit patterns at scale s through backend cpu (a one-scale row
// and a per-element row) and counts codes that differ from the reference; the first few differing
// inputs go to the failure message.
int64_t mismatches(Fp8Format f, const std::vector<uint32_t>& pattern, float s, std::string& why) {
  std::vector<float> x(pattern.size());
  for (size_t i = 0; i < x.size(); ++i) x[i] = bits_float(pattern[i]);
  std::vector<uint8_t> one(x.size() + 1, 0xA5), each(x.size() + 1, 0xA5);  // + a sentinel
  const std::vector<float> scales(x.size(), s);
  fp8_quantize_row(f, x.data(), static_cast<int64_t>(x.size()), s, one.data());
  fp8_quantize_row(f, x.data(), static_cast<int64_t>(x.size()), scales.data(), each.data());
  int64_t bad = 0;
  if (one.back() != 0xA5 || each.back() != 0xA5) ++bad, why += " wrote past the end;";
  for (size_t i = 0; i < x.size(); ++i) {
    const uint8_t want = ref_code(f, x[i], s);
    if (one[i] != want || each[i] != want) {
      if (bad++ < 5)
        why += " x=0x" + std::to_string(pattern[i]) + " want " + std::to_string(want) + " got " +
               std::to_string(one[i]) + "/" + std::to_string(each[i]) + ";";
    }
  }
  return bad;
}

// Every 4099th bit pattern (~1M), and for every sign and exponent the mantissas that decide
// rounding in each format: all patterns of the top 8 mantissa bits with the bits below them at
// 0, a half, just below and above a half, and all ones.
std::vector<uint32_t> dense_sample() {
  std::vector<uint32_t> p;
  for (uint64_t b = 0; b < (1ull << 32); b += 4099) p.push_back(static_cast<uint32_t>(b));
  for (uint32_t se = 0; se < 512; ++se)
    for (uint32_t top = 0; top < 256; ++top)
      for (uint32_t low : {0u, 0x4000u, 0x3fffu, 0x4001u, 0x7fffu, 0x2000u, 0x1fffu, 0x2001u})
        p.push_back((se << 23) | (top << 15) | low);
  return p;
}

TEST(cpuFp8Encode, denseBitPatterns_scale1_everyFormat_bitExact) {
  const auto p = dense_sample();
  ASSERT_GT(p.size(), 2'000'000u);
  for (Fp8Format f : kFormats) {
    std::string why;
    EXPECT_EQ(mismatches(f, p, 1.0f, why), 0) << to_string(f) << why;
  }
}

TEST(cpuFp8Encode, randomValues_oddScales_everyFormat_bitExact) {
  std::mt19937 rng(11);
  std::vector<uint32_t> p(200'003);  // odd length: the scalar tail runs too
  for (auto& b : p) b = rng();
  for (Fp8Format f : kFormats)
    for (float s : {0.37f, 3.0e-5f, 1.0e-40f, 1.0f / 3.0f, 65504.0f, 1.0e30f}) {
      std::string why;
      EXPECT_EQ(mismatches(f, p, s, why), 0) << to_string(f) << " s=" << s << why;
    }
}

TEST(cpuFp8Encode, shortRowsOfEveryLength_tailsMatch) {
  std::vector<uint32_t> all;
  for (int n = 0; n < 70; ++n) {
    std::vector<uint32_t> p(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i)
      p[static_cast<size_t>(i)] = float_bits(0.3f * static_cast<float>(i - 20));
    for (Fp8Format f : kFormats) {
      std::string why;
      EXPECT_EQ(mismatches(f, p, 0.7f, why), 0) << "n=" << n << why;
    }
  }
}

#ifdef KVQ_FP8_FULL
TEST(cpuFp8EncodeFull, all2Pow32Patterns_scale1_everyFormat_bitExact) {
  constexpr uint64_t kChunk = 1u << 22;
  std::vector<uint32_t> p(kChunk);
  for (Fp8Format f : kFormats) {
    int64_t bad = 0;
    std::string why;
    for (uint64_t b0 = 0; b0 < (1ull << 32); b0 += kChunk) {
      for (uint64_t i = 0; i < kChunk; ++i) p[i] = static_cast<uint32_t>(b0 + i);
      bad += mismatches(f, p, 1.0f, why);
    }
    EXPECT_EQ(bad, 0) << to_string(f) << why;
  }
}
#endif

// ---- whole tensors ----------------------------------------------------------------------------

// Gaussian [T, H, D] with an outlier channel, a constant row, a zero head and, when asked, NaN,
// +-inf, subnormals and values beyond every format's range.
Tensor3 tensor(Shape3 s, bool specials, uint32_t seed) {
  Tensor3 x(s);
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  for (int64_t t = 0; t < s.tokens; ++t)
    for (int64_t h = 0; h < s.heads; ++h)
      for (int64_t d = 0; d < s.dim; ++d)
        x.at(t, h, d) = h == 1 ? 0.0f : nd(rng) * (d == 5 ? 40.0f : 1.0f);
  if (s.tokens > 2)
    for (int64_t d = 0; d < s.dim; ++d) x.at(2, 0, d) = 1.5f;  // a constant row
  if (specials && s.tokens > 3 && s.dim > 8) {
    x.at(3, 0, 0) = std::numeric_limits<float>::quiet_NaN();
    x.at(1, 0, 1) = std::numeric_limits<float>::infinity();
    x.at(1, 0, 2) = -std::numeric_limits<float>::infinity();
    x.at(3, 0, 3) = 1.0e-42f;
    x.at(0, 0, 4) = -3.0e38f;
    x.at(s.tokens - 1, s.heads - 1, s.dim - 1) = 1.0e-39f;
    // A NaN in a late row too: the per-token kernel works in blocks of 16 rows and has written
    // earlier blocks' scales and codes when it meets this one.
    if (s.tokens * s.heads > 32) x.at(s.tokens - 2, s.heads - 1, 0) = std::nanf("");
  }
  return x;
}

struct Case {
  Shape3 shape;
  bool specials;
};

class cpuFp8Tensor : public ::testing::TestWithParam<Case> {};

TEST_P(cpuFp8Tensor, scalesAndCodes_everyGranularitySourceFormat_bitExact) {
  const Case c = GetParam();
  const Tensor3 x = tensor(c.shape, c.specials, 5);
  for (Fp8Format f : kFormats)
    for (Granularity g :
         {Granularity::Tensor, Granularity::Head, Granularity::Token, Granularity::Channel})
      for (ScaleSource src : {ScaleSource::Dynamic, ScaleSource::Constant}) {
        Fp8Spec spec;
        spec.format = f;
        spec.gran = g;
        spec.source = src;
        spec.constant = 0.25f;
        const auto want_s = fp8::compute_scales(spec, Role::Key, x);
        const auto got_s = fp8_compute_scales(spec, Role::Key, x);
        const std::string name = std::string(to_string(f)) + "/" + std::string(to_string(g)) +
                                 (src == ScaleSource::Dynamic ? "/dynamic" : "/constant");
        ASSERT_EQ(want_s.size(), got_s.size()) << name;
        for (size_t i = 0; i < want_s.size(); ++i)
          ASSERT_EQ(float_bits(want_s[i]), float_bits(got_s[i])) << name << " scale " << i;
        std::vector<uint8_t> want, got;
        fp8::quantize(spec, want_s, x, want);
        fp8_quantize(spec, got_s, x, got);
        ASSERT_EQ(want.size(), got.size()) << name;
        for (size_t i = 0; i < want.size(); ++i)
          ASSERT_EQ(want[i], got[i]) << name << " code " << i << " x=" << x.data[i];
        std::vector<float> fused_s;
        std::vector<uint8_t> fused;
        fp8_quantize_dynamic(spec, Role::Key, x, fused_s, fused);
        ASSERT_EQ(fused_s.size(), want_s.size()) << name;
        for (size_t i = 0; i < want_s.size(); ++i)
          ASSERT_EQ(float_bits(want_s[i]), float_bits(fused_s[i])) << name << " fused scale " << i;
        ASSERT_EQ(fused, want) << name << " fused codes";
      }
}

INSTANTIATE_TEST_SUITE_P(Shapes, cpuFp8Tensor,
                         ::testing::Values(Case{{37, 3, 72}, true}, Case{{37, 3, 72}, false},
                                           Case{{64, 8, 128}, false}, Case{{5, 2, 13}, true},
                                           Case{{1, 1, 1}, false}, Case{{0, 2, 64}, false}),
                         [](const auto& i) {
                           const Case& c = i.param;
                           return "T" + std::to_string(c.shape.tokens) + "_H" +
                                  std::to_string(c.shape.heads) + "_D" +
                                  std::to_string(c.shape.dim) + (c.specials ? "_specials" : "");
                         });

TEST(cpuFp8Tensor, wrongScaleCount_throwsNamingTheCount) {
  const Tensor3 x = tensor({4, 2, 16}, false, 1);
  Fp8Spec spec;
  spec.gran = Granularity::Head;
  std::vector<uint8_t> codes;
  EXPECT_THROW(fp8_quantize(spec, {1.0f}, x, codes), Error);
}

}  // namespace
}  // namespace kvq::cpu
