// Tests for kernels/cuda/mma_int.h (the Mma decode kernel's KIVI 2/4-bit fragment arithmetic) on
// the host.
//
// Expected values come from definitions: kivi's unpack_one and ChannelLayout / TokenLayout::code
// (the layouts' definitions) for the codes in every lane's B registers, under every pattern of a
// slice's bits; exact (double) products for the fp16 scale fold over every non-negative fp16
// scale; the fp16 format for value_shift; and dequantize-then-dot (sum q_c (code s_c + m_c),
// sum_t p_t (code s_t + m_t), in double) for a random run's scores and a tile's P V emulated
// through the kernel's steps (q' and p' as fp16 high + low rows times a power of two, the fold,
// codes as -(64 + c), the offset mma against -64 and the minima mma into one accumulator E,
// read back as E - C), within kTolRel of the sum of |terms|. The transposed value product (GQA
// <= 4, MmaIntTransposed): the PTX tables' A rows / columns for every lane's code registers,
// fold_f16x2's own bits for the selected B fold, and dequantize-then-weighted-sum for a tile.
#include "kernels/cuda/mma_int.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <random>
#include <vector>

#include "core/half.h"
#include "kernels/cuda/mma_fp8.h"
#include "kernels/cuda/mma_layout.h"
#include "kivi/layout.h"
#include "tests/kernels/cuda/mma_emu.h"

