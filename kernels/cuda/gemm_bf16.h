// The tensor-core GEMM of the model's dense layers (model_kernels.cu's gemm_bf16 kernel) as
// __host__ __device__ arithmetic, so that the CPU tests (tests/kernels/cuda/gemm_bf16_test.cpp)
// check every index the kernel uses and run a whole launch through emulated mma.
//
// Y [n][rows] (+)= X [n][cols] W^T, W [rows][cols] the model's bf16 device weights as stored
// (row-major), X float32 activations, Y float32. In mma.m16n8k16 terms (mma_layout.h) W is A
// (M = weight rows, row-major as stored) and X is B (N = activation rows, its rows the columns of
// a column-major B), so neither operand is transposed on the way in.
//
// X is not rounded to bf16: each pair of x values is split into a high bf16x2 and the bf16x2 of
// the remainder (mma_layout.h's split_bf16x2) and both are multiplied (two mmas a tile), so x
// carries ~16 significant bits (|x - hi - lo| <= 2^-16 |x|) and a product's only rounding beyond
// the gemv's float32 path is that 2^-16; rounding x to bf16 alone would cost 2^-8, which the
// model tests' 1e-4 x max |logit| term does not allow (tests/cuda/model_cuda_test.cpp). The
// weights are bf16 already (the gemv multiplies the same values), accumulation is float32.
//
// A block: kGemmWarps warps over a tile of kGemmBM weight rows x kGemmBN activation rows, its k
// loop in steps of kGemmBK columns through kGemmStages shared-memory stages filled by cp.async
// (16-byte chunks: 8 bf16 of W, 4 floats of X; a chunk past `rows`, `n` or `cols` is zero-filled
// and its products are zero). Warp w owns activation rows [16 w, 16 w + 16) of the tile (two
// n-tiles of 8) and every weight row (two m-tiles of 16): per k-step of 16, 8 A words, 4 float2
// of X split into 4 high and 4 low B words, 8 mmas. Shared rows are padded (kGemmWStride bf16,
// kGemmXStride floats) so that a warp's fragment loads hit 32 different banks (checked by the
// host test). Each output element belongs to one lane of one block (of each k slice, split-K
// below, whose partial sums a second launch adds in a fixed order): no atomics, the same bits
// every run.
//
// Dispatch (use_gemm): bf16 weights, at least kGemmMinRows activation rows, cols a multiple of 8
// and x rows 16-byte aligned (ldx % 4 == 0); else the gemv (model_kernels.h). Below the threshold
// the gemv reads every weight once for up to kGemvCols rows (one pass, at the weight-bandwidth
// roofline: nothing to gain); from kGemvCols + 1 rows on it makes another pass over W and runs
// kGemvCols more rows of FMAs on CUDA cores per pass, while the GEMM's cost stays one read of W
// plus tensor-core work far below it (SmolLM2-135M at 64 rows: ~35 GFLOP of bf16 mma with the
// split, ~35 us at H200's ~990 TFLOP/s, against ~55 us to read its 270 MB of weights).
#pragma once

#include <cstdint>

#include "core/hostdev.h"
#include "kernels/cuda/mma_layout.h"

