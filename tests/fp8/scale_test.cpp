// Tests for fp8/scale.{h,cpp}: scale layouts and values per granularity, constant and calibrated
// scales, the calibration file reader, and the quantize/dequantize error bound.
//
// Where expected values come from: amax per group is computed by hand in the comments below;
// scales are amax / max_finite with max_finite from REFERENCE.md section 2 (448, 240, 57344);
// codes come from the independent reference encoder in tests/fp8/fp8_ref.h (format definition);
// the error bound is half an fp8 ulp at |x / s|, from the format definition.
#include "fp8/scale.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "core/error.h"
#include "tests/fp8/fp8_ref.h"
#include "tests/support/expect_error.h"

namespace kvq {
/// Readable gtest parameter output (found by ADL) instead of a byte dump.
[[maybe_unused]] static void PrintTo(Granularity g, std::ostream* os) { *os << to_string(g); }
}  // namespace kvq

namespace kvq::fp8 {
namespace {

using test::Fp8Def;
namespace fs = std::filesystem;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// ---- the hand-built tensor [T=3, H=2, D=4] --------------------------------------------------
//
//   t0 h0:   1     0     3    -4        t0 h1:  0.5   8   -0.25   1
//   t1 h0:  -7     0     2     1        t1 h1:  3    -1   16     -2
//   t2 h0:   0    -0     0     0        t2 h1: -32    4    1      0.125
//
// amax by hand:
//   tensor  [1]: 32
//   head    [2]: h0 7, h1 32
//   token   [6]: t0h0 4, t0h1 8, t1h0 7, t1h1 16, t2h0 0 (all zero -> scale 1), t2h1 32
//   channel [8]: h0: d0 7, d1 0 (all zero -> scale 1), d2 3, d3 4;  h1: d0 32, d1 8, d2 16, d3 2
Tensor3 hand_tensor() {
  Tensor3 x(Shape3{3, 2, 4});
  x.data = {1, 0,  3,  -4, 0.5f, 8,     -0.25f, 1, -7,  0, 2, 1,
            3, -1, 16, -2, 0,    -0.0f, 0,      0, -32, 4, 1, 0.125f};
  return x;
}

std::vector<float> hand_amax(Granularity g) {
  switch (g) {
    case Granularity::Tensor:
      return {32};
    case Granularity::Head:
      return {7, 32};
    case Granularity::Token:
      return {4, 8, 7, 16, 0, 32};
    case Granularity::Channel:
      return {7, 0, 3, 4, 32, 8, 16, 2};
  }
  return {};
}

/// The layout from scale.h's header comment, written out here (not scale_index).
size_t layout_index(Granularity g, int64_t t, int64_t h, int64_t d, Shape3 s) {
  switch (g) {
    case Granularity::Tensor:
      return 0;
    case Granularity::Head:
      return static_cast<size_t>(h);
    case Granularity::Token:
      return static_cast<size_t>(t * s.heads + h);
    case Granularity::Channel:
      return static_cast<size_t>(h * s.dim + d);
  }
  return 0;
}

/// REFERENCE section 2: s = amax / max_finite; an all-zero group gets 1.
float expected_scale(float amax, const Fp8Def& f) {
  return amax == 0.0f ? 1.0f : amax / static_cast<float>(f.max_finite);
}

Fp8Spec dynamic_spec(const Fp8Def& f, Granularity g) {
  Fp8Spec s;
  s.format = f.format;
  s.gran = g;
  s.source = ScaleSource::Dynamic;
  return s;
}

const std::vector<Granularity> kGrans = {Granularity::Tensor, Granularity::Head, Granularity::Token,
                                         Granularity::Channel};

using FormatGran = std::tuple<Fp8Def, Granularity>;
std::string format_gran_name(const ::testing::TestParamInfo<FormatGran>& p) {
  return std::string(std::get<0>(p.param).name) + "_" +
         std::string(to_string(std::get<1>(p.param)));
}

class ScaleGran : public ::testing::TestWithParam<FormatGran> {};

// Expected: hand amax above / max_finite; codes from the reference encoder applied to
// x / s with s picked by the layout written out above; dequantized values s * decoded value.
TEST_P(ScaleGran, HandTensorScalesCodesAndValues) {
  const auto& [f, g] = GetParam();
  const Tensor3 x = hand_tensor();
  const Fp8Spec spec = dynamic_spec(f, g);
  const std::vector<float> scales = compute_scales(spec, Role::Key, x);
  const std::vector<float> amax = hand_amax(g);
  ASSERT_EQ(scales.size(), amax.size());
  ASSERT_EQ(scale_count(g, x.shape), static_cast<int64_t>(amax.size()));
  for (size_t i = 0; i < amax.size(); ++i)
    EXPECT_EQ(float_bits(scales[i]), float_bits(expected_scale(amax[i], f))) << "scale " << i;

  std::vector<uint8_t> codes;
  quantize(spec, scales, x, codes);
  ASSERT_EQ(codes.size(), x.data.size());
  Tensor3 y(x.shape);
  dequantize(spec, scales, codes, y);
  const test::RefEncoder ref(f);
  int checked = 0, nonzero = 0;
  for (int64_t t = 0; t < 3; ++t)
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t d = 0; d < 4; ++d) {
        const float s = expected_scale(amax[layout_index(g, t, h, d, x.shape)], f);
        const size_t i = static_cast<size_t>((t * 2 + h) * 4 + d);
        const uint8_t want = ref(x.data[i] / s);
        EXPECT_EQ(codes[i], want) << "t" << t << " h" << h << " d" << d;
        const float back = s * static_cast<float>(test::ref_decode(f, want));
        EXPECT_EQ(float_bits(y.data[i]), float_bits(back)) << "t" << t << " h" << h << " d" << d;
        nonzero += y.data[i] != 0.0f;
        ++checked;
      }
  EXPECT_EQ(checked, 24);
  // 18 nonzero inputs; the smallest, 0.125 at the tensor scale, is 0.125 * 448 / 32 = 1.75 (e4m3),
  // 0.9375 (fnuz), 224 (e5m2): nothing flushes to zero.
  EXPECT_EQ(nonzero, 18);
}

// Expected: with amax = max_finite the scale is exactly 1, and the group's amax element maps to
// the max code (hand: 448 / (448 / 448) = 448).
TEST_P(ScaleGran, AmaxElementMapsToMaxCode) {
  const auto& [f, g] = GetParam();
  Tensor3 x(Shape3{2, 2, 3});
  for (size_t i = 0; i < x.data.size(); ++i) x.data[i] = static_cast<float>(f.max_finite);
  x.data[0] = -static_cast<float>(f.max_finite);
  const Fp8Spec spec = dynamic_spec(f, g);
  const std::vector<float> scales = compute_scales(spec, Role::Value, x);
  for (float s : scales) EXPECT_EQ(s, 1.0f);
  std::vector<uint8_t> codes;
  quantize(spec, scales, x, codes);
  const test::RefEncoder ref(f);
  for (size_t i = 0; i < codes.size(); ++i) EXPECT_EQ(codes[i], ref(x.data[i])) << i;
  EXPECT_EQ(codes.size(), 12u);
}

// Expected: a NaN anywhere in a group (here in the middle, with larger values after it) makes
// that group's scale NaN, and only that group's; hand layout: x(0,1,2) is in token group 1,
// channel group 6, head group 1, the tensor group.
TEST_P(ScaleGran, NaNReachesOnlyItsGroupScale) {
  const auto& [f, g] = GetParam();
  Tensor3 x = hand_tensor();
  x.at(0, 1, 2) = kNaN;
  const std::vector<float> scales = compute_scales(dynamic_spec(f, g), Role::Key, x);
  const size_t nan_group = layout_index(g, 0, 1, 2, x.shape);
  const std::vector<float> amax = hand_amax(g);
  ASSERT_EQ(scales.size(), amax.size());
  for (size_t i = 0; i < scales.size(); ++i) {
    if (i == nan_group)
      EXPECT_TRUE(std::isnan(scales[i])) << i;
    else
      EXPECT_EQ(scales[i], expected_scale(amax[i], f)) << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Fp8Scale, ScaleGran,
                         ::testing::Combine(::testing::ValuesIn(test::fp8_defs()),
                                            ::testing::ValuesIn(kGrans)),
                         format_gran_name);

class ScaleFormat : public ::testing::TestWithParam<Fp8Def> {};

// Expected: a constant scale is the one scale for every granularity (vLLM's default 1.0; here
// 0.25 so the division is exact), and codes are the reference encoder of x / 0.25.
TEST_P(ScaleFormat, ConstantScaleIgnoresGranularity) {
  const Fp8Def& f = GetParam();
  const Tensor3 x = hand_tensor();
  const test::RefEncoder ref(f);
  int checked = 0;
  for (Granularity g : kGrans) {
    Fp8Spec spec = dynamic_spec(f, g);
    spec.source = ScaleSource::Constant;
    spec.constant = 0.25f;
    const std::vector<float> scales = compute_scales(spec, Role::Key, x);
    ASSERT_EQ(scales, std::vector<float>{0.25f});
    std::vector<uint8_t> codes;
    quantize(spec, scales, x, codes);
    Tensor3 y(x.shape);
    dequantize(spec, scales, codes, y);
    for (size_t i = 0; i < x.data.size(); ++i) {
      EXPECT_EQ(codes[i], ref(x.data[i] * 4.0f)) << to_string(g) << " " << i;
      EXPECT_EQ(y.data[i], 0.25f * static_cast<float>(test::ref_decode(f, codes[i])));
      ++checked;
    }
  }
  EXPECT_EQ(checked, 4 * 24);
}

// Expected: a group whose amax / max_finite underflows to 0 (amax = 3 * 2^-149) must not divide
// 0 by 0: no NaN code, zeros stay zero codes, and the tiny value does not saturate.
TEST_P(ScaleFormat, SubnormalGroupGivesNoNaN) {
  const Fp8Def& f = GetParam();
  Tensor3 x(Shape3{1, 1, 4});
  const float tiny = 3 * std::numeric_limits<float>::denorm_min();
  x.data = {0, tiny, -tiny, 0};
  const Fp8Spec spec = dynamic_spec(f, Granularity::Token);
  const std::vector<float> scales = compute_scales(spec, Role::Key, x);
  ASSERT_EQ(scales.size(), 1u);
  EXPECT_GT(scales[0], 0.0f);
  std::vector<uint8_t> codes;
  quantize(spec, scales, x, codes);
  Tensor3 y(x.shape);
  dequantize(spec, scales, codes, y);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_FALSE(std::isnan(y.data[i])) << i;
    EXPECT_NE(codes[i], f.nan_code) << i;
    EXPECT_LT(std::fabs(y.data[i]), 1e-30f) << i;
  }
  EXPECT_EQ(codes[0], 0x00);
  EXPECT_EQ(codes[3], 0x00);
}

/// Half an fp8 ulp at magnitude v (v <= max finite), from the definition: the spacing is
/// min_subnormal below the smallest normal 2^(1-bias), else 2^(floor(log2 v) - mant_bits).
double half_ulp(const Fp8Def& f, double v) {
  const double min_normal = std::ldexp(1.0, 1 - f.bias);
  v = std::min(v, f.max_finite);
  if (v < min_normal) return f.min_subnormal / 2;
  return std::ldexp(1.0, std::ilogb(v) - f.mant_bits) / 2;
}

// Expected: for every element |x - x'| <= s * half_ulp(|x / s|) (round to nearest), plus two
// float roundings (x / s and s * q) of at most 2^-24 |x| each: kFloatRounding.
TEST_P(ScaleGran, RoundTripErrorWithinHalfUlp) {
  const auto& [f, g] = GetParam();
  constexpr double kFloatRounding = 0x1p-23;
  const Shape3 shape{37, 3, 72};
  Tensor3 x(shape);
  std::mt19937 rng(1234);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& v : x.data) v = normal(rng);
  for (int64_t t = 0; t < shape.tokens; ++t) x.at(t, 1, 5) *= 100.0f;  // an outlier channel
  for (int64_t d = 0; d < shape.dim; ++d) x.at(4, 2, d) = 0.0f;        // an all-zero token group
  x.at(7, 0, 3) = 1e-40f;                                              // a float subnormal
  const Fp8Spec spec = dynamic_spec(f, g);
  const std::vector<float> scales = compute_scales(spec, Role::Key, x);
  std::vector<uint8_t> codes;
  quantize(spec, scales, x, codes);
  Tensor3 y(shape);
  dequantize(spec, scales, codes, y);
  int64_t checked = 0;
  double sumsq = 0, worst_ratio = 0;
  for (int64_t t = 0; t < shape.tokens; ++t)
    for (int64_t h = 0; h < shape.heads; ++h)
      for (int64_t d = 0; d < shape.dim; ++d) {
        const double s = scales[layout_index(g, t, h, d, shape)];
        const double xv = x.at(t, h, d), yv = y.at(t, h, d);
        ASSERT_TRUE(std::isfinite(yv));
        const double bound = s * half_ulp(f, std::fabs(xv) / s) + kFloatRounding * std::fabs(xv);
        const double err = std::fabs(xv - yv);
        ASSERT_LE(err, bound) << "t" << t << " h" << h << " d" << d << " x=" << xv << " x'=" << yv;
        worst_ratio = std::max(worst_ratio, err / bound);
        sumsq += yv * yv;
        ++checked;
      }
  EXPECT_EQ(checked, shape.numel());
  EXPECT_GT(sumsq, 0.0);
  EXPECT_GT(worst_ratio, 0.5);  // the bound is tight: some element rounds by about half an ulp
}