namespace kvq::cuda::mma_int {
namespace {

using mma::a_col;
using mma::b_col;
using mma::b_row;
using mma::c_col;
using mma::group_of;
using mma::kK;
using mma_emu::Frag;
using mma_emu::Frag4;

// The emulated results against the exact sums, relative to sum |terms| (terms counted with the
// offset: |a| (64 + c) + |x m|): the fold carries 2^-21, q' and p' 2^-21, the offset's
// cancellation costs 2^-24 per fp32 accumulation of ~64 sum |a|.
constexpr double kTolRel = 1.0 / (1 << 20);

void mma(float (&c)[32][4], const Frag4& a, const Frag& b0, const Frag& b1) {
  mma_emu::mma<mma_emu::Elem::F16>(c, a, b0, b1);
}

/// fp16 bits of -(64 + c) (exact: c < 2^10).
uint16_t minus64(uint32_t c) { return float_to_half_bits(-64.0f - static_cast<float>(c)); }
/// What a key B register's half holds for code c at n-tile j (2-bit keys: key_code_half2).
template <int B>
uint16_t key_half(uint32_t c, int j) {
  if constexpr (B == 2) return float_to_half_bits(-key_base2(j) - static_cast<float>(c));
  return minus64(c);
}

/// Codes 4 s + k of w0 and w1 (kivi's unpack_one) as code_half's two halves.
template <int B>
void expect_pair(uint32_t w0, uint32_t w1, int s, int k) {
  const uint32_t got = code_half<B>(pair_slices<B>(w0, w1, s), k);
  const uint32_t c0 = kivi::unpack_one(&w0, 4 * s + k, B), c1 = kivi::unpack_one(&w1, 4 * s + k, B);
  const uint32_t want = minus64(c0) | (static_cast<uint32_t>(minus64(c1)) << 16);
  ASSERT_EQ(got, want) << "B " << B << " slice " << s << " code " << k << " words " << std::hex
                       << w0 << " " << w1;
}

TEST(MmaInt, EveryCodeOfEverySliceBecomesMinus64MinusCode) {
  // Other bits of the words: zeros, ones and two mixes (a slice must not see its neighbours).
  const uint32_t others[] = {0u, 0xffffffffu, 0xa5c3968fu, 0x5a3c6970u};
  for (uint32_t o : others) {
    for (int s = 0; s < 4; ++s)  // 2-bit: slices are bytes; every pair of byte values
      for (uint32_t x = 0; x < 256; ++x)
        for (uint32_t y = 0; y < 256; ++y) {
          const uint32_t m = 0xffu << (8 * s);
          const uint32_t w0 = (o & ~m) | (x << (8 * s)), w1 = (~o & ~m) | (y << (8 * s));
          for (int k = 0; k < 4; ++k) expect_pair<2>(w0, w1, s, k);
        }
    for (int s = 0; s < 2; ++s)  // 4-bit: slices are 16-bit halves; every value in each
      for (uint32_t x = 0; x < 65536; ++x) {
        const uint32_t m = 0xffffu << (16 * s), y = (x * 40503u + 7u) & 0xffffu;
        const uint32_t w0 = (o & ~m) | (x << (16 * s)), w1 = (~o & ~m) | (y << (16 * s));
        for (int k = 0; k < 4; ++k) {
          expect_pair<4>(w0, w1, s, k);
          expect_pair<4>(w1, w0, s, k);
        }
      }
  }
  // 2-bit keys (key_code_half2): every pair of byte values at every slice.
  for (uint32_t o : others)
    for (int s = 0; s < 4; ++s)
      for (uint32_t x = 0; x < 256; ++x)
        for (uint32_t y = 0; y < 256; ++y) {
          const uint32_t m = 0xffu << (8 * s);
          const uint32_t w0 = (o & ~m) | (x << (8 * s)), w1 = (~o & ~m) | (y << (8 * s));
          for (int k = 0; k < 4; ++k) {
            const uint32_t got = key_code_half2(pair_slices<2>(w0, w1, s), k);
            const uint32_t want =
                key_half<2>(kivi::unpack_one(&w0, 4 * s + k, 2), k) |
                (static_cast<uint32_t>(key_half<2>(kivi::unpack_one(&w1, 4 * s + k, 2), k)) << 16);
            ASSERT_EQ(got, want) << "slice " << s << " code " << k;
          }
        }
  EXPECT_EQ(half_bits_to_float(static_cast<uint16_t>(kMinus64x2)), -kOffset);
  EXPECT_EQ(half_bits_to_float(static_cast<uint16_t>(kMinus16x2)), -16.0f);
  EXPECT_EQ(half_bits_to_float(static_cast<uint16_t>(kMinus1x2)), -1.0f);
  EXPECT_EQ(kMinus64x2 >> 16, kMinus64x2 & 0xffffu);
}

std::vector<uint32_t> random_words(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint32_t> w(n);
  for (uint32_t& x : w) x = static_cast<uint32_t>(rng());
  return w;
}

/// B register r of n-tile j for `lane` at k-step ks of a staged key run (the kernel's reads: the
/// lane's 16-byte load of k-step ks, words 2 r and 2 r + 1 of it).
template <int D, int B>
uint32_t key_b_reg(const std::vector<uint32_t>& staged, int lane, int ks, int r, int j) {
  const int g = group_of(lane);
  const size_t s = static_cast<size_t>(key_lane_slot<D, B>(g, mma::tig_of(lane)) + 4 * ks + 2 * r);
  const uint32_t y = pair_slices<B>(staged.at(s), staged.at(s + 1), slice_of<B>(g));
  if constexpr (B == 2) return key_code_half2(y, j);
  return code_half<B>(y, j);
}

constexpr uint32_t kUnwritten = 0x7e57f00du;  // a staged slot no copy wrote

/// The staged key run of tokens [t0, t0 + 32) of head h, by the kernel's copies (KeyRunCopy):
/// lane l copies word w of channel l + 32 x (its source: the run's first word of channel l, then
/// + 32 x times the group's words, + w) to the slot key_slot(l, 0) + w kKeyClassWords + 8 x. Slots
/// no copy writes hold kUnwritten; a slot written twice fails the test.
template <int D, int B>
std::vector<uint32_t> staged_key_run(const kivi::ChannelLayout& L,
                                     const std::vector<uint32_t>& words, int64_t t0, int64_t h) {
  std::vector<uint32_t> staged(static_cast<size_t>(kKeyRunWords<D, B>), kUnwritten);
  const int64_t wpg = L.words_per_group();
  const int64_t first = L.word_index(t0 / L.group, h, 0) + (t0 % L.group) / kivi::codes_per_word(B);
  for (int l = 0; l < 32; ++l)
    for (int x = 0; x < D / 32; ++x)
      for (int w = 0; w < B; ++w) {
        const int slot = key_slot<D, B>(l, 0) + key_copy_offset<D>(x, w);
        EXPECT_EQ(staged.at(static_cast<size_t>(slot)), kUnwritten) << "slot " << slot << " twice";
        staged.at(static_cast<size_t>(slot)) =
            words.at(static_cast<size_t>(first + l * wpg + x * 32 * wpg + w));
      }
  return staged;
}

template <int B, int D>
void check_key_fragments(int G) {
  const kivi::ChannelLayout L{2, D, G, B};
  const int64_t groups = 3;
  const std::vector<uint32_t> words = random_words(
      static_cast<size_t>(L.words_for_tokens(groups * G)), static_cast<uint32_t>(B * D + G));
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t t0 = 0; t0 < groups * G; t0 += kSpan) {
      const std::vector<uint32_t> run = staged_key_run<D, B>(L, words, t0, h);
      for (int l = 0; l < 32; ++l)
        for (int ks = 0; ks < D / kK; ++ks)
          for (int r = 0; r < 2; ++r)
            for (int j = 0; j < kE; ++j) {
              const uint32_t reg = key_b_reg<D, B>(run, l, ks, r, j);
              for (int hf = 0; hf < 2; ++hf) {
                const int64_t d = kK * ks + b_row(l, r, hf);
                const int64_t t = t0 + set_index(b_col(l), j);
                ASSERT_EQ(static_cast<uint16_t>(reg >> (16 * hf)),
                          key_half<B>(L.code(words.data(), t, h, d), j))
                    << "B " << B << " D " << D << " G " << G << " lane " << l << " token " << t
                    << " channel " << d;
              }
            }
    }
}

TEST(MmaInt, KeyFragmentsHoldTheChannelLayoutsCodes) {
  for (int G : {32, 64, 128}) {
    check_key_fragments<2, 64>(G);
    check_key_fragments<2, 128>(G);
    check_key_fragments<4, 64>(G);
    check_key_fragments<4, 128>(G);
  }
}

// The staged run's 16-byte loads: the distinct addresses of a warp's load (a k-step's words, a
// k-step pair's scale or minimum pairs) spread evenly over the 8 bank quads of 16 bytes, so the
// load takes the fewest wavefronts (one per 128 bytes).
void expect_even_quads(const std::vector<int>& slots, const char* what, int D, int B, int step) {
  std::vector<int> distinct;
  for (int x : slots)
    if (std::find(distinct.begin(), distinct.end(), x) == distinct.end()) distinct.push_back(x);
  std::array<int, 8> per_quad{};
  for (int x : distinct) {
    ASSERT_EQ(x % 4, 0) << what << ": a 16-byte load off its alignment";
    ++per_quad[static_cast<size_t>(x / 4 % 8)];
  }
  const int most = (static_cast<int>(distinct.size()) + 7) / 8;
  for (int q = 0; q < 8; ++q)
    EXPECT_LE(per_quad[static_cast<size_t>(q)], most)
        << what << " D " << D << " B " << B << " step " << step << " quad " << q;
}

template <int D, int B>
void check_staged_key_loads() {
  for (int ks = 0; ks < D / kK; ++ks) {
    std::vector<int> slots;
    for (int l = 0; l < 32; ++l) {
      const int s = key_lane_slot<D, B>(group_of(l), mma::tig_of(l)) + 4 * ks;
      ASSERT_LE(s + 4, (kKeyRunWords<D, B>));
      slots.push_back(s);
    }
    expect_even_quads(slots, "key words", D, B, ks);
  }
  for (int k2 = 0; k2 < D / kK / 2; ++k2) {
    std::vector<int> slots;
    for (int l = 0; l < 32; ++l) slots.push_back(key_param_slot<D>(mma::tig_of(l)) + 4 * k2);
    expect_even_quads(slots, "key params", D, B, k2);
  }
}

// The copies' compile-time offsets from a lane's first slot land every channel's words (scale and
// minimum pairs) where key_slot (key_param_slot) puts them, and the slots of a run are distinct
// and inside kKeyRunWords (kKeyParamWords).
template <int D, int B>
void check_staged_key_slots() {
  std::vector<int> seen(static_cast<size_t>(kKeyRunWords<D, B>), 0);
  for (int l = 0; l < 32; ++l)
    for (int x = 0; x < D / 32; ++x)
      for (int w = 0; w < B; ++w) {
        const int slot = key_slot<D, B>(l, 0) + key_copy_offset<D>(x, w);
        ASSERT_EQ(slot, (key_slot<D, B>(l + 32 * x, w)))
            << "D " << D << " B " << B << " lane " << l;
        ASSERT_GE(slot, 0);
        ASSERT_LT(slot, (kKeyRunWords<D, B>));
        ++seen[static_cast<size_t>(slot)];
      }
  for (int v : seen) ASSERT_LE(v, 1) << "D " << D << " B " << B << ": a slot taken twice";
  std::vector<int> pseen(static_cast<size_t>(kKeyParamWords<D>), 0);
  for (int l = 0; l < 16; ++l)
    for (int x = 0; x < D / 32; ++x) {
      const int slot = key_param_slot<D>(l) + key_param_copy_offset(x);
      ASSERT_EQ(slot, key_param_slot<D>(l + 16 * x)) << "D " << D << " lane " << l;
      ASSERT_LT(slot, kKeyParamWords<D>);
      ++pseen[static_cast<size_t>(slot)];
    }
  for (int v : pseen) ASSERT_LE(v, 1) << "D " << D << ": a parameter slot taken twice";
}

TEST(MmaInt, StagedKeyCopiesLandWhereKeySlotSays) {
  check_staged_key_slots<64, 2>();
  check_staged_key_slots<128, 2>();
  check_staged_key_slots<64, 4>();
  check_staged_key_slots<128, 4>();
}

TEST(MmaInt, StagedKeyLoadsSpreadOverTheBankQuads) {
  check_staged_key_loads<64, 2>();
  check_staged_key_loads<128, 2>();
  check_staged_key_loads<64, 4>();
  check_staged_key_loads<128, 4>();
}

// The staged scale and minimum pairs, by the kernel's copies (lanes < 16 the scales, >= 16 the
// minima, 4 bytes each) from a run's D halves: every lane's 16-byte loads (k-steps 2 k2, 2 k2 + 1)
// give the pairs of its A columns, channels a_col(lane, 2 r2, 0) + 16 ks (mma_layout.h), + 1.
template <int D>
void check_staged_key_params() {
  std::vector<uint32_t> global[2];  // scales, minima: word p = channels 2 p, 2 p + 1
  for (int a = 0; a < 2; ++a) global[a] = random_words(static_cast<size_t>(D / 2), 77u * D + a);
  std::vector<uint32_t> staged[2];
  for (auto& x : staged) x.assign(static_cast<size_t>(kKeyParamWords<D>), kUnwritten);
  for (int l = 0; l < 32; ++l)
    for (int x = 0; x < D / 32; ++x) {
      const size_t slot = static_cast<size_t>(key_param_slot<D>(l % 16) + key_param_copy_offset(x));
      std::vector<uint32_t>& st = staged[l / 16];
      ASSERT_EQ(st.at(slot), kUnwritten) << "slot " << slot << " twice";
      st.at(slot) = global[l / 16].at(static_cast<size_t>(l % 16 + 16 * x));
    }
  for (int a = 0; a < 2; ++a)
    for (int l = 0; l < 32; ++l)
      for (int ks = 0; ks < D / kK; ++ks)
        for (int r2 = 0; r2 < 2; ++r2) {
          const int slot = key_param_slot<D>(mma::tig_of(l)) + 4 * (ks / 2) + 2 * (ks % 2) + r2;
          const int d = a_col(l, 2 * r2, 0) + kK * ks;
          ASSERT_EQ(staged[a].at(static_cast<size_t>(slot)), global[a][static_cast<size_t>(d / 2)])
              << "D " << D << " array " << a << " lane " << l << " k-step " << ks << " r2 " << r2;
        }
}

TEST(MmaInt, StagedKeyParamsGiveEveryLaneItsChannelPairs) {
  check_staged_key_params<64>();
  check_staged_key_params<128>();
}

/// B register r of n-tile j for `lane`, channel set cs, at the k-step of rows [row0, row0 + 16).
template <int D, int B>
uint32_t value_b_reg(const std::vector<uint32_t>& rows, int lane, int row0, int cs, int r, int j) {
  const int g = group_of(lane), t = row0 + b_row(lane, r, 0);
  return code_half<B>(
      pair_slices<B>(rows[static_cast<size_t>(value_word<D, B>(t, cs, g))],
                     rows[static_cast<size_t>(value_word<D, B>(t + 1, cs, g))], slice_of<B>(g)),
      j);
}

/// Value rows as the kernel copies them: token t's D B / 32 words of head h, t in [0, tokens).
template <int D, int B>
std::vector<uint32_t> value_rows(const kivi::TokenLayout& L, const std::vector<uint32_t>& words,
                                 int64_t tokens, int64_t h) {
  std::vector<uint32_t> rows;
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t w = 0; w < L.words_per_token_head(); ++w)
      rows.push_back(words[static_cast<size_t>(L.word_index(t, h, 0) + w)]);
  return rows;
}

