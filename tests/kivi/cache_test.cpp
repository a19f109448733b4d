// kivi/cache.h: residual rules by hand, any partition of appends stores the same bytes, the stored
// bytes equal an independent naive quantizer's (tests/kivi/naive.h), the dequantization error
// stays within its derived bound, the byte count equals kvq::footprint, errors name the value.
#include "kivi/cache.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "core/error.h"
#include "core/footprint.h"
#include "core/half.h"
#include "core/spec.h"
#include "kivi/group.h"
#include "kivi/tensor_quant.h"
#include "tests/kivi/naive.h"

namespace kvq::kivi {
namespace {

using naive::naive_store;
using naive::random_kv;

constexpr int kG = 32;

IntSpec make_spec(int bits, Axis axis, int group, int residual, bool sym = false) {
  IntSpec q;
  q.bits = bits;
  q.key_axis = q.value_axis = axis;  // the role does not matter then; tests use Role::Key
  q.group = group;
  q.residual = residual;
  q.sym = sym;
  return q;
}

const char* axis_name(Axis a) { return a == Axis::Channel ? "channel" : "token"; }

// Bitwise equality of everything a cache stores.
void expect_same_storage(const SideCache& a, const SideCache& b, const std::string& what) {
  ASSERT_EQ(a.tokens(), b.tokens()) << what;
  ASSERT_EQ(a.quantized_tokens(), b.quantized_tokens()) << what;
  ASSERT_EQ(a.residual_tokens(), b.residual_tokens()) << what;
  EXPECT_TRUE(std::ranges::equal(a.words(), b.words())) << what << ": words differ";
  EXPECT_TRUE(std::ranges::equal(a.scales(), b.scales())) << what << ": scales differ";
  EXPECT_TRUE(std::ranges::equal(a.mins(), b.mins())) << what << ": mins differ";
  ASSERT_EQ(a.residual().size(), b.residual().size()) << what;
  if (!a.residual().empty()) {  // (memcmp of null pointers is undefined even for 0 bytes)
    EXPECT_EQ(std::memcmp(a.residual().data(), b.residual().data(), a.residual().size_bytes()), 0)
        << what << ": residual differs";
  }
}

// ---- residual rules ------------------------------------------------------------------------

TEST(kiviCacheResidual, g32_r128_T300_byHand) {
  const Tensor3 x = random_kv(300, 2, 40, 1);
  struct Case {
    Axis axis;
    int r;
    int64_t quantized, residual;
  };
  // channel: B = R (or G when R = 0), floor(300 / B) * B quantized; token: max(300 - R, 0)
  for (const Case& c : {Case{Axis::Channel, 128, 256, 44}, Case{Axis::Token, 128, 172, 128},
                        Case{Axis::Channel, 0, 288, 12}, Case{Axis::Token, 0, 300, 0},
                        Case{Axis::Channel, 32, 288, 12}, Case{Axis::Token, 32, 268, 32}}) {
    SideCache cache(make_spec(2, c.axis, kG, c.r), Role::Key, 2, 40);
    cache.append(x.data.data(), 300);
    EXPECT_EQ(cache.quantized_tokens(), c.quantized) << axis_name(c.axis) << " r=" << c.r;
    EXPECT_EQ(cache.residual_tokens(), c.residual) << axis_name(c.axis) << " r=" << c.r;
    EXPECT_EQ(cache.tokens(), 300);
    EXPECT_EQ(static_cast<int64_t>(cache.residual().size()), c.residual * 2 * 40);
  }
}

TEST(kiviCacheResidual, kivi2_keysChannel_valuesToken_T300) {
  const SchemeSpec s = parse_spec("kivi2");
  const Tensor3 x = random_kv(300, 2, 64, 2);
  SideCache k(s.q(), Role::Key, 2, 64), v(s.q(), Role::Value, 2, 64);
  k.append(x.data.data(), 300);
  v.append(x.data.data(), 300);
  EXPECT_EQ(k.axis(), Axis::Channel);
  EXPECT_EQ(v.axis(), Axis::Token);
  EXPECT_EQ(k.quantized_tokens(), 256);
  EXPECT_EQ(v.quantized_tokens(), 172);
}

TEST(kiviCacheResidual, oneTokenAtATime_T0to300_countsByHand) {
  const Tensor3 x = random_kv(300, 1, 32, 3);
  for (int r : {0, 32, 128}) {
    SideCache ch(make_spec(4, Axis::Channel, kG, r), Role::Key, 1, 32);
    SideCache tk(make_spec(4, Axis::Token, kG, r), Role::Key, 1, 32);
    const int64_t block = r > 0 ? r : kG;
    for (int64_t t = 1; t <= 300; ++t) {
      ch.append(x.data.data() + (t - 1) * 32, 1);
      tk.append(x.data.data() + (t - 1) * 32, 1);
      ASSERT_EQ(ch.quantized_tokens(), t / block * block) << "r=" << r << " T=" << t;
      ASSERT_EQ(tk.quantized_tokens(), t > r ? t - r : 0) << "r=" << r << " T=" << t;
      ASSERT_EQ(ch.residual_tokens() + ch.quantized_tokens(), t);
      ASSERT_EQ(tk.residual_tokens() + tk.quantized_tokens(), t);
    }
  }
}

// ---- any partition of appends stores the same bytes ----------------------------------------

using PartitionParam = std::tuple<int, Axis, int, int64_t>;  // bits, axis, R / G, T

class kiviCachePartition : public ::testing::TestWithParam<PartitionParam> {};

TEST_P(kiviCachePartition, randomPartitions_bitIdenticalToOneAppend) {
  const auto [bits, axis, r_groups, T] = GetParam();
  const int R = r_groups * kG;
  const int64_t H = 3, D = 40;  // per-token side: channel groups of 32 and 8
  const IntSpec spec = make_spec(bits, axis, kG, R);
  const Tensor3 x = random_kv(T, H, D, 100 + static_cast<uint64_t>(T));
  SideCache ref(spec, Role::Key, H, D);
  ref.append(x.data.data(), T);
  // not vacuous: the hand rule says how many tokens are quantized
  const int64_t block = R > 0 ? R : kG;
  const int64_t want_q = axis == Axis::Channel ? T / block * block : std::max<int64_t>(T - R, 0);
  ASSERT_EQ(ref.quantized_tokens(), want_q);
  if (want_q > 0) {
    ASSERT_FALSE(ref.words().empty());
  }

  for (uint64_t seed = 0; seed < 6; ++seed) {
    std::mt19937_64 rng(seed * 7919 + static_cast<uint64_t>(T) + 31 * static_cast<uint64_t>(bits));
    SideCache c(spec, Role::Key, H, D);
    int64_t done = 0;
    int appends = 0, checkpoints = 0;
    while (done < T) {
      int64_t n = 0;
      switch (rng() % 6) {
        case 0:
          n = 0;
          break;  // empty append
        case 1:
          n = 1;
          break;  // decode step
        case 2:
          n = 1 + static_cast<int64_t>(rng() % 5);
          break;  // a few tokens
        case 3:
          n = 1 + static_cast<int64_t>(rng() % 70);
          break;  // a chunk
        case 4:
          n = seed == 0 ? 1 : 1 + static_cast<int64_t>(rng() % 200);
          break;
        default:
          n = rng() % 4 == 0 ? T - done : 1 + static_cast<int64_t>(rng() % 33);
          break;
      }
      n = std::min(n, T - done);
      c.append(n == 0 && rng() % 2 ? nullptr : x.data.data() + done * H * D, n);
      done += n;
      ++appends;
      if (rng() % 8 == 0) {  // an intermediate state equals one append of the prefix too
        SideCache prefix(spec, Role::Key, H, D);
        prefix.append(x.data.data(), done);
        expect_same_storage(c, prefix, fmt::format("prefix T={}", done));
        ++checkpoints;
      }
    }
    c.append(x.data.data(), 0);
    expect_same_storage(c, ref, fmt::format("seed {}, {} appends", seed, appends));
    (void)checkpoints;
  }
}

std::string partition_name(const ::testing::TestParamInfo<PartitionParam>& info) {
  const auto [b, axis, rg, T] = info.param;
  return fmt::format("b{}_g32_r{}_{}_T{}", b, rg * kG, axis_name(axis), T);
}

INSTANTIATE_TEST_SUITE_P(Grid, kiviCachePartition,
                         ::testing::Combine(::testing::Values(2, 3, 4, 8),
                                            ::testing::Values(Axis::Channel, Axis::Token),
                                            ::testing::Values(0, 1, 4),
                                            ::testing::Values(int64_t{1}, int64_t{31}, int64_t{33},
                                                              int64_t{257}, int64_t{1000})),
                         partition_name);

// ---- storage equals an independent naive quantizer, bit for bit -----------------------------

using StoreParam = std::tuple<int, Axis, bool>;  // bits, axis, sym

std::string store_name(const ::testing::TestParamInfo<StoreParam>& info) {
  const auto [b, axis, sym] = info.param;
  return fmt::format("b{}_g32_r128_d72_T300_{}_{}", b, axis_name(axis), sym ? "sym" : "asym");
}

// The same groups through the one-group routine of kivi/group.h (what kernels port), in the
// layout's order, so the routine, the cache's batched loops and the naive quantizer all agree.
naive::NaiveStore group_routine_store(const Tensor3& x, int64_t tq, Axis axis, int bits, bool sym) {
  naive::NaiveStore s;
  const int64_t H = x.shape.heads, D = x.shape.dim;
  auto run = [&](const float* v, int64_t stride, int n) {
    std::vector<uint32_t> w(static_cast<size_t>(words_for(n, bits)));
    uint16_t sh = 0, mh = 0;
    quantize_group(v, stride, n, bits, sym, w.data(), &sh, &mh);
    s.words.insert(s.words.end(), w.begin(), w.end());
    s.scales.push_back(sh);
    if (!sym) s.mins.push_back(mh);
  };
  if (axis == Axis::Channel) {
    for (int64_t g = 0; g < tq / kG; ++g)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t d = 0; d < D; ++d) run(x.data.data() + ((g * kG) * H + h) * D + d, H * D, kG);
  } else {
    for (int64_t t = 0; t < tq; ++t)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t c0 = 0; c0 < D; c0 += kG)
          run(x.data.data() + (t * H + h) * D + c0, 1,
              static_cast<int>(std::min<int64_t>(kG, D - c0)));
  }
  return s;
}

