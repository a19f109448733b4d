// Tests for kernels/cuda/fp8_kernels.cu against the CPU reference (fp8/scale.cpp).
//
// Where expected values come from: fp8::compute_scales, fp8::quantize and fp8::dequantize on the
// host (the spec, STYLE 1). Scales and codes must be bit-equal (STYLE 3); dequantized values too,
// since both sides evaluate the same single IEEE multiply. NaN compares equal to NaN only where
// the inputs hold a NaN (payloads may differ between CPU and GPU). Every output buffer has
// sentinel bytes on both sides that must survive (STYLE 4). Without a device, the device tests
// skip with a visible message; the configuration tests run everywhere.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "core/error.h"
#include "fp8/scale.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/fp8_kernels.cuh"
#include "tests/cuda/cuda_test_util.h"
#include "tests/support/expect_error.h"

namespace kvq {
/// Readable gtest parameter output (found by ADL) instead of a byte dump.
[[maybe_unused]] static void PrintTo(Granularity g, std::ostream* os) { *os << to_string(g); }
}  // namespace kvq

namespace kvq::cuda {
namespace {

using kvq::testing::expect_error;

using testing::GuardedBuffer;

bool same_float(float a, float b) {
  return (std::isnan(a) && std::isnan(b)) || float_bits(a) == float_bits(b);
}

std::string describe(float v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g (0x%08x)", static_cast<double>(v), float_bits(v));
  return buf;
}
std::string describe(uint8_t c) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%02x", c);
  return buf;
}

/// Counts mismatches of two vectors and reports the first few with their index.
template <typename T, typename Eq>
int64_t report_mismatches(const char* what, const std::vector<T>& got, const std::vector<T>& want,
                          Eq eq) {
  EXPECT_EQ(got.size(), want.size()) << what;
  int64_t bad = 0;
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
    if (eq(got[i], want[i])) continue;
    if (++bad <= 8)
      ADD_FAILURE() << what << "[" << i << "]: device " << describe(got[i]) << " cpu "
                    << describe(want[i]);
  }
  return bad;
}

/// Adversarial but finite input (STYLE 5): normal values, an outlier channel (d % 7 == 3, x40),
/// an all-zero token group (t=1, h=0), an all-zero channel (h=0, d=1), -0, float subnormals.
Tensor3 make_input(Shape3 s, uint32_t seed) {
  Tensor3 x(s);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t t = 0; t < s.tokens; ++t)
    for (int64_t h = 0; h < s.heads; ++h)
      for (int64_t d = 0; d < s.dim; ++d) x.at(t, h, d) = normal(rng) * (d % 7 == 3 ? 40.0f : 1.0f);
  if (s.tokens > 1)
    for (int64_t d = 0; d < s.dim; ++d) x.at(1, 0, d) = 0.0f;
  if (s.dim > 1)
    for (int64_t t = 0; t < s.tokens; ++t) x.at(t, 0, 1) = t % 2 ? -0.0f : 0.0f;
  if (s.dim > 2) x.at(0, 0, 2) = 1e-40f;
  if (s.heads > 1 && s.dim > 5) x.at(s.tokens - 1, s.heads - 1, 5) = -3e-42f;
  return x;
}

struct FormatName {
  Fp8Format format;
  const char* name;
};
void PrintTo(const FormatName& f, std::ostream* os) { *os << f.name; }
const FormatName kFormats[] = {
    {Fp8Format::E4M3, "e4m3"}, {Fp8Format::E4M3FNUZ, "e4m3fnuz"}, {Fp8Format::E5M2, "e5m2"}};
const Granularity kGrans[] = {Granularity::Tensor, Granularity::Head, Granularity::Token,
                              Granularity::Channel};

