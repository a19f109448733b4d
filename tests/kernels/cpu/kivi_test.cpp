// Tests for kernels/cpu/kivi.h: backend cpu's KIVI quantize + pack against the reference
// (kivi::SideCache with r=0 after one append, which stores through kivi/minmax.h, kivi/pack.h and
// kivi/layout.h): words, fp16 scales and minima bit for bit, both axes, 2/3/4/8 bits, asym and
// sym, ragged shapes (T not a multiple of G, head_dim 72 and 13 with short last channel groups),
// groups holding NaN, +-inf, subnormals, constants, values beyond fp16, tie-heavy data, values
// on or one to three ulps from a tie (where the kernels' multiply-by-reciprocal estimate and the
// IEEE quotient can round apart: the kernels must fall back to the division), and groups far from
// zero with a tiny range (quotients far outside [lo, hi]: the clamp). A per-token tensor whose G
// divides D is quantized as one row of groups, 8 (AVX2) or 16 (AVX-512) groups per parameter
// computation: those shapes run every data kind, with a short last batch, and groups of 1, 2, 3 and
// 4 vectors of 16; per-channel groups of 6 and 64 rows (words written per column through the
// generic and the zip paths, rows not a multiple of the kernel's 4).
//
// The F16C conversion the kernels use for fp16 parameters (vcvtps2ph, nearest even) must equal
// core/half.h's float_to_half_bits on every float that can reach it (all but NaN, which takes
// nan_params first): a dense sample in the quick tier, all 2^32 patterns in the full tier
// (KVQ_KIVI_FULL, label full).
#include "kernels/cpu/kivi.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "kernels/cpu/isa.h"
#include "kivi/cache.h"
#include "kivi/minmax.h"
#include "tests/kivi/naive.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace kvq::cpu {
namespace {

// ---- F16C vs float_to_half_bits ---------------------------------------------------------------

#if defined(__x86_64__)
// Patterns [b0, b0 + n): counts non-NaN floats whose vcvtps2ph differs from float_to_half_bits
// (compiled for F16C here alone: the program itself is baseline x86-64; callers check path().avx2,
// whose CPUs have F16C).
__attribute__((target("avx,f16c"))) int64_t f16c_mismatches(const std::vector<uint32_t>& p,
                                                            std::string& why) {
  int64_t bad = 0;
  for (size_t i = 0; i + 8 <= p.size(); i += 8) {
    const __m256 v =
        _mm256_castsi256_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(&p[i])));
    alignas(16) uint16_t h[8];
    _mm_store_si128(reinterpret_cast<__m128i*>(h),
                    _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    for (int j = 0; j < 8; ++j) {
      const float f = bits_float(p[i + j]);
      if (std::isnan(f)) continue;
      if (h[j] != float_to_half_bits(f) && bad++ < 5)
        why += " 0x" + std::to_string(p[i + j]) + ": " + std::to_string(h[j]) + " vs " +
               std::to_string(float_to_half_bits(f)) + ";";
    }
  }
  return bad;
}

TEST(cpuKiviF16c, denseSample_equalsFloatToHalfBits) {
  if (!path().avx2) GTEST_SKIP() << "this process runs no path with F16C";
  // Every sign and exponent with every pattern of the top 10 mantissa bits (the fp16 mantissa)
  // and the 13 bits below at 0, just below / at / above the half, and all ones; plus every
  // 65537th pattern.
  std::vector<uint32_t> p;
  for (uint32_t se = 0; se < 512; ++se)
    for (uint32_t top = 0; top < 1024; ++top)
      for (uint32_t low : {0u, 0xfffu, 0x1000u, 0x1001u, 0x1fffu})
        p.push_back((se << 23) | (top << 13) | low);
  for (uint64_t b = 0; b < (1ull << 32); b += 65537) p.push_back(static_cast<uint32_t>(b));
  while (p.size() % 8) p.push_back(0);
  std::string why;
  EXPECT_EQ(f16c_mismatches(p, why), 0) << why;
}

#ifdef KVQ_KIVI_FULL
TEST(cpuKiviF16cFull, all2Pow32Patterns_equalsFloatToHalfBits) {
  if (!path().avx2) GTEST_SKIP() << "this process runs no path with F16C";
  constexpr uint64_t kChunk = 1u << 22;
  std::vector<uint32_t> p(kChunk);
  int64_t bad = 0;
  std::string why;
  for (uint64_t b0 = 0; b0 < (1ull << 32); b0 += kChunk) {
    for (uint64_t i = 0; i < kChunk; ++i) p[i] = static_cast<uint32_t>(b0 + i);
    bad += f16c_mismatches(p, why);
  }
  EXPECT_EQ(bad, 0) << why;
}
#endif
#endif

// ---- whole tensors against kivi::SideCache ----------------------------------------------------

enum class Data { Outliers, Specials, TieHeavy, NearTies, Offset };