// Bit-exact comparison of a cache's storage with the naive quantizer and the group routine.
void expect_matches_naive(const SideCache& c, const Tensor3& x, const std::string& what) {
  const int64_t tq = c.quantized_tokens();
  const naive::NaiveStore want = naive_store(x, tq, c.axis(), kG, c.bits(), c.sym());
  const naive::NaiveStore routine = group_routine_store(x, tq, c.axis(), c.bits(), c.sym());
  ASSERT_EQ(c.words().size(), want.words.size()) << what;
  ASSERT_EQ(c.scales().size(), want.scales.size()) << what;
  ASSERT_EQ(c.mins().size(), want.mins.size()) << what;
  EXPECT_EQ(c.sym(), want.mins.empty()) << what;
  int64_t word_diff = 0, scale_diff = 0, min_diff = 0;
  for (size_t i = 0; i < want.words.size(); ++i) word_diff += c.words()[i] != want.words[i];
  for (size_t i = 0; i < want.scales.size(); ++i) scale_diff += c.scales()[i] != want.scales[i];
  for (size_t i = 0; i < want.mins.size(); ++i) min_diff += c.mins()[i] != want.mins[i];
  EXPECT_EQ(word_diff, 0) << what << ": of " << want.words.size() << " words";
  EXPECT_EQ(scale_diff, 0) << what << ": of " << want.scales.size() << " scales";
  EXPECT_EQ(min_diff, 0) << what << ": of " << want.mins.size() << " mins";
  EXPECT_EQ(routine.words, want.words) << what << ": group routine words";
  EXPECT_EQ(routine.scales, want.scales) << what << ": group routine scales";
  EXPECT_EQ(routine.mins, want.mins) << what << ": group routine mins";
  // not a vacuous comparison: most words differ from the first one
  int64_t differ = 0;
  for (uint32_t w : c.words()) differ += w != want.words[0];
  EXPECT_GT(differ, static_cast<int64_t>(want.words.size()) / 2) << what;
}