/// Runs scales + quantize + dequantize on the device and compares each stage with the CPU.
/// `nan_allowed`: the input holds NaN, so NaN outputs may differ in payload only.
/// `all_special`: every scale group holds a NaN or an infinity, so (by the definition: its scale
/// is NaN or inf, and code * scale is NaN or inf) no output is finite.
void run_and_compare(FormatName f, Granularity g, const Tensor3& x, bool nan_allowed,
                     bool all_special = false) {
  const Shape3 s = x.shape;
  Fp8Spec spec;
  spec.format = f.format;
  spec.gran = g;
  spec.source = ScaleSource::Dynamic;
  const std::vector<float> scales_ref = fp8::compute_scales(spec, Role::Key, x);
  std::vector<uint8_t> codes_ref;
  fp8::quantize(spec, scales_ref, x, codes_ref);
  Tensor3 y_ref(s);
  fp8::dequantize(spec, scales_ref, codes_ref, y_ref);

  const size_t n = x.data.size(), count = scales_ref.size();
  ASSERT_EQ(static_cast<int64_t>(count), fp8::scale_count(g, s));
  GuardedBuffer<float> dx(n), dscales(count), dy(n);
  GuardedBuffer<uint8_t> dcodes(n);
  dx.upload(x.data);
  KVQ_CUDA_CHECK(fp8_dynamic_scales(f.format, g, s, dx.get(), dscales.get()));
  KVQ_CUDA_CHECK(fp8_quantize(f.format, g, s, dx.get(), dscales.get(), dcodes.get()));
  KVQ_CUDA_CHECK(fp8_dequantize(f.format, g, s, dcodes.get(), dscales.get(), dy.get()));
  KVQ_CUDA_CHECK(cudaDeviceSynchronize());

  const auto bits_eq = [](float a, float b) { return float_bits(a) == float_bits(b); };
  const auto float_eq = [&](float a, float b) {
    return nan_allowed ? same_float(a, b) : bits_eq(a, b);
  };
  EXPECT_EQ(report_mismatches("scale", dscales.download(), scales_ref, float_eq), 0);
  EXPECT_EQ(report_mismatches("code", dcodes.download(), codes_ref,
                              [](uint8_t a, uint8_t b) { return a == b; }),
            0);
  const std::vector<float> y = dy.download();
  EXPECT_EQ(report_mismatches("dequantized", y, y_ref.data, float_eq), 0);
  EXPECT_EQ(dx.damaged_guard_bytes(), 0u) << "x";
  EXPECT_EQ(dscales.damaged_guard_bytes(), 0u) << "scales";
  EXPECT_EQ(dcodes.damaged_guard_bytes(), 0u) << "codes";
  EXPECT_EQ(dy.damaged_guard_bytes(), 0u) << "y";

  // Not vacuous: everything was compared, the output is not all zero, and (finite inputs) no
  // NaN / inf appeared; where every group is special, no output is finite.
  EXPECT_EQ(y.size(), n);
  double sumsq = 0;
  int64_t finite = 0;
  for (float v : y)
    if (std::isfinite(v)) {
      sumsq += static_cast<double>(v) * v;
      ++finite;
    } else {
      EXPECT_TRUE(nan_allowed) << "non-finite output " << v;
    }
  if (all_special)
    EXPECT_EQ(finite, 0);
  else if (n > 0)
    EXPECT_GT(sumsq, 0.0);
}

// ---- every format x granularity x odd shape -------------------------------------------------

using KernelCase = std::tuple<FormatName, Granularity, int64_t, int64_t, int64_t>;

class Fp8Kernel : public ::testing::TestWithParam<KernelCase> {
 protected:
  void SetUp() override { KVQ_SKIP_WITHOUT_DEVICE(); }
};

// Expected: the CPU reference on the same input (see the file comment).
TEST_P(Fp8Kernel, MatchesCpuReference) {
  const auto& [f, g, T, H, D] = GetParam();
  const Tensor3 x = make_input(Shape3{T, H, D}, static_cast<uint32_t>(T * 131 + H * 17 + D));
  run_and_compare(f, g, x, false);
}

std::string kernel_case_name(const ::testing::TestParamInfo<KernelCase>& p) {
  const auto& [f, g, T, H, D] = p.param;
  return std::string(f.name) + "_" + std::string(to_string(g)) + "_T" + std::to_string(T) + "_H" +
         std::to_string(H) + "_D" + std::to_string(D);
}

INSTANTIATE_TEST_SUITE_P(Shapes, Fp8Kernel,
                         ::testing::Combine(::testing::ValuesIn(kFormats),
                                            ::testing::ValuesIn(kGrans),
                                            ::testing::Values<int64_t>(1, 37, 1000),
                                            ::testing::Values<int64_t>(1, 3, 8),
                                            ::testing::Values<int64_t>(64, 72, 128)),
                         kernel_case_name);