template <int B, int D>
void check_value_fragments(int G) {
  const kivi::TokenLayout L{2, D, G, B};
  ASSERT_EQ(L.words_per_token_head(), D * B / 32);
  const int64_t tokens = 32;
  const std::vector<uint32_t> words = random_words(static_cast<size_t>(L.words_for_tokens(tokens)),
                                                   static_cast<uint32_t>(3 * B * D + G));
  for (int64_t h = 0; h < 2; ++h) {
    const std::vector<uint32_t> rows = value_rows<D, B>(L, words, tokens, h);
    for (int l = 0; l < 32; ++l)
      for (int row0 = 0; row0 < tokens; row0 += kK)
        for (int cs = 0; cs < D / kSpan; ++cs)
          for (int r = 0; r < 2; ++r)
            for (int j = 0; j < kE; ++j) {
              const uint32_t reg = value_b_reg<D, B>(rows, l, row0, cs, r, j);
              for (int hf = 0; hf < 2; ++hf) {
                const int64_t t = row0 + b_row(l, r, hf);
                const int64_t d = kSpan * cs + set_index(b_col(l), j);
                ASSERT_EQ(static_cast<uint16_t>(reg >> (16 * hf)),
                          minus64(L.code(words.data(), t, h, d)))
                    << "B " << B << " D " << D << " G " << G << " lane " << l << " token " << t
                    << " channel " << d;
              }
            }
  }
}