class kiviCacheNaive : public ::testing::TestWithParam<StoreParam> {};

TEST_P(kiviCacheNaive, outlierChannels_wordsScalesMinsBitExact) {
  const auto [bits, axis, sym] = GetParam();
  const int64_t T = 300, H = 3, D = 72;  // D = 72: per-token groups of 32, 32, 8
  const Tensor3 x = random_kv(T, H, D, 7);
  SideCache c(make_spec(bits, axis, kG, 128, sym), Role::Key, H, D);
  c.append(x.data.data(), T);
  ASSERT_EQ(c.quantized_tokens(), axis == Axis::Channel ? 256 : 172);
  expect_matches_naive(c, x, "outliers");
  const Tensor3 y = c.dequantize();  // the residual is exact
  for (int64_t i = c.quantized_tokens() * H * D; i < T * H * D; ++i)
    ASSERT_EQ(y.data[i], x.data[i]);
}

// Values on the ties of their group: each group holds its min and max at fixed positions so that
// scale_h = 1 exactly (asym: min -0.5, max 2^b - 1.5; sym: amax = qmax); most other values are
// integers (asym: quotient k + 1/2, an exact tie, to even) or half-integers (sym); some asym
// values are +-2^-40 or +-2^-30 (quotient 1/2 +- tiny: float32 rounds it onto the tie, the exact
// quotient is not on it); the rest uniform.
Tensor3 tie_heavy_kv(int64_t T, int64_t H, int64_t D, int bits, bool sym, Axis axis) {
  Tensor3 x(Shape3{T, H, D});
  std::mt19937_64 rng(99);
  const int qmax = (1 << (bits - 1)) - 1, n = (1 << bits) - 1;
  const float lo = sym ? -static_cast<float>(qmax) : -0.5f;
  const float hi = sym ? static_cast<float>(qmax) : static_cast<float>(n) - 0.5f;
  std::uniform_real_distribution<float> uniform(lo, hi);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t d = 0; d < D; ++d) {
        const int64_t pos = (axis == Axis::Channel ? t : d) % kG;
        const uint64_t r = rng() % 8;
        float v;
        if (pos == 0)
          v = lo;
        else if (pos == 1)
          v = hi;
        else if (r < 5 && sym)
          v = static_cast<float>(static_cast<int>(rng() % (2 * qmax)) - qmax) + 0.5f;
        else if (r < 5)
          v = static_cast<float>(rng() % static_cast<uint64_t>(n));
        else if (r < 7 && !sym)
          v = std::ldexp(rng() % 2 ? 1.0f : -1.0f, r == 5 ? -40 : -30);
        else
          v = uniform(rng);
        x.at(t, h, d) = v;
      }
  return x;
}