// ---- special values and empty tensors --------------------------------------------------------

using FormatGran = std::tuple<FormatName, Granularity>;

class Fp8KernelSpecial : public ::testing::TestWithParam<FormatGran> {
 protected:
  void SetUp() override { KVQ_SKIP_WITHOUT_DEVICE(); }
};

/// [37, 3, dim] input with the special values: NaN in head 1, inf at the last channel of head 2,
/// -inf in head 0, a value near FLT_MAX, a subnormal-only row.
Tensor3 special_input(int64_t dim, uint32_t seed) {
  Tensor3 x = make_input(Shape3{37, 3, dim}, seed);
  x.at(5, 1, 10) = std::numeric_limits<float>::quiet_NaN();
  x.at(20, 2, dim - 1) = std::numeric_limits<float>::infinity();
  x.at(30, 0, 0) = -std::numeric_limits<float>::infinity();
  x.at(11, 2, 40) = 3e38f;
  for (int64_t d = 0; d < dim; ++d)
    x.at(36, 1, d) = (d % 3) * std::numeric_limits<float>::denorm_min();
  return x;
}

// Expected: the CPU reference; NaN makes its group's scale NaN, inf makes it inf, a value near
// FLT_MAX and a subnormal-only group (scale underflow) must match as well. Per tensor and per
// head every group holds a special value (heads 0, 1, 2: -inf, NaN, inf), so no output is finite
// there; per token and per channel most groups are ordinary.
TEST_P(Fp8KernelSpecial, NaNInfHugeAndSubnormalGroups) {
  const auto& [f, g] = GetParam();
  run_and_compare(f, g, special_input(72, 99), true,
                  g == Granularity::Tensor || g == Granularity::Head);
}

// Expected: the CPU reference, as above, with head_dim 64: fp8_quantize's chunked kernel (16
// codes a thread, 16-byte stores; D = 72 above takes the row kernel) on the same special values.
TEST_P(Fp8KernelSpecial, NaNInfHugeAndSubnormalGroupsChunked) {
  const auto& [f, g] = GetParam();
  run_and_compare(f, g, special_input(64, 98), true,
                  g == Granularity::Tensor || g == Granularity::Head);
}

// Expected: the CPU reference; T = 0 still has scales for tensor/head/channel (all 1: no data).
TEST_P(Fp8KernelSpecial, EmptyTensor) {
  const auto& [f, g] = GetParam();
  const Tensor3 x(Shape3{0, 3, 72});
  Fp8Spec spec;
  spec.format = f.format;
  spec.gran = g;
  const std::vector<float> want = fp8::compute_scales(spec, Role::Value, x);
  GuardedBuffer<float> dscales(want.size());
  KVQ_CUDA_CHECK(fp8_dynamic_scales(f.format, g, x.shape, nullptr, dscales.get()));
  KVQ_CUDA_CHECK(fp8_quantize(f.format, g, x.shape, nullptr, dscales.get(), nullptr));
  KVQ_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(report_mismatches("scale", dscales.download(), want,
                              [](float a, float b) { return float_bits(a) == float_bits(b); }),
            0);
  EXPECT_EQ(dscales.damaged_guard_bytes(), 0u);
}

INSTANTIATE_TEST_SUITE_P(Special, Fp8KernelSpecial,
                         ::testing::Combine(::testing::ValuesIn(kFormats),
                                            ::testing::ValuesIn(kGrans)),
                         [](const ::testing::TestParamInfo<FormatGran>& p) {
                           return std::string(std::get<0>(p.param).name) + "_" +
                                  std::string(to_string(std::get<1>(p.param)));
                         });

// ---- fused per-token dynamic quantize (fp8_quantize_dynamic_token) --------------------------