template <Fp8Format F>
void expect_elementwise(const Fp8Spec& spec, const std::vector<float>& sc, const Tensor3& x,
                        const std::vector<uint8_t>& codes, const Tensor3& y, int64_t* checked) {
  const Shape3 s = x.shape;
  for (int64_t t = 0; t < s.tokens; ++t)
    for (int64_t h = 0; h < s.heads; ++h)
      for (int64_t d = 0; d < s.dim; ++d) {
        const size_t i = static_cast<size_t>((t * s.heads + h) * s.dim + d);
        const float scale = sc[layout_index(spec.gran, t, h, d, s)];
        ASSERT_EQ(codes[i], quantize_value<F>(x.data[i], scale))
            << "t" << t << " h" << h << " d" << d;
        ASSERT_EQ(float_bits(y.data[i]), float_bits(dequantize_value<F>(codes[i], scale)))
            << "t" << t << " h" << h << " d" << d;
        ++*checked;
      }
}

// Expected: the per-element formulas of scale.h (quantize_value / dequantize_value with the
// scale picked by the layout written out above). fp8::quantize / dequantize loop by rows and
// look decoded values up in a table; this proves those loops give identical codes and values.
TEST_P(ScaleGran, RowLoopsEqualElementwiseFormulas) {
  const auto& [f, g] = GetParam();
  int64_t checked = 0;
  for (const Shape3 shape : {Shape3{1, 1, 1}, Shape3{5, 3, 7}, Shape3{37, 2, 72}}) {
    Tensor3 x(shape);
    std::mt19937 rng(77);
    std::normal_distribution<float> normal(0.0f, 3.0f);
    for (float& v : x.data) v = normal(rng);
    x.data[x.data.size() / 2] = -0.0f;
    const Fp8Spec spec = dynamic_spec(f, g);
    const std::vector<float> sc = compute_scales(spec, Role::Key, x);
    std::vector<uint8_t> codes;
    quantize(spec, sc, x, codes);
    Tensor3 y(shape);
    dequantize(spec, sc, codes, y);
    switch (f.format) {
      case Fp8Format::E4M3:
        expect_elementwise<Fp8Format::E4M3>(spec, sc, x, codes, y, &checked);
        break;
      case Fp8Format::E4M3FNUZ:
        expect_elementwise<Fp8Format::E4M3FNUZ>(spec, sc, x, codes, y, &checked);
        break;
      case Fp8Format::E5M2:
        expect_elementwise<Fp8Format::E5M2>(spec, sc, x, codes, y, &checked);
        break;
    }
  }
  EXPECT_EQ(checked, 1 + 5 * 3 * 7 + 37 * 2 * 72);
}

