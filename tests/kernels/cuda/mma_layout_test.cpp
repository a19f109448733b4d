// Tests for kernels/cuda/mma_layout.h (the Mma decode kernel's fragment arithmetic) on the host.
//
// Expected values come from definitions: the PTX ISA's fragment tables for mma.m16n8k16 (written
// here as literal rows for a few lanes, and as bijection checks for all), the ldmatrix semantics
// (lane l addresses row l % 8 of matrix l / 8 and receives row l / 4, columns 2 (l % 4) + {0, 1},
// or transposed), and plain dot products. The emulations below reproduce the kernel's steps on
// the host through these functions: q and p as high + low bf16 parts in the A rows g and g + 8,
// K and V rows in the XOR-swizzled shared tile read by ldmatrix, mma as a sum over k, and the
// kernel's reading of the C values; the results must equal the dot products within kTolRel.
// The int path (kernels/cuda/mma_int.h): every code of every slice under every pattern of the
// slice's bits (4-bit slices: all 2^16 values in each half) against kivi's unpack_one; every
// lane's B fragments of key runs and value rows against kivi::ChannelLayout / TokenLayout::code
// (the layout's definition); a random int tile's scores and P V through the emulated fragments,
// scales folded into q and p and the ones-mma subtracted, against dequantize-then-dot.
#include "kernels/cuda/mma_layout.h"

#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <random>
#include <set>
#include <utility>
#include <vector>

#include "core/half.h"
#include "kernels/cuda/mma_int.h"
#include "kivi/layout.h"