/// fp8_quantize_dynamic_token against the CPU reference at Granularity::Token
/// (fp8::compute_scales, fp8::quantize). `misalign`: x and codes start one element past a
/// 16-byte boundary (the one-warp-a-row kernel); the element before them must keep its sentinel.
void run_fused_and_compare(FormatName f, const Tensor3& x, bool nan_allowed, bool misalign) {
  const Shape3 s = x.shape;
  Fp8Spec spec;
  spec.format = f.format;
  spec.gran = Granularity::Token;
  spec.source = ScaleSource::Dynamic;
  const std::vector<float> scales_ref = fp8::compute_scales(spec, Role::Value, x);
  std::vector<uint8_t> codes_ref;
  fp8::quantize(spec, scales_ref, x, codes_ref);

  const size_t n = x.data.size(), count = scales_ref.size(), pad = misalign ? 1 : 0;
  ASSERT_EQ(static_cast<int64_t>(count), s.tokens * s.heads);
  GuardedBuffer<float> dx(n + pad), dscales(count);
  GuardedBuffer<uint8_t> dcodes(n + pad);
  std::vector<float> xh(pad, 0.0f);
  xh.insert(xh.end(), x.data.begin(), x.data.end());
  dx.upload(xh);
  KVQ_CUDA_CHECK(
      fp8_quantize_dynamic_token(f.format, s, dx.get() + pad, dscales.get(), dcodes.get() + pad));
  KVQ_CUDA_CHECK(cudaDeviceSynchronize());

  const auto float_eq = [&](float a, float b) {
    return nan_allowed ? same_float(a, b) : float_bits(a) == float_bits(b);
  };
  EXPECT_EQ(report_mismatches("scale", dscales.download(), scales_ref, float_eq), 0);
  std::vector<uint8_t> codes = dcodes.download();
  if (misalign) {
    EXPECT_EQ(codes[0], GuardedBuffer<uint8_t>::kSentinel) << "the byte before the codes";
    codes.erase(codes.begin());
  }
  EXPECT_EQ(
      report_mismatches("code", codes, codes_ref, [](uint8_t a, uint8_t b) { return a == b; }), 0);
  EXPECT_EQ(dscales.damaged_guard_bytes(), 0u) << "scales";
  EXPECT_EQ(dcodes.damaged_guard_bytes(), 0u) << "codes";
  // Not vacuous: every code was compared and some code is nonzero.
  EXPECT_EQ(codes.size(), n);
  bool any = false;
  for (uint8_t c : codes) any = any || (c & 0x7f) != 0;
  if (n > 0) EXPECT_TRUE(any);
}

using FusedCase = std::tuple<FormatName, int64_t, int64_t, int64_t, bool>;

class Fp8FusedToken : public ::testing::TestWithParam<FusedCase> {
 protected:
  void SetUp() override { KVQ_SKIP_WITHOUT_DEVICE(); }
};

// Expected: the CPU reference (fp8::compute_scales then fp8::quantize, per token), bit for bit.
// D covers every split of the register kernel (fp8_token_split.h): 16 (1 lane a row), 48 (3 of
// 4 lanes), 64 and 128 (the model shapes), 96 (6 of 8 lanes), 640 (2 chunks a lane, some lanes
// 1), 2048 (4 a lane); 72 and 2064 take the row kernel, as does every misaligned case. T = 37
// and 300 leave a partial last warp of rows.
TEST_P(Fp8FusedToken, MatchesCpuReference) {
  const auto& [f, T, H, D, misalign] = GetParam();
  const Tensor3 x = make_input(Shape3{T, H, D}, static_cast<uint32_t>(T * 7 + H * 3 + D));
  run_fused_and_compare(f, x, false, misalign);
}

std::string fused_case_name(const ::testing::TestParamInfo<FusedCase>& p) {
  const auto& [f, T, H, D, misalign] = p.param;
  return std::string(f.name) + "_T" + std::to_string(T) + "_H" + std::to_string(H) + "_D" +
         std::to_string(D) + (misalign ? "_misaligned" : "_aligned");
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, Fp8FusedToken,
    ::testing::Combine(::testing::ValuesIn(kFormats), ::testing::Values<int64_t>(1, 37, 300),
                       ::testing::Values<int64_t>(1, 3, 8),
                       ::testing::Values<int64_t>(16, 48, 64, 72, 96, 128, 640, 2048, 2064),
                       ::testing::Bool()),
    fused_case_name);

class Fp8FusedTokenSpecial : public ::testing::TestWithParam<FormatName> {
 protected:
  void SetUp() override { KVQ_SKIP_WITHOUT_DEVICE(); }
};

// Expected: the CPU reference on special_input (NaN, +-inf, near FLT_MAX, a subnormal-only row:
// NaN / inf / smallest-float scales), through the register kernel (D = 64) and the row kernel
// (D = 72); NaN scales may differ in payload only.
TEST_P(Fp8FusedTokenSpecial, NaNInfHugeAndSubnormalRows) {
  run_fused_and_compare(GetParam(), special_input(64, 97), true, false);
  run_fused_and_compare(GetParam(), special_input(72, 96), true, false);
}