// Expected: a scale vector of the wrong length is a kvq::Error naming both counts (it would
// otherwise be read out of bounds).
TEST_P(ScaleGran, WrongScaleCountIsAnError) {
  const auto& [f, g] = GetParam();
  const Tensor3 x = hand_tensor();
  const Fp8Spec spec = dynamic_spec(f, g);
  std::vector<float> sc(static_cast<size_t>(scale_count(g, x.shape)) + 1, 1.0f);
  std::vector<uint8_t> codes;
  EXPECT_THROW(quantize(spec, sc, x, codes), Error);
  codes.assign(x.data.size(), 0);
  Tensor3 y(x.shape);
  EXPECT_THROW(dequantize(spec, sc, codes, y), Error);
}

INSTANTIATE_TEST_SUITE_P(Fp8Format, ScaleFormat, ::testing::ValuesIn(test::fp8_defs()),
                         [](const ::testing::TestParamInfo<Fp8Def>& p) {
                           return std::string(p.param.name);
                         });

// ---- calibration files ---------------------------------------------------------------------

class Calib : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("kvq_scale_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& text) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path) << text;
    return path;
  }
  fs::path dir_;
};

const char* kValid = R"({"kvq_calibration": 1, "model": "tiny", "source": "wiki.txt",
  "layers": [ {"k_amax": [2, 4], "v_amax": [3, 5]}, {"k_amax": [8, 1], "v_amax": [6, 7.5]} ]})";