TEST(MmaInt, ValueFragmentsHoldTheTokenLayoutsCodes) {
  for (int G : {32, 64}) {
    check_value_fragments<2, 64>(G);
    check_value_fragments<2, 128>(G);
    check_value_fragments<4, 64>(G);
    check_value_fragments<4, 128>(G);
  }
  check_value_fragments<2, 128>(128);
  check_value_fragments<4, 128>(128);
}

// The fold: (xh + xl) s as fp16 hi + lo for every non-negative finite fp16 s, against the exact
// product, for x over 24 binades (high + low parts of a float, as the kernel splits q' and p').
TEST(MmaInt, FoldCarriesTheProductToTwentyOneBits) {
  std::mt19937 rng(17);
  std::uniform_real_distribution<float> u(0.5f, 1.0f);
  int checked = 0;
  for (int e = -23; e <= 0; ++e) {
    const float x = std::ldexp(u(rng), e), y = -std::ldexp(u(rng), e);
    const mma_fp8::HiLo q = mma_fp8::split_half2(x, y);
    const double xs[2] = {half_value(q.hi & 0xffffu) + half_value(q.lo & 0xffffu),
                          half_value(q.hi >> 16) + half_value(q.lo >> 16)};
    for (uint32_t sb = 0; sb < 0x7c00u; sb += 3) {
      const uint32_t s2 = sb | (sb << 16);
      const HiLo16 f = fold_f16x2(q.hi, q.lo, s2);
      const double s = half_value(sb);
      for (int k = 0; k < 2; ++k) {
        const double got =
            half_value(f.hi >> (16 * k) & 0xffffu) + half_value(f.lo >> (16 * k) & 0xffffu);
        const double want = xs[k] * s;
        ASSERT_LE(std::fabs(got - want), std::ldexp(std::fabs(want), -21) + std::ldexp(1.0, -24))
            << "x " << xs[k] << " s " << s;
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 500000);
}

// value_shift: every finite non-negative fp16 scale s times 2^e stays below 2^14, and (unless the
// shift is at its cap of 15) at or above 2^12, so p' s is normal fp16 down to p = 2^-26.
TEST(MmaInt, ValueShiftBringsTheLargestScaleBelowTwoToTheFourteen) {
  for (uint32_t sb = 0; sb < 0x7c00u; ++sb) {
    const int e = value_shift(sb);
    const double s = std::ldexp(half_value(sb), e);
    ASSERT_LT(s, 16384.0) << sb;
    ASSERT_LE(e, 15);
    if (e < 15) {
      ASSERT_GE(s, 4096.0) << sb;
    }
  }
  EXPECT_EQ(value_shift(0), 15);
}

/// An fp16 value in [lo, hi).
float random_half(std::mt19937& rng, float lo, float hi) {
  return round_to_half(std::uniform_real_distribution<float>(lo, hi)(rng));
}

uint32_t half2_of(float x, float y) {
  return float_to_half_bits(x) | (static_cast<uint32_t>(float_to_half_bits(y)) << 16);
}

/// x' = x 2^e (per head) as the A fragment of one k-step, columns col(l, r, h), zero for g >= nq.
template <class Val>
Frag4 a_frag(int nq, int ks, Val val) {
  Frag4 a;
  for (Frag& f : a) f.assign(32, 0);
  for (int l = 0; l < 32; ++l)
    for (int r = 0; r < 2; ++r) {
      const int g = group_of(l), k = a_col(l, 2 * r, 0) + kK * ks;
      const mma_fp8::HiLo s =
          g < nq ? mma_fp8::split_half2(val(g, k), val(g, k + 1)) : mma_fp8::HiLo{0, 0};
      a[2 * r][static_cast<size_t>(l)] = s.hi;
      a[2 * r + 1][static_cast<size_t>(l)] = s.lo;
    }
  return a;
}

/// A = fold(x', s pairs at the lane's columns).
template <class Scale>
Frag4 fold_frag(const Frag4& x, int ks, Scale s2_of) {
  Frag4 a;
  for (Frag& f : a) f.assign(32, 0);
  for (int l = 0; l < 32; ++l)
    for (int r = 0; r < 2; ++r) {
      const HiLo16 f =
          fold_f16x2(x[2 * r][static_cast<size_t>(l)], x[2 * r + 1][static_cast<size_t>(l)],
                     s2_of(a_col(l, 2 * r, 0) + kK * ks));
      a[2 * r][static_cast<size_t>(l)] = f.hi;
      a[2 * r + 1][static_cast<size_t>(l)] = f.lo;
    }
  return a;
}

// Scores of a 32-token key run of one group, the kernel's steps, against sum_c q_c (code s_c +
// m_c). Scales over 2^-12 .. 2^4 (and a zero-scale channel), minima over +-8.
template <int B, int D>
void check_int_scores(int nq) {
  std::mt19937 rng(static_cast<uint32_t>(11 * D + 5 * B + nq));
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const kivi::ChannelLayout L{1, D, kSpan, B};
  const std::vector<uint32_t> words =
      random_words(static_cast<size_t>(L.words_for_tokens(kSpan)), rng());
  std::vector<float> q(8 * D), sc(D), mn(D);
  for (float& x : q) x = nd(rng) * 3.0f;
  for (int d = 0; d < D; ++d) {
    sc[static_cast<size_t>(d)] =
        round_to_half(std::ldexp(random_half(rng, 1.0f, 2.0f), d % 17 - 12));
    mn[static_cast<size_t>(d)] = random_half(rng, -8.0f, 8.0f);
  }
  sc[5] = 0.0f;
  std::vector<int> qe(8);  // the kernel's shift: q_shift - 15 (max |q'| in [1/2, 1))
  for (int g = 0; g < 8; ++g) {
    float amax = 0.0f;
    for (int d = 0; d < D; ++d) amax = std::max(amax, std::fabs(q[static_cast<size_t>(g * D + d)]));
    qe[static_cast<size_t>(g)] = mma_fp8::q_shift(amax) - 15;
  }
  const std::vector<uint32_t> run = staged_key_run<D, B>(L, words, 0, 0);
  const auto pair = [&](const std::vector<float>& v) {
    return
        [&v](int d) { return half2_of(v[static_cast<size_t>(d)], v[static_cast<size_t>(d) + 1]); };
  };
  float c[kE][32][4] = {}, ex[32][4] = {}, e1[32][4] = {};
  for (int ks = 0; ks < D / kK; ++ks) {
    const Frag4 qa = a_frag(nq, ks, [&](int g, int d) {
      return std::ldexp(q[static_cast<size_t>(g * D + d)], qe[static_cast<size_t>(g)]);
    });
    const Frag4 a = fold_frag(qa, ks, pair(sc));
    for (int j = 0; j < kE; ++j) {
      Frag b0(32), b1(32);
      for (int l = 0; l < 32; ++l) {
        b0[static_cast<size_t>(l)] = key_b_reg<D, B>(run, l, ks, 0, j);
        b1[static_cast<size_t>(l)] = key_b_reg<D, B>(run, l, ks, 1, j);
      }
      mma(c[j], a, b0, b1);
    }
    if (B == 2)
      mma(e1, a, Frag(32, kMinus1x2), Frag(32, kMinus1x2));
    else
      mma(ex, a, Frag(32, kMinus64x2), Frag(32, kMinus64x2));
    Frag m0(32), m1(32);
    for (int l = 0; l < 32; ++l) {
      m0[static_cast<size_t>(l)] = pair(mn)(kK * ks + b_row(l, 0, 0));
      m1[static_cast<size_t>(l)] = pair(mn)(kK * ks + b_row(l, 1, 0));
    }
    mma(ex, qa, m0, m1);
  }
  for (int l = 0; l < 32; ++l) {
    const int g = group_of(l);
    if (g >= nq) continue;
    for (int j = 0; j < kE; ++j)
      for (int e = 0; e < 2; ++e) {
        const int t = set_index(c_col(l, e), j);
        const double base = B == 2 ? key_base2(j) : 0.0;  // 2-bit: the offsets' sum apart
        const double got =
            ((static_cast<double>(ex[l][0]) + ex[l][2]) +
             base * (static_cast<double>(e1[l][0]) + e1[l][2]) - (c[j][l][e] + c[j][l][e + 2])) *
            std::ldexp(1.0, -qe[static_cast<size_t>(g)]);
        double want = 0, mag = 0;
        for (int d = 0; d < D; ++d) {
          const double qd = q[static_cast<size_t>(g * D + d)], s = sc[static_cast<size_t>(d)];
          const double code = L.code(words.data(), t, 0, d), m = mn[static_cast<size_t>(d)];
          want += qd * (code * s + m);
          mag += std::fabs(qd * s) * (kOffset + code) + std::fabs(qd * m);
        }
        EXPECT_NEAR(got, want, kTolRel * mag)
            << "B " << B << " D " << D << " head " << g << " token " << t;
      }
  }
}

TEST(MmaInt, ScoresOfAnIntRunEqualDequantizeThenDot) {
  for (int nq : {1, 3, 4, 8}) {
    check_int_scores<2, 64>(nq);
    check_int_scores<2, 128>(nq);
    check_int_scores<4, 64>(nq);
    check_int_scores<4, 128>(nq);
  }
}

// P V of 32 value rows (two k-steps), channel groups of 32, the kernel's steps (p' = p 2^ve from
// the largest scale, A = fold(p', s_t) per group, codes, the offset and minima mma's into E per
// group), against sum_t p_t (code s_t + m_t). Scales over 2^-10 .. 2^5.
template <int B, int D>
void check_int_values(int nq) {
  std::mt19937 rng(static_cast<uint32_t>(13 * D + 7 * B + nq));
  std::uniform_real_distribution<float> up(0.0f, 1.0f);
  constexpr int kTokens = 2 * kK, kSets = D / kSpan;
  const kivi::TokenLayout L{1, D, kSpan, B};
  const std::vector<uint32_t> words =
      random_words(static_cast<size_t>(L.words_for_tokens(kTokens)), rng());
  std::vector<float> pr(8 * kTokens), sc(kTokens * kSets), mn(kTokens * kSets);
  for (float& x : pr) x = std::ldexp(up(rng), -static_cast<int>(rng() % 12));
  uint32_t smax = 0;
  for (size_t i = 0; i < sc.size(); ++i) {
    sc[i] = round_to_half(std::ldexp(random_half(rng, 1.0f, 2.0f), static_cast<int>(i % 16) - 10));
    mn[i] = random_half(rng, -8.0f, 8.0f);
    smax = std::max<uint32_t>(smax, float_to_half_bits(sc[i]));
  }
  const int ve = value_shift(smax);
  const std::vector<uint32_t> rows = value_rows<D, B>(L, words, kTokens, 0);
  for (int cs = 0; cs < kSets; ++cs) {
    const auto pair = [&](const std::vector<float>& v) {
      return [&v, cs](int t) {
        return half2_of(v[static_cast<size_t>(t * kSets + cs)],
                        v[static_cast<size_t>((t + 1) * kSets + cs)]);
      };
    };
    float o[kE][32][4] = {}, ex[32][4] = {};
    for (int ks = 0; ks < kTokens / kK; ++ks) {
      const Frag4 pa = a_frag(nq, ks, [&](int g, int t) {
        return std::ldexp(pr[static_cast<size_t>(g * kTokens + t)], ve);
      });
      const Frag4 a = fold_frag(pa, ks, pair(sc));
      mma(ex, a, Frag(32, kMinus64x2), Frag(32, kMinus64x2));
      Frag m0(32), m1(32);
      for (int l = 0; l < 32; ++l) {
        m0[static_cast<size_t>(l)] = pair(mn)(kK * ks + b_row(l, 0, 0));
        m1[static_cast<size_t>(l)] = pair(mn)(kK * ks + b_row(l, 1, 0));
      }
      mma(ex, pa, m0, m1);
      for (int j = 0; j < kE; ++j) {
        Frag b0(32), b1(32);
        for (int l = 0; l < 32; ++l) {
          b0[static_cast<size_t>(l)] = value_b_reg<D, B>(rows, l, kK * ks, cs, 0, j);
          b1[static_cast<size_t>(l)] = value_b_reg<D, B>(rows, l, kK * ks, cs, 1, j);
        }
        mma(o[j], a, b0, b1);
      }
    }
    for (int l = 0; l < 32; ++l) {
      const int g = group_of(l);
      if (g >= nq) continue;
      for (int j = 0; j < kE; ++j)
        for (int e = 0; e < 2; ++e) {
          const int d = kSpan * cs + set_index(c_col(l, e), j);
          const double got =
              ((static_cast<double>(ex[l][0]) + ex[l][2]) - (o[j][l][e] + o[j][l][e + 2])) *
              std::ldexp(1.0, -ve);
          double want = 0, mag = 0;
          for (int t = 0; t < kTokens; ++t) {
            const double pt = pr[static_cast<size_t>(g * kTokens + t)];
            const double s = sc[static_cast<size_t>(t * kSets + cs)];
            const double mt = mn[static_cast<size_t>(t * kSets + cs)];
            const double code = L.code(words.data(), t, 0, d);
            want += pt * (code * s + mt);
            mag += std::fabs(pt * s) * (kOffset + code) + std::fabs(pt * mt);
          }
          EXPECT_NEAR(got, want, kTolRel * mag)
              << "B " << B << " D " << D << " head " << g << " channel " << d;
        }
    }
  }
}

TEST(MmaInt, ValuesOfAnIntTileEqualDequantizeThenWeightedSum) {
  for (int nq : {1, 3, 4, 8}) {
    check_int_values<2, 64>(nq);
    check_int_values<2, 128>(nq);
    check_int_values<4, 64>(nq);
    check_int_values<4, 128>(nq);
  }
}

// ---- the transposed value product (nq <= 4) -----------------------------------------------------

using mma::a_row;
using mma::c_row;

// t_channel: the two m-tiles' 32 rows are the 32 channels of a set, each once, and row g of
// m-tile mt is the channel of lane group g's slice code t_code(mt, 0) (row g + 8: t_code(mt, 1)).
TEST(MmaIntTransposed, ChannelMapIsAPermutationOfTheSetByLaneGroupAndCode) {
  std::array<int, kSpan> seen{};
  for (int mt = 0; mt < 2; ++mt)
    for (int row = 0; row < 16; ++row) {
      const int c = t_channel(mt, row);
      ASSERT_GE(c, 0);
      ASSERT_LT(c, kSpan);
      ++seen[static_cast<size_t>(c)];
      EXPECT_EQ(c, set_index(row % 8, t_code(mt, row < 8 ? 0 : 1)));
    }
  for (int n : seen) EXPECT_EQ(n, 1);
}

// t_min_group: rows g and g + 8 of the minima A hold two different groups of one 32-bit word of
// minima (the kernel loads the word once for both), every group of an even NCG in some row g,
// and group 0 at NCG 1.
TEST(MmaIntTransposed, MinimaGroupsOfALaneShareAWord) {
  for (int ncg : {2, 4}) {
    std::array<int, 4> seen{};
    for (int g = 0; g < 8; ++g) {
      const int a = t_min_group(g, ncg, 0), b = t_min_group(g, ncg, 1);
      ASSERT_LT(a, ncg);
      ASSERT_LT(b, ncg);
      EXPECT_EQ(a / 2, b / 2) << "ncg " << ncg << " g " << g;
      EXPECT_NE(a, b) << "ncg " << ncg << " g " << g;
      EXPECT_EQ(a, g % ncg);
      ++seen[static_cast<size_t>(a)];
    }
    for (int c = 0; c < ncg; ++c) EXPECT_GT(seen[static_cast<size_t>(c)], 0);
  }
  for (int g = 0; g < 8; ++g) EXPECT_EQ(t_min_group(g, 1, 0) + t_min_group(g, 1, 1), 0);
}

/// A register r of m-tile mt for `lane`, channel set cs, at the k-step of rows [row0, row0 + 16):
/// the kernel's reads (the direct form's y words).
template <int D, int B>
uint32_t value_a_reg(const std::vector<uint32_t>& rows, int lane, int row0, int cs, int mt, int r) {
  const int g = group_of(lane), t = row0 + a_col(lane, r, 0);
  const uint32_t y =
      pair_slices<B>(rows[static_cast<size_t>(value_word<D, B>(t, cs, g))],
                     rows[static_cast<size_t>(value_word<D, B>(t + 1, cs, g))], slice_of<B>(g));
  return t_code_half<B>(y, t_code(mt, r));
}

// Every lane's A registers hold TokenLayout::code of the token (the PTX table's A column) and the
// channel (t_channel of the PTX table's A row) as fp16 -(t_base + c).
template <int B, int D>
void check_transposed_fragments(int G) {
  const kivi::TokenLayout L{2, D, G, B};
  const int64_t tokens = 32;
  const std::vector<uint32_t> words = random_words(static_cast<size_t>(L.words_for_tokens(tokens)),
                                                   static_cast<uint32_t>(5 * B * D + G));
  for (int64_t h = 0; h < 2; ++h) {
    const std::vector<uint32_t> rows = value_rows<D, B>(L, words, tokens, h);
    for (int l = 0; l < 32; ++l)
      for (int row0 = 0; row0 < tokens; row0 += kK)
        for (int cs = 0; cs < D / kSpan; ++cs)
          for (int mt = 0; mt < 2; ++mt)
            for (int r = 0; r < 4; ++r) {
              const uint32_t reg = value_a_reg<D, B>(rows, l, row0, cs, mt, r);
              for (int hf = 0; hf < 2; ++hf) {
                const int64_t t = row0 + a_col(l, r, hf);
                const int64_t d = kSpan * cs + t_channel(mt, a_row(l, r));
                const float want =
                    -t_base<B>(t_code(mt, r)) - static_cast<float>(L.code(words.data(), t, h, d));
                ASSERT_EQ(static_cast<uint16_t>(reg >> (16 * hf)), float_to_half_bits(want))
                    << "B " << B << " D " << D << " G " << G << " lane " << l << " token " << t
                    << " channel " << d;
              }
            }
  }
}

TEST(MmaIntTransposed, ValueAFragmentsHoldTheTokenLayoutsCodes) {
  for (int G : {32, 64}) {
    check_transposed_fragments<2, 64>(G);
    check_transposed_fragments<2, 128>(G);
    check_transposed_fragments<4, 64>(G);
    check_transposed_fragments<4, 128>(G);
  }
  check_transposed_fragments<2, 128>(128);
  check_transposed_fragments<4, 128>(128);
}

// The B fold: from the softmax's packed words, a high column's B is fold_f16x2's hi and a low
// column's its lo (the direct form's A registers), bit for bit, for p' over 30 binades and every
// 7th non-negative finite fp16 scale; xl' is the direct form's high (low) parts for the minima.
TEST(MmaIntTransposed, SelectedFoldGivesTheDirectFormsBitsForEveryLaneClass) {
  std::mt19937 rng(29);
  std::uniform_real_distribution<float> u(0.5f, 1.0f);
  int checked = 0;
  for (int e = -26; e <= 3; ++e) {
    const float x = std::ldexp(u(rng), e), y = std::ldexp(u(rng), e - static_cast<int>(rng() % 3));
    const mma_fp8::HiLo q = mma_fp8::split_half2(x, y);  // the direct form's p' A registers
    const uint32_t w0 = pack_p(x), w1 = pack_p(y);
    ASSERT_EQ((w0 & 0xffffu) | (w1 << 16), q.hi);
    ASSERT_EQ((w0 >> 16) | (w1 & 0xffff0000u), q.lo);
    for (int l = 0; l < 32; ++l) {
      const bool low = group_of(l) >= kTHeads;
      const HiLo16 xs = p_select(w0, w1, p_selector(low), p_mask(low));
      ASSERT_EQ(xs.lo, low ? q.lo : q.hi) << "lane " << l;
      ASSERT_EQ(xs.hi, low ? q.hi : 0u) << "lane " << l;
      if (l % 4 != 0) continue;  // lanes of one group take the same path
      for (uint32_t sb = 0; sb < 0x7c00u; sb += 7) {
        const uint32_t s2 = sb | ((sb ^ 0x15u) << 16);
        const HiLo16 f = fold_f16x2(q.hi, q.lo, s2);
        ASSERT_EQ(fold_b(xs, s2), low ? f.lo : f.hi) << "lane " << l << " x " << x << " s " << sb;
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 500000);
}

// P V through the transposed fragments (codes as A, B = fold_b per channel group, one offset mma
// per group into EO[cg] and one minima mma per k-step into EM), read back as the kernel's write-out
// does (columns h and h + 4 summed, t_base EO[cg] + EM[cg] - C), against sum_t p_t (code s_t + m_t)
// in double. 80 tokens (5 k-steps, the last 15 past nv hold NaN words: the predicate zeroes them),
// scales over 2^-12 .. 2^5 with one zero-scale token group, minima over +-8.
template <int B, int D>
void check_transposed_values(int nq, int G) {
  ASSERT_LE(nq, kTHeads);
  const int ncg = D / G;
  ASSERT_LE(ncg, kTHeads);
  std::mt19937 rng(static_cast<uint32_t>(17 * D + 7 * B + 3 * nq + G));
  std::uniform_real_distribution<float> up(0.0f, 1.0f);
  constexpr int kTokens = 5 * kK, kSets = D / kSpan, kValid = kTokens - 15;
  const kivi::TokenLayout L{1, D, G, B};
  const std::vector<uint32_t> words =
      random_words(static_cast<size_t>(L.words_for_tokens(kTokens)), rng());
  std::vector<float> pr(static_cast<size_t>(nq * kTokens));
  std::vector<float> sc(static_cast<size_t>(kTokens * ncg)), mn(sc.size());
  for (float& x : pr) x = std::ldexp(up(rng), -static_cast<int>(rng() % 12));
  uint32_t smax = 0;
  for (size_t i = 0; i < sc.size(); ++i) {
    sc[i] = round_to_half(std::ldexp(random_half(rng, 1.0f, 2.0f), static_cast<int>(i % 18) - 12));
    mn[i] = random_half(rng, -8.0f, 8.0f);
    if (i / static_cast<size_t>(ncg) < kValid)
      smax = std::max<uint32_t>(smax, float_to_half_bits(sc[i]));
  }
  sc[7] = 0.0f;
  const int ve = value_shift(smax);
  // The score buffer as the softmax leaves it: pack_p(p') below kValid, NaN words past it.
  std::vector<uint32_t> sbuf(static_cast<size_t>(nq * kTokens), 0x7e007e00u);
  for (int h = 0; h < nq; ++h)
    for (int t = 0; t < kValid; ++t)
      sbuf[static_cast<size_t>(h * kTokens + t)] =
          pack_p(std::ldexp(pr[static_cast<size_t>(h * kTokens + t)], ve));
  const std::vector<uint32_t> rows = value_rows<D, B>(L, words, kTokens, 0);
  const auto pair = [&](const std::vector<float>& v, int t, int cg) {
    return half2_of(v[static_cast<size_t>(t * ncg + cg)],
                    v[static_cast<size_t>((t + 1) * ncg + cg)]);
  };
  float o[kSets][2][32][4] = {}, em[32][4] = {}, eo[kTHeads][32][4] = {};
  for (int ks = 0; ks < kTokens / kK; ++ks) {
    // B inputs per lane and register: head g % 4's words, zero past kValid or for heads >= nq.
    std::array<std::vector<HiLo16>, 2> xs;
    for (int r = 0; r < 2; ++r)
      for (int l = 0; l < 32; ++l) {
        const int hh = group_of(l) % kTHeads, t = kK * ks + b_row(l, r, 0);
        const int lim = hh < nq ? kValid : 0;
        const uint32_t w0 = t < lim ? sbuf[static_cast<size_t>(hh * kTokens + t)] : 0u;
        const uint32_t w1 = t + 1 < lim ? sbuf[static_cast<size_t>(hh * kTokens + t + 1)] : 0u;
        const bool low = group_of(l) >= kTHeads;
        xs[static_cast<size_t>(r)].push_back(p_select(w0, w1, p_selector(low), p_mask(low)));
      }
    // The minima mma: A row g = m_{t, g % ncg}, row g + 8 = m_{t, (g + 1) % ncg}; B = xl'.
    Frag4 am;
    for (Frag& f : am) f.assign(32, 0);
    Frag xl0(32), xl1(32);
    for (int l = 0; l < 32; ++l) {
      for (int r = 0; r < 4; ++r)
        am[static_cast<size_t>(r)][static_cast<size_t>(l)] =
            pair(mn, kK * ks + a_col(l, r, 0), t_min_group(group_of(l), ncg, r));
      xl0[static_cast<size_t>(l)] = xs[0][static_cast<size_t>(l)].lo;
      xl1[static_cast<size_t>(l)] = xs[1][static_cast<size_t>(l)].lo;
    }
    mma(em, am, xl0, xl1);
    for (int cg = 0; cg < ncg; ++cg) {
      Frag b0(32), b1(32);
      for (int l = 0; l < 32; ++l)
        for (int r = 0; r < 2; ++r)
          (r == 0 ? b0 : b1)[static_cast<size_t>(l)] =
              fold_b(xs[static_cast<size_t>(r)][static_cast<size_t>(l)],
                     pair(sc, kK * ks + b_row(l, r, 0), cg));
      mma(eo[cg],
          Frag4{Frag(32, kMinus1x2), Frag(32, kMinus1x2), Frag(32, kMinus1x2), Frag(32, kMinus1x2)},
          b0, b1);
      for (int cs = cg * kSets / ncg; cs < (cg + 1) * kSets / ncg; ++cs)
        for (int mt = 0; mt < 2; ++mt) {
          Frag4 a;
          for (int r = 0; r < 4; ++r)
            for (int l = 0; l < 32; ++l)
              a[static_cast<size_t>(r)].push_back(value_a_reg<D, B>(rows, l, kK * ks, cs, mt, r));
          mma(o[cs][mt], a, b0, b1);
        }
    }
  }
  // Read back: C value i of lane l is row c_row, column c_col; EM (row = group) and EO likewise.
  double EM[16][8] = {}, EO[kTHeads][16][8] = {}, C[kSets][2][16][8] = {};
  for (int l = 0; l < 32; ++l)
    for (int i = 0; i < 4; ++i) {
      EM[c_row(l, i)][c_col(l, i)] = em[l][i];
      for (int cg = 0; cg < ncg; ++cg) EO[cg][c_row(l, i)][c_col(l, i)] = eo[cg][l][i];
      for (int cs = 0; cs < kSets; ++cs)
        for (int mt = 0; mt < 2; ++mt) C[cs][mt][c_row(l, i)][c_col(l, i)] = o[cs][mt][l][i];
    }
  for (int h = 0; h < nq; ++h)
    for (int cs = 0; cs < kSets; ++cs)
      for (int mt = 0; mt < 2; ++mt)
        for (int row = 0; row < 16; ++row) {
          const int d = kSpan * cs + t_channel(mt, row), cg = d / G;
          const auto col2 = [h](const double(&m)[8]) { return m[h] + m[h + kTHeads]; };
          const double got = (t_base<B>(t_code(mt, row / 8)) * col2(EO[cg][row]) + col2(EM[cg]) -
                              col2(C[cs][mt][row])) *
                             std::ldexp(1.0, -ve);
          double want = 0, mag = 0;
          for (int t = 0; t < kValid; ++t) {
            const double pt = pr[static_cast<size_t>(h * kTokens + t)];
            const double s = sc[static_cast<size_t>(t * ncg + cg)];
            const double mt2 = mn[static_cast<size_t>(t * ncg + cg)];
            const double code = L.code(words.data(), t, 0, d);
            want += pt * (code * s + mt2);
            mag += std::fabs(pt * s) * (kOffset + code) + std::fabs(pt * mt2);
          }
          ASSERT_NEAR(got, want, kTolRel * mag) << "B " << B << " D " << D << " G " << G << " nq "
                                                << nq << " head " << h << " channel " << d;
        }
}

TEST(MmaIntTransposed, ValuesOfAnIntTileEqualDequantizeThenWeightedSum) {
  for (int nq : {1, 3, 4})
    for (int G : {32, 64}) {
      check_transposed_values<2, 64>(nq, G);
      check_transposed_values<2, 128>(nq, G);
      check_transposed_values<4, 64>(nq, G);
      check_transposed_values<4, 128>(nq, G);
    }
  check_transposed_values<2, 128>(4, 128);
  check_transposed_values<4, 128>(3, 128);
}

}  // namespace
}  // namespace kvq::cuda::mma_int
