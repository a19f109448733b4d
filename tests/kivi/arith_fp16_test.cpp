// arith=fp16, KIVI's own reference arithmetic (kivi/minmax.h minmax_params_fp16 / encode_fp16).
// Expected codes, scales and minima come from tests/fixtures/kivi_fp16_arith.json, written by
// experiments/plots/make_kivi_fixtures.py: KIVI's quant_and_pack_kcache / quant_and_pack_vcache
// re-run in numpy float16 (an implementation sharing nothing with kvq). The hand-computed cases
// show the two places KIVI's arithmetic differs from kvq's exact definition.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "core/spec.h"
#include "kernels/cpu/kivi.h"
#include "kivi/cache.h"
#include "kivi/group.h"
#include "kivi/layout.h"

namespace kvq::kivi {
namespace {

using nlohmann::json;

const json& fixtures() {
  static const json doc = [] {
    std::ifstream in(std::string(KVQ_SOURCE_DIR) + "/tests/fixtures/kivi_fp16_arith.json");
    if (!in) throw Error("tests/fixtures/kivi_fp16_arith.json is missing");
    return json::parse(in);
  }();
  return doc;
}

// The codes, scales and minima a SideCache holds for the whole of x (r=0: nothing stays exact).
struct Stored {
  std::vector<uint32_t> codes;  // [T][H][D]
  std::vector<uint16_t> scales, mins;
};

Stored quantize(const std::string& spec_text, Role role, const std::vector<float>& x, int64_t T,
                int64_t H, int64_t D, const GroupQuantizers& q) {
  const SchemeSpec spec = parse_spec(spec_text);
  SideCache cache(spec.q(), role, H, D, q);
  cache.append(x.data(), T);
  EXPECT_EQ(cache.quantized_tokens(), T);
  Stored s;
  s.scales.assign(cache.scales().begin(), cache.scales().end());
  s.mins.assign(cache.mins().begin(), cache.mins().end());
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t d = 0; d < D; ++d)
        s.codes.push_back(spec.q().axis(role) == Axis::Channel
                              ? cache.channel_layout().code(cache.words().data(), t, h, d)
                              : cache.token_layout().code(cache.words().data(), t, h, d));
  return s;
}

// Every fixture case, code for code, on the reference group loops and on backend cpu's.
TEST(kiviArithFp16, matchesKiviFixture_allCases_refAndCpuQuantizers) {
  const json& doc = fixtures();
  ASSERT_EQ(doc["cases"].size(), 6u);
  for (const json& c : doc["cases"]) {
    const int bits = c["bits"];
    const std::string axis = c["axis"];
    const int64_t T = c["shape"][0], H = c["shape"][1], D = c["shape"][2];
    std::vector<float> x;
    for (uint16_t h : c["x_fp16_bits"].get<std::vector<uint16_t>>())
      x.push_back(half_bits_to_float(h));
    const Role role = axis == "channel" ? Role::Key : Role::Value;
    const std::string spec =
        fmt::format("int{}:k=channel,v=token,g={},r=0,arith=fp16", bits, c["group"].get<int>());
    const auto codes = c["codes"].get<std::vector<uint32_t>>();
    const auto scales = c["scale_fp16_bits"].get<std::vector<uint16_t>>();
    const auto mins = c["min_fp16_bits"].get<std::vector<uint16_t>>();
    for (bool cpu : {false, true}) {
      SCOPED_TRACE(fmt::format("{} {} backend {}", spec, axis, cpu ? "cpu" : "ref"));
      const Stored s =
          quantize(spec, role, x, T, H, D, cpu ? cpu::kivi_group_quantizers() : GroupQuantizers{});
      ASSERT_EQ(s.codes.size(), codes.size());
      int64_t bad = 0;
      for (size_t i = 0; i < codes.size(); ++i) bad += s.codes[i] != codes[i];
      EXPECT_EQ(bad, 0) << "codes differing from KIVI's";
      EXPECT_EQ(s.scales, scales);
      EXPECT_EQ(s.mins, mins);
    }
  }
}

// The exact arithmetic does not reproduce the fixture (so the test above can tell them apart).
TEST(kiviArithFp16, exactArithmeticDiffersFromKivi_onFixture) {
  const json& c = fixtures()["cases"][0];
  ASSERT_EQ(c["bits"], 2);
  ASSERT_EQ(c["axis"], "channel");
  const int64_t T = c["shape"][0], H = c["shape"][1], D = c["shape"][2];
  std::vector<float> x;
  for (uint16_t h : c["x_fp16_bits"].get<std::vector<uint16_t>>())
    x.push_back(half_bits_to_float(h));
  const Stored s = quantize("int2:k=channel,v=token,g=32,r=0", Role::Key, x, T, H, D, {});
  const auto codes = c["codes"].get<std::vector<uint32_t>>();
  const auto scales = c["scale_fp16_bits"].get<std::vector<uint16_t>>();
  ASSERT_EQ(s.codes.size(), codes.size());
  ASSERT_EQ(s.scales.size(), scales.size());
  int64_t code_diff = 0, scale_diff = 0;
  for (size_t i = 0; i < codes.size(); ++i) code_diff += s.codes[i] != codes[i];
  for (size_t i = 0; i < scales.size(); ++i) scale_diff += s.scales[i] != scales[i];
  EXPECT_GT(code_diff + scale_diff, 0);
}

TEST(kiviArithFp16, quotientRoundedToFp16_crossesTie_b2) {
  // Hand-computed, 2 bits, group {0, 3.001953125, 1.5009765625} (all fp16 values; fp16's ulp is
  // 2^-10 in [1, 2) and 2^-9 in [2, 4)). Both arithmetics: min 0, range 3.001953125 (exact in
  // fp16), scale fp16(3.001953125 / 3 = 1.000651) = 1.0009765625 (0.67 ulp above 1 rounds up).
  // Exact: 1.5009765625 / 1.0009765625 = 1537 / 1025 = 1.4995122, below the tie 1.5 -> code 1.
  // KIVI: that quotient rounded to fp16 is 1.5 (it is 0.4995 ulp below 1.5), and round(1.5)
  // is 2 (half to even) -> code 2. 3.001953125 / 1.0009765625 = 3074 / 1025 = 2.99902 rounds to
  // 3.0 (0.4995 ulp below) -> code 3 in both.
  const float g[3] = {0.0f, 3.001953125f, 1.5009765625f};
  uint32_t exact_w = 0, kivi_w = 0;
  uint16_t es, em, ks, km;
  quantize_group(g, 1, 3, 2, false, &exact_w, &es, &em);
  quantize_group_fp16(g, 1, 3, 2, &kivi_w, &ks, &km);
  EXPECT_EQ(half_bits_to_float(es), 1.0009765625f);
  EXPECT_EQ(ks, es);
  EXPECT_EQ(em, 0u);
  EXPECT_EQ(km, 0u);
  EXPECT_EQ(unpack_one(&exact_w, 2, 2), 1u);
  EXPECT_EQ(unpack_one(&kivi_w, 2, 2), 2u);
  EXPECT_EQ(unpack_one(&kivi_w, 1, 2), 3u);
  EXPECT_EQ(unpack_one(&kivi_w, 0, 2), 0u);
}

// Hand-computed: a zero scale. A constant group gives 0 / 0 (code 0); a range whose third
// rounds to 0 in fp16 gives +inf for every element above the min (code 3), as KIVI's CUDA run.
TEST(kiviArithFp16, zeroScale_constantAndUnderflowingRange) {
  const float c[4] = {1.25f, 1.25f, 1.25f, 1.25f};
  uint32_t w = 0xffffffffu;
  uint16_t s, m;
  quantize_group_fp16(c, 1, 4, 2, &w, &s, &m);
  EXPECT_EQ(s, 0u);
  EXPECT_EQ(half_bits_to_float(m), 1.25f);
  EXPECT_EQ(w, 0u);
  // Range 2^-24 (the smallest subnormal): 2^-24 / 3 rounds to 0 in fp16.
  const float u[4] = {0.0f, 0x1p-24f, 0.0f, 0x1p-24f};
  quantize_group_fp16(u, 1, 4, 2, &w, &s, &m);
  EXPECT_EQ(s, 0u);
  EXPECT_EQ(m, 0u);
  EXPECT_EQ(unpack_one(&w, 0, 2), 0u);
  EXPECT_EQ(unpack_one(&w, 1, 2), 3u);
  EXPECT_EQ(unpack_one(&w, 3, 2), 3u);
}

// Input beyond fp16's range makes the group NaN (visible), as in the exact arithmetic.
TEST(kiviArithFp16, beyondFp16Range_nanParams) {
  const float g[2] = {0.0f, 70000.0f};
  uint32_t w = 0;
  uint16_t s, m;
  quantize_group_fp16(g, 1, 2, 4, &w, &s, &m);
  EXPECT_EQ(s, kHalfNaN);
  EXPECT_EQ(m, kHalfNaN);
}

TEST(kiviArithFp16, spec_canonicalAndErrors) {
  EXPECT_EQ(parse_spec("kivi2:arith=fp16").canonical(), "kivi2:g=32,r=128,arith=fp16");
  EXPECT_EQ(parse_spec("kivi2:arith=exact").canonical(), "kivi2:g=32,r=128");
  EXPECT_EQ(parse_spec("int4:k=channel,v=token,arith=fp16").q().arith, Arith::Fp16);
  EXPECT_THROW(parse_spec("kivi2:arith=bf16"), Error);
  EXPECT_THROW(parse_spec("kivi2:sym,arith=fp16"), Error);
  EXPECT_THROW(parse_spec("fp8_e4m3:arith=fp16"), Error);
}

}  // namespace
}  // namespace kvq::kivi
