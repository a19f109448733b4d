// Host tests of the tensor-core GEMM's arithmetic (kernels/cuda/gemm_bf16.h): the cp.async load
// plan, the fragment offsets against mma_layout.h's PTX tables, the shared-memory banks, the
// output map, the dispatch, and whole launches emulated on the CPU (mma_emu.h: fragments as PTX
// lays them out, each mma's sum exact in double, rounded into float32 accumulators) through the
// very index functions the kernel uses. Expected values: a double-precision GEMM of the same bf16
// weights and float32 activations, within gemm_rel_bound (x's high + low split and the float32
// additions, derived in the header); the same launch with x's low part dropped (x rounded to bf16
// alone) must miss that bound, so the check sees the second mma.
#include "kernels/cuda/gemm_bf16.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "core/half.h"
#include "tests/kernels/cuda/gemm_ref.h"
#include "tests/kernels/cuda/mma_emu.h"

namespace kvq::cuda::gemm {
namespace {

TEST(GemmBf16Plan, LoadPlanCoversEveryChunkOnce) {
  std::set<int> w_offsets, x_offsets;
  std::set<std::pair<int, int>> w_cells, x_cells;
  for (int t = 0; t < kGemmThreads; ++t) {
    ASSERT_LT(w_chunk_row(t), kGemmBM);
    ASSERT_LE(w_chunk_col(t) + 8, kGemmBK);
    EXPECT_EQ(w_chunk_smem(t) * 2 % 16, 0) << "cp.async needs 16-byte aligned shared chunks";
    EXPECT_EQ(w_chunk_smem(t), w_chunk_row(t) * kGemmWStride + w_chunk_col(t));
    EXPECT_TRUE(w_cells.insert({w_chunk_row(t), w_chunk_col(t)}).second) << "thread " << t;
    w_offsets.insert(w_chunk_smem(t));
    for (int i = 0; i < kGemmXChunksPerThread; ++i) {
      ASSERT_LT(x_chunk_row(t, i), kGemmBN);
      ASSERT_LE(x_chunk_col(t, i) + 4, kGemmBK);
      EXPECT_EQ(x_chunk_smem(t, i) * 4 % 16, 0);
      EXPECT_TRUE(x_cells.insert({x_chunk_row(t, i), x_chunk_col(t, i)}).second)
          << "thread " << t << " chunk " << i;
      x_offsets.insert(x_chunk_smem(t, i));
    }
  }
  EXPECT_EQ(w_cells.size(), static_cast<size_t>(kGemmBM * kGemmBK / 8));
  EXPECT_EQ(x_cells.size(), static_cast<size_t>(kGemmBN * kGemmBK / 4));
  EXPECT_EQ(w_offsets.size(), w_cells.size());
  EXPECT_EQ(x_offsets.size(), x_cells.size());
  // consecutive threads take consecutive 16-byte pieces of a row (coalesced global reads)
  EXPECT_EQ(w_chunk_col(1), 8);
  EXPECT_EQ(x_chunk_col(1, 0), 4);
  EXPECT_EQ(kGemmSmemBytes, 38400);
}

// Every lane's A words (weights) and B pairs (x) sit where mma_layout.h's tables put that element
// of the tile: A[16 mt + row][16 s + col] at row * kGemmWStride + col, x row 16 warp + 8 nt + col.
TEST(GemmBf16Plan, FragmentOffsetsFollowThePtxTables) {
  for (int s = 0; s < kGemmBK / mma::kK; ++s)
    for (int mt = 0; mt < 2; ++mt) {
      std::set<std::pair<int, int>> seen;
      for (int lane = 0; lane < 32; ++lane)
        for (int r = 0; r < 4; ++r) {
          const int off = a_smem(lane, mt, s, r);
          ASSERT_EQ(off % 2, 0) << "a 32-bit shared load";
          const int row = off / kGemmWStride, col = off % kGemmWStride;
          EXPECT_EQ(row, 16 * mt + mma::a_row(lane, r));
          EXPECT_EQ(col, 16 * s + mma::a_col(lane, r, 0));
          EXPECT_EQ(mma::a_col(lane, r, 1), mma::a_col(lane, r, 0) + 1);
          EXPECT_TRUE(seen.insert({row, col}).second);
        }
      EXPECT_EQ(seen.size(), 16u * 16 / 2);  // the 16 x 16 tile, pairs of columns
    }
  for (int warp = 0; warp < kGemmWarps; ++warp)
    for (int s = 0; s < kGemmBK / mma::kK; ++s)
      for (int nt = 0; nt < 2; ++nt) {
        std::set<std::pair<int, int>> seen;
        for (int lane = 0; lane < 32; ++lane)
          for (int r = 0; r < 2; ++r) {
            const int off = b_smem(lane, warp, nt, s, r);
            ASSERT_EQ(off % 2, 0) << "a 64-bit shared load";
            const int row = off / kGemmXStride, k = off % kGemmXStride;
            EXPECT_EQ(row, 16 * warp + 8 * nt + mma::b_col(lane));
            EXPECT_EQ(k, 16 * s + mma::b_row(lane, r, 0));
            EXPECT_EQ(mma::b_row(lane, r, 1), mma::b_row(lane, r, 0) + 1);
            EXPECT_TRUE(seen.insert({row, k}).second);
          }
        EXPECT_EQ(seen.size(), 16u * 8 / 2);
      }
}

// A warp's fragment loads hit distinct banks: the 32 lanes' A words 32 banks; each half-warp's
// float2 pairs (a 64-bit load is served 16 lanes at a time) 32 banks.
TEST(GemmBf16Plan, FragmentLoadsAreBankConflictFree) {
  for (int s = 0; s < kGemmBK / mma::kK; ++s) {
    for (int mt = 0; mt < 2; ++mt)
      for (int r = 0; r < 4; ++r) {
        std::set<int> banks;
        for (int lane = 0; lane < 32; ++lane) banks.insert((a_smem(lane, mt, s, r) / 2) % 32);
        EXPECT_EQ(banks.size(), 32u) << "A mt " << mt << " s " << s << " r " << r;
      }
    for (int warp = 0; warp < kGemmWarps; ++warp)
      for (int nt = 0; nt < 2; ++nt)
        for (int r = 0; r < 2; ++r)
          for (int half = 0; half < 2; ++half) {
            std::set<int> banks;
            for (int lane = 16 * half; lane < 16 * half + 16; ++lane) {
              const int off = b_smem(lane, warp, nt, s, r);
              banks.insert(off % 32);
              banks.insert((off + 1) % 32);
            }
            EXPECT_EQ(banks.size(), 32u) << "B warp " << warp << " nt " << nt << " r " << r;
          }
  }
}

TEST(GemmBf16Plan, OutputsCoverTheTileOnce) {
  std::set<std::pair<int, int>> seen;
  for (int warp = 0; warp < kGemmWarps; ++warp)
    for (int lane = 0; lane < 32; ++lane)
      for (int mt = 0; mt < 2; ++mt)
        for (int nt = 0; nt < 2; ++nt)
          for (int i = 0; i < 4; ++i) {
            const int r = c_wrow(lane, mt, i), b = c_xrow(lane, warp, nt, i);
            ASSERT_TRUE(r >= 0 && r < kGemmBM && b >= 0 && b < kGemmBN);
            // the row b of x this value multiplies is the one the warp's B fragments hold
            EXPECT_EQ(b / 16, warp);
            EXPECT_TRUE(seen.insert({r, b}).second);
          }
  EXPECT_EQ(seen.size(), static_cast<size_t>(kGemmBM * kGemmBN));
}

// The threshold and shapes (the file comment of gemm_bf16.h); SmolLM2-135M's matrices at batch 64
// all take the GEMM: q|k|v [960, 576], o [576, 576], gate|up [3072, 576], down [576, 1536] read
// from g|u at ldx 3072, the head [49152, 576].
TEST(GemmBf16Plan, DispatchThresholdAndShapes) {
  EXPECT_FALSE(use_gemm(true, kGemmMinRows - 1, 576, 576)) << "at most 8 rows: the gemv's one pass";
  EXPECT_EQ(kGemmMinRows, 9);
  EXPECT_TRUE(use_gemm(true, kGemmMinRows, 576, 576));
  EXPECT_FALSE(use_gemm(false, 64, 576, 576)) << "float32 weights stay on the gemv";
  EXPECT_FALSE(use_gemm(true, 64, 572, 572)) << "cols not a multiple of 8";
  EXPECT_FALSE(use_gemm(true, 64, 576, 578)) << "x rows not 16-byte aligned";
  EXPECT_TRUE(use_gemm(true, 64, 1536, 3072));
  const std::tuple<int64_t, int64_t, int64_t> smol[] = {
      {960, 576, 30}, {576, 576, 18}, {3072, 576, 96}, {576, 1536, 18}, {49152, 576, 1536}};
  for (const auto& [rows, cols, blocks] : smol) {
    EXPECT_TRUE(use_gemm(true, 64, cols, cols));
    EXPECT_EQ(gemm_blocks_m(rows), blocks);
    EXPECT_EQ(gemm_blocks_n(64), 1);
    EXPECT_EQ(gemm_blocks_n(65), 2);
  }
  EXPECT_EQ(gemm_k_tiles(576), 18);
  EXPECT_EQ(gemm_k_tiles(40), 2);
}

// Split-K on an H200 (132 SMs: the launcher asks for 264 blocks) at 64 rows, by hand: down has
// 18 blocks and 48 stages, ceil(264 / 18) = 15 slices capped at 48 / 4 = 12, slices of 4 (216
// blocks); o and q|k|v (18 stages) at most 4 slices, of 5, 5, 5, 3 (72, 120 blocks); gate|up
// ceil(264 / 96) = 3 slices of 6 (288); the head's 1,536 blocks fill the GPU (one slice).
TEST(GemmBf16Plan, SplitKSlicesOnSmolLM2AtBatch64) {
  const std::tuple<int64_t, int64_t, int64_t, int64_t> smol[] = {{576, 1536, 4, 12},
                                                                 {576, 576, 5, 4},
                                                                 {960, 576, 5, 4},
                                                                 {3072, 576, 6, 3},
                                                                 {49152, 576, 18, 1}};
  for (const auto& [rows, cols, slice, splits] : smol) {
    EXPECT_EQ(gemm_slice_tiles(rows, 64, cols, 264), slice) << rows << "x" << cols;
    EXPECT_EQ(gemm_splits(cols, slice), splits) << rows << "x" << cols;
  }
  EXPECT_EQ(gemm_slice_tiles(576, 64, 96, 264), 3) << "3 stages: too few to cut";
  EXPECT_EQ(gemm_slice_tiles(64, 64, 32 * 1000, 100000), 1000 / kGemmMaxSplits + 1)
      << "at most kGemmMaxSplits slices";
}

// One launch on the CPU, slice by slice, block by block, stage by stage, warp by warp, as the
// kernel runs it (the slices of gemm_slice_tiles for `target_blocks`; zero-filled chunks outside
// the matrices; fragments through a_smem / b_smem; x split by split_bf16x2; two emulated mmas a
// tile unless `drop_low`; outputs through c_wrow / c_xrow into the slice's partial sums, then the
// reduce's sum over the slices in order). Returns the number of slices.
int64_t emulate(const std::vector<uint16_t>& w, int64_t rows, int64_t cols,
                const std::vector<float>& x, int64_t ldx, int64_t n, std::vector<float>& y,
                bool accumulate, bool drop_low, int64_t target_blocks) {
  std::vector<uint16_t> ws(kGemmWStage);
  std::vector<float> xs(kGemmXStage);
  const int64_t slice = gemm_slice_tiles(rows, n, cols, target_blocks);
  const int64_t splits = gemm_splits(cols, slice), tiles = gemm_k_tiles(cols);
  std::vector<float> partial(static_cast<size_t>(splits * n * rows), NAN);
  for (int64_t z = 0; z < splits; ++z)
    for (int64_t bx = 0; bx < gemm_blocks_m(rows); ++bx)
      for (int64_t by = 0; by < gemm_blocks_n(n); ++by) {
        const int64_t m0 = bx * kGemmBM, n0 = by * kGemmBN;
        float acc[kGemmWarps][32][2][2][4] = {};
        for (int64_t kt = z * slice; kt < std::min(tiles, (z + 1) * slice); ++kt) {
          const int64_t k0 = kt * kGemmBK;
          std::fill(ws.begin(), ws.end(), uint16_t{0xffff});  // padding never read: NaN if it were
          std::fill(xs.begin(), xs.end(), NAN);
          for (int t = 0; t < kGemmThreads; ++t) {
            const int64_t r = m0 + w_chunk_row(t), c = k0 + w_chunk_col(t);
            for (int e = 0; e < 8; ++e)
              ws[static_cast<size_t>(w_chunk_smem(t) + e)] =
                  r < rows && c < cols ? w[static_cast<size_t>(r * cols + c + e)] : 0;
            for (int i = 0; i < kGemmXChunksPerThread; ++i) {
              const int64_t xr = n0 + x_chunk_row(t, i), xc = k0 + x_chunk_col(t, i);
              for (int e = 0; e < 4; ++e)
                xs[static_cast<size_t>(x_chunk_smem(t, i) + e)] =
                    xr < n && xc < cols ? x[static_cast<size_t>(xr * ldx + xc + e)] : 0.0f;
            }
          }
          for (int warp = 0; warp < kGemmWarps; ++warp) {
            if (n0 + 16 * warp >= n) continue;
            for (int s = 0; s < kGemmBK / mma::kK; ++s) {
              mma_emu::Frag4 a[2];
              mma_emu::Frag hi[2][2], lo[2][2];
              for (int mt = 0; mt < 2; ++mt)
                for (int r = 0; r < 4; ++r) {
                  a[mt][static_cast<size_t>(r)].resize(32);
                  for (int lane = 0; lane < 32; ++lane) {
                    const size_t off = static_cast<size_t>(a_smem(lane, mt, s, r));
                    a[mt][static_cast<size_t>(r)][static_cast<size_t>(lane)] =
                        ws[off] | static_cast<uint32_t>(ws[off + 1]) << 16;
                  }
                }
              for (int nt = 0; nt < 2; ++nt)
                for (int r = 0; r < 2; ++r) {
                  hi[nt][r].resize(32);
                  lo[nt][r].resize(32);
                  for (int lane = 0; lane < 32; ++lane) {
                    const size_t off = static_cast<size_t>(b_smem(lane, warp, nt, s, r));
                    const mma::HiLo h = mma::split_bf16x2(xs[off], xs[off + 1]);
                    hi[nt][r][static_cast<size_t>(lane)] = h.hi;
                    lo[nt][r][static_cast<size_t>(lane)] = drop_low ? 0u : h.lo;
                  }
                }
              for (int mt = 0; mt < 2; ++mt)
                for (int nt = 0; nt < 2; ++nt) {
                  float c[32][4];
                  for (int lane = 0; lane < 32; ++lane)
                    for (int i = 0; i < 4; ++i) c[lane][i] = acc[warp][lane][mt][nt][i];
                  mma_emu::mma<mma_emu::Elem::Bf16>(c, a[mt], hi[nt][0], hi[nt][1]);
                  mma_emu::mma<mma_emu::Elem::Bf16>(c, a[mt], lo[nt][0], lo[nt][1]);
                  for (int lane = 0; lane < 32; ++lane)
                    for (int i = 0; i < 4; ++i) acc[warp][lane][mt][nt][i] = c[lane][i];
                }
            }
          }
        }
        for (int warp = 0; warp < kGemmWarps; ++warp)
          for (int lane = 0; lane < 32; ++lane)
            for (int mt = 0; mt < 2; ++mt)
              for (int nt = 0; nt < 2; ++nt)
                for (int i = 0; i < 4; ++i) {
                  const int64_t r = m0 + c_wrow(lane, mt, i), b = n0 + c_xrow(lane, warp, nt, i);
                  if (r >= rows || b >= n) continue;
                  float& p = partial[static_cast<size_t>((z * n + b) * rows + r)];
                  EXPECT_TRUE(std::isnan(p)) << "an output written twice";
                  p = acc[warp][lane][mt][nt][i];
                }
      }
  for (int64_t i = 0; i < n * rows; ++i) {
    float v = partial[static_cast<size_t>(i)];
    for (int64_t z = 1; z < splits; ++z) v += partial[static_cast<size_t>(z * n * rows + i)];
    float& out = y[static_cast<size_t>(i)];
    out = accumulate ? out + v : v;
  }
  return splits;
}

struct Shape {
  int64_t rows, cols, n, ldx, target_blocks, splits;  // splits: what gemm_slice_tiles gives
};

// Random bf16 weights and float32 x with magnitudes over 2^-6 .. 2^6 (so x's low halves matter),
// the emulated launch against the double GEMM; y starts as a sentinel (overwrite) or as values
// the launch adds to (accumulate).
TEST(GemmBf16Emulated, MatchesADoubleGemmWithinTheBound) {
  const Shape shapes[] = {
      {32, 32, 16, 32, 1, 1},         // one block, one stage
      {70, 40, 9, 40, 264, 1},        // ragged rows, the threshold's 9 rows, a k tail of 8
      {96, 576, 64, 576, 1, 1},       // SmolLM2's hidden: 18 stages, one slice
      {96, 576, 64, 576, 264, 4},     // the same in 4 slices of 5, 5, 5, 3 stages
      {40, 96, 70, 200, 264, 1},      // two block rows of x (70 rows), x rows 200 floats apart
      {40, 1544, 20, 1552, 264, 10},  // 49 stages: 9 slices of 5, one of 4 ending in a tail of 8
  };
  std::mt19937 rng(47);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f), e(-6.0f, 6.0f);
  for (const Shape& sh : shapes)
    for (const bool accumulate : {false, true}) {
      const std::string what = std::to_string(sh.rows) + "x" + std::to_string(sh.cols) + " n " +
                               std::to_string(sh.n) + " target " +
                               std::to_string(sh.target_blocks) + (accumulate ? " accumulate" : "");
      std::vector<uint16_t> w(static_cast<size_t>(sh.rows * sh.cols));
      for (uint16_t& v : w) v = float_to_bf16_bits(u(rng) * std::exp2(e(rng)));
      std::vector<float> x(static_cast<size_t>(sh.n * sh.ldx), NAN);  // the gap past cols: unread
      for (int64_t b = 0; b < sh.n; ++b)
        for (int64_t c = 0; c < sh.cols; ++c)
          x[static_cast<size_t>(b * sh.ldx + c)] = u(rng) * std::exp2(e(rng));
      std::vector<float> y0(static_cast<size_t>(sh.n * sh.rows));
      for (float& v : y0) v = accumulate ? u(rng) : -12345.0f;
      std::vector<float> y = y0, y_hi = y0;
      EXPECT_EQ(
          emulate(w, sh.rows, sh.cols, x, sh.ldx, sh.n, y, accumulate, false, sh.target_blocks),
          sh.splits)
          << what;
      emulate(w, sh.rows, sh.cols, x, sh.ldx, sh.n, y_hi, accumulate, true, sh.target_blocks);
      double worst = 0, worst_hi = 0;  // error / bound
      for (int64_t b = 0; b < sh.n; ++b)
        for (int64_t r = 0; r < sh.rows; ++r) {
          const auto [ref, mag] = gemm_ref::dot(w, x, sh.cols, sh.ldx, b, r);
          const size_t at = static_cast<size_t>(b * sh.rows + r);
          const double base = accumulate ? y0[at] : 0.0;
          // the accumulate's own float addition: half an ulp of the result
          const double bound = gemm_rel_bound(sh.cols) * mag +
                               (accumulate ? 0x1p-24 * (std::fabs(base) + mag) : 0.0);
          ASSERT_TRUE(std::isfinite(y[at])) << what << " row " << b << " out " << r;
          worst = std::max(worst, std::fabs(y[at] - (base + ref)) / bound);
          worst_hi = std::max(worst_hi, std::fabs(y_hi[at] - (base + ref)) / bound);
        }
      EXPECT_LE(worst, 1.0) << what;
      EXPECT_GT(worst_hi, 1.0) << what << ": x rounded to bf16 alone would pass the bound";
      RecordProperty(what + " error/bound", std::to_string(worst));
    }
}

}  // namespace
}  // namespace kvq::cuda::gemm