// Expected: T = 0 writes nothing; D = 0 gives every (t, h) the scale 1 (amax 0, as
// fp8::scale_from_amax and the CPU reference) and no codes.
TEST_P(Fp8FusedTokenSpecial, EmptyTensors) {
  const FormatName f = GetParam();
  GuardedBuffer<float> dscales(6);
  KVQ_CUDA_CHECK(fp8_quantize_dynamic_token(f.format, Shape3{0, 3, 64}, nullptr, nullptr, nullptr));
  KVQ_CUDA_CHECK(
      fp8_quantize_dynamic_token(f.format, Shape3{2, 3, 0}, nullptr, dscales.get(), nullptr));
  KVQ_CUDA_CHECK(cudaDeviceSynchronize());
  Fp8Spec spec;
  spec.format = f.format;
  spec.gran = Granularity::Token;
  const std::vector<float> want = fp8::compute_scales(spec, Role::Value, Tensor3(Shape3{2, 3, 0}));
  EXPECT_EQ(report_mismatches("scale", dscales.download(), want,
                              [](float a, float b) { return float_bits(a) == float_bits(b); }),
            0);
  EXPECT_EQ(dscales.damaged_guard_bytes(), 0u);
}

INSTANTIATE_TEST_SUITE_P(Special, Fp8FusedTokenSpecial, ::testing::ValuesIn(kFormats),
                         [](const ::testing::TestParamInfo<FormatName>& p) {
                           return std::string(p.param.name);
                         });

// ---- configuration errors (host only: these run without a device) ----------------------------

// Expected: the offending value appears in the message (STYLE 9).
TEST(Fp8KernelConfig, BadConfigurationThrowsNamingTheValue) {
  float f = 0;
  uint8_t c = 0;
  const Shape3 ok{2, 2, 4};
  expect_error(
      [&] {
        (void)fp8_quantize(Fp8Format::E4M3, Granularity::Token, Shape3{-1, 2, 4}, &f, &f, &c);
      },
      "T=-1");
  expect_error(
      [&] {
        (void)fp8_dequantize(Fp8Format::E5M2, Granularity::Head, Shape3{2, -3, 4}, &c, &f, &f);
      },
      "H=-3");
  expect_error(
      [&] { (void)fp8_quantize(Fp8Format::E4M3, Granularity::Token, ok, nullptr, &f, &c); },
      "x is null");
  expect_error(
      [&] { (void)fp8_quantize(Fp8Format::E4M3, Granularity::Token, ok, &f, nullptr, &c); },
      "scales is null");
  expect_error(
      [&] { (void)fp8_dequantize(Fp8Format::E4M3, Granularity::Token, ok, &c, &f, nullptr); },
      "y is null");
  expect_error(
      [&] { (void)fp8_dynamic_scales(Fp8Format::E4M3, Granularity::Channel, ok, &f, nullptr); },
      "scales is null");
  expect_error(
      [&] { (void)fp8_quantize(static_cast<Fp8Format>(7), Granularity::Token, ok, &f, &f, &c); },
      "unknown Fp8Format value 7");
  expect_error(
      [&] { (void)fp8_dynamic_scales(Fp8Format::E4M3, static_cast<Granularity>(9), ok, &f, &f); },
      "unknown Granularity value 9");
  expect_error(
      [&] {
        (void)fp8_quantize_dynamic_token(Fp8Format::E4M3, Shape3{2, 2, -4}, &f, &f, &c);
      },
      "D=-4");
  expect_error([&] { (void)fp8_quantize_dynamic_token(Fp8Format::E4M3, ok, &f, nullptr, &c); },
               "scales is null but must hold 4 values");
  expect_error([&] { (void)fp8_quantize_dynamic_token(Fp8Format::E5M2, ok, &f, &f, nullptr); },
               "codes is null");
  expect_error([&] { (void)fp8_quantize_dynamic_token(static_cast<Fp8Format>(5), ok, &f, &f, &c); },
               "unknown Fp8Format value 5");
}

}  // namespace
}  // namespace kvq::cuda
