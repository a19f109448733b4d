// evaluation/model_eval.h without the model: how much of the attended K/V a model row quantized
// (issue 50: a row whose window covers every scored position measured nothing of its scheme), and
// the block bootstrap behind every interval a model row reports.
#include "evaluation/model_eval.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "cache/side.h"
#include "core/error.h"
#include "core/splitmix.h"

namespace kvq::eval {
namespace {

constexpr int kLayers = 30, kHeadDim = 64;  // SmolLM2-135M's shape

PplOptions windows(int ctx, int stride = 0, int score_from = 0) {
  PplOptions o;
  o.ctx = ctx;
  o.stride = stride;
  o.score_from = score_from;
  return o;
}

// KIVI's layout by REFERENCE.md section 3, written out: keys per channel hold floor(t / B) * B
// tokens quantized (B = R, or G without a window), values per token max(t - R, 0).
double kivi_share(int64_t t, int64_t g, int64_t r) {
  const int64_t block = r > 0 ? r : g;
  return (static_cast<double>(t / block * block) +
          static_cast<double>(std::max<int64_t>(t - r, 0))) /
         (2.0 * static_cast<double>(t));
}

// The mean of kivi_share over the positions of non-overlapping windows that score everything:
// window position p attends p + 1 tokens, p = 0 .. ctx - 2.
double kivi_whole_windows(int ctx, int64_t g, int64_t r) {
  double s = 0;
  for (int p = 0; p < ctx - 1; ++p) s += kivi_share(p + 1, g, r);
  return s / (ctx - 1);
}

constexpr double kTol = 1e-12;  // sums of a few thousand fractions in another order

// The case: kivi2's 128-token window (and FP8's first 128 tokens) cover every scored
// position of 128-token windows: nothing of the scheme was measured.
TEST(QuantizedFraction, ZeroWhenTheWindowOrFirstNCoversEveryWindow) {
  EXPECT_EQ(quantized_fraction(parse_spec("kivi2"), windows(128), 256, kLayers), 0.0);
  EXPECT_EQ(quantized_fraction(parse_spec("fp8_e4m3"), windows(128), 256, kLayers), 0.0);
  EXPECT_EQ(quantized_fraction(parse_spec("fp8_e4m3:first=16"), windows(128), 256, kLayers),
            112.0 / 127.0)
      << "positions 15 .. 126 read everything quantized, positions 0 .. 14 nothing";
  // Per-token scales, bf16: every token stored rounded; fp32: nothing, by design.
  EXPECT_EQ(quantized_fraction(parse_spec("fp8_e4m3:gran=token"), windows(128), 256, kLayers), 1.0);
  EXPECT_EQ(quantized_fraction(parse_spec("bf16"), windows(128), 256, kLayers), 1.0);
  EXPECT_EQ(quantized_fraction(parse_spec("fp32"), windows(128), 256, kLayers), 0.0);
  EXPECT_TRUE(exact_by_design(parse_spec("fp32")));
  EXPECT_FALSE(exact_by_design(parse_spec("fp32@3=kivi2")));
  EXPECT_FALSE(exact_by_design(parse_spec("k=fp32;v=kivi2")));
}

TEST(QuantizedFraction, KiviLayoutByHand) {
  for (int ctx : {64, 256, 512, 2048}) {
    EXPECT_NEAR(quantized_fraction(parse_spec("kivi2"), windows(ctx), 4096, kLayers),
                kivi_whole_windows(ctx, 32, 128), kTol)
        << ctx;
    EXPECT_NEAR(quantized_fraction(parse_spec("kivi2:g=32,r=0"), windows(ctx), 4096, kLayers),
                kivi_whole_windows(ctx, 32, 0), kTol)
        << ctx;
  }
  // The numbers kMinQuantizedFraction's comment quotes.
  EXPECT_NEAR(kivi_whole_windows(256, 32, 128), 0.25, 0.005);
  EXPECT_NEAR(kivi_whole_windows(512, 32, 128), 0.50, 0.005);
  // Per-token sides quantize every token outside the window, whatever their group (g=dim too).
  EXPECT_EQ(quantized_fraction(parse_spec("int2:k=token,v=token,g=dim"), windows(256), 256, 1),
            1.0);
}

// Overlapping windows score only their last `stride` positions after the first; score_from cuts
// every window's head. By hand over the windows.
TEST(QuantizedFraction, StrideAndScoreFromWeighTheScoredPositions) {
  const auto by_hand = [](int ctx, int stride, int score_from, int64_t n) {
    double s = 0, count = 0;
    for (int64_t w = 0; w <= (n - ctx) / stride; ++w) {
      const int first = std::max(score_from, w == 0 ? 0 : ctx - stride - 1);
      for (int p = first; p < ctx - 1; ++p, ++count) s += kivi_share(p + 1, 32, 128);
    }
    return s / count;
  };
  EXPECT_NEAR(quantized_fraction(parse_spec("kivi2"), windows(256, 64), 1000, kLayers),
              by_hand(256, 64, 0, 1000), kTol);
  EXPECT_NEAR(quantized_fraction(parse_spec("kivi2"), windows(256, 0, 128), 1000, kLayers),
              by_hand(256, 256, 128, 1000), kTol);
  EXPECT_GT(by_hand(256, 64, 0, 1000), kivi_whole_windows(256, 32, 128))
      << "the later windows' tails read more of the cache quantized";
}

// Per-layer and split specs: every layer's own scheme counts; fp32 sides are exact by design and
// left out of the mean.
TEST(QuantizedFraction, PerLayerAndSplitSpecs) {
  const double r0 = kivi_whole_windows(256, 32, 0), kivi2 = kivi_whole_windows(256, 32, 128);
  const auto f = [](const char* spec, int layers) {
    return quantized_fraction(parse_spec(spec), windows(256), 256, layers);
  };
  EXPECT_NEAR(f("fp32@1=kivi2:g=32,r=0", 2), r0, kTol);
  EXPECT_NEAR(f("kivi2:g=32,r=0@1=bf16", 2), (r0 + 1.0) / 2, kTol);
  EXPECT_NEAR(f("kivi2:g=32,r=0@1=kivi2", 2), (r0 + kivi2) / 2, kTol);
  // k=fp32;v=kivi2: the value side alone, per token with its window of 128.
  double v = 0;
  for (int p = 0; p < 255; ++p) v += std::max(p + 1 - 128, 0) / (p + 1.0);
  EXPECT_NEAR(f("k=fp32;v=kivi2", 1), v / 255, kTol);
}

// The rule agrees with what the cache sides themselves read exactly (cache/side.h:
// quantized_tokens_at, which counts sink tokens in front of the scheme's own side), streamed, and
// with a tensor quantized at once (FP8's first-N clamps to the tensor: everything quantized).
TEST(QuantizedFraction, AgreesWithTheCacheSides) {
  for (const char* text : {"kivi2", "kivi4:g=16,r=48", "int2:k=token,v=channel,g=32,r=0",
                           "int4:k=channel,v=token,g=32,r=0", "fp8_e4m3", "fp8_e5m2:gran=head",
                           "fp8_e4m3:gran=channel,first=20", "fp8_e4m3:gran=token", "kivi2:sink=4",
                           "fp8_e4m3:sink=8", "kivi2:rot=hadamard"}) {
    const SchemeSpec spec = parse_spec(text);
    for (Role r : {Role::Key, Role::Value}) {
      const SchemeSpec& side = spec.side(r);
      const auto own = make_side(side.base(), r, 3, kHeadDim);  // no sinks, no rotation
      for (int64_t t = 1; t <= 300; ++t) {
        const int64_t want = t <= side.sink ? 0 : own->quantized_tokens_at(t - side.sink);
        ASSERT_EQ(quantized_tokens_of(spec, r, t), want) << text << " t=" << t;
      }
    }
  }
  EXPECT_EQ(quantized_tokens_of(parse_spec("fp8_e4m3"), Role::Key, 64, 0, false), 64);
  EXPECT_EQ(quantized_tokens_of(parse_spec("fp8_e4m3"), Role::Key, 64, 0, true), 0);
}

// ---- the block bootstrap -----------------------------------------------------------------------

PositionScores scores(const std::vector<double>& nll, const std::vector<size_t>& window_begin) {
  PositionScores s;
  s.nll = nll;
  s.nll_ref.assign(nll.size(), 1.0);
  s.kl = nll;
  for (double x : nll) s.agree.push_back(x > 1.0 ? 1.0 : 0.0);
  s.window_begin = window_begin;
  return s;
}

double mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return s / static_cast<double>(v.size());
}

TEST(Bootstrap, BlocksNeverCrossAWindow_fewerThanTwoGiveNoInterval) {
  PplResult r;
  bootstrap_intervals(scores(std::vector<double>(63 * 2, 1.0), {0, 63}), r);
  EXPECT_EQ(r.ci_blocks, 4) << "two windows of 63 positions: blocks of 32 + 31 each";
  bootstrap_intervals(scores(std::vector<double>(100, 1.0), {0, 10, 20, 90}), r);
  EXPECT_EQ(r.ci_blocks, 1 + 3 + 1 + 1);
  bootstrap_intervals(scores(std::vector<double>(20, 1.0), {0}), r);
  EXPECT_EQ(r.ci_blocks, 1);
  EXPECT_FALSE(r.kld_ci.known());
  EXPECT_FALSE(r.ppl_ci.known());
}

// Constant scores: every resample equals the estimate.
TEST(Bootstrap, ConstantScoresGiveAPointInterval) {
  PplResult r;
  bootstrap_intervals(scores(std::vector<double>(640, 0.7), {0, 320}), r);
  EXPECT_NEAR(r.kld_ci.lo, 0.7, kTol);
  EXPECT_NEAR(r.kld_ci.hi, 0.7, kTol);
  EXPECT_NEAR(r.ppl_ci.lo, std::exp(0.7), kTol);
  EXPECT_NEAR(r.ppl_ref_ci.hi, std::exp(1.0), kTol);
  EXPECT_NEAR(r.delta_ppl_ci.lo, std::exp(0.7) - std::exp(1.0), kTol);
  EXPECT_EQ(r.top1_ci.hi, 0.0);
}

// Dependence: scores constant within each block of 32 and independent between blocks. The mean's
// standard error is that of the block means, sd / sqrt(blocks) - sqrt(32) times what a bootstrap
// over single positions would claim. The 95% interval's half-width is then about 1.96 standard
// errors (normal approximation, 200 blocks); the tolerance allows the bootstrap's own noise.
TEST(Bootstrap, IntervalWidthIsThatOfTheBlockMeans) {
  constexpr int kBlocks = 200;
  constexpr double kRelTol = 0.15;
  std::vector<double> v;
  uint64_t st = 7;
  for (int b = 0; b < kBlocks; ++b) {
    const double x = static_cast<double>(splitmix64(st) >> 11) * 0x1.0p-53;  // U(0, 1)
    for (int i = 0; i < kCiBlock; ++i) v.push_back(x);
  }
  std::vector<double> block_means;
  for (int b = 0; b < kBlocks; ++b) block_means.push_back(v[static_cast<size_t>(b * kCiBlock)]);
  const double m = mean(block_means);
  double var = 0;
  for (double x : block_means) var += (x - m) * (x - m);
  const double se = std::sqrt(var / (kBlocks - 1) / kBlocks);
  PplResult r;
  bootstrap_intervals(scores(v, {0}), r);
  EXPECT_EQ(r.ci_blocks, kBlocks);
  EXPECT_NEAR((r.kld_ci.hi - r.kld_ci.lo) / 2, 1.96 * se, kRelTol * 1.96 * se);
  EXPECT_LT(r.kld_ci.lo, mean(v));
  EXPECT_GT(r.kld_ci.hi, mean(v));
  // The same draws every time.
  PplResult again;
  bootstrap_intervals(scores(v, {0}), again);
  EXPECT_EQ(again.kld_ci.lo, r.kld_ci.lo);
  EXPECT_EQ(again.ppl_ci.hi, r.ppl_ci.hi);
}

// delta ppl's interval comes from the same draws as both perplexities (paired): a scheme whose
// NLL equals the reference's at every position has delta 0 in every resample, while each
// perplexity alone varies.
TEST(Bootstrap, DeltaPplIsPaired) {
  std::vector<double> ref;
  uint64_t st = 3;
  for (int i = 0; i < 640; ++i)
    ref.push_back(static_cast<double>(splitmix64(st) >> 11) * 0x1.0p-52);
  PositionScores s = scores(ref, {0});
  s.nll_ref = ref;  // s.nll == ref too
  PplResult r;
  bootstrap_intervals(s, r);
  EXPECT_GT(r.ppl_ci.hi - r.ppl_ci.lo, 0.01) << "the perplexities vary between resamples";
  EXPECT_EQ(r.delta_ppl_ci.lo, 0.0);
  EXPECT_EQ(r.delta_ppl_ci.hi, 0.0);
}

}  // namespace
}  // namespace kvq::eval