namespace kvq::cuda::mma {
namespace {

// q and p carry ~16 significant bits (high + low bf16): the relative error of a product is at
// most 2^-16, of a dot product over |terms| at most 2^-16 sum |terms| (plus fp32 sums).
constexpr double kTolRel = 1.0 / 65536;

TEST(MmaLayout, FragmentsMatchThePtxTables) {
  // PTX ISA, m16n8k16 .bf16: lane 0 holds A (0,0),(0,1) | (8,0),(8,1) | (0,8),(0,9) | (8,8),(8,9);
  // lane 5 (group 1, tig 1): A (1,2),(1,3) | (9,2),(9,3) | (1,10),(1,11) | (9,10),(9,11).
  const int want5[4][2][2] = {
      {{1, 2}, {1, 3}}, {{9, 2}, {9, 3}}, {{1, 10}, {1, 11}}, {{9, 10}, {9, 11}}};
  for (int r = 0; r < 4; ++r)
    for (int h = 0; h < 2; ++h) {
      EXPECT_EQ(a_row(5, r), want5[r][h][0]);
      EXPECT_EQ(a_col(5, r, h), want5[r][h][1]);
    }
  // B: lane 6 (group 1, tig 2) holds (k 4, n 1), (5, 1) | (12, 1), (13, 1).
  EXPECT_EQ(b_row(6, 0, 0), 4);
  EXPECT_EQ(b_row(6, 0, 1), 5);
  EXPECT_EQ(b_row(6, 1, 0), 12);
  EXPECT_EQ(b_row(6, 1, 1), 13);
  EXPECT_EQ(b_col(6), 1);
  // C: lane 31 (group 7, tig 3) holds (7, 6), (7, 7), (15, 6), (15, 7).
  EXPECT_EQ(c_row(31, 0), 7);
  EXPECT_EQ(c_col(31, 1), 7);
  EXPECT_EQ(c_row(31, 2), 15);
  EXPECT_EQ(c_col(31, 2), 6);
}

TEST(MmaLayout, EveryElementHeldOnce) {
  std::set<std::pair<int, int>> a, b, c;
  for (int l = 0; l < 32; ++l) {
    for (int r = 0; r < 4; ++r)
      for (int h = 0; h < 2; ++h) a.insert({a_row(l, r), a_col(l, r, h)});
    for (int r = 0; r < 2; ++r)
      for (int h = 0; h < 2; ++h) b.insert({b_row(l, r, h), b_col(l)});
    for (int i = 0; i < 4; ++i) c.insert({c_row(l, i), c_col(l, i)});
  }
  EXPECT_EQ(a.size(), 16u * 16u);
  EXPECT_EQ(b.size(), 16u * 8u);
  EXPECT_EQ(c.size(), 16u * 8u);
  for (auto [r, col] : a) EXPECT_TRUE(r < 16 && col < 16);
  for (auto [r, col] : b) EXPECT_TRUE(r < 16 && col < 8);
  for (auto [r, col] : c) EXPECT_TRUE(r < 16 && col < 8);
}

template <int D>
void check_swizzle() {
  constexpr int kChunks = D / kChunk, kRows = 64;
  std::set<int> slots;
  for (int r = 0; r < kRows; ++r)
    for (int c = 0; c < kChunks; ++c) slots.insert(chunk_slot<D>(r, c));
  EXPECT_EQ(slots.size(), static_cast<size_t>(kRows * kChunks));  // a permutation
  EXPECT_EQ(*slots.rbegin(), kRows * kChunks - 1);
  // One ldmatrix phase: 8 consecutive rows at one logical chunk; 16-byte slot s covers banks
  // 4 (s % 8) .. +3, so the 8 slots must differ mod 8 (no bank conflict).
  for (int r0 = 0; r0 < kRows; r0 += 8)
    for (int c = 0; c < kChunks; ++c) {
      std::set<int> banks;
      for (int r = r0; r < r0 + 8; ++r) banks.insert(chunk_slot<D>(r, c) % 8);
      EXPECT_EQ(banks.size(), 8u) << "rows " << r0 << "+, chunk " << c;
    }
}

TEST(MmaLayout, SwizzleIsAConflictFreePermutation) {
  check_swizzle<64>();
  check_swizzle<128>();
}

TEST(MmaLayout, HighPlusLowCarriesSixteenBits) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-4.0f, 4.0f);
  for (int i = 0; i < 100000; ++i) {
    const float x = u(rng), y = u(rng);
    const HiLo s = split_bf16x2(x, y);
    const double hx = bf16_bits_to_float(static_cast<uint16_t>(s.hi)) +
                      bf16_bits_to_float(static_cast<uint16_t>(s.lo));
    const double hy = bf16_bits_to_float(static_cast<uint16_t>(s.hi >> 16)) +
                      bf16_bits_to_float(static_cast<uint16_t>(s.lo >> 16));
    ASSERT_LE(std::fabs(hx - x), std::ldexp(std::fabs(x), -16)) << x;
    ASSERT_LE(std::fabs(hy - y), std::ldexp(std::fabs(y), -16)) << y;
  }
}

// ---- the kernel's steps, emulated -------------------------------------------------------------

using Frag = std::vector<uint32_t>;  // one register per lane
using Frag4 = std::array<Frag, 4>;

float lo_bf16(uint32_t w) { return bf16_bits_to_float(static_cast<uint16_t>(w)); }
float hi_bf16(uint32_t w) { return bf16_bits_to_float(static_cast<uint16_t>(w >> 16)); }

/// ldmatrix.x4 from a tile of bf16 (row addresses per lane), as the PTX ISA defines it.
void ldmatrix_x4(const std::vector<uint16_t>& tile, const std::vector<int>& addr, bool trans,
                 Frag4& out) {
  for (int m = 0; m < 4; ++m) {
    out[m].assign(32, 0);
    for (int l = 0; l < 32; ++l) {
      uint16_t e[2];
      for (int h = 0; h < 2; ++h) {
        const int row = trans ? 2 * (l % 4) + h : l / 4;  // of matrix m
        const int col = trans ? l / 4 : 2 * (l % 4) + h;
        e[h] = tile[static_cast<size_t>(addr[8 * m + row]) + col];
      }
      out[m][l] = e[0] | (static_cast<uint32_t>(e[1]) << 16);
    }
  }
}