// NearTies: every group holds its two extremes, so that its fp16 scale is exactly sh (a fp16
// value that is not a power of two, for which x * (1 / sh) and x / sh round apart) and its zero
// point 0; every other value sits 1 to 3 ulps either side of a tie (k + 1/2) * sh, or on it.
// The group's first two elements (in its own order: tokens on the channel axis, channels on the
// token axis) are the extremes.
float near_tie_value(int bits, bool sym, int64_t pos_in_group, std::mt19937_64& rng) {
  const float sh = 0.0999755859375f;  // fp16 0x2E66, the nearest to 0.1
  const int lo = sym ? -kivi::sym_qmax(bits) : 0;
  const int hi = sym ? kivi::sym_qmax(bits) : kivi::max_code(bits);
  if (pos_in_group == 0) return static_cast<float>(lo) * sh;
  if (pos_in_group == 1) return static_cast<float>(hi) * sh;
  const int k = lo + static_cast<int>(rng() % static_cast<uint64_t>(hi - lo));
  float v = (static_cast<float>(k) + 0.5f) * sh;  // exact: 9 bits times 11 bits
  const int ulps = static_cast<int>(rng() % 7) - 3;
  for (int u = 0; u < std::abs(ulps); ++u)
    v = std::nextafter(v, ulps > 0 ? std::numeric_limits<float>::infinity()
                                   : -std::numeric_limits<float>::infinity());
  return v;
}

Tensor3 make_input(Shape3 s, Data kind, int bits, uint64_t seed, bool sym = false,
                   Axis axis = Axis::Token, int group = 1) {
  Tensor3 x = kivi::naive::random_kv(s.tokens, s.heads, s.dim, seed);
  std::mt19937_64 rng(seed + 1);
  if (kind == Data::Offset)  // a range far below fp16's spacing at the values: fp16(min) lands
    for (float& v : x.data) v = 1000.0f + 0.01f * v;  // outside it, quotients far outside [lo, hi]
  if (kind == Data::NearTies)
    for (int64_t t = 0; t < s.tokens; ++t)
      for (int64_t h = 0; h < s.heads; ++h)
        for (int64_t d = 0; d < s.dim; ++d)
          x.at(t, h, d) =
              near_tie_value(bits, sym, axis == Axis::Channel ? t % group : d % group, rng);
  if (kind == Data::TieHeavy) {  // half-integers on a grid whose groups mostly have scale 1
    const int n = (1 << bits) - 1;
    for (float& v : x.data) v = 0.5f * static_cast<float>(rng() % static_cast<uint64_t>(2 * n + 1));
  }
  if (kind == Data::Specials && s.tokens >= 8 && s.dim >= 12) {
    const float inf = std::numeric_limits<float>::infinity();
    x.at(1, 0, 0) = std::numeric_limits<float>::quiet_NaN();
    x.at(2, 0, 9) = inf;
    x.at(5, s.heads - 1, 10) = -inf;
    x.at(3, 0, 4) = 1.0e-42f;  // float subnormal
    x.at(4, 0, 4) = -3.0e-8f;  // fp16 subnormal range
    x.at(6, 0, 5) = 1.0e6f;    // beyond fp16: the group's parameters overflow
    x.at(7, 0, 6) = -7.0e4f;
    for (int64_t t = 0; t < s.tokens; ++t) x.at(t, 0, 2) = 0.75f;         // a constant column
    for (int64_t d = 0; d < s.dim; ++d) x.at(0, s.heads - 1, d) = -2.5f;  // a constant row
    for (int64_t d = 0; d < s.dim; ++d) x.at(3, s.heads - 1, d) = 0.0f;   // an all-zero row
  }
  return x;
}

struct Case {
  int bits;
  bool sym;
  Axis axis;
  Shape3 shape;
  int group;
  Data data;
};

std::string name_of(const ::testing::TestParamInfo<Case>& i) {
  const Case& c = i.param;
  const char* data[] = {"outliers", "specials", "ties", "nearTies", "offset"};
  return "b" + std::to_string(c.bits) + (c.sym ? "sym" : "") +
         (c.axis == Axis::Channel ? "_channel" : "_token") + "_g" + std::to_string(c.group) + "_T" +
         std::to_string(c.shape.tokens) + "_H" + std::to_string(c.shape.heads) + "_D" +
         std::to_string(c.shape.dim) + "_" + data[static_cast<int>(c.data)];
}

class cpuKiviQuantize : public ::testing::TestWithParam<Case> {};

