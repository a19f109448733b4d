// Tests for kernels/cuda/mma_fp8.h (the Mma decode kernel's FP8 fragment arithmetic) on the host.
//
// Expected values come from definitions: fp8::decode (the one definition of every format) for
// the conversion, on every pair of codes under several patterns of the ignored bytes; the PTX
// fragment tables (mma_layout.h's a_/b_/c_ functions) and plain indexing of a row-major code tile
// for the lanes' B registers, every lane and register; shared-memory bank groups per
// quarter-warp (16-byte loads) or half-warp (8-byte loads) phase for the swizzle; and a random
// tile's scores and P V, emulated through the kernel's steps (q times 2^q_shift and p times
// 2^kPShift as fp16 high + low A rows, codes through the swizzled tile into B registers, mma as
// a sum over k, the powers of two and the scale applied once; token and channel scales folded
// where the kernel folds them), against decode-then-dot within kTolRel (plus the stated absolute
// terms where fp16 leaves its normal range); token_pshift over every float exponent.
#include "kernels/cuda/mma_fp8.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <random>
#include <set>
#include <vector>

#include "core/half.h"
#include "kernels/cuda/mma_layout.h"
#include "kernels/cuda/unpack.h"
#include "tests/kernels/cuda/mma_emu.h"

namespace kvq::cuda::mma_fp8 {
namespace {

using mma::a_col;
using mma::a_row;
using mma::b_col;
using mma::b_row;
using mma::c_col;
using mma::c_row;
using mma::group_of;
using mma::tig_of;

/// Relative error of the emulated scores / outputs against the exact sums (of |terms|): fp16
/// high + low parts carry ~22 bits; fp32 accumulation over D or 16 terms.
constexpr double kTolRel = 1.0 / (1 << 20);

float lo_h(uint32_t w) { return half_bits_to_float(static_cast<uint16_t>(w)); }
float hi_h(uint32_t w) { return half_bits_to_float(static_cast<uint16_t>(w >> 16)); }

template <Fp8Format F>
float expected_half(uint8_t c) {  // decode(c) * 2^(kBias - 15): what a half must hold
  return fp8::decode<F>(c) * pow2(-unpack::kHalfExpShift<F>);
}

template <Fp8Format F>
void check_every_pair() {
  for (uint32_t c1 = 0; c1 < 256; ++c1)
    for (uint32_t c3 = 0; c3 < 256; ++c3) {
      const bool nan1 = std::isnan(fp8::decode<F>(static_cast<uint8_t>(c1)));
      const bool nan3 = std::isnan(fp8::decode<F>(static_cast<uint8_t>(c3)));
      for (uint32_t junk : {0x00u, 0xffu, 0x5au, c3 ^ 0xa5u}) {
        const uint32_t t = junk | (c1 << 8) | ((junk ^ 0x3cu) << 16) | (c3 << 24);
        const uint32_t h = fp8_hi_pair_half2<F>(t);
        if (!nan1) {
          const float want = expected_half<F>(static_cast<uint8_t>(c1));
          ASSERT_EQ(lo_h(h), want) << "code " << c1 << " junk " << junk;
          ASSERT_EQ(std::signbit(lo_h(h)), std::signbit(want)) << "code " << c1;
        }
        if (!nan3) {
          const float want = expected_half<F>(static_cast<uint8_t>(c3));
          ASSERT_EQ(hi_h(h), want) << "code " << c3 << " junk " << junk;
          ASSERT_EQ(std::signbit(hi_h(h)), std::signbit(want)) << "code " << c3;
        }
      }
    }
}

TEST(MmaFp8, EveryCodePairConvertsToItsScaledValue) {
  check_every_pair<Fp8Format::E4M3>();
  check_every_pair<Fp8Format::E4M3FNUZ>();
  check_every_pair<Fp8Format::E5M2>();
}

TEST(MmaFp8, PairWordsPickTheirBytes) {
  std::mt19937 rng(5);
  for (int i = 0; i < 1000; ++i) {
    const uint32_t a = rng(), b = rng();
    for (int k = 0; k < 4; ++k) {
      const uint32_t t = value_pair_word(a, b, k);
      EXPECT_EQ((t >> 8) & 0xffu, (a >> (8 * k)) & 0xffu);
      EXPECT_EQ((t >> 24) & 0xffu, (b >> (8 * k)) & 0xffu);
    }
    for (int r = 0; r < 2; ++r)
      for (int h = 0; h < 2; ++h)  // register r, half h: byte 2 h + r
        EXPECT_EQ((key_pair_word(a, r) >> (8 + 16 * h)) & 0xffu, (a >> (8 * (2 * h + r))) & 0xffu);
  }
}

template <int D>
void check_channel_maps() {
  std::set<int> keys, values;
  for (int tg = 0; tg < 4; ++tg)
    for (int ks = 0; ks < D / 16; ++ks)
      for (int r = 0; r < 2; ++r)
        for (int h = 0; h < 2; ++h) {
          const int c = key_channel(D, tg, ks, r, h);
          // the lane's run: D / 4 channels from tg D / 4; word ks holds 4 ks .. 4 ks + 3
          EXPECT_EQ(c / (D / 4), tg);
          EXPECT_EQ((c % (D / 4)) / 4, ks);
          keys.insert(c);
        }
  for (int nc = 0; nc < 8; ++nc)
    for (int j = 0; j < D / 8; ++j) values.insert(value_channel(D, nc, j));
  EXPECT_EQ(keys.size(), static_cast<size_t>(D));
  EXPECT_EQ(values.size(), static_cast<size_t>(D));
  EXPECT_EQ(*keys.rbegin(), D - 1);
  EXPECT_EQ(*values.rbegin(), D - 1);
}

TEST(MmaFp8, ChannelMapsArePermutations) {
  check_channel_maps<64>();
  check_channel_maps<128>();
}

/// Bank group (16-byte unit within a 128-byte line) of a byte offset.
int bank16(int off) { return (off % 128) / 16; }

template <int D>
void check_swizzle() {
  constexpr int kRows = 64;
  std::set<int> offs;
  for (int r = 0; r < kRows; ++r)
    for (int c = 0; c < D / 16; ++c) {
      const int o = chunk_offset<D>(r, c);
      EXPECT_EQ(o % 16, 0);
      EXPECT_EQ(o / (8 * 16), (r * (D / 16) + c) / 8) << "stays in its line";
      offs.insert(o);
    }
  EXPECT_EQ(offs.size(), static_cast<size_t>(kRows * D / 16));
  // The kernel's copies step rows by 128 threads / (D / 16) chunks: offsets by that many rows.
  constexpr int kStep = 128 / (D / 16);
  for (int r = 0; r < kStep; ++r)
    for (int c = 0; c < D / 16; ++c)
      for (int k = 0; k < kRows / kStep; ++k)
        EXPECT_EQ(chunk_offset<D>(r + k * kStep, c), chunk_offset<D>(r, c) + k * kStep * D);
  // Keys: lane (g, tg) reads 16 bytes at chunk tg D / 64 + c of row row0 + g; phases of 8 lanes.
  for (int row0 : {0, 8, 16, 48})
    for (int c = 0; c < D / 64; ++c)
      for (int phase = 0; phase < 4; ++phase) {
        std::set<int> banks;
        for (int l = 8 * phase; l < 8 * phase + 8; ++l)
          banks.insert(bank16(chunk_offset<D>(row0 + group_of(l), tig_of(l) * (D / 64) + c)));
        EXPECT_EQ(banks.size(), 8u) << "D " << D << " key phase " << phase;
      }
  // Values: lane (g, tg) reads D / 8 bytes at channel g D / 8 of row 16 w + 2 tg + e % 2 + 8 (e /
  // 2): 16-byte loads in phases of 8 lanes (D 128), 8-byte loads in phases of 16 lanes (D 64).
  const int lanes = D == 128 ? 8 : 16, bytes = D / 8;
  for (int w = 0; w < 4; ++w)
    for (int e = 0; e < 4; ++e)
      for (int phase = 0; phase < 32 / lanes; ++phase) {
        std::set<int> units;  // 8-byte units within the 128-byte line
        for (int l = lanes * phase; l < lanes * phase + lanes; ++l) {
          const int row = 16 * w + 2 * tig_of(l) + e % 2 + 8 * (e / 2);
          const int ch = group_of(l) * bytes;
          const int o = chunk_offset<D>(row, ch / 16) + ch % 16;
          for (int u = 0; u < bytes / 8; ++u) units.insert((o % 128) / 8 + u);
        }
        EXPECT_EQ(units.size(), 16u) << "D " << D << " value e " << e << " phase " << phase;
      }
}

TEST(MmaFp8, SwizzleIsAConflictFreePermutation) {
  check_swizzle<64>();
  check_swizzle<128>();
}

TEST(MmaFp8, QShiftBringsTheMaximumIntoRange) {
  EXPECT_EQ(q_shift(0.0f), 0);
  EXPECT_EQ(q_shift(INFINITY), 0);
  EXPECT_EQ(q_shift(NAN), 0);
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> m(1.0f, 2.0f);
  for (int e = -100; e <= 100; ++e)
    for (int i = 0; i < 20; ++i) {
      const float a = std::ldexp(m(rng), e);
      const double s = std::ldexp(static_cast<double>(a), q_shift(a));
      ASSERT_GE(s, 16384.0) << a;
      ASSERT_LT(s, 32768.0) << a;
    }
  EXPECT_EQ(q_shift(std::ldexp(1.0f, -140)), 126);  // subnormal: the shift stays a float
}

TEST(MmaFp8, HighPlusLowCarriesTwentyTwoBits) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-32768.0f, 32768.0f);
  for (int i = 0; i < 100000; ++i) {
    const float x = u(rng), y = u(rng);
    const HiLo s = split_half2(x, y);
    const double hx = static_cast<double>(lo_h(s.hi)) + lo_h(s.lo);
    const double hy = static_cast<double>(hi_h(s.hi)) + hi_h(s.lo);
    ASSERT_LE(std::fabs(hx - x), std::ldexp(1.0, -24) + std::ldexp(std::fabs(x), -21)) << x;
    ASSERT_LE(std::fabs(hy - y), std::ldexp(1.0, -24) + std::ldexp(std::fabs(y), -21)) << y;
  }
}