/// C += A B, fragments per lane as mma_layout.h says.
void mma(float (&c)[32][4], const Frag4& a, const Frag& b0, const Frag& b1) {
  float A[16][16] = {}, B[16][8] = {};
  for (int l = 0; l < 32; ++l) {
    for (int r = 0; r < 4; ++r) {
      A[a_row(l, r)][a_col(l, r, 0)] = lo_bf16(a[r][l]);
      A[a_row(l, r)][a_col(l, r, 1)] = hi_bf16(a[r][l]);
    }
    for (int r = 0; r < 2; ++r) {
      const uint32_t w = r == 0 ? b0[l] : b1[l];
      B[b_row(l, r, 0)][b_col(l)] = lo_bf16(w);
      B[b_row(l, r, 1)][b_col(l)] = hi_bf16(w);
    }
  }
  for (int l = 0; l < 32; ++l)
    for (int i = 0; i < 4; ++i) {
      double s = 0;
      for (int k = 0; k < 16; ++k) s += static_cast<double>(A[c_row(l, i)][k]) * B[k][c_col(l, i)];
      c[l][i] += static_cast<float>(s);
    }
}

/// A swizzled shared tile of 16 rows x D bf16 (rows: tokens), from row-major values.
template <int D>
std::vector<uint16_t> tile_of(const std::vector<float>& rows) {
  std::vector<uint16_t> t(16 * D);
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < D / kChunk; ++c)
      for (int e = 0; e < kChunk; ++e)
        t[static_cast<size_t>(chunk_slot<D>(r, c) * kChunk + e)] =
            float_to_bf16_bits(rows[static_cast<size_t>(r * D + c * kChunk + e)]);
  return t;
}

template <int D>
void check_scores(int nq) {
  std::mt19937 rng(static_cast<uint32_t>(D + nq));
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> q(8 * D), k(16 * D);
  for (float& x : q) x = nd(rng);
  for (float& x : k) x = round_to_bf16(nd(rng) * 3.0f);
  const std::vector<uint16_t> tile = tile_of<D>(k);
  // A fragments of q as the kernel builds them (rows g: high, g + 8: low; heads >= nq zero).
  std::vector<Frag4> qa(D / kK);
  for (int ks = 0; ks < D / kK; ++ks)
    for (int r = 0; r < 4; ++r) qa[static_cast<size_t>(ks)][r].assign(32, 0);
  for (int l = 0; l < 32; ++l)
    for (int ks = 0; ks < D / kK; ++ks)
      for (int half = 0; half < 2; ++half) {
        const int g = group_of(l), d = a_col(l, 2 * half, 0) + ks * kK;
        const float x = g < nq ? q[static_cast<size_t>(g * D + d)] : 0.0f;
        const float y = g < nq ? q[static_cast<size_t>(g * D + d + 1)] : 0.0f;
        const HiLo s = split_bf16x2(x, y);
        qa[static_cast<size_t>(ks)][2 * half][l] = s.hi;
        qa[static_cast<size_t>(ks)][2 * half + 1][l] = s.lo;
      }
  for (int nt = 0; nt < 2; ++nt) {
    float c[32][4] = {};
    for (int ks = 0; ks < D / kK; ks += 2) {
      std::vector<int> addr(32);
      for (int l = 0; l < 32; ++l)
        addr[static_cast<size_t>(l)] =
            chunk_slot<D>(8 * nt + k_ldm_row(l), 2 * ks + k_ldm_chunk(l)) * kChunk;
      Frag4 r;
      ldmatrix_x4(tile, addr, false, r);
      mma(c, qa[static_cast<size_t>(ks)], r[0], r[1]);
      mma(c, qa[static_cast<size_t>(ks) + 1], r[2], r[3]);
    }
    for (int l = 0; l < 32; ++l) {
      const int g = group_of(l);
      if (g >= nq) continue;
      for (int i = 0; i < 2; ++i) {
        const int tok = 8 * nt + c_col(l, i);
        double want = 0, mag = 0;
        for (int d = 0; d < D; ++d) {
          want += static_cast<double>(q[static_cast<size_t>(g * D + d)]) *
                  k[static_cast<size_t>(tok * D + d)];
          mag += std::fabs(q[static_cast<size_t>(g * D + d)] * k[static_cast<size_t>(tok * D + d)]);
        }
        const double got = static_cast<double>(c[l][i]) + c[l][i + 2];
        EXPECT_NEAR(got, want, kTolRel * mag + 1e-6)
            << "D " << D << " head " << g << " token " << tok;
      }
    }
  }
}

