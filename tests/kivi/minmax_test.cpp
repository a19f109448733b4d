// kivi/minmax.h and kivi/group.h: one group, values hand-computed from REFERENCE.md section 3
// (fp16 bit patterns worked out by hand: 1.0 = 0x3c00, 2.5 = 0x4100, 0.1 -> 0x2e66 =
// 0.0999755859375, 0.3 -> 0x34cd = 0.300048828125, 1/3 -> 0x3555 = 0.333251953125).
#include "kivi/minmax.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "core/half.h"
#include "kivi/group.h"
#include "kivi/pack.h"

namespace kvq::kivi {
namespace {

constexpr uint32_t kSentinel = 0xDEADBEEFu;

struct Quantized {
  std::vector<uint32_t> codes;
  uint16_t scale_h = 0, min_h = 0;
  std::vector<float> values;  // dequantized
};

// Runs quantize_group on x (read with a stride of 3 out of an interleaved buffer, to exercise the
// stride), checks the word after the last one is untouched, then unpacks and dequantizes.
Quantized run(const std::vector<float>& x, int bits, bool sym) {
  const int n = static_cast<int>(x.size());
  std::vector<float> strided(x.size() * 3, -12345.0f);
  for (size_t i = 0; i < x.size(); ++i) strided[3 * i] = x[i];
  const int64_t nw = words_for(n, bits);
  std::vector<uint32_t> words(static_cast<size_t>(nw) + 1, kSentinel);
  Quantized q;
  q.min_h = 0x1234;  // must be overwritten (asym) or left alone (sym)
  quantize_group(strided.data(), 3, n, bits, sym, words.data(), &q.scale_h, &q.min_h);
  EXPECT_EQ(words[nw], kSentinel) << "wrote past the group's words";
  if (sym) {
    EXPECT_EQ(q.min_h, 0x1234) << "sym wrote a min";
  }
  q.codes.resize(x.size());
  unpack(words.data(), n, bits, q.codes.data());
  q.values.assign(x.size(), -777.0f);
  dequantize_group(words.data(), n, bits, sym, q.scale_h, q.min_h, q.values.data(), 1);
  return q;
}

using Codes = std::vector<uint32_t>;
using Values = std::vector<float>;

TEST(kiviMinMaxAsym, b2_0123_scale1_codesIdentity) {
  const Quantized q = run({0, 1, 2, 3}, 2, false);
  EXPECT_EQ(q.scale_h, 0x3c00);  // (3 - 0) / 3 = 1
  EXPECT_EQ(q.min_h, 0x0000);
  EXPECT_EQ(q.codes, (Codes{0, 1, 2, 3}));
  EXPECT_EQ(q.values, (Values{0, 1, 2, 3}));
}

TEST(kiviMinMaxAsym, integers_0_to_2bMinus1_exact_allBits) {
  for (int b : {2, 3, 4, 8}) {
    std::vector<float> x;
    Codes want;
    for (int i = (1 << b) - 1; i >= 0; --i) {  // descending, so the order is not the sort
      x.push_back(static_cast<float>(i));
      want.push_back(static_cast<uint32_t>(i));
    }
    const Quantized q = run(x, b, false);
    EXPECT_EQ(q.scale_h, 0x3c00) << "b=" << b;
    EXPECT_EQ(q.codes, want) << "b=" << b;
    EXPECT_EQ(q.values, x) << "b=" << b;
  }
}

TEST(kiviMinMaxAsym, b2_tiesToEven) {
  // scale 1, min 0: quotients 0, .5, 1.5, 2.5, 3 -> 0, 0, 2, 2, 3
  const Quantized q = run({0, 0.5f, 1.5f, 2.5f, 3}, 2, false);
  EXPECT_EQ(q.scale_h, 0x3c00);
  EXPECT_EQ(q.codes, (Codes{0, 0, 2, 2, 3}));
  EXPECT_EQ(q.values, (Values{0, 0, 2, 2, 3}));
}

TEST(kiviMinMaxAsym, b3_tiesToEven) {
  // scale 1, min 0: .5 .. 6.5 -> 0 2 2 4 4 6 6
  const Quantized q = run({0, 0.5f, 1.5f, 2.5f, 3.5f, 4.5f, 5.5f, 6.5f, 7}, 3, false);
  EXPECT_EQ(q.codes, (Codes{0, 0, 2, 2, 4, 4, 6, 6, 7}));
}

TEST(kiviMinMaxAsym, b2_nearTie_resolvedExactly) {
  // min -0.5, scale 1: x = 1e-30 has quotient 0.5 + 1e-30 (exact) -> 1, though float32 computes
  // 1e-30 + 0.5 = 0.5 exactly, a tie; -1e-30 has 0.5 - 1e-30 -> 0.
  EXPECT_EQ(0.5f + 1e-30f, 0.5f);  // the float quotient really is the tie
  Quantized q = run({-0.5f, 1e-30f, 2.5f}, 2, false);
  EXPECT_EQ(q.scale_h, 0x3c00);
  EXPECT_EQ(q.min_h, 0xb800);  // -0.5
  EXPECT_EQ(q.codes, (Codes{0, 1, 3}));
  q = run({-0.5f, -1e-30f, 2.5f}, 2, false);
  EXPECT_EQ(q.codes, (Codes{0, 0, 3}));
}

TEST(kiviMinMaxAsym, b2_clampsBothEnds) {
  // min 0.3 rounds UP to 0.300048828125 (0x34cd); scale float32(1.0/3) rounds down to
  // 0.333251953125 (0x3555), so the top level 1.2998046875 is below 1.3: the quotients of the
  // group's own min and max fall outside [0, 3] and are clamped.
  const Quantized q = run({0.3f, 1.3f}, 2, false);
  EXPECT_EQ(q.min_h, 0x34cd);
  EXPECT_EQ(q.scale_h, 0x3555);
  const double m = 0.300048828125, s = 0.333251953125;
  EXPECT_LT((static_cast<double>(0.3f) - m) / s, 0.0);  // the clamp is really exercised
  EXPECT_GT((static_cast<double>(1.3f) - m) / s, 3.0);
  EXPECT_EQ(q.codes, (Codes{0, 3}));
  EXPECT_EQ(q.values, (Values{0.300048828125f, 1.2998046875f}));
}

TEST(kiviMinMaxAsym, b2_scaleAndMinRoundedToFp16_codesUseRoundedParams) {
  // {0.1, 0.26663, 1.1}: min_h 0x2e66 (0.0999755859375), scale float32(1.0 / 3) -> 0x3555.
  // The tie between codes 0 and 1 sits at 0.0999755859375 + 0.333251953125 / 2 = 0.2666015625
  // with the stored parameters, at 0.1 + 1/6 = 0.26667 with unrounded ones: 0.26663 lies between,
  // so it gets code 1 (the definition), where unrounded parameters would give 0.
  const float x = 0.26663f;
  ASSERT_GT(static_cast<double>(x), 0.2666015625);
  ASSERT_LT(static_cast<double>(x), 0.1 + 1.0 / 6.0);
  const Quantized q = run({0.1f, x, 1.1f}, 2, false);
  EXPECT_EQ(q.min_h, 0x2e66);
  EXPECT_EQ(q.scale_h, 0x3555);
  EXPECT_EQ(q.codes, (Codes{0, 1, 3}));
  EXPECT_EQ(q.values[1], static_cast<float>(0.0999755859375 + 0.333251953125));
}

TEST(kiviMinMaxAsym, b4_constantGroup_exactWhenFp16) {
  const Quantized q = run({2.5f, 2.5f, 2.5f, 2.5f, 2.5f}, 4, false);
  EXPECT_EQ(q.scale_h, 0);
  EXPECT_EQ(q.min_h, 0x4100);
  EXPECT_EQ(q.codes, (Codes{0, 0, 0, 0, 0}));
  EXPECT_EQ(q.values, (Values{2.5f, 2.5f, 2.5f, 2.5f, 2.5f}));
}

TEST(kiviMinMaxAsym, b2_constantGroup_notFp16_readsBackMinRoundedToFp16) {
  // Documented in kivi/minmax.h: x' = fp16(mn) (0.1 -> 0.0999755859375).
  const Quantized q = run({0.1f, 0.1f, 0.1f}, 2, false);
  EXPECT_EQ(q.scale_h, 0);
  EXPECT_EQ(q.min_h, 0x2e66);
  EXPECT_EQ(q.values, (Values{0.0999755859375f, 0.0999755859375f, 0.0999755859375f}));
}

TEST(kiviMinMaxAsym, b8_rangeBelowFp16_scaleRoundsToZero) {
  // range 2^-23, / 255 = 4.7e-10 < 2^-25 (half the smallest fp16 subnormal) -> scale 0.
  const float up = 1.0f + std::ldexp(1.0f, -23);
  const Quantized q = run({1.0f, up, 1.0f}, 8, false);
  EXPECT_EQ(q.scale_h, 0);
  EXPECT_EQ(q.min_h, 0x3c00);
  EXPECT_EQ(q.codes, (Codes{0, 0, 0}));
  EXPECT_EQ(q.values, (Values{1.0f, 1.0f, 1.0f}));
}

TEST(kiviMinMaxAsym, b2_negativeZeroMin_storedAsPositiveZero) {
  const Quantized q = run({-0.0f, 3.0f}, 2, false);
  EXPECT_EQ(q.min_h, 0x0000);
  EXPECT_EQ(q.codes, (Codes{0, 3}));
}

TEST(kiviMinMaxSym, b3_scaleAmaxOver3) {
  // qmax 3, amax 3 -> scale 1; q = -3 -1 0 0(0.4) 1 3, stored + 4
  const Quantized q = run({-3, -1, 0, 0.4f, 1, 3}, 3, true);
  EXPECT_EQ(q.scale_h, 0x3c00);
  EXPECT_EQ(q.codes, (Codes{1, 3, 4, 4, 5, 7}));
  EXPECT_EQ(q.values, (Values{-3, -1, 0, 0, 1, 3}));
}

TEST(kiviMinMaxSym, b4_tiesToEven) {
  // qmax 7, amax 7 -> scale 1; +-0.5 -> 0, 1.5 -> 2, -1.5 -> -2, +-2.5 -> +-2; stored + 8
  const Quantized q = run({7, -0.5f, 0.5f, 1.5f, -1.5f, 2.5f, -2.5f}, 4, true);
  EXPECT_EQ(q.codes, (Codes{15, 8, 8, 10, 6, 10, 6}));
  EXPECT_EQ(q.values, (Values{7, 0, 0, 2, -2, 2, -2}));
}

TEST(kiviMinMaxSym, b2_threeLevels) {
  // qmax 1, amax 2 -> scale 2 (0x4000); 0.9/2 = .45 -> 0, -1.1/2 = -.55 -> -1; stored + 2
  const Quantized q = run({-2, 2, 0.9f, -1.1f}, 2, true);
  EXPECT_EQ(q.scale_h, 0x4000);
  EXPECT_EQ(q.codes, (Codes{1, 3, 2, 1}));
  EXPECT_EQ(q.values, (Values{-2, 2, 0, -2}));
}

TEST(kiviMinMaxSym, b8_amaxFromNegativeSide) {
  // amax 127 from -127 -> scale 1; 3.2 -> 3
  const Quantized q = run({-127, 3.2f, 1}, 8, true);
  EXPECT_EQ(q.scale_h, 0x3c00);
  EXPECT_EQ(q.codes, (Codes{1, 131, 129}));
}

TEST(kiviMinMaxSym, b8_zeroGroup) {
  const Quantized q = run({0, 0, 0}, 8, true);
  EXPECT_EQ(q.scale_h, 0);
  EXPECT_EQ(q.codes, (Codes{128, 128, 128}));
  EXPECT_EQ(q.values, (Values{0, 0, 0}));
}

// A NaN or inf anywhere in a group makes every value of that group read back as NaN.
TEST(kiviMinMaxNonFinite, nan_inf_groupReadsBackNaN_allBits_symAndAsym) {
  const float bad[] = {std::numeric_limits<float>::quiet_NaN(),
                       std::numeric_limits<float>::infinity(),
                       -std::numeric_limits<float>::infinity()};
  int checked = 0;
  for (int b : {2, 3, 4, 8})
    for (bool sym : {false, true})
      for (float v : bad) {
        const Quantized q = run({1.0f, v, 2.0f, 0.5f}, b, sym);
        EXPECT_EQ(q.scale_h, kHalfNaN) << "b=" << b << " sym=" << sym << " v=" << v;
        if (!sym) {
          EXPECT_EQ(q.min_h, kHalfNaN);
        }
        for (float y : q.values) {
          EXPECT_TRUE(std::isnan(y)) << "b=" << b << " sym=" << sym << " v=" << v;
          ++checked;
        }
      }
  EXPECT_EQ(checked, 4 * 2 * 3 * 4);
}

TEST(kiviMinMaxNonFinite, fp16Overflow_groupReadsBackNaN) {
  Quantized q = run({70000.0f, 70001.0f}, 4, false);  // min beyond 65504
  EXPECT_EQ(q.scale_h, kHalfNaN);
  EXPECT_TRUE(std::isnan(q.values[0]) && std::isnan(q.values[1]));
  q = run({1e5f, 0.0f}, 2, true);  // sym b=2: scale = amax = 1e5
  EXPECT_EQ(q.scale_h, kHalfNaN);
  EXPECT_TRUE(std::isnan(q.values[0]) && std::isnan(q.values[1]));
  q = run({-60000.0f, 60000.0f}, 2, false);  // fits: min -60000, scale 40000
  EXPECT_TRUE(std::isfinite(q.values[0]) && std::isfinite(q.values[1]));
}

TEST(kiviMinMaxEncode, matchesRunOnOwnParams) {
  // encode/decode used directly agree with the group routine (the cache's batched path uses them)
  GroupRange r = GroupRange::of(0.3f);
  r.add(1.3f);
  const GroupParams p = minmax_params(r, 2, false);
  EXPECT_EQ(p.scale_h, 0x3555);
  EXPECT_EQ(p.min_h, 0x34cd);
  EXPECT_EQ(encode(0.3f, p, 2, false), 0u);
  EXPECT_EQ(encode(1.3f, p, 2, false), 3u);
  EXPECT_EQ(encode(0.8f, p, 2, false), 2u);  // (0.8 - 0.30005) / 0.33325 = 1.5003 -> 2
  EXPECT_EQ(decode(2, p.scale, p.min, 2, false), 0.300048828125f + 2 * 0.333251953125f);
}

}  // namespace
}  // namespace kvq::kivi
