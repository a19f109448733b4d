// Host tests of the model kernels' host-side arithmetic (kernels/cuda/model_kernels.h): the RoPE
// angles and channel pairs the CUDA rope kernel applies, against the CPU forward pass's own
// rotation (LlamaModel::rope: tested against transformers in tests/model/hf_model_test.cpp) on a
// checkpoint folder (rotate_half pairs) and the SmolLM2 GGUF (adjacent pairs, when cached); the
// gemv's launch shape. Built and run without CUDA.
#include "kernels/cuda/model_kernels.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "model/arch.h"
#include "model/llama.h"
#include "tests/support/expect_error.h"
#include "tests/support/model.h"
#include "tests/support/random.h"

namespace kvq::cuda::model {
namespace {

// x [heads, dim] rotated as the kernel does: one (head, pair) at a time through rope_pair and
// rope_rotate with rope_angles' factors.
void kernel_rope(std::vector<float>& x, int64_t heads, int64_t dim, bool half,
                 const RopeAngles& a) {
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t i = 0; i < dim / 2; ++i) {
      int64_t ca, cb;
      rope_pair(i, dim, half, ca, cb);
      float* p = x.data() + h * dim;
      rope_rotate(p[ca], p[cb], a.cs[i], a.sn[i]);
    }
}

// The kernel's rotation equals LlamaModel::rope at several positions. Both multiply by the same
// float cos / sin; the only freedom is whether a compiler fuses a product into the sum, a
// difference of at most one rounding of each product: 2^-23 x (|x0| + |x1|) per channel.
void expect_rope_matches(const LlamaModel& m, const std::vector<float>& inv_freq, bool half) {
  const LlamaConfig& c = m.config();
  const int64_t heads = c.heads, dim = c.head_dim;
  for (int64_t pos : {0, 1, 17, 1000, 8191}) {
    std::vector<float> x = testing::random_q(heads * dim, static_cast<uint64_t>(7 + pos));
    std::vector<float> want = x;
    m.rope(want.data(), 1, heads, pos);
    std::vector<float> got = x;
    kernel_rope(got, heads, dim, half, rope_angles(inv_freq, pos));
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < dim / 2; ++i) {
        int64_t ca, cb;
        rope_pair(i, dim, half, ca, cb);
        const float* x0 = x.data() + h * dim;
        const double tol = std::ldexp(1.0, -22) * (std::fabs(x0[ca]) + std::fabs(x0[cb]));
        for (int64_t ch : {ca, cb})
          ASSERT_NEAR(got[static_cast<size_t>(h * dim + ch)],
                      want[static_cast<size_t>(h * dim + ch)], tol)
              << "pos " << pos << " head " << h << " pair " << i;
      }
  }
}

TEST(ModelKernelsRope, HalfPairsMatchTheCpuOnACheckpointFolder) {
  const LlamaModel m = LlamaModel::load(std::string(KVQ_SOURCE_DIR) + "/tests/fixtures/hf/smollm2");
  ASSERT_EQ(m.config().rope_style, RopeStyle::kHalf);
  expect_rope_matches(m, rope_inv_freq(m.config()), true);
}

TEST(ModelKernelsRope, Llama3ScaledAnglesMatchTheCpu) {
  const LlamaModel m = LlamaModel::load(std::string(KVQ_SOURCE_DIR) + "/tests/fixtures/hf/llama3");
  ASSERT_EQ(m.config().rope_scaling.type, "llama3");
  expect_rope_matches(m, rope_inv_freq(m.config()), true);
}

TEST(ModelKernelsRope, AdjacentPairsMatchTheCpuOnTheGguf) {
  KVQ_REQUIRE_MODEL();
  ASSERT_EQ(M->model.config().rope_style, RopeStyle::kAdjacent);
  // SmolLM2's GGUF has no rope_freqs.weight: its frequencies are the config's
  expect_rope_matches(M->model, rope_inv_freq(M->model.config()), false);
}

TEST(ModelKernelsRope, PairsCoverEveryChannelOnce) {
  for (int64_t dim : {64, 128, 256})
    for (bool half : {false, true}) {
      std::vector<int> seen(static_cast<size_t>(dim), 0);
      for (int64_t i = 0; i < dim / 2; ++i) {
        int64_t a, b;
        rope_pair(i, dim, half, a, b);
        ASSERT_TRUE(a >= 0 && a < dim && b >= 0 && b < dim);
        ++seen[static_cast<size_t>(a)];
        ++seen[static_cast<size_t>(b)];
      }
      for (int s : seen) EXPECT_EQ(s, 1) << dim << (half ? " half" : " adjacent");
    }
}

TEST(ModelKernelsRope, TooManyPairsRefused) {
  const std::vector<float> f(kMaxRopePairs + 1, 1.0f);
  testing::expect_error([&] { (void)rope_angles(f, 3); }, "at most 128");
}

// Every row gets one warp: the blocks cover the rows, the last block holds at least one.
TEST(ModelKernelsGemv, LaunchCoversEveryRowOnce) {
  for (int64_t rows : {1, 7, 8, 9, 576, 1536, 49152, 151936}) {
    const int64_t b = gemv_blocks(rows);
    EXPECT_GE(b * kGemvWarps, rows) << rows;
    EXPECT_LT((b - 1) * kGemvWarps, rows) << rows;
  }
  // the vector path only where a row is whole 16-byte chunks (cudaMalloc'd matrices: every row
  // then starts 16-byte aligned)
  EXPECT_TRUE(gemv_vectorized(576, true));
  EXPECT_FALSE(gemv_vectorized(572, true));
  EXPECT_TRUE(gemv_vectorized(572, false));
  EXPECT_FALSE(gemv_vectorized(570, false));
  for (bool bf16 : {true, false}) EXPECT_EQ(vec_width(bf16) * (bf16 ? 2 : 4), 16);
}

// A batched product's activation rows: the vector path also needs every x row 16-byte aligned
// (ldx a multiple of 4 floats; the down projection reads g|u's first half, ldx = 2 ffn), and the
// passes over n rows take kGemvCols rows each, the last at least one.
TEST(ModelKernelsGemv, BatchedRowsAlignedAndCoveredOnce) {
  EXPECT_TRUE(gemv_vectorized(1536, true, 3072));   // SmolLM2's down projection
  EXPECT_TRUE(gemv_vectorized(1536, true, 0));      // ldx 0: cols
  EXPECT_FALSE(gemv_vectorized(1536, true, 3074));  // rows 8 bytes off 16
  EXPECT_FALSE(gemv_vectorized(576, false, 578));
  EXPECT_TRUE(gemv_vectorized(576, false, 580));
  for (int64_t n : {1, 7, 8, 9, 64, 65}) {
    const int64_t p = gemv_passes(n);
    EXPECT_GE(p * kGemvCols, n) << n;
    EXPECT_LT((p - 1) * kGemvCols, n) << n;
  }
  EXPECT_EQ(gemv_passes(64), 8);
}

}  // namespace
}  // namespace kvq::cuda::model