TEST(MmaLayout, ScoresOfATileEqualTheDotProducts) {
  for (int nq : {1, 3, 4, 8}) {
    check_scores<64>(nq);
    check_scores<128>(nq);
  }
}

template <int D>
void check_values(int nq) {
  std::mt19937 rng(static_cast<uint32_t>(7 * D + nq));
  std::uniform_real_distribution<float> up(0.0f, 1.0f);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> pr(8 * 16), v(16 * D);  // probabilities [head][token], V [token][channel]
  for (float& x : pr) x = up(rng);
  for (float& x : v) x = round_to_bf16(nd(rng));
  const std::vector<uint16_t> tile = tile_of<D>(v);
  Frag4 pa;
  for (Frag& f : pa) f.assign(32, 0);
  for (int l = 0; l < 32; ++l)
    for (int half = 0; half < 2; ++half) {
      const int g = group_of(l), tok = a_col(l, 2 * half, 0);
      const float x = g < nq ? pr[static_cast<size_t>(g * 16 + tok)] : 0.0f;
      const float y = g < nq ? pr[static_cast<size_t>(g * 16 + tok + 1)] : 0.0f;
      const HiLo s = split_bf16x2(x, y);
      pa[2 * half][l] = s.hi;
      pa[2 * half + 1][l] = s.lo;
    }
  std::vector<std::array<std::array<float, 4>, 32>> o(D / kN);
  for (auto& t : o)
    for (auto& x : t) x.fill(0.0f);
  for (int j = 0; j < D / kN; j += 2) {
    std::vector<int> addr(32);
    for (int l = 0; l < 32; ++l)
      addr[static_cast<size_t>(l)] = chunk_slot<D>(v_ldm_row(l), j + v_ldm_chunk(l)) * kChunk;
    Frag4 r;
    ldmatrix_x4(tile, addr, true, r);
    float c0[32][4] = {}, c1[32][4] = {};
    mma(c0, pa, r[0], r[1]);
    mma(c1, pa, r[2], r[3]);
    for (int l = 0; l < 32; ++l)
      for (int i = 0; i < 4; ++i) {
        o[static_cast<size_t>(j)][static_cast<size_t>(l)][static_cast<size_t>(i)] = c0[l][i];
        o[static_cast<size_t>(j) + 1][static_cast<size_t>(l)][static_cast<size_t>(i)] = c1[l][i];
      }
  }
  for (int l = 0; l < 32; ++l) {
    const int g = group_of(l);
    if (g >= nq) continue;
    for (int j = 0; j < D / kN; ++j)
      for (int i = 0; i < 2; ++i) {
        const int d = j * kN + c_col(l, i);
        double want = 0, mag = 0;
        for (int t = 0; t < 16; ++t) {
          want += static_cast<double>(pr[static_cast<size_t>(g * 16 + t)]) *
                  v[static_cast<size_t>(t * D + d)];
          mag += std::fabs(pr[static_cast<size_t>(g * 16 + t)] * v[static_cast<size_t>(t * D + d)]);
        }
        const auto& x = o[static_cast<size_t>(j)][static_cast<size_t>(l)];
        EXPECT_NEAR(static_cast<double>(x[static_cast<size_t>(i)]) + x[static_cast<size_t>(i) + 2],
                    want, kTolRel * mag + 1e-6)
            << "D " << D << " head " << g << " channel " << d;
      }
  }
}