TEST_P(kiviCacheNaive, tieHeavy_exactAndFloatOnlyTies_bitExact) {
  const auto [bits, axis, sym] = GetParam();
  const int64_t T = 300, H = 3, D = 72;
  const Tensor3 x = tie_heavy_kv(T, H, D, bits, sym, axis);
  SideCache c(make_spec(bits, axis, kG, 128, sym), Role::Key, H, D);
  c.append(x.data.data(), T);
  expect_matches_naive(c, x, "tie-heavy");
  // the ties are really there: float32 quotients on k + 1/2 with the stored scale 1
  int64_t ties = 0, float_only = 0;
  const int64_t nq = c.quantized_tokens() * H * D;
  for (int64_t i = 0; i < nq; ++i) {
    const float q = sym ? x.data[i] : x.data[i] + 0.5f;  // (x - min) / 1 in float32
    if (std::abs(std::nearbyint(q) - q) == 0.5f) ++ties;
    if (!sym && std::abs(x.data[i]) > 0 && std::abs(x.data[i]) < 1e-8f) ++float_only;
  }
  for (uint16_t s : c.scales()) ASSERT_EQ(s, 0x3c00);  // every scale is 1
  EXPECT_GT(ties, nq / 3);
  if (!sym) {
    EXPECT_GT(float_only, nq / 20);
  }
}