// ---- the kernel's steps, emulated -------------------------------------------------------------

using mma_emu::Frag;
using mma_emu::Frag4;

void mma(float (&c)[32][4], const Frag4& a, const Frag& b0, const Frag& b1) {
  mma_emu::mma<mma_emu::Elem::F16>(c, a, b0, b1);
}

/// A swizzled shared tile of 16 rows of D codes, from row-major codes.
template <int D>
std::vector<uint8_t> tile_of(const std::vector<uint8_t>& codes) {
  std::vector<uint8_t> t(16 * D);
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < D / 16; ++c)
      for (int e = 0; e < 16; ++e)
        t[static_cast<size_t>(chunk_offset<D>(r, c) + e)] =
            codes[static_cast<size_t>(r * D + 16 * c + e)];
  return t;
}

uint32_t word_at(const std::vector<uint8_t>& tile, int off) {
  return tile[static_cast<size_t>(off)] | (tile[static_cast<size_t>(off) + 1] << 8) |
         (tile[static_cast<size_t>(off) + 2] << 16) |
         (static_cast<uint32_t>(tile[static_cast<size_t>(off) + 3]) << 24);
}

template <Fp8Format F>
std::vector<uint8_t> random_codes(std::mt19937& rng, size_t n) {
  std::vector<uint8_t> c(n);
  for (uint8_t& x : c) {
    do x = static_cast<uint8_t>(rng());
    while (std::isnan(fp8::decode<F>(x)) || std::isinf(fp8::decode<F>(x)));
  }
  return c;
}