/// Expects fn to throw kvq::Error (one line) whose message contains every piece.
void expect_error(const std::function<void()>& fn, const std::vector<std::string>& pieces) {
  const std::string msg = kvq::testing::expect_error(fn, pieces.front());
  if (msg.empty()) return;
  for (const std::string& p : pieces)
    EXPECT_NE(msg.find(p), std::string::npos) << "'" << msg << "' lacks '" << p << "'";
}

// Expected: the numbers written in kValid.
TEST_F(Calib, ReadsValidFile) {
  const Calibration c = read_calibration(write("ok.json", kValid));
  EXPECT_EQ(c.model, "tiny");
  EXPECT_EQ(c.source, "wiki.txt");
  EXPECT_EQ(c.k_amax, (std::vector<std::vector<float>>{{2, 4}, {8, 1}}));
  EXPECT_EQ(c.v_amax, (std::vector<std::vector<float>>{{3, 5}, {6, 7.5f}}));
}

// Expected: what was written reads back unchanged.
TEST_F(Calib, WriteThenReadRoundTrips) {
  Calibration c;
  c.model = "m";
  c.source = "s";
  c.k_amax = {{0.1f, 1e-20f, 3e30f}};
  c.v_amax = {{7, 8, 9}};
  const std::string path = (dir_ / "w.json").string();
  write_calibration(path, c);
  const Calibration r = read_calibration(path);
  EXPECT_EQ(r.k_amax, c.k_amax);
  EXPECT_EQ(r.v_amax, c.v_amax);
  EXPECT_EQ(r.model, "m");
}