namespace kvq::cuda::gemm {

inline constexpr int kGemmBM = 32;  ///< weight rows (outputs) a block
inline constexpr int kGemmBN = 64;  ///< activation rows a block
inline constexpr int kGemmBK = 32;  ///< columns a stage
inline constexpr int kGemmStages = 3;
inline constexpr int kGemmWarps = 4;
inline constexpr int kGemmThreads = 32 * kGemmWarps;
/// Shared row strides: the W tile in bf16, the X tile in floats (+8 each: bank spread).
inline constexpr int kGemmWStride = kGemmBK + 8;
inline constexpr int kGemmXStride = kGemmBK + 8;
inline constexpr int kGemmWStage = kGemmBM * kGemmWStride;  ///< bf16 a stage
inline constexpr int kGemmXStage = kGemmBN * kGemmXStride;  ///< floats a stage
inline constexpr int kGemmSmemBytes = kGemmStages * (kGemmWStage * 2 + kGemmXStage * 4);
/// 16-byte chunks a stage and the ones each thread issues.
inline constexpr int kGemmWChunks = kGemmBM * kGemmBK / 8;
inline constexpr int kGemmXChunks = kGemmBN * kGemmBK / 4;
inline constexpr int kGemmXChunksPerThread = kGemmXChunks / kGemmThreads;
static_assert(kGemmWChunks == kGemmThreads, "one W chunk a thread");
static_assert(kGemmXChunks % kGemmThreads == 0, "whole X chunks a thread");
static_assert(kGemmBN == 16 * kGemmWarps && kGemmBM == 2 * mma::kM && kGemmBK == 2 * mma::kK,
              "the warp tile: 2 m-tiles x 2 n-tiles, 2 k-steps a stage");
static_assert(kGemmSmemBytes <= 48 * 1024, "static shared memory");
/// The fewest activation rows the GEMM takes (model_kernels.h's gemv below).
inline constexpr int64_t kGemmMinRows = 9;

/// \brief Whether gemv's arguments go to the GEMM (see the file comment).
KVQ_HD bool use_gemm(bool bf16, int64_t n, int64_t cols, int64_t ldx) {
  return bf16 && n >= kGemmMinRows && cols % 8 == 0 && ldx % 4 == 0;
}
/// \brief The GEMM's error bound relative to sum_c |W[r][c] x[b][c]|: x's split (2^-16) and the
/// float32 additions of 2 ceil(cols / 16) mma results, each rounded at most twice, plus the
/// split-K reduce's additions of at most cols / (kGemmBK kGemmMinSliceTiles) = cols / 128 slices
/// (2^-24 a rounding, every partial sum bounded by the same sum of magnitudes): 5 ceil(cols / 16)
/// roundings in all. The emulated launch meets it
/// (tests/kernels/cuda/gemm_bf16_test.cpp); the device tests allow twice it (PTX leaves the
/// rounding of the mma's internal sum unspecified).
KVQ_HD double gemm_rel_bound(int64_t cols) {
  return 0x1p-16 + 5.0 * static_cast<double>((cols + 15) / 16) * 0x1p-24;
}
/// \brief Blocks along the weight rows (grid.x) and the activation rows (grid.y).
KVQ_HD int64_t gemm_blocks_m(int64_t rows) { return (rows + kGemmBM - 1) / kGemmBM; }
KVQ_HD int64_t gemm_blocks_n(int64_t n) { return (n + kGemmBN - 1) / kGemmBN; }
KVQ_HD int64_t gemm_k_tiles(int64_t cols) { return (cols + kGemmBK - 1) / kGemmBK; }

/// \brief Split-K: a product whose out / kGemmBM x n / kGemmBN blocks cannot fill the GPU (at 64
/// rows SmolLM2's o and down have 18) cuts its column stages into slices, grid.z one a slice, each
/// block writing its partial sums to a workspace [splits][n][rows]; a second launch adds the
/// slices in order z = 0, 1, ... (and y when accumulating), so the bits stay the same every run.
/// A slice takes at least kGemmMinSliceTiles stages (the pipeline's fill amortized), at most
/// kGemmMaxSplits slices.
inline constexpr int64_t kGemmMinSliceTiles = 4;
inline constexpr int64_t kGemmMaxSplits = 16;
/// \brief Stages a slice takes so that the grid reaches `target_blocks` blocks where it can (the
/// launcher asks for 2 blocks an SM); gemm_k_tiles(cols) when one slice is enough.
KVQ_HD int64_t gemm_slice_tiles(int64_t rows, int64_t n, int64_t cols, int64_t target_blocks) {
  const int64_t blocks = gemm_blocks_m(rows) * gemm_blocks_n(n), tiles = gemm_k_tiles(cols);
  int64_t splits = blocks >= target_blocks ? 1 : (target_blocks + blocks - 1) / blocks;
  if (splits > tiles / kGemmMinSliceTiles) splits = tiles / kGemmMinSliceTiles;
  if (splits > kGemmMaxSplits) splits = kGemmMaxSplits;
  if (splits < 1) splits = 1;
  return (tiles + splits - 1) / splits;
}
/// \brief Slices of `slice_tiles` stages each (the last may be shorter, none empty).
KVQ_HD int64_t gemm_splits(int64_t cols, int64_t slice_tiles) {
  return (gemm_k_tiles(cols) + slice_tiles - 1) / slice_tiles;
}

/// \brief Tile row and first column of thread t's W chunk (8 bf16), and its offset in a stage.
KVQ_HD int w_chunk_row(int t) { return t / (kGemmBK / 8); }
KVQ_HD int w_chunk_col(int t) { return 8 * (t % (kGemmBK / 8)); }
KVQ_HD int w_chunk_smem(int t) { return w_chunk_row(t) * kGemmWStride + w_chunk_col(t); }
/// \brief Tile row and first column of thread t's i-th X chunk (4 floats), its offset in a stage.
KVQ_HD int x_chunk_row(int t, int i) { return (t + kGemmThreads * i) / (kGemmBK / 4); }
KVQ_HD int x_chunk_col(int t, int i) { return 4 * ((t + kGemmThreads * i) % (kGemmBK / 4)); }
KVQ_HD int x_chunk_smem(int t, int i) {
  return x_chunk_row(t, i) * kGemmXStride + x_chunk_col(t, i);
}

/// \brief Offset (bf16) in a W stage of the pair `lane` holds in A register r of m-tile mt at
/// k-step s (the low element; the high one follows it).
KVQ_HD int a_smem(int lane, int mt, int s, int r) {
  return (mma::kM * mt + mma::a_row(lane, r)) * kGemmWStride + mma::kK * s + mma::a_col(lane, r, 0);
}
/// \brief Offset (float) in an X stage of the pair (a float2) `lane` of warp `warp` splits into B
/// register r of n-tile nt at k-step s.
KVQ_HD int b_smem(int lane, int warp, int nt, int s, int r) {
  return (16 * warp + mma::kN * nt + mma::b_col(lane)) * kGemmXStride + mma::kK * s +
         mma::b_row(lane, r, 0);
}
/// \brief The tile's weight row (output column of y) and activation row of C value i of
/// (mt, nt) held by `lane` of warp `warp`.
KVQ_HD int c_wrow(int lane, int mt, int i) { return mma::kM * mt + mma::c_row(lane, i); }
KVQ_HD int c_xrow(int lane, int warp, int nt, int i) {
  return 16 * warp + mma::kN * nt + mma::c_col(lane, i);
}

}  // namespace kvq::cuda::gemm