/// n scales 2^top times [2^-30, 2^1) spread over 31 binades (token scales, one per token of a
/// tile, or channel scales, one per channel).
std::vector<float> spread_scales(std::mt19937& rng, int n, int top = 10) {
  std::uniform_real_distribution<float> u(1.0f, 2.0f);
  std::vector<float> s(static_cast<size_t>(n));
  for (int t = 0; t < n; ++t)
    s[static_cast<size_t>(t)] =
        static_cast<float>(std::ldexp(static_cast<double>(u(rng)), top - 30 + 31 * t / n));
  return s;
}

/// How a side is scaled: one scale (tensor / head), per token, or per channel.
enum class Gran { One, Token, Channel };
const char* name(Gran g) {
  return g == Gran::One ? "one" : (g == Gran::Token ? "token" : "channel");
}

// Token: per-token key scales, applied to each score (the kernel's fp8_token_scale). Channel:
// per-channel key scales folded into q before q_shift and the high + low split (q_c s_c, the
// kernel's q_fragments_f16 with cs).
template <int D, Fp8Format F>
void check_scores(int nq, Gran gran) {
  std::mt19937 rng(
      static_cast<uint32_t>(D + nq + 10 * static_cast<int>(F) + 100 * static_cast<int>(gran)));
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> q(8 * D);
  for (float& x : q) x = nd(rng) * 0.01f;  // far from [2^14, 2^15): q_shift matters
  const std::vector<uint8_t> k = random_codes<F>(rng, 16 * D);
  const std::vector<uint8_t> tile = tile_of<D>(k);
  const float scale = gran == Gran::One ? 0.37f : 1.0f;
  const std::vector<float> st =
      gran == Gran::Token ? spread_scales(rng, 16) : std::vector<float>(16, 1.0f);
  std::vector<float> sc = gran == Gran::Channel ? spread_scales(rng, D, 5)
                                                : std::vector<float>(static_cast<size_t>(D), 1.0f);
  std::shuffle(sc.begin(), sc.end(), rng);  // large and small scales on every lane's channels
  // A fragments of q (times the channel scales) as the kernel builds them.
  std::vector<Frag4> qa(D / 16);
  for (Frag4& f : qa)
    for (Frag& r : f) r.assign(32, 0);
  std::vector<int> qe(32);
  const auto qs_c = [&](int g, int c) {  // q_c s_c in fp32, as the kernel
    return g < nq ? q[static_cast<size_t>(g * D + c)] * sc[static_cast<size_t>(c)] : 0.0f;
  };
  double qmax = 0;  // the largest |q_c s_c| of any head
  for (int l = 0; l < 32; ++l) {
    const int g = group_of(l);
    float amax = 0.0f;  // over the lane's quad (every channel of head g)
    for (int d = 0; d < D; ++d) amax = std::fmax(amax, std::fabs(qs_c(g, d)));
    qmax = std::max(qmax, static_cast<double>(amax));
    qe[static_cast<size_t>(l)] = q_shift(amax);
    const float qs = pow2(qe[static_cast<size_t>(l)]);
    for (int ks = 0; ks < D / 16; ++ks)
      for (int r = 0; r < 2; ++r) {
        const int tg = tig_of(l);
        const HiLo s = split_half2(qs_c(g, key_channel(D, tg, ks, r, 0)) * qs,
                                   qs_c(g, key_channel(D, tg, ks, r, 1)) * qs);
        qa[static_cast<size_t>(ks)][2 * r][l] = s.hi;
        qa[static_cast<size_t>(ks)][2 * r + 1][l] = s.lo;
      }
  }
  double kmax = 0;
  for (uint8_t c : k) kmax = std::max(kmax, std::fabs(static_cast<double>(fp8::decode<F>(c))));
  // q' below fp16's normal range (channels far below the head's largest |q_c s_c|) rounds to
  // 2^-25 absolute of q' = 2^-39 of max |q_c s_c|: D such terms, relative to max |q s| max |K|.
  const double abs_tol = D * std::ldexp(qmax * kmax, -39) * scale + 1e-30;
  for (int nt = 0; nt < 2; ++nt) {
    float c[32][4] = {};
    for (int ks = 0; ks < D / 16; ++ks) {
      Frag b0(32), b1(32);
      for (int l = 0; l < 32; ++l) {
        const int row = 8 * nt + group_of(l), ch = tig_of(l) * (D / 4) + 4 * ks;
        const uint32_t w = word_at(tile, chunk_offset<D>(row, ch / 16) + ch % 16);
        b0[static_cast<size_t>(l)] = fp8_hi_pair_half2<F>(key_pair_word(w, 0));
        b1[static_cast<size_t>(l)] = fp8_hi_pair_half2<F>(key_pair_word(w, 1));
      }
      mma(c, qa[static_cast<size_t>(ks)], b0, b1);
    }
    for (int l = 0; l < 32; ++l) {
      const int g = group_of(l);
      if (g >= nq) continue;
      const float fac = pow2(unpack::kHalfExpShift<F> - qe[static_cast<size_t>(l)]) * scale;
      for (int i = 0; i < 2; ++i) {
        const int tok = 8 * nt + c_col(l, i);
        double want = 0, mag = 0;
        for (int d = 0; d < D; ++d) {
          const double t = static_cast<double>(q[static_cast<size_t>(g * D + d)]) *
                           sc[static_cast<size_t>(d)] *
                           fp8::decode<F>(k[static_cast<size_t>(tok * D + d)]) * scale *
                           st[static_cast<size_t>(tok)];
          want += t;
          mag += std::fabs(t);
        }
        const double got =
            (static_cast<double>(c[l][i]) + c[l][i + 2]) * fac * st[static_cast<size_t>(tok)];
        EXPECT_NEAR(got, want, kTolRel * mag + abs_tol * st[static_cast<size_t>(tok)])
            << "D " << D << " format " << static_cast<int>(F) << " head " << g << " token " << tok
            << " key scales " << name(gran);
      }
    }
  }
}

