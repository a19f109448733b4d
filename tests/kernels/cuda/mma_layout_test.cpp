// Tests for kernels/cuda/mma_layout.h (the Mma decode kernel's fragment arithmetic) on the host.
//
// Expected values come from definitions: the PTX ISA's fragment tables for mma.m16n8k16 (written
// here as literal rows for a few lanes, and as bijection checks for all), the ldmatrix semantics
// (lane l addresses row l % 8 of matrix l / 8 and receives row l / 4, columns 2 (l % 4) + {0, 1},
// or transposed), and plain dot products. The emulations below reproduce the kernel's steps on
// the host through these functions: q and p as high + low bf16 parts in the A rows g and g + 8,
// K and V rows in the XOR-swizzled shared tile read by ldmatrix, mma as a sum over k, and the
// kernel's reading of the C values; the results must equal the dot products within kTolRel.
// The int path (kernels/cuda/mma_int.h) is tested in mma_int_test.cpp.
#include "kernels/cuda/mma_layout.h"

#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <random>
#include <set>
#include <utility>
#include <vector>

#include "core/half.h"
#include "tests/kernels/cuda/mma_emu.h"

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

using mma_emu::Frag;
using mma_emu::Frag4;

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

void mma(float (&c)[32][4], const Frag4& a, const Frag& b0, const Frag& b1) {
  mma_emu::mma<mma_emu::Elem::Bf16>(c, a, b0, b1);
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

}  // namespace
}  // namespace kvq::cuda::mma
