// The dense layers' tensor-core GEMM on the device (kernels/cuda/model_kernels.h gemm_bf16, the
// arithmetic in kernels/cuda/gemm_bf16.h, emulated on the CPU by
// tests/kernels/cuda/gemm_bf16_test.cpp). Expected values: (1) a double-precision GEMM on the host
// of the same bf16 weights and float32 x, within 2 x gemm_rel_bound(cols) x sum |w x| (twice the
// emulated launch's bound: PTX leaves the rounding inside an mma's sum unspecified); (2) the gemv
// path (model::gemv with tensor_cores false: the CUDA-core kernel, float32 FMAs, same rows) within
// that bound plus the gemv's own float32 rounding, cols x 2^-24 x sum |w x|; (3) gemv at the
// threshold or above, which dispatches to the GEMM, bit for bit, and a second launch bit for bit
// (no atomics). Guard bytes around y catch writes past the rows. Shapes: SmolLM2-135M's matrices at
// batch 64 (q|k|v, gate|up, down read from g|u at ldx 2 ffn), ragged rows and batches (70 outputs,
// 9 and 100 rows: partial tiles, an idle warp, two block rows), a k tail (cols 40); on a GPU of
// more than ~16 SMs every case but 70x40 runs split-K (gemm_slice_tiles: down 12 slices on an
// H200), so the reduce is checked too.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "core/half.h"
#include "kernels/cuda/gemm_bf16.h"
#include "kernels/cuda/model_kernels.h"
#include "tests/cuda/cuda_test_util.h"
#include "tests/kernels/cuda/gemm_ref.h"

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
    dy.upload(y0);  // the gemv path: CUDA cores, float32 FMAs, at the same rows
    model::gemv(dw.get(), true, g.rows, g.cols, dx.get(), dy.get(), accumulate, g.n, g.ldx, false);
    const std::vector<float> gv = dy.download();
    EXPECT_EQ(dy.damaged_guard_bytes(), 0u) << what;
    double worst = 0, worst_gemv = 0;
    for (int64_t b = 0; b < g.n; ++b)
      for (int64_t r = 0; r < g.rows; ++r) {
        const auto [ref, mag] = gemm_ref::dot(w, x, g.cols, g.ldx, b, r);
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

// Timings (recorded, not asserted; scripts/device-check.sh keeps each binary's JSON):
// SmolLM2-135M's five products at 64 rows, the GEMM against the gemv on CUDA cores, CUDA events
// over 20 launches after 3 warm-up launches, each launch's weights read from DRAM (copies
// of them round-robin over 128 MB, as a step's layers are). Properties: <name>_{gemm,gemv}_us a
// launch, and the GEMM's weight-stream GB/s.
TEST(GemmBf16DeviceTiming, SmolLM2ProductsAtBatch64) {
  KVQ_SKIP_WITHOUT_DEVICE();
  struct P {
    const char* name;
    int64_t rows, cols, ldx, count;  // count: how many a decode step runs (30 layers, 1 head)
  };
  const P ps[] = {{"qkv", 960, 576, 576, 30},
                  {"o", 576, 576, 576, 30},
                  {"gate_up", 3072, 576, 576, 30},
                  {"down", 576, 1536, 3072, 30},
                  {"head", 49152, 576, 576, 1}};
  const int64_t n = 64;
  cudaEvent_t t0, t1;
  KVQ_CUDA_CHECK(cudaEventCreate(&t0));
  KVQ_CUDA_CHECK(cudaEventCreate(&t1));
  double step_gemm = 0, step_gemv = 0;
  for (const P& p : ps) {
    // copies of the weights round-robin over >= 128 MB (beyond the L2), so each launch reads its W
    // from DRAM as a decode step does (a layer's weights were last read 269 MB earlier)
    const int64_t wbytes = p.rows * p.cols * 2;
    const int copies =
        static_cast<int>(std::max<int64_t>(2, ((int64_t{128} << 20) + wbytes - 1) / wbytes));
    GuardedBuffer<uint16_t> dw(static_cast<size_t>(copies * p.rows * p.cols));
    GuardedBuffer<float> dx(static_cast<size_t>(n * p.ldx)), dy(static_cast<size_t>(n * p.rows));
    KVQ_CUDA_CHECK(cudaMemset(dw.get(), 0x3c, static_cast<size_t>(copies * p.rows * p.cols) * 2));
    KVQ_CUDA_CHECK(cudaMemset(dx.get(), 0x3c, static_cast<size_t>(n * p.ldx) * 4));
    auto time_us = [&](bool tc) {
      const int reps = 20, warm = 3;
      for (int i = 0; i < warm + reps; ++i) {
        if (i == warm) KVQ_CUDA_CHECK(cudaEventRecord(t0));
        model::gemv(dw.get() + (i % copies) * p.rows * p.cols, true, p.rows, p.cols, dx.get(),
                    dy.get(), false, n, p.ldx, tc);
      }
      KVQ_CUDA_CHECK(cudaEventRecord(t1));
      KVQ_CUDA_CHECK(cudaEventSynchronize(t1));
      float ms = 0;
      KVQ_CUDA_CHECK(cudaEventElapsedTime(&ms, t0, t1));
      return 1000.0 * ms / reps;
    };
    const double gemm_us = time_us(true), gemv_us = time_us(false);
    step_gemm += gemm_us * static_cast<double>(p.count);
    step_gemv += gemv_us * static_cast<double>(p.count);
    const double gbs = static_cast<double>(p.rows * p.cols * 2) / (gemm_us * 1e3);
    std::printf("%-8s [%lld, %lld] x 64 rows: gemm %.1f us (%.0f GB/s of W), gemv %.1f us\n",
                p.name, static_cast<long long>(p.rows), static_cast<long long>(p.cols), gemm_us,
                gbs, gemv_us);
    RecordProperty(std::string(p.name) + "_gemm_us", std::to_string(gemm_us));
    RecordProperty(std::string(p.name) + "_gemv_us", std::to_string(gemv_us));
    RecordProperty(std::string(p.name) + "_gemm_weight_gbs", std::to_string(gbs));
  }
  std::printf("a decode step's products at 64 rows: gemm %.0f us, gemv %.0f us\n", step_gemm,
              step_gemv);
  RecordProperty("step_products_gemm_us", std::to_string(step_gemm));
  RecordProperty("step_products_gemv_us", std::to_string(step_gemv));
  cudaEventDestroy(t0);
  cudaEventDestroy(t1);
}

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