template <Fp8Format F>
void scores_all() {
  for (int nq : {1, 3, 8})
    for (Gran gran : {Gran::One, Gran::Token, Gran::Channel}) {
      check_scores<64, F>(nq, gran);
      check_scores<128, F>(nq, gran);
    }
}

TEST(MmaFp8, ScoresOfATileEqualDecodeThenDot) {
  scores_all<Fp8Format::E4M3>();
  scores_all<Fp8Format::E4M3FNUZ>();
  scores_all<Fp8Format::E5M2>();
}

// Token: per-token value scales folded into p (p_t (2^token_pshift(max s_t) s_t), as the kernel's
// softmax writes it), the largest scale near 2^top. Channel: per-channel value scales multiply
// each output channel once (the kernel's write_partial), in fp32.
template <int D, Fp8Format F>
void check_values(int nq, Gran gran, int top = 10) {
  std::mt19937 rng(static_cast<uint32_t>(3 * D + nq + 10 * static_cast<int>(F) +
                                         100 * static_cast<int>(gran) + top));
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  std::vector<float> p(8 * 16);
  for (float& x : p) x = u(rng) * u(rng) * u(rng);  // softmax weights, some small
  const std::vector<uint8_t> v = random_codes<F>(rng, 16 * D);
  const std::vector<uint8_t> tile = tile_of<D>(v);
  const float scale = gran == Gran::One ? 1.9f : 1.0f;
  const bool token = gran == Gran::Token;
  const std::vector<float> st = token ? spread_scales(rng, 16, top) : std::vector<float>(16, 1.0f);
  const std::vector<float> sc = gran == Gran::Channel
                                    ? spread_scales(rng, D, 5)
                                    : std::vector<float>(static_cast<size_t>(D), 1.0f);
  const float smax = *std::max_element(st.begin(), st.end());
  const int pe = token ? token_pshift(smax) : kPShift;
  Frag4 pa;
  for (Frag& r : pa) r.assign(32, 0);
  const auto pp = [&](int g, int t) {  // p' as the kernel's softmax writes it
    return g < nq ? p[static_cast<size_t>(g * 16 + t)] * (pow2(pe) * st[static_cast<size_t>(t)])
                  : 0.0f;
  };
  for (int l = 0; l < 32; ++l)
    for (int half = 0; half < 2; ++half) {
      const int g = group_of(l), tok = a_col(l, 2 * half, 0);
      const HiLo s = split_half2(pp(g, tok), pp(g, tok + 1));
      pa[2 * half][l] = s.hi;
      pa[2 * half + 1][l] = s.lo;
    }
  float o[D / 8][32][4] = {};
  for (int j = 0; j < D / 8; ++j) {
    Frag b0(32), b1(32);
    for (int l = 0; l < 32; ++l) {
      uint32_t w[4];
      for (int e = 0; e < 4; ++e) {
        const int row = 2 * tig_of(l) + e % 2 + 8 * (e / 2),
                  ch = group_of(l) * (D / 8) + 4 * (j / 4);
        w[e] = word_at(tile, chunk_offset<D>(row, ch / 16) + ch % 16);
      }
      b0[static_cast<size_t>(l)] = fp8_hi_pair_half2<F>(value_pair_word(w[0], w[1], j % 4));
      b1[static_cast<size_t>(l)] = fp8_hi_pair_half2<F>(value_pair_word(w[2], w[3], j % 4));
    }
    mma(o[j], pa, b0, b1);
  }
  const float fac = pow2(unpack::kHalfExpShift<F> - pe) * scale;
  // Token scales: p' below fp16's normal range (tokens whose s_t is far below the largest) rounds
  // to 2^-24 (high and low parts), so each token may add 2^-24 2^-pe |decode(v)| <= 2^-37
  // max(max s_t, 2^-112) |decode(v)| (token_pshift: smax 2^pe >= 2^13 for smax >= 2^-112, else
  // pe = 125): an error bound relative to the split's largest |V| (as the device tests' max-|V|
  // tolerance), not to sum |terms|.
  double vmax = 0;
  for (uint8_t c : v) vmax = std::max(vmax, std::fabs(static_cast<double>(fp8::decode<F>(c))));
  const double abs_tol =
      token
          ? 16 * std::ldexp(std::max(static_cast<double>(smax), std::ldexp(1.0, -112)) * vmax, -37)
          : 1e-30;
  for (int l = 0; l < 32; ++l) {
    const int g = group_of(l);
    if (g >= nq) continue;
    for (int j = 0; j < D / 8; ++j)
      for (int i = 0; i < 2; ++i) {
        const int d = value_channel(D, 2 * tig_of(l) + i, j);
        double want = 0, mag = 0;
        for (int t = 0; t < 16; ++t) {
          const double x = static_cast<double>(p[static_cast<size_t>(g * 16 + t)]) *
                           fp8::decode<F>(v[static_cast<size_t>(t * D + d)]) * scale *
                           st[static_cast<size_t>(t)] * sc[static_cast<size_t>(d)];
          want += x;
          mag += std::fabs(x);
        }
        // The kernel: the warps' fp32 sum times the channel scale, times the factor (fp32).
        const float sum = o[j][l][i] + o[j][l][i + 2];
        const double got = static_cast<double>(sum * sc[static_cast<size_t>(d)] * fac);
        EXPECT_NEAR(got, want, kTolRel * mag + abs_tol)
            << "D " << D << " format " << static_cast<int>(F) << " head " << g << " channel " << d
            << " value scales " << name(gran) << " top 2^" << top;
      }
  }
}