INSTANTIATE_TEST_SUITE_P(Grid, kiviCacheNaive,
                         ::testing::Combine(::testing::Values(2, 3, 4, 8),
                                            ::testing::Values(Axis::Channel, Axis::Token),
                                            ::testing::Values(false, true)),
                         store_name);

// ---- dequantization error bound ------------------------------------------------------------
//
// Asymmetric group with min mn, max mx, stored min_h, scale_h, levels L_k = min_h + k*scale_h,
// k = 0..n (n = 2^b - 1), top = L_n. The code is the nearest level after clamping, so
//   x in [min_h, top]: |x - L| <= scale_h / 2;   x < min_h: |x - L_0| <= min_h - mn;
//   x > top:          |x - L_n| <= mx - top,
// and x' = float32(L) adds at most half an ulp, <= 2^-24 |x'|. Hence
//   |x - x'| <= max(scale_h / 2, min_h - mn, mx - top) + 2^-24 |x'|.
// The slack terms exist only through fp16 rounding: |min_h - mn| <= 2^-11 |mn| (+ 2^-25 if
// subnormal), and n |scale_h - (mx - mn)/n| <= (2^-11 + 2^-23) (mx - mn) + n 2^-25 (two float32
// roundings, one fp16), so slack <= kSlackRel (|mn| + mx - mn) + n 2^-24 with kSlackRel = 2^-10.
// Symmetric: |x - x'| <= max(scale_h / 2, amax - qmax*scale_h), x' exact (a product of small
// integers and an fp16 value), slack <= kSlackRel amax + qmax 2^-24.
constexpr double kSlackRel = 1.0 / 1024;
constexpr double kTwoM24 = 1.0 / 16777216;

class kiviCacheErrorBound : public ::testing::TestWithParam<StoreParam> {};

TEST_P(kiviCacheErrorBound, perElementWithinHalfScalePlusFp16Slack) {
  const auto [bits, axis, sym_param] = GetParam();
  const bool sym = sym_param;  // a variable: clang 14 (scripts/sanitize.sh) captures no binding
  const int64_t T = 300, H = 3, D = 72;
  const Tensor3 x = random_kv(T, H, D, 11);
  SideCache c(make_spec(bits, axis, kG, 128, sym), Role::Key, H, D);
  c.append(x.data.data(), T);
  const Tensor3 y = c.dequantize();
  const int64_t tq = c.quantized_tokens();
  const int n = (1 << bits) - 1, qmax = (1 << (bits - 1)) - 1;
  int64_t checked = 0, groups = 0;
  double max_err = 0, max_ratio = 0;
  // Enumerate groups as element lists (per-channel: G tokens of one (h, d); per-token: up to G
  // channels of one (t, h)) in the layout's parameter order.
  auto check_group = [&](const std::vector<int64_t>& idx, int64_t p) {
    double mn = INFINITY, mx = -INFINITY;
    for (int64_t i : idx)
      mn = std::min(mn, double(x.data[i])), mx = std::max(mx, double(x.data[i]));
    const double s = half_bits_to_float(c.scales()[p]);
    double bound_base, slack;
    if (sym) {
      const double amax = std::max(-mn, mx);
      slack = std::max(0.0, amax - qmax * s);
      bound_base = std::max(s / 2, slack);
      EXPECT_LE(slack, kSlackRel * amax + qmax * kTwoM24);
    } else {
      const double m = half_bits_to_float(c.mins()[p]), top = m + n * s;
      slack = std::max({0.0, m - mn, mx - top});
      bound_base = std::max(s / 2, slack);
      EXPECT_LE(slack, kSlackRel * (std::abs(mn) + mx - mn) + n * kTwoM24);
      for (int64_t i : idx) {  // every value read back lies in [min_h, float32(top)]
        EXPECT_GE(double(y.data[i]), m);
        EXPECT_LE(y.data[i], static_cast<float>(top));
      }
    }
    for (int64_t i : idx) {
      const double err = std::abs(double(x.data[i]) - double(y.data[i]));
      const double bound = bound_base + kTwoM24 * std::abs(double(y.data[i]));
      ASSERT_LE(err, bound) << "element " << i << " group " << p << " x=" << x.data[i]
                            << " x'=" << y.data[i] << " scale_h=" << s;
      if (sym) {
        ASSERT_LE(std::abs(double(y.data[i])), qmax * s);
      }
      max_err = std::max(max_err, err);
      if (s > 0) max_ratio = std::max(max_ratio, err / s);
      ++checked;
    }
    ++groups;
  };
  std::vector<int64_t> idx;
  if (axis == Axis::Channel) {
    for (int64_t g = 0; g < tq / kG; ++g)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t d = 0; d < D; ++d) {
          idx.clear();
          for (int64_t i = 0; i < kG; ++i) idx.push_back(((g * kG + i) * H + h) * D + d);
          check_group(idx, (g * H + h) * D + d);
        }
  } else {
    const int64_t ncg = (D + kG - 1) / kG;
    for (int64_t t = 0; t < tq; ++t)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t cg = 0; cg < ncg; ++cg) {
          idx.clear();
          for (int64_t d = cg * kG; d < std::min<int64_t>(D, (cg + 1) * kG); ++d)
            idx.push_back((t * H + h) * D + d);
          check_group(idx, (t * H + h) * ncg + cg);
        }
  }
  EXPECT_EQ(checked, tq * H * D);
  EXPECT_EQ(groups, static_cast<int64_t>(c.scales().size()));
  EXPECT_GT(max_err, 0.0);
  EXPECT_GT(max_ratio, 0.25);  // errors do reach the order of the bound (~scale/2)
}