// Expected (hand): gran=tensor, layer 1, keys: max(8, 1) / max_finite; gran=head, layer 0,
// values: [3, 5] / max_finite; for each format.
TEST_F(Calib, ScalesFromCalibration) {
  const std::string path = write("ok.json", kValid);
  const Tensor3 x(Shape3{5, 2, 8});
  int checked = 0;
  for (const Fp8Def& f : test::fp8_defs()) {
    Fp8Spec spec = dynamic_spec(f, Granularity::Tensor);
    spec.source = ScaleSource::Calib;
    spec.calib_path = path;
    EXPECT_EQ(compute_scales(spec, Role::Key, x, 1), std::vector<float>{expected_scale(8, f)});
    spec.gran = Granularity::Head;
    EXPECT_EQ(compute_scales(spec, Role::Value, x, 0),
              (std::vector<float>{expected_scale(3, f), expected_scale(5, f)}));
    EXPECT_EQ(compute_scales(spec, Role::Value, x, 1),
              (std::vector<float>{expected_scale(6, f), expected_scale(7.5f, f)}));
    checked += 3;
  }
  EXPECT_EQ(checked, 9);
}

// Issue 14: vLLM's names. k_scale / v_scale are E4M3 scales (amax / 448): one per layer (vLLM's
// checkpoints) or one per head. Expected (hand): amax = scale x 448; an E4M3 gran=tensor scale
// read back is the file's scale (to the float rounding of x 448 / 448: within an ulp); a per-layer
// scale serves every head.
TEST_F(Calib, VllmScaleNames_perLayerOrPerHead) {
  const std::string path = write("vllm.json", R"({"kvq_calibration": 1, "layers": [
    {"k_scale": 0.25, "v_scale": [0.5, 0.125]}, {"k_scale": 0.0078125, "v_amax": [3, 5]}]})");
  const Calibration c = read_calibration(path);
  EXPECT_EQ(c.k_amax, (std::vector<std::vector<float>>{{112}, {3.5f}}));
  EXPECT_EQ(c.v_amax, (std::vector<std::vector<float>>{{224, 56}, {3, 5}}));
  Fp8Spec spec;
  spec.format = Fp8Format::E4M3;
  spec.source = ScaleSource::Calib;
  spec.calib_path = path;
  const Tensor3 x(Shape3{5, 2, 8});
  EXPECT_EQ(compute_scales(spec, Role::Key, x, 0), std::vector<float>{0.25f});
  spec.gran = Granularity::Head;
  EXPECT_EQ(compute_scales(spec, Role::Key, x, 1), (std::vector<float>{0.0078125f, 0.0078125f}));
  expect_error(
      [&] {
        read_calibration(write("bad.json", R"({"kvq_calibration": 1, "layers": [
    {"k_scale": -1, "v_scale": 1}]})"));
      },
      {"bad.json", "layers[0].k_scale[0]"});
}