TEST(MmaLayout, ValuesOfATileEqualTheWeightedSums) {
  for (int nq : {1, 3, 4, 8}) {
    check_values<64>(nq);
    check_values<128>(nq);
  }
}

// ---- the int path (mma_int.h) -------------------------------------------------------------------

namespace mi = mma_int;

/// bf16 bits of 1 + c * kUnit<B> (exact: c < 2^B, kUnit a power of two).
template <int B>
uint16_t one_plus(uint32_t c) {
  return float_to_bf16_bits(1.0f + static_cast<float>(c) * mi::kUnit<B>);
}

/// Codes 4 s + k of w0 and w1 (kivi's unpack_one) as code_pair's two halves.
template <int B>
void expect_pair(uint32_t w0, uint32_t w1, int s, int k) {
  const uint32_t got = mi::code_pair<B>(mi::pair_slices<B>(w0, w1, s), k);
  const uint32_t c0 = kivi::unpack_one(&w0, 4 * s + k, B), c1 = kivi::unpack_one(&w1, 4 * s + k, B);
  const uint32_t want = one_plus<B>(c0) | (static_cast<uint32_t>(one_plus<B>(c1)) << 16);
  ASSERT_EQ(got, want) << "B " << B << " slice " << s << " code " << k << " words " << std::hex
                       << w0 << " " << w1;
}

TEST(MmaInt, EveryCodeOfEverySliceBecomesOnePlusCodeUnits) {
  // Other bits of the words: zeros, ones and two mixes (a slice must not see its neighbours).
  const uint32_t others[] = {0u, 0xffffffffu, 0xa5c3968fu, 0x5a3c6970u};
  for (uint32_t o : others) {
    // 2-bit: slices are bytes; every pair of byte values, at every slice.
    for (int s = 0; s < 4; ++s)
      for (uint32_t x = 0; x < 256; ++x)
        for (uint32_t y = 0; y < 256; ++y) {
          const uint32_t m = 0xffu << (8 * s);
          const uint32_t w0 = (o & ~m) | (x << (8 * s)), w1 = (~o & ~m) | (y << (8 * s));
          for (int k = 0; k < 4; ++k) expect_pair<2>(w0, w1, s, k);
        }
    // 4-bit: slices are 16-bit halves; every value in each word's slice (the other word's
    // slice a different value each time).
    for (int s = 0; s < 2; ++s)
      for (uint32_t x = 0; x < 65536; ++x) {
        const uint32_t m = 0xffffu << (16 * s), y = (x * 40503u + 7u) & 0xffffu;
        const uint32_t w0 = (o & ~m) | (x << (16 * s)), w1 = (~o & ~m) | (y << (16 * s));
        for (int k = 0; k < 4; ++k) {
          expect_pair<4>(w0, w1, s, k);
          expect_pair<4>(w1, w0, s, k);
        }
      }
  }
  EXPECT_EQ(mi::kInvUnit<2> * mi::kUnit<2>, 1.0f);
  EXPECT_EQ(mi::kInvUnit<4>, 16.0f);
}

std::vector<uint32_t> random_words(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint32_t> w(n);
  for (uint32_t& x : w) x = static_cast<uint32_t>(rng());
  return w;
}

/// B register r of n-tile j for `lane` at k-step ks of a key run (the kernel's reads).
template <int B>
uint32_t key_b_reg(const std::vector<uint32_t>& run, int lane, int ks, int r, int j) {
  const int g = group_of(lane), d = kK * ks + b_row(lane, r, 0);
  return mi::code_pair<B>(
      mi::pair_slices<B>(run[static_cast<size_t>(mi::key_word<B>(d, g))],
                         run[static_cast<size_t>(mi::key_word<B>(d + 1, g))], mi::slice_of<B>(g)),
      j);
}