INSTANTIATE_TEST_SUITE_P(Grid, kiviCacheErrorBound,
                         ::testing::Combine(::testing::Values(2, 3, 4, 8),
                                            ::testing::Values(Axis::Channel, Axis::Token),
                                            ::testing::Values(false, true)),
                         store_name);

TEST(kiviCacheQuality, nmseFallsWithBits_keysPerChannel) {
  const Tensor3 x = random_kv(512, 4, 64, 5);
  double prev = INFINITY, energy = 0;
  for (float v : x.data) energy += double(v) * v;
  for (int b : {2, 3, 4, 8}) {
    const Tensor3 y = round_trip(make_spec(b, Axis::Channel, kG, 0), Role::Key, x);
    double se = 0;
    for (size_t i = 0; i < x.data.size(); ++i) se += std::pow(double(x.data[i]) - y.data[i], 2);
    const double nmse = se / energy;
    EXPECT_LT(nmse, prev / 3) << "b=" << b;  // each extra bit cuts the error several-fold
    EXPECT_GT(nmse, 0.0);
    prev = nmse;
  }
}

// ---- layout by hand ------------------------------------------------------------------------

TEST(kiviCacheLayout, tokenAxis_d72_g32_shortLastGroup) {
  const std::pair<int, int64_t> cases[] = {{2, 5}, {3, 9}, {4, 9}, {8, 18}};
  for (auto [b, wpth] : cases) {
    // words per (token, head): words_for(32) + words_for(32) + words_for(8)
    SideCache c(make_spec(b, Axis::Token, kG, 0), Role::Key, 3, 72);
    const TokenLayout lay = c.token_layout();
    EXPECT_EQ(lay.channel_groups(), 3);
    EXPECT_EQ(lay.group_len(0), 32);
    EXPECT_EQ(lay.group_len(2), 8);
    EXPECT_EQ(lay.words_per_token_head(), wpth) << "b=" << b;
    const Tensor3 x = random_kv(5, 3, 72, 9);
    c.append(x.data.data(), 5);
    EXPECT_EQ(static_cast<int64_t>(c.words().size()), 5 * 3 * wpth);
    EXPECT_EQ(c.scales().size(), 5u * 3 * 3);
    // spot-check one element's code through the layout against its dequantized value
    const int64_t p = lay.param_index(4, 2, 2);
    const float s = half_bits_to_float(c.scales()[p]), m = half_bits_to_float(c.mins()[p]);
    const uint32_t code = lay.code(c.words().data(), 4, 2, 70);
    EXPECT_EQ(c.dequantize().at(4, 2, 70), static_cast<float>(code) * s + m);
  }
}