template <Fp8Format F>
void values_all() {
  for (int nq : {1, 3, 8})
    for (Gran gran : {Gran::One, Gran::Token, Gran::Channel}) {
      check_values<64, F>(nq, gran);
      check_values<128, F>(nq, gran);
    }
}

// token_pshift over every float exponent (zero, subnormal and normal scales, the largest float):
// the largest token scale times 2^e lands in [2^13, 2^14) for every smax >= 2^-112, and below
// that e = 125 (smax 2^e < 2^13); e within [-114, 125], so 2^e and the output factor
// 2^(kHalfExpShift
// - e) of every format are normal floats (kPShift for 0, inf, NaN).
TEST(MmaFp8, TokenPShiftBringsTheLargestScaleIntoRange) {
  for (uint32_t x = 0; x < 255; ++x)
    for (uint32_t m : {0u, 1u, 0x2aaaaau, 0x400000u, 0x7ffffeu, 0x7fffffu}) {
      const float s = bits_float((x << 23) | m);
      if (s == 0.0f) continue;
      const int e = token_pshift(s);
      ASSERT_GE(e, -114) << s;
      ASSERT_LE(e, 125) << s;
      for (int k : {unpack::kHalfExpShift<Fp8Format::E4M3>, unpack::kHalfExpShift<Fp8Format::E5M2>,
                    unpack::kHalfExpShift<Fp8Format::E4M3FNUZ>}) {
        ASSERT_TRUE(std::isnormal(pow2(k - e))) << s;
        ASSERT_EQ(static_cast<double>(pow2(k - e)), std::ldexp(1.0, k - e)) << s;
      }
      ASSERT_EQ(static_cast<double>(pow2(e)), std::ldexp(1.0, e)) << s;
      const double y = std::ldexp(static_cast<double>(s), e);
      ASSERT_LT(y, 16384.0) << s;
      if (s >= std::ldexp(1.0f, -112)) {
        ASSERT_GE(y, 8192.0) << s;
      } else {
        ASSERT_EQ(e, 125) << s;
      }
    }
  EXPECT_EQ(token_pshift(0.0f), kPShift);
  EXPECT_EQ(token_pshift(INFINITY), kPShift);
  EXPECT_EQ(token_pshift(NAN), kPShift);
}

TEST(MmaFp8, ValuesOfATileEqualDecodeThenWeightedSum) {
  values_all<Fp8Format::E4M3>();
  values_all<Fp8Format::E4M3FNUZ>();
  values_all<Fp8Format::E5M2>();
}

// Token value scales at the ends of float's range (outputs finite): the largest near 2^100, 2^60,
// 2^-60, 2^-112 (the last exact token_pshift), 2^-120 and 2^-135 (its smallest tokens subnormal),
// every format (e5m2's codes up to 57344 and down to 2^-16, e4m3's subnormal codes), within the
// bound above.
TEST(MmaFp8, ValuesOfATileWithExtremeTokenScales) {
  for (int top : {100, 60, -60, -112, -120, -135}) {
    check_values<64, Fp8Format::E4M3>(3, Gran::Token, top);
    check_values<128, Fp8Format::E5M2>(8, Gran::Token, top);
    check_values<128, Fp8Format::E4M3FNUZ>(1, Gran::Token, top);
  }
}

}  // namespace
}  // namespace kvq::cuda::mma_fp8