/// A key run as the kernel copies it: channel d's words of tokens [t0, t0 + 32) of its group.
template <int B>
std::vector<uint32_t> key_run(const kivi::ChannelLayout& L, const std::vector<uint32_t>& words,
                              int64_t t0, int64_t h) {
  std::vector<uint32_t> run(static_cast<size_t>(L.dim * B));
  for (int64_t d = 0; d < L.dim; ++d)
    for (int w = 0; w < B; ++w)
      run[static_cast<size_t>(d * B + w)] = words[static_cast<size_t>(
          L.word_index(t0 / L.group, h, d) + (t0 % L.group) / kivi::codes_per_word(B) + w)];
  return run;
}

template <int B, int D>
void check_key_fragments(int G) {
  const kivi::ChannelLayout L{2, D, G, B};
  const int64_t groups = 3;
  const std::vector<uint32_t> words = random_words(
      static_cast<size_t>(L.words_for_tokens(groups * G)), static_cast<uint32_t>(B * D + G));
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t t0 = 0; t0 < groups * G; t0 += mi::kSpan) {
      const std::vector<uint32_t> run = key_run<B>(L, words, t0, h);
      for (int l = 0; l < 32; ++l)
        for (int ks = 0; ks < D / kK; ++ks)
          for (int r = 0; r < 2; ++r)
            for (int j = 0; j < mi::kE; ++j) {
              const uint32_t reg = key_b_reg<B>(run, l, ks, r, j);
              for (int hf = 0; hf < 2; ++hf) {
                const int64_t d = kK * ks + b_row(l, r, hf);
                const int64_t t = t0 + mi::set_index(b_col(l), j);
                ASSERT_EQ(static_cast<uint16_t>(reg >> (16 * hf)),
                          one_plus<B>(L.code(words.data(), t, h, d)))
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

/// B register r of n-tile j for `lane`, channel set cs, at the k-step of rows [row0, row0 + 16).
template <int D, int B>
uint32_t value_b_reg(const std::vector<uint32_t>& rows, int lane, int row0, int cs, int r, int j) {
  const int g = group_of(lane), t = row0 + b_row(lane, r, 0);
  return mi::code_pair<B>(
      mi::pair_slices<B>(rows[static_cast<size_t>(mi::value_word<D, B>(t, cs, g))],
                         rows[static_cast<size_t>(mi::value_word<D, B>(t + 1, cs, g))],
                         mi::slice_of<B>(g)),
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
        for (int cs = 0; cs < D / mi::kSpan; ++cs)
          for (int r = 0; r < 2; ++r)
            for (int j = 0; j < mi::kE; ++j) {
              const uint32_t reg = value_b_reg<D, B>(rows, l, row0, cs, r, j);
              for (int hf = 0; hf < 2; ++hf) {
                const int64_t t = row0 + b_row(l, r, hf);
                const int64_t d = mi::kSpan * cs + mi::set_index(b_col(l), j);
                ASSERT_EQ(static_cast<uint16_t>(reg >> (16 * hf)),
                          one_plus<B>(L.code(words.data(), t, h, d)))
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

/// An fp16 value in [lo, hi).
float random_half(std::mt19937& rng, float lo, float hi) {
  return round_to_half(std::uniform_real_distribution<float>(lo, hi)(rng));
}

/// A fragment of 4 registers with row g = high part, g + 8 = low part of (x, y) per lane pair.
void fold_pair(Frag4& a, int l, int half, float x, float y) {
  const HiLo s = split_bf16x2(x, y);
  a[2 * half][static_cast<size_t>(l)] = s.hi;
  a[2 * half + 1][static_cast<size_t>(l)] = s.lo;
}

Frag ones_frag() { return Frag(32, mi::kOne2); }

// Scores of a 32-token key run of one group: the kernel's steps (A = q_c s_c, B = codes, the
// ones-mma, C read back, sum q_c m_c) against sum_c q_c (code s_c + m_c).
template <int B, int D>
void check_int_scores(int nq) {
  std::mt19937 rng(static_cast<uint32_t>(11 * D + 5 * B + nq));
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const kivi::ChannelLayout L{1, D, mi::kSpan, B};
  const std::vector<uint32_t> words =
      random_words(static_cast<size_t>(L.words_for_tokens(mi::kSpan)), rng());
  std::vector<float> q(8 * D), sc(D), mn(D);
  for (float& x : q) x = nd(rng);
  for (int d = 0; d < D; ++d) {
    sc[static_cast<size_t>(d)] = random_half(rng, 0.01f, 2.0f);
    mn[static_cast<size_t>(d)] = random_half(rng, -8.0f, 8.0f);
  }
  const std::vector<uint32_t> run = key_run<B>(L, words, 0, 0);
  float c[mi::kE][32][4] = {}, c1[32][4] = {};
  for (int ks = 0; ks < D / kK; ++ks) {
    Frag4 a;
    for (Frag& f : a) f.assign(32, 0);
    for (int l = 0; l < 32; ++l)
      for (int half = 0; half < 2; ++half) {
        const int g = group_of(l), d = a_col(l, 2 * half, 0) + kK * ks;
        const auto qs = [&](int e) {
          return g < nq ? q[static_cast<size_t>(g * D + d + e)] * sc[static_cast<size_t>(d + e)]
                        : 0.0f;
        };
        fold_pair(a, l, half, qs(0), qs(1));
      }
    for (int j = 0; j < mi::kE; ++j) {
      Frag b0(32), b1(32);
      for (int l = 0; l < 32; ++l) {
        b0[static_cast<size_t>(l)] = key_b_reg<B>(run, l, ks, 0, j);
        b1[static_cast<size_t>(l)] = key_b_reg<B>(run, l, ks, 1, j);
      }
      mma(c[j], a, b0, b1);
    }
    mma(c1, a, ones_frag(), ones_frag());
  }
  for (int l = 0; l < 32; ++l) {
    const int g = group_of(l);
    if (g >= nq) continue;
    float base = 0.0f;
    for (int d = 0; d < D; ++d)
      base += q[static_cast<size_t>(g * D + d)] * mn[static_cast<size_t>(d)];
    for (int j = 0; j < mi::kE; ++j)
      for (int e = 0; e < 2; ++e) {
        const int t = mi::set_index(c_col(l, e), j);
        const double got =
            ((c[j][l][e] - c1[l][e]) + (c[j][l][e + 2] - c1[l][e + 2])) * mi::kInvUnit<B> + base;
        double want = 0, mag = 0;
        for (int d = 0; d < D; ++d) {
          const double qd = q[static_cast<size_t>(g * D + d)];
          const double code = L.code(words.data(), t, 0, d);
          want += qd * (code * sc[static_cast<size_t>(d)] + mn[static_cast<size_t>(d)]);
          mag += std::fabs(qd * sc[static_cast<size_t>(d)]) * (mi::kInvUnit<B> + code) +
                 std::fabs(qd * mn[static_cast<size_t>(d)]);
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

// P V of 32 value rows (two k-steps), channel groups of 32: the kernel's steps (A = p_t s_t per
// channel set, B = codes, the ones-mma, sum_t p_t m_t) against sum_t p_t (code s_t + m_t).
template <int B, int D>
void check_int_values(int nq) {
  std::mt19937 rng(static_cast<uint32_t>(13 * D + 7 * B + nq));
  std::uniform_real_distribution<float> up(0.0f, 1.0f);
  constexpr int kTokens = 2 * kK, kSets = D / mi::kSpan;
  const kivi::TokenLayout L{1, D, mi::kSpan, B};
  const std::vector<uint32_t> words =
      random_words(static_cast<size_t>(L.words_for_tokens(kTokens)), rng());
  std::vector<float> pr(8 * kTokens), sc(kTokens * kSets), mn(kTokens * kSets);
  for (float& x : pr) x = up(rng);
  for (size_t i = 0; i < sc.size(); ++i) {
    sc[i] = random_half(rng, 0.01f, 2.0f);
    mn[i] = random_half(rng, -8.0f, 8.0f);
  }
  const std::vector<uint32_t> rows = value_rows<D, B>(L, words, kTokens, 0);
  std::vector<std::array<std::array<std::array<float, 4>, 32>, mi::kE>> o(kSets);
  std::vector<std::array<std::array<float, 4>, 32>> o1(kSets);
  std::vector<std::array<float, 32>> msum(kSets);
  for (int cs = 0; cs < kSets; ++cs) {
    float cj[mi::kE][32][4] = {}, c1[32][4] = {};
    float ms[32] = {};
    for (int row0 = 0; row0 < kTokens; row0 += kK) {
      Frag4 a;
      for (Frag& f : a) f.assign(32, 0);
      for (int l = 0; l < 32; ++l)
        for (int half = 0; half < 2; ++half) {
          const int g = group_of(l), t = row0 + a_col(l, 2 * half, 0);
          const auto ps = [&](int e) {
            return g < nq ? pr[static_cast<size_t>(g * kTokens + t + e)] *
                                sc[static_cast<size_t>((t + e) * kSets + cs)]
                          : 0.0f;
          };
          fold_pair(a, l, half, ps(0), ps(1));
          for (int e = 0; e < 2 && g < nq; ++e)
            ms[l] += pr[static_cast<size_t>(g * kTokens + t + e)] *
                     mn[static_cast<size_t>((t + e) * kSets + cs)];
        }
      for (int j = 0; j < mi::kE; ++j) {
        Frag b0(32), b1(32);
        for (int l = 0; l < 32; ++l) {
          b0[static_cast<size_t>(l)] = value_b_reg<D, B>(rows, l, row0, cs, 0, j);
          b1[static_cast<size_t>(l)] = value_b_reg<D, B>(rows, l, row0, cs, 1, j);
        }
        mma(cj[j], a, b0, b1);
      }
      mma(c1, a, ones_frag(), ones_frag());
    }
    for (int l = 0; l < 32; ++l) {
      for (int i = 0; i < 4; ++i) {
        for (int j = 0; j < mi::kE; ++j)
          o[static_cast<size_t>(cs)][static_cast<size_t>(j)][static_cast<size_t>(l)]
           [static_cast<size_t>(i)] = cj[j][l][i];
        o1[static_cast<size_t>(cs)][static_cast<size_t>(l)][static_cast<size_t>(i)] = c1[l][i];
      }
      msum[static_cast<size_t>(cs)][static_cast<size_t>(l)] = ms[l];
    }
  }
  for (int l = 0; l < 32; ++l) {
    const int g = group_of(l);
    if (g >= nq) continue;
    for (int cs = 0; cs < kSets; ++cs) {
      // the lane's sum over its tokens, summed over the 4 lanes of its group (the kernel's
      // shuffles)
      float m = 0.0f;
      for (int x = 4 * g; x < 4 * g + 4; ++x)
        m += msum[static_cast<size_t>(cs)][static_cast<size_t>(x)];
      const auto& oc = o[static_cast<size_t>(cs)];
      const auto& one = o1[static_cast<size_t>(cs)][static_cast<size_t>(l)];
      for (int j = 0; j < mi::kE; ++j)
        for (int e = 0; e < 2; ++e) {
          const int d = mi::kSpan * cs + mi::set_index(c_col(l, e), j);
          const auto& x = oc[static_cast<size_t>(j)][static_cast<size_t>(l)];
          const auto ue = static_cast<size_t>(e);
          const double got = ((x[ue] - one[ue]) + (x[ue + 2] - one[ue + 2])) * mi::kInvUnit<B> + m;
          double want = 0, mag = 0;
          for (int t = 0; t < kTokens; ++t) {
            const double pt = pr[static_cast<size_t>(g * kTokens + t)];
            const double s = sc[static_cast<size_t>(t * kSets + cs)];
            const double mt = mn[static_cast<size_t>(t * kSets + cs)];
            const double code = L.code(words.data(), t, 0, d);
            want += pt * (code * s + mt);
            mag += std::fabs(pt * s) * (mi::kInvUnit<B> + code) + std::fabs(pt * mt);
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

}  // namespace
}  // namespace kvq::cuda::mma