TEST(kiviCacheLayout, channelAxis_wordsPerGroup_andCodeLookup) {
  const Tensor3 x = random_kv(64, 2, 8, 10);
  const std::pair<int, int64_t> cases[] = {{2, 2}, {3, 4}, {4, 4}, {8, 8}};
  for (auto [b, wpg] : cases) {
    SideCache c(make_spec(b, Axis::Channel, kG, 0), Role::Key, 2, 8);
    c.append(x.data.data(), 64);
    const ChannelLayout lay = c.channel_layout();
    EXPECT_EQ(lay.words_per_group(), wpg);
    EXPECT_EQ(static_cast<int64_t>(c.words().size()), 2 * 2 * 8 * wpg);
    const Tensor3 y = c.dequantize();
    for (int64_t t : {0, 13, 31, 32, 50, 63}) {
      const int64_t p = lay.param_index(t / kG, 1, 5);
      const float s = half_bits_to_float(c.scales()[p]), m = half_bits_to_float(c.mins()[p]);
      EXPECT_EQ(y.at(t, 1, 5), static_cast<float>(lay.code(c.words().data(), t, 1, 5)) * s + m);
    }
  }
}

TEST(kiviCacheLayout, tokenAxis_gDim_isHeadDim) {
  IntSpec q = make_spec(4, Axis::Token, kGroupWholeDim, 0);
  SideCache c(q, Role::Key, 2, 72);
  EXPECT_EQ(c.group(), 72);
  EXPECT_EQ(c.token_layout().channel_groups(), 1);
}

// ---- memory accounting: stored bytes equal the one formula --------------------------------

TEST(kiviCacheFootprint, storedBytesEqualFootprint) {
  int checked = 0;
  for (Axis axis : {Axis::Channel, Axis::Token})
    for (bool sym : {false, true})
      for (int b : {2, 3, 4, 8})
        for (int r : {0, 128})
          for (int64_t T : {0, 1, 100, 300, 333}) {
            const int64_t H = 3, D = 72;
            SideCache c(make_spec(b, axis, kG, r, sym), Role::Key, H, D);
            const Tensor3 x = random_kv(T, H, D, 12);
            c.append(x.data.data(), T);
            const Footprint f = c.footprint();
            const std::string what =
                fmt::format("{} b={} r={} T={}{}", axis_name(axis), b, r, T, sym ? " sym" : "");
            EXPECT_EQ(f.code_bytes, 4.0 * c.words().size()) << what;
            EXPECT_EQ(f.scale_bytes, 2.0 * c.scales().size()) << what;
            EXPECT_EQ(f.zero_bytes, 2.0 * c.mins().size()) << what;
            EXPECT_EQ(f.residual_bytes, kResidualBytesPerElement * c.residual().size()) << what;
            EXPECT_EQ(f.quantized_elements, c.quantized_tokens() * H * D) << what;
            EXPECT_EQ(f.residual_elements, static_cast<int64_t>(c.residual().size())) << what;
            EXPECT_EQ(c.quantized_tokens(), kvq::quantized_tokens(c.spec(), axis, T)) << what;
            ++checked;
          }
  EXPECT_EQ(checked, 2 * 2 * 4 * 2 * 5);
}

TEST(kiviCacheFootprint, kivi2_g32_effectiveBits3) {
  // b + 32/G bits per quantized element: 2 + 1 = 3 on the per-channel side at G = 32
  SideCache c(parse_spec("kivi2").q(), Role::Key, 8, 128);
  const Tensor3 x = random_kv(256, 8, 128, 13);
  c.append(x.data.data(), 256);
  EXPECT_EQ(c.footprint().effective_bits(), 3.0);
}

// ---- NaN / inf stay visible, and only in their group ---------------------------------------

