// The dense layers' tensor-core GEMM on the device (kernels/cuda/model_kernels.h gemm_bf16, the
// arithmetic in kernels/cuda/gemm_bf16.h, emulated on the CPU by
// tests/kernels/cuda/gemm_bf16_test.cpp). Expected values: (1) a double-precision GEMM on the host
// of the same bf16 weights and float32 x, within 2 x gemm_rel_bound(cols) x sum |w x| (twice the
// emulated launch's bound: PTX leaves the rounding inside an mma's sum unspecified); (2) the gemv
// path (model::gemv over at most kGemvCols rows a call, below the GEMM's threshold: float32 FMAs)
// within that bound plus the gemv's own float32 rounding, cols x 2^-24 x sum |w x|; (3) gemv at
// the threshold or above, which dispatches to the GEMM, bit for bit, and a second launch bit for
// bit (no atomics). Guard bytes around y catch writes past the rows. Shapes: SmolLM2-135M's
// matrices at batch 64 (q|k|v, gate|up, down read from g|u at ldx 2 ffn), ragged rows and batches
// (70 outputs, 9 and 100 rows: partial tiles, an idle warp, two block rows), a k tail (cols 40).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "core/half.h"
#include "kernels/cuda/gemm_bf16.h"
#include "kernels/cuda/model_kernels.h"
#include "tests/cuda/cuda_test_util.h"

namespace kvq::cuda {
namespace {

using testing::GuardedBuffer;

struct GemmCase {
  int64_t rows, cols, n, ldx;
  std::string name;
};

class GemmBf16Device : public ::testing::TestWithParam<GemmCase> {
 protected:
  void SetUp() override { KVQ_SKIP_WITHOUT_DEVICE(); }
};

TEST_P(GemmBf16Device, MatchesDoubleGemmAndTheGemv) {
  const GemmCase& g = GetParam();
  std::mt19937 rng(static_cast<uint32_t>(g.rows * 131 + g.n));
  std::uniform_real_distribution<float> u(-1.0f, 1.0f), e(-4.0f, 4.0f);
  std::vector<uint16_t> w(static_cast<size_t>(g.rows * g.cols));
  for (uint16_t& v : w) v = float_to_bf16_bits(u(rng) * std::exp2(e(rng)));
  std::vector<float> x(static_cast<size_t>(g.n * g.ldx));
  for (float& v : x) v = u(rng) * std::exp2(e(rng));
  std::vector<float> y0(static_cast<size_t>(g.n * g.rows));
  for (float& v : y0) v = u(rng);
  GuardedBuffer<uint16_t> dw(w.size());
  GuardedBuffer<float> dx(x.size()), dy(y0.size());
  dw.upload(w);
  dx.upload(x);
  for (const bool accumulate : {false, true}) {
    const std::string what = g.name + (accumulate ? " accumulate" : "");
    dy.upload(y0);
    model::gemm_bf16(dw.get(), g.rows, g.cols, dx.get(), dy.get(), accumulate, g.n, g.ldx);
    const std::vector<float> got = dy.download();
    dy.upload(y0);  // the same launch again: the same bits
    model::gemm_bf16(dw.get(), g.rows, g.cols, dx.get(), dy.get(), accumulate, g.n, g.ldx);
    EXPECT_EQ(dy.download(), got) << what << ": a second launch";
    dy.upload(y0);  // gemv at these rows: the GEMM when use_gemm holds
    model::gemv(dw.get(), true, g.rows, g.cols, dx.get(), dy.get(), accumulate, g.n, g.ldx);
    if (gemm::use_gemm(true, g.n, g.cols, g.ldx))
      EXPECT_EQ(dy.download(), got) << what << ": gemv dispatches to the GEMM";
    dy.upload(y0);  // the gemv path: at most kGemvCols rows a call
    for (int64_t b0 = 0; b0 < g.n; b0 += model::kGemvCols)
      model::gemv(dw.get(), true, g.rows, g.cols, dx.get() + b0 * g.ldx, dy.get() + b0 * g.rows,
                  accumulate, std::min<int64_t>(model::kGemvCols, g.n - b0), g.ldx);
    const std::vector<float> gv = dy.download();
    EXPECT_EQ(dy.damaged_guard_bytes(), 0u) << what;
    double worst = 0, worst_gemv = 0;
    for (int64_t b = 0; b < g.n; ++b)
      for (int64_t r = 0; r < g.rows; ++r) {
        double ref = 0, mag = 0;
        for (int64_t c = 0; c < g.cols; ++c) {
          const double p =
              static_cast<double>(bf16_bits_to_float(w[static_cast<size_t>(r * g.cols + c)])) *
              x[static_cast<size_t>(b * g.ldx + c)];
          ref += p;
          mag += std::fabs(p);
        }
        const size_t at = static_cast<size_t>(b * g.rows + r);
        const double base = accumulate ? y0[at] : 0.0;
        const double add = accumulate ? 0x1p-24 * (std::fabs(base) + mag) : 0.0;
        const double bound = 2 * gemm::gemm_rel_bound(g.cols) * mag + add;
        const double gemv_bound = static_cast<double>(g.cols) * 0x1p-24 * mag + add;
        ASSERT_TRUE(std::isfinite(got[at])) << what << " row " << b << " out " << r;
        worst = std::max(worst, std::fabs(got[at] - (base + ref)) / bound);
        worst_gemv = std::max(worst_gemv, std::fabs(got[at] - gv[at]) / (bound + gemv_bound));
      }
    EXPECT_LE(worst, 1.0) << what << ": |gemm - double| / bound";
    EXPECT_LE(worst_gemv, 1.0) << what << ": |gemm - gemv| / bound";
    RecordProperty(what + " error/bound", std::to_string(worst));
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, GemmBf16Device,
                         ::testing::Values(GemmCase{960, 576, 64, 576, "smollm2_qkv_b64"},
                                           GemmCase{3072, 576, 64, 576, "smollm2_gate_up_b64"},
                                           GemmCase{576, 1536, 64, 3072, "smollm2_down_b64"},
                                           GemmCase{70, 40, 9, 40, "ragged_70x40_b9"},
                                           GemmCase{70, 576, 100, 580, "ragged_70x576_b100"}),
                         [](const ::testing::TestParamInfo<GemmCase>& i) { return i.param.name; });

TEST(GemmBf16DeviceErrors, BadShapesRefused) {
  KVQ_SKIP_WITHOUT_DEVICE();
  GuardedBuffer<uint16_t> dw(64 * 64);
  GuardedBuffer<float> dx(64 * 64), dy(64 * 64);
  try {
    model::gemm_bf16(dw.get(), 64, 60, dx.get(), dy.get(), false, 16, 60);
    ADD_FAILURE() << "cols 60 accepted";
  } catch (const std::exception& ex) {
    EXPECT_NE(std::string(ex.what()).find("gemm_bf16: bad shape [64, 60]"), std::string::npos)
        << ex.what();
  }
}

}  // namespace
}  // namespace kvq::cuda
