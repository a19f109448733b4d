// Tests for kernels/cuda/quant_index.h on the host: the index arithmetic of the one-pass quantize
// kernels against plain definitions, exhaustively over small shapes. row_pos against the nested
// (t, h, d) loops of a C-order tensor; the FP8 chunks (16 elements a thread) stay in one row and
// start 16-element aligned exactly when dim is a multiple of 16; store_words splits a thread's
// run of words into aligned stores of 16, 8 or 4 bytes.
#include "kernels/cuda/quant_index.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>

#include "kivi/pack.h"

namespace kvq::cuda::quant_index {
namespace {

TEST(QuantIndex, RowPosIsTheCOrderPositionOfEveryElement) {
  for (int64_t tokens = 1; tokens <= 3; ++tokens)
    for (int64_t heads = 1; heads <= 5; ++heads)
      for (int64_t dim = 1; dim <= 40; ++dim) {
        int64_t e = 0;
        for (int64_t t = 0; t < tokens; ++t)
          for (int64_t h = 0; h < heads; ++h)
            for (int64_t d = 0; d < dim; ++d, ++e) {
              const RowPos p = row_pos(e, heads, dim);
              ASSERT_EQ(p.t, t) << "e=" << e << " H=" << heads << " D=" << dim;
              ASSERT_EQ(p.h, h) << "e=" << e << " H=" << heads << " D=" << dim;
              ASSERT_EQ(p.d, d) << "e=" << e << " H=" << heads << " D=" << dim;
            }
      }
}

// A chunk's 16 elements share (t, h) and run d0 .. d0 + 15 with d0 a multiple of 16 (so the
// chunk's floats and codes are 16-byte aligned when the tensor is), for every chunk when
// fp8_chunks_fit(dim); when it does not, some chunk of a two-row tensor leaves its row.
TEST(QuantIndex, Fp8ChunksStayInOneRowExactlyWhenTheyFit) {
  for (int64_t heads = 1; heads <= 3; ++heads)
    for (int64_t dim = 1; dim <= 80; ++dim) {
      const int64_t tokens = 2, n = tokens * heads * dim;
      bool all_in_row = n % kFp8Chunk == 0;
      for (int64_t k = 0; k * kFp8Chunk < n; ++k) {
        const int64_t e0 = k * kFp8Chunk;
        const RowPos p0 = row_pos(e0, heads, dim);
        for (int j = 0; j < kFp8Chunk; ++j) {
          const int64_t e = e0 + j;
          const int64_t row = e / dim;  // the definition: flat row t * H + h
          if (e >= n || row != p0.t * heads + p0.h || e - row * dim != p0.d + j) all_in_row = false;
        }
        if (fp8_chunks_fit(dim)) {
          ASSERT_EQ(p0.d % kFp8Chunk, 0) << "D=" << dim << " k=" << k;
        }
      }
      EXPECT_EQ(fp8_chunks_fit(dim), all_in_row) << "H=" << heads << " D=" << dim;
    }
  EXPECT_FALSE(fp8_chunks_fit(0));
}

// The four words, stored in memory, read back as the 16 bytes in order (memcpy is the store).
TEST(QuantIndex, PutByteLaysEveryByteAtItsAddress) {
  for (int j = 0; j < 16; ++j)
    for (uint32_t b = 0; b < 256; ++b) {
      uint32_t w[4] = {0, 0, 0, 0};
      put_byte(w, j, b | 0xab00u);  // bits above the byte must not leak
      uint8_t bytes[16];
      std::memcpy(bytes, w, sizeof bytes);
      for (int i = 0; i < 16; ++i) ASSERT_EQ(bytes[i], i == j ? b : 0u) << "j=" << j << " b=" << b;
    }
  uint32_t w[4] = {0, 0, 0, 0};
  for (int j = 0; j < 16; ++j) put_byte(w, j, static_cast<uint32_t>(0x10 + j));
  uint8_t bytes[16];
  std::memcpy(bytes, w, sizeof bytes);
  for (int j = 0; j < 16; ++j) EXPECT_EQ(bytes[j], 0x10 + j) << j;
}

TEST(QuantIndex, StoreWordsIsTheWidestAlignedStoreThatTilesTheRun) {
  for (int wpg = 1; wpg <= 64; ++wpg) {
    const int v = store_words(wpg);
    ASSERT_TRUE(v == 1 || v == 2 || v == 4) << wpg;
    EXPECT_EQ(wpg % v, 0) << "wpg=" << wpg;  // the stores tile the run
    if (v < 4) {
      EXPECT_NE(wpg % (2 * v), 0) << "wpg=" << wpg;  // and are the widest that do
    }
  }
  // KIVI's groups: b=2 G=32 packs 2 words (8-byte stores), every other case in use 4 or 8 words.
  EXPECT_EQ(store_words(static_cast<int>(kivi::words_for(32, 2))), 2);
  EXPECT_EQ(store_words(static_cast<int>(kivi::words_for(32, 3))), 4);
  EXPECT_EQ(store_words(static_cast<int>(kivi::words_for(32, 4))), 4);
  EXPECT_EQ(store_words(static_cast<int>(kivi::words_for(64, 2))), 4);
  EXPECT_EQ(store_words(static_cast<int>(kivi::words_for(64, 8))), 4);
}

}  // namespace
}  // namespace kvq::cuda::quant_index