TEST(kiviCacheNonFinite, nanPoisonsItsGroupOnly_bothAxes) {
  for (Axis axis : {Axis::Channel, Axis::Token}) {
    const int64_t T = 64, H = 2, D = 72;
    Tensor3 x = random_kv(T, H, D, 14);
    x.at(5, 1, 40) = std::numeric_limits<float>::quiet_NaN();
    x.at(60, 0, 3) = std::numeric_limits<float>::infinity();  // in the residual (token side)
    SideCache c(make_spec(3, axis, kG, axis == Axis::Channel ? 0 : 4), Role::Key, H, D);
    c.append(x.data.data(), T);
    const Tensor3 y = c.dequantize();
    int64_t nan = 0;
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t d = 0; d < D; ++d) {
          bool in_bad;
          if (axis == Axis::Channel)  // (token group, head, channel)
            in_bad = (t / 32 == 0 && h == 1 && d == 40) || (t / 32 == 1 && h == 0 && d == 3);
          else  // (token, head, channel group); token 60 is in the residual window of 4
            in_bad = (t == 5 && h == 1 && d / 32 == 1);
          const bool resid_inf = axis == Axis::Token && t == 60 && h == 0 && d == 3;
          if (in_bad) {
            EXPECT_TRUE(std::isnan(y.at(t, h, d)))
                << axis_name(axis) << " " << t << "," << h << "," << d;
            ++nan;
          } else if (resid_inf) {
            EXPECT_EQ(y.at(t, h, d), INFINITY);
          } else {
            ASSERT_TRUE(std::isfinite(y.at(t, h, d)))
                << axis_name(axis) << " " << t << "," << h << "," << d;
          }
        }
    EXPECT_EQ(nan, axis == Axis::Channel ? 64 : 32);
  }
}

// ---- configuration errors name the value ---------------------------------------------------

std::string error_of(const IntSpec& q, Role role, int64_t heads, int64_t dim) {
  try {
    SideCache c(q, role, heads, dim);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(kiviCacheErrors, g64_tokenAxis_d40_groupLargerThanHeadDim) {
  const std::string e = error_of(make_spec(2, Axis::Token, 64, 0), Role::Value, 2, 40);
  EXPECT_NE(e.find("g=64"), std::string::npos) << e;
  EXPECT_NE(e.find("40"), std::string::npos) << e;
}

TEST(kiviCacheErrors, r48_g32_channelAxis_notMultiple) {
  const std::string e = error_of(make_spec(2, Axis::Channel, 32, 48), Role::Key, 2, 64);
  EXPECT_NE(e.find("r=48"), std::string::npos) << e;
  EXPECT_NE(e.find("g=32"), std::string::npos) << e;
  EXPECT_THROW(parse_spec("kivi2:g=32,r=48"), Error);  // the spec parser catches it first
}

TEST(kiviCacheErrors, bits5_negativeR_gDimOnChannel_badShape_negativeAppend) {
  EXPECT_NE(error_of(make_spec(5, Axis::Token, 32, 0), Role::Key, 2, 64).find("5 bits"),
            std::string::npos);
  EXPECT_NE(error_of(make_spec(2, Axis::Token, 32, -1), Role::Key, 2, 64).find("r=-1"),
            std::string::npos);
  EXPECT_NE(
      error_of(make_spec(2, Axis::Channel, kGroupWholeDim, 0), Role::Key, 2, 64).find("g=dim"),
      std::string::npos);
  EXPECT_NE(error_of(make_spec(2, Axis::Token, 32, 0), Role::Key, 0, 64).find("heads=0"),
            std::string::npos);
  SideCache c(make_spec(2, Axis::Token, 32, 0), Role::Key, 1, 32);
  EXPECT_THROW(c.append(nullptr, -3), Error);
  EXPECT_THROW(c.append(nullptr, 2), Error);
}

// ---- round_trip is the cache read back -----------------------------------------------------

TEST(kiviCacheRoundTrip, kivi4_g32_r128_T333_bothRoles_equalsCacheDequantize) {
  const SchemeSpec s = parse_spec("kivi4");
  const Tensor3 x = random_kv(333, 2, 64, 15);
  for (Role role : {Role::Key, Role::Value}) {
    SideCache c(s.q(), role, 2, 64);
    for (int64_t t = 0; t < 333; ++t) c.append(x.data.data() + t * 128, 1);  // streamed
    const Tensor3 a = round_trip(s.q(), role, x), b = c.dequantize();
    ASSERT_EQ(a.shape, x.shape);
    EXPECT_EQ(std::memcmp(a.data.data(), b.data.data(), a.data.size() * sizeof(float)), 0);
    double norm = 0;
    for (float v : a.data) norm += double(v) * v;
    EXPECT_GT(norm, 0.0);
  }
}

}  // namespace
}  // namespace kvq::kivi