// Expected: each malformed file is rejected with kvq::Error naming the file and the bad part.
TEST_F(Calib, RejectsMalformedFiles) {
  struct Bad {
    const char* name;
    const char* text;
    const char* says;
  };
  const std::vector<Bad> bad = {
      {"not_json", "{\"kvq_calibration\": 1, ", "not valid JSON"},
      {"not_object", "[1, 2]", "kvq_calibration"},
      {"missing_key", R"({"layers": [{"k_amax": [1], "v_amax": [1]}]})", "kvq_calibration"},
      {"wrong_version", R"({"kvq_calibration": 2, "layers": [{"k_amax": [1], "v_amax": [1]}]})",
       "version 2"},
      {"no_layers", R"({"kvq_calibration": 1})", "\"layers\""},
      {"empty_layers", R"({"kvq_calibration": 1, "layers": []})", "\"layers\""},
      {"missing_v", R"({"kvq_calibration": 1, "layers": [{"k_amax": [1]}]})", "layers[0].v_amax"},
      {"negative_amax",
       R"({"kvq_calibration": 1, "layers": [{"k_amax": [1, -2], "v_amax": [1, 1]}]})",
       "layers[0].k_amax[1]"},
      {"zero_amax", R"({"kvq_calibration": 1, "layers": [{"k_amax": [1], "v_amax": [0]}]})",
       "layers[0].v_amax[0]"},
      {"nan_amax", R"({"kvq_calibration": 1, "layers": [{"k_amax": ["NaN"], "v_amax": [1]}]})",
       "layers[0].k_amax[0]"},
      {"inf_amax", R"({"kvq_calibration": 1, "layers": [{"k_amax": [1e999], "v_amax": [1]}]})",
       "not valid JSON"},
      {"float_overflow_amax",
       R"({"kvq_calibration": 1, "layers": [{"k_amax": [1e300], "v_amax": [1]}]})",
       "layers[0].k_amax[0]"},
      {"float_underflow_amax",
       R"({"kvq_calibration": 1, "layers": [{"k_amax": [1], "v_amax": [1e-300]}]})",
       "layers[0].v_amax[0]"},
      {"ragged_heads",
       R"({"kvq_calibration": 1, "layers": [{"k_amax": [1, 2], "v_amax": [1, 2]},
                                           {"k_amax": [1, 2, 3], "v_amax": [1, 2, 3]}]})",
       "layers[1].k_amax has 3 heads"},
      {"k_v_heads_differ",
       R"({"kvq_calibration": 1, "layers": [{"k_amax": [1, 2], "v_amax": [1]}]})",
       "layers[0].v_amax has 1 heads"},
      // fuzz finding (session 27): a number where the model's name goes threw nlohmann's
      // type_error, not kvq::Error
      {"model_not_string",
       R"({"kvq_calibration": 1, "model": 2.0, "layers": [{"k_amax": [1], "v_amax": [1]}]})",
       "\"model\" must be a string"},
      {"source_not_string",
       R"({"kvq_calibration": 1, "source": [1], "layers": [{"k_amax": [1], "v_amax": [1]}]})",
       "\"source\" must be a string"},
  };
  int checked = 0;
  for (const Bad& b : bad) {
    SCOPED_TRACE(b.name);
    const std::string path = write(std::string(b.name) + ".json", b.text);
    expect_error([&] { read_calibration(path); }, {path, b.says});
    ++checked;
  }
  const std::string missing = (dir_ / "missing.json").string();
  expect_error([&] { read_calibration(missing); }, {missing});
  EXPECT_EQ(checked, 17);
}

// Expected: calibration misuse is rejected naming the value: layer out of range, head count
// mismatch with the tensor, and token/channel granularity (the file has per-head amax only).
TEST_F(Calib, RejectsMisuse) {
  const std::string path = write("ok.json", kValid);
  Fp8Spec spec = dynamic_spec(test::fp8_defs()[0], Granularity::Head);
  spec.source = ScaleSource::Calib;
  spec.calib_path = path;
  const Tensor3 x2(Shape3{4, 2, 8}), x3(Shape3{4, 3, 8});
  expect_error([&] { compute_scales(spec, Role::Key, x2, 2); }, {path, "layer 2"});
  expect_error([&] { compute_scales(spec, Role::Key, x2, -1); }, {path, "layer -1"});
  expect_error([&] { compute_scales(spec, Role::Value, x3, 0); }, {path, "2 heads", "has 3"});
  for (Granularity g : {Granularity::Token, Granularity::Channel}) {
    spec.gran = g;
    expect_error([&] { compute_scales(spec, Role::Key, x2, 0); },
                 {path, std::string(to_string(g))});
  }
}

}  // namespace
}  // namespace kvq::fp8