TEST_P(cpuKiviQuantize, wordsScalesMins_bitExactWithSideCache) {
  const Case c = GetParam();
  IntSpec spec;
  spec.bits = c.bits;
  spec.sym = c.sym;
  spec.key_axis = c.axis;
  spec.group = c.group;
  spec.residual = 0;
  const Tensor3 x = make_input(c.shape, c.data, c.bits, 17, c.sym, c.axis, c.group);
  kivi::SideCache ref(spec, Role::Key, c.shape.heads, c.shape.dim);
  ref.append(x.data.data(), c.shape.tokens);
  KiviPacked got;
  kivi_quantize(spec, Role::Key, x.data.data(), c.shape.tokens, c.shape.heads, c.shape.dim, got);
  ASSERT_EQ(got.quantized_tokens, ref.quantized_tokens());
  ASSERT_EQ(got.words.size(), ref.words().size());
  ASSERT_EQ(got.scales.size(), ref.scales().size());
  ASSERT_EQ(got.mins.size(), ref.mins().size());
  if (c.shape.tokens >= c.group) {
    ASSERT_GT(got.words.size(), 0u);  // not vacuous
  }
  for (size_t i = 0; i < got.words.size(); ++i)
    ASSERT_EQ(got.words[i], ref.words()[i]) << "word " << i;
  for (size_t i = 0; i < got.scales.size(); ++i)
    ASSERT_EQ(got.scales[i], ref.scales()[i]) << "scale " << i;
  for (size_t i = 0; i < got.mins.size(); ++i) ASSERT_EQ(got.mins[i], ref.mins()[i]) << "min " << i;
}

std::vector<Case> grid() {
  std::vector<Case> v;
  for (int bits : {2, 3, 4, 8})
    for (bool sym : {false, true})
      for (Data data :
           {Data::Outliers, Data::Specials, Data::TieHeavy, Data::NearTies, Data::Offset}) {
        v.push_back({bits, sym, Axis::Channel, {100, 3, 72}, 32, data});  // 100 = 3 groups + 4
        v.push_back({bits, sym, Axis::Token, {37, 3, 72}, 32, data});     // 72 = 32 + 32 + 8
        v.push_back({bits, sym, Axis::Token, {9, 2, 13}, 8, data});       // 13 = 8 + 5
        v.push_back({bits, sym, Axis::Channel, {9, 2, 13}, 4, data});     // 13 columns * 2 heads
        // G divides D: the whole tensor is one row of 60 groups (batches of 8 or 16, then 4 or 12)
        v.push_back({bits, sym, Axis::Token, {10, 3, 64}, 32, data});
        v.push_back({bits, sym, Axis::Token, {10, 3, 64}, 16, data});  // one vector a group
        v.push_back({bits, sym, Axis::Token, {6, 2, 128}, 64, data});  // four vectors a group
        v.push_back({bits, sym, Axis::Token, {5, 2, 96}, 48, data});  // three (counted at run time)
        // 8-channel vectors, not 16 (row8 on a 512-bit build too); 3-bit: 3 and 4 words a group
        v.push_back({bits, sym, Axis::Token, {6, 3, 72}, 24, data});
        v.push_back({bits, sym, Axis::Token, {7, 2, 80}, 40, data});
        v.push_back({bits, sym, Axis::Channel, {13, 3, 40}, 6, data});  // 6 rows; 120 = 7 x 16 + 8
        v.push_back({bits, sym, Axis::Channel, {130, 2, 64}, 64, data});  // 64-row groups
      }
  v.push_back({2, false, Axis::Token, {8, 1, 512}, 512, Data::Specials});  // groups over 256
  v.push_back({3, true, Axis::Token, {5, 3, 48}, 16, Data::TieHeavy});     // 45 groups of 16
  for (int bits : {2, 4}) {  // the bench shape, G = 32 and 128 channels or tokens
    v.push_back({bits, false, Axis::Channel, {256, 8, 128}, 32, Data::Outliers});
    v.push_back({bits, false, Axis::Token, {64, 8, 128}, 32, Data::Outliers});
    v.push_back({bits, false, Axis::Token, {16, 2, 128}, 128, Data::Outliers});
    v.push_back({bits, false, Axis::Channel, {128, 2, 64}, 64, Data::Outliers});
  }
  v.push_back({2, false, Axis::Channel, {0, 2, 64}, 32, Data::Outliers});   // empty
  v.push_back({2, false, Axis::Channel, {31, 2, 64}, 32, Data::Outliers});  // nothing quantized
  v.push_back({4, false, Axis::Token, {1, 1, 64}, 32, Data::Outliers});     // one token
  return v;
}

INSTANTIATE_TEST_SUITE_P(Grid, cpuKiviQuantize, ::testing::ValuesIn(grid()), name_of);

TEST(cpuKiviQuantize, badConfigurations_throwNamingTheValue) {
  IntSpec spec;
  KiviPacked out;
  const std::vector<float> x(64, 1.0f);
  spec.bits = 5;
  EXPECT_THROW(kivi_quantize(spec, Role::Key, x.data(), 1, 1, 64, out), Error);
  spec.bits = 2;
  spec.group = kGroupWholeDim;
  EXPECT_THROW(kivi_quantize(spec, Role::Key, x.data(), 1, 1, 64, out), Error);
  spec.group = 128;
  spec.value_axis = Axis::Token;
  EXPECT_THROW(kivi_quantize(spec, Role::Value, x.data(), 1, 1, 64, out), Error);
}

}  // namespace
}  // namespace kvq::cpu
