// Tests for kernels/cuda/fp8_token_split.h on the host: how the fused FP8 per-token quantize
// (fp8_quantize_dynamic_token) splits rows over a warp's lanes, against the plain definitions,
// for every dim the fused kernel takes (multiples of 16 up to 2048) and the ones it must refuse.
// Expected: every chunk of a row is taken by exactly one lane of its span, exactly once; span is
// the smallest power of two >= chunks (at most 32); chunks_per_lane is a power of two covering
// ceil(chunks / span); neighbouring lanes take neighbouring chunks (coalesced 64-byte runs).
#include "kernels/cuda/fp8_token_split.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

namespace kvq::cuda::fp8_token {
namespace {

constexpr int kChunk = quant_index::kFp8Chunk;

TEST(Fp8TokenSplit, EveryChunkOfARowIsTakenByExactlyOneLaneOnceForEveryFittingDim) {
  int64_t checked = 0;
  for (int64_t dim = kChunk; dim <= 2048; dim += kChunk) {
    ASSERT_TRUE(fits_registers(dim)) << "D=" << dim;
    const Split s = split_for(dim);
    const int chunks = static_cast<int>(dim / kChunk);
    ASSERT_EQ(s.chunks, chunks) << "D=" << dim;
    // span: the smallest power of two >= chunks, capped at 32; divides the warp.
    int want_span = 1;
    while (want_span < chunks && want_span < 32) want_span *= 2;
    ASSERT_EQ(s.span, want_span) << "D=" << dim;
    ASSERT_EQ(32 % s.span, 0) << "D=" << dim;
    // chunks_per_lane: a power of two, covers the row, at most kMaxChunksPerLane, and not twice
    // what is needed.
    const int need = (chunks + s.span - 1) / s.span;
    ASSERT_GE(s.chunks_per_lane, need) << "D=" << dim;
    ASSERT_LT(s.chunks_per_lane, 2 * need) << "D=" << dim;
    ASSERT_EQ(s.chunks_per_lane & (s.chunks_per_lane - 1), 0) << "D=" << dim;
    ASSERT_LE(s.chunks_per_lane, kMaxChunksPerLane) << "D=" << dim;
    std::vector<int> taken(static_cast<size_t>(chunks), 0);
    for (int part = 0; part < s.span; ++part)
      for (int c = 0; c < s.chunks_per_lane; ++c) {
        const int64_t d0 = chunk_start(s, part, c);
        if (d0 < 0) continue;
        ASSERT_EQ(d0 % kChunk, 0) << "D=" << dim;  // 16-byte aligned codes, 64-byte floats
        ASSERT_LE(d0 + kChunk, dim) << "D=" << dim;
        ++taken[static_cast<size_t>(d0 / kChunk)];
        // Coalesced: chunk c of lane part is the (c * span + part)-th of the row.
        ASSERT_EQ(d0, int64_t{c * s.span + part} * kChunk) << "D=" << dim;
        ++checked;
      }
    for (int k = 0; k < chunks; ++k) ASSERT_EQ(taken[static_cast<size_t>(k)], 1) << "D=" << dim;
  }
  EXPECT_EQ(checked, 2048 / kChunk * (2048 / kChunk + 1) / 2);  // sum of chunks over every dim
}

// Hand-worked cases: the model shapes (D = 64: 4 lanes a row, 8 rows a warp; D = 128: 8 lanes,
// 4 rows) and the largest (D = 2048: 128 chunks, 32 lanes, 4 a lane).
TEST(Fp8TokenSplit, ModelShapesByHand) {
  const Split d64 = split_for(64), d128 = split_for(128), d2048 = split_for(2048);
  EXPECT_EQ(d64.span, 4);
  EXPECT_EQ(d64.chunks_per_lane, 1);
  EXPECT_EQ(d128.span, 8);
  EXPECT_EQ(d128.chunks_per_lane, 1);
  EXPECT_EQ(d2048.span, 32);
  EXPECT_EQ(d2048.chunks_per_lane, 4);
  // D = 96: 6 chunks on 8 lanes, lanes 6 and 7 idle.
  const Split d96 = split_for(96);
  EXPECT_EQ(d96.span, 8);
  EXPECT_EQ(chunk_start(d96, 5, 0), 80);
  EXPECT_EQ(chunk_start(d96, 6, 0), -1);
  // D = 640: 40 chunks on 32 lanes, 2 a lane; lane 7's second chunk is the 39th, lane 8's none.
  const Split d640 = split_for(640);
  EXPECT_EQ(d640.chunks_per_lane, 2);
  EXPECT_EQ(chunk_start(d640, 7, 1), 39 * kChunk);
  EXPECT_EQ(chunk_start(d640, 8, 1), -1);
}

// The fused kernel refuses what its registers cannot hold or its chunks cannot tile; the row
// kernel takes those.
TEST(Fp8TokenSplit, FitsRegistersOnlyForMultiplesOf16UpTo2048) {
  for (int64_t dim = 0; dim <= 4096; ++dim)
    EXPECT_EQ(fits_registers(dim), dim > 0 && dim % 16 == 0 && dim <= 2048) << "D=" << dim;
}

}  // namespace
}  // namespace kvq::cuda::fp8_token
