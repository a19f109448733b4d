// Tests for kernels/cpu/attention.h: backend cpu's decode attention against the reference
// (reference_cpu/attention.h decode_attention over the same stored bytes, read through
// SideStore::stored()). Every cache kind, GQA 1/3/4/8, head_dim 64/72/128 and a ragged 20 (the
// portable path), contexts that are not multiples of the block, the group or the residual window,
// one-token caches, 1 and 3 threads.
//
// Tolerance (exact mode): both sides are float arithmetic over the same values in a different
// order (and backend cpu's exp is a polynomial, ~2 ulp). Outputs are convex combinations of V
// rows, so the error is measured against max |V| (as tests/reference_cpu/attention_test.cpp
// does): kExactTol. A score error e changes a weight by a factor e^e, so the bound scales with
// the score magnitudes; these inputs (keys with x12 outlier channels) reach |s| ~ 30.
#include "kernels/cpu/attention.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "experiments/synthetic.h"
#include "kernels/cpu/isa.h"
#include "reference_cpu/attention.h"

namespace kvq::cpu {
namespace {

constexpr double kExactTol = 2e-5;

std::vector<float> random_q(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> q(static_cast<size_t>(n));
  for (float& x : q) x = nd(rng);
  return q;
}

struct Case {
  std::string spec;
  int64_t tokens, heads, dim;
  int gqa;
  int threads;
  bool fast;  // whether the SIMD path must take it (on an AVX2 build)
};

std::string name_of(const ::testing::TestParamInfo<Case>& i) {
  const Case& c = i.param;
  std::string s = c.spec;
  for (char& ch : s)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return s + "_T" + std::to_string(c.tokens) + "_H" + std::to_string(c.heads) + "_D" +
         std::to_string(c.dim) + "_gqa" + std::to_string(c.gqa) + "_thr" +
         std::to_string(c.threads);
}

struct Result {
  double max_err = 0, max_v = 0, out_norm = 0;
};

Result run(const Case& c, IntMode mode) {
  const SchemeSpec spec = parse_spec(c.spec);
  const Tensor3 kx = synthetic_kv({{c.tokens, c.heads, c.dim}, 2, 12.0f, 1});
  const Tensor3 vx = synthetic_kv({{c.tokens, c.heads, c.dim}, 0, 1.0f, 2});
  const auto k = make_side(spec, Role::Key, kx), v = make_side(spec, Role::Value, vx);
  const int64_t qh = c.heads * c.gqa;
  const auto q = random_q(qh * c.dim, 3);
  std::vector<float> want(static_cast<size_t>(qh * c.dim)), got(want.size() + 1, 7.0f);
  decode_attention(q.data(), qh, *k, *v, want.data());
  cpu::decode_attention(q.data(), qh, k->stored(), v->stored(), got.data(), {c.threads, mode});
  EXPECT_EQ(got.back(), 7.0f) << "wrote past the output";
  EXPECT_EQ(has_fast_path(k->stored(), v->stored(), qh), c.fast && kAvx2) << c.spec;
  Result r;
  for (float x : v->dequantize().data)
    r.max_v = std::max(r.max_v, std::fabs(static_cast<double>(x)));
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_TRUE(std::isfinite(got[i])) << i;
    r.max_err = std::max(r.max_err, std::fabs(static_cast<double>(got[i]) - want[i]));
    r.out_norm += static_cast<double>(got[i]) * got[i];
  }
  return r;
}

class cpuDecodeAttention : public ::testing::TestWithParam<Case> {};

TEST_P(cpuDecodeAttention, exactMode_withinTolOfReference) {
  const Result r = run(GetParam(), IntMode::Exact);
  EXPECT_GT(r.out_norm, 0.0);
  RecordProperty("err_over_max_v", std::to_string(r.max_err / r.max_v));
  EXPECT_LE(r.max_err, kExactTol * r.max_v) << "max err " << r.max_err << " max |V| " << r.max_v;
}

std::vector<Case> grid() {
  std::vector<Case> v;
  const char* fast_specs[] = {"fp32",
                              "bf16",
                              "fp16",
                              "fp8_e4m3:gran=token",
                              "fp8_e4m3:gran=tensor",
                              "fp8_e5m2:gran=channel",
                              "fp8_e4m3fnuz:gran=head",
                              "kivi2",
                              "kivi4",
                              "int8:k=channel,v=token,g=32,r=64",
                              "kivi2:g=64,r=128,sym",
                              "int3:k=channel,v=token,g=32,r=32"};
  for (const char* s : fast_specs) {
    const bool fast = std::string(s).rfind("int3", 0) != 0;  // 3-bit values: portable
    v.push_back({s, 1000, 2, 128, 4, 1, fast});
    v.push_back({s, 300, 3, 72, 3, 3, fast});
    v.push_back({s, 1, 2, 64, 8, 1, fast});
    v.push_back({s, 161, 1, 64, 1, 2, fast});
  }
  for (int gqa : {1, 3, 4, 8}) v.push_back({"kivi2", 555, 2, 128, gqa, 1, true});
  v.push_back({"kivi4", 1100, 2, 64, 4, 3, true});
  v.push_back({"bf16", 20, 2, 20, 4, 1, false});                               // ragged head_dim
  v.push_back({"kivi2:g=8,r=16", 45, 2, 20, 2, 1, false});                     // ragged head_dim
  v.push_back({"int4:k=token,v=channel,g=32,r=32", 300, 2, 64, 4, 1, false});  // mirror axes
  return v;
}

INSTANTIATE_TEST_SUITE_P(Grid, cpuDecodeAttention, ::testing::ValuesIn(grid()), name_of);

TEST(cpuDecodeAttentionErrors, mismatchedSidesAndBadGqa_throw) {
  const auto k = make_side(parse_spec("bf16"), Role::Key, synthetic_kv({{8, 2, 64}, 0, 1.0f, 1}));
  const auto v = make_side(parse_spec("bf16"), Role::Value, synthetic_kv({{9, 2, 64}, 0, 1.0f, 1}));
  std::vector<float> q(4 * 64), o(4 * 64);
  EXPECT_THROW(cpu::decode_attention(q.data(), 4, k->stored(), v->stored(), o.data()), Error);
  EXPECT_THROW(cpu::decode_attention(q.data(), 3, k->stored(), k->stored(), o.data()), Error);
}

}  // namespace
}  // namespace kvq::cpu
