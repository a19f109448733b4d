// Attention over every cache kind (reference_cpu/attention.h).
//
// Expected values: a naive attention loop written here in double precision over the tensors the
// scheme's own whole-tensor reference (reference_cpu/quantize.h round_trip) reads back. The code
// under test never builds those tensors: it reads codes directly.
#include "reference_cpu/attention.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>

#include "cache/round_trip.h"
#include "core/error.h"
#include "evaluation/synthetic.h"
#include "fp8/scale.h"
#include "tests/support/names.h"
#include "tests/support/random.h"

namespace kvq {
namespace {

// Float accumulation (scores over D <= 128 channels, outputs over T <= 1000 tokens) against the
// double reference: outputs are convex combinations of V rows, so errors are measured relative to
// max |V|. 2e-5 leaves ~100x margin over float's 2^-24 per operation on these sizes.
constexpr double kAttnTol = 2e-5;
// Prefill and token-by-token decode read the same stored values through different loops.
constexpr double kPathTol = 2e-5;

std::vector<double> naive_attention(const std::vector<float>& q, int64_t q_heads, const Tensor3& k,
                                    const Tensor3& v, int64_t t_end) {
  const int64_t H = k.shape.heads, D = k.shape.dim, ratio = q_heads / H;
  std::vector<double> out(static_cast<size_t>(q_heads * D), 0.0);
  for (int64_t j = 0; j < q_heads; ++j) {
    const int64_t h = j / ratio;
    std::vector<double> s(static_cast<size_t>(t_end));
    double mx = -INFINITY;
    for (int64_t t = 0; t < t_end; ++t) {
      double a = 0;
      for (int64_t d = 0; d < D; ++d)
        a += static_cast<double>(q[static_cast<size_t>(j * D + d)]) * k.at(t, h, d);
      s[static_cast<size_t>(t)] = a / std::sqrt(static_cast<double>(D));
      mx = std::max(mx, s[static_cast<size_t>(t)]);
    }
    double z = 0;
    for (double& x : s) z += x = std::exp(x - mx);
    for (int64_t t = 0; t < t_end; ++t)
      for (int64_t d = 0; d < D; ++d)
        out[static_cast<size_t>(j * D + d)] += s[static_cast<size_t>(t)] / z * v.at(t, h, d);
  }
  return out;
}

using kvq::testing::random_q;

double max_abs(const std::vector<float>& x) {
  double m = 0;
  for (float v : x) m = std::max(m, static_cast<double>(std::fabs(v)));
  return m;
}

struct Case {
  std::string spec;
  int64_t tokens, heads, dim, gqa;
};

std::string case_name(const ::testing::TestParamInfo<Case>& i) {
  return kvq::testing::test_name(i.param.spec) + "_T" + std::to_string(i.param.tokens) + "_H" +
         std::to_string(i.param.heads) + "_D" + std::to_string(i.param.dim) + "_gqa" +
         std::to_string(i.param.gqa);
}

void PrintTo(const Case& c, std::ostream* os) {
  *os << c.spec << " T=" << c.tokens << " H=" << c.heads << " D=" << c.dim << " gqa=" << c.gqa;
}

// A one-layer calibration file for the calib: specs (amax 30 for keys, 5 for values, per head).
std::string calib_path(int64_t heads) {
  const auto path = std::filesystem::temp_directory_path() /
                    ("kvq_attention_calib_h" + std::to_string(heads) + ".json");
  fp8::Calibration c;
  c.model = "test";
  c.k_amax = {std::vector<float>(static_cast<size_t>(heads), 30.0f)};
  c.v_amax = {std::vector<float>(static_cast<size_t>(heads), 5.0f)};
  fp8::write_calibration(path.string(), c);
  return path.string();
}

SchemeSpec spec_of(const Case& c) {
  std::string s = c.spec;
  const auto at = s.find("CALIB");
  if (at != std::string::npos) s.replace(at, 5, calib_path(c.heads));
  return parse_spec(s);
}

class AttentionOverCache : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    const Case& c = GetParam();
    SyntheticSpec ks{{c.tokens, c.heads, c.dim}, 2, 12.0f, 11};
    SyntheticSpec vs{{c.tokens, c.heads, c.dim}, 0, 1.0f, 12};
    k_ = synthetic_kv(ks);
    v_ = synthetic_kv(vs);
    q_ = random_q(c.heads * c.gqa * c.dim, 13);
    spec_ = spec_of(c);
  }
  Tensor3 k_, v_;
  std::vector<float> q_;
  SchemeSpec spec_;
};

TEST_P(AttentionOverCache, DecodeEqualsNaiveOverDequantized) {
  const Case& c = GetParam();
  const auto ks = make_side(spec_, Role::Key, k_), vs = make_side(spec_, Role::Value, v_);
  const Tensor3 kd = round_trip(spec_, Role::Key, k_).values,
                vd = round_trip(spec_, Role::Value, v_).values;
  // The cache stores what the whole-tensor reference stores, bit for bit.
  ASSERT_EQ(ks->dequantize().data.size(), kd.data.size());
  EXPECT_EQ(0, std::memcmp(ks->dequantize().data.data(), kd.data.data(), kd.data.size() * 4));
  EXPECT_EQ(0, std::memcmp(vs->dequantize().data.data(), vd.data.data(), vd.data.size() * 4));
  const int64_t qh = c.heads * c.gqa;
  std::vector<float> o(static_cast<size_t>(qh * c.dim), NAN);
  for (int threads : {1, 2}) {
    decode_attention(q_.data(), qh, *ks, *vs, o.data(), threads);
    const auto ref = naive_attention(q_, qh, kd, vd, c.tokens);
    double err = 0, norm = 0;
    for (size_t i = 0; i < o.size(); ++i) {
      ASSERT_TRUE(std::isfinite(o[i])) << i;
      err = std::max(err, std::fabs(o[i] - ref[i]));
      norm += ref[i] * ref[i];
    }
    EXPECT_GT(norm, 0.0) << "vacuous: zero output";
    EXPECT_LE(err, kAttnTol * max_abs(vd.data)) << "threads " << threads;
  }
}

TEST_P(AttentionOverCache, PrefillEqualsTokenByTokenDecode) {
  const Case& c = GetParam();
  const int64_t qh = c.heads * c.gqa, T = c.tokens, D = c.dim;
  std::vector<float> qs = random_q(T * qh * D, 21);
  const auto ks = make_side(spec_, Role::Key, k_), vs = make_side(spec_, Role::Value, v_);
  std::vector<float> pre(static_cast<size_t>(T * qh * D), NAN);
  prefill_attention(qs.data(), qh, *ks, *vs, k_, v_, pre.data(), 2);
  // Every scheme streams: append one token at a time. FP8 dynamic tensor/head/channel scales come
  // from the first min(first, T) tokens in both caches (the one-shot cache is its own prefill).
  SchemeSpec streamed = spec_;
  if (streamed.kind() == SchemeKind::Fp8)
    streamed.fp8().first = std::min<int>(streamed.fp8().first, static_cast<int>(T));
  auto k1 = make_side(streamed, Role::Key, c.heads, D),
       v1 = make_side(streamed, Role::Value, c.heads, D);
  const double tol = kPathTol * max_abs(v_.data);
  std::vector<float> o(static_cast<size_t>(qh * D));
  int64_t checked = 0;
  for (int64_t i = 0; i < T; ++i) {
    k1->append(k_.data.data() + i * c.heads * D, 1);
    v1->append(v_.data.data() + i * c.heads * D, 1);
    decode_attention(qs.data() + i * qh * D, qh, *k1, *v1, o.data(), 1);
    for (int64_t j = 0; j < qh * D; ++j) {
      ASSERT_NEAR(pre[static_cast<size_t>(i * qh * D + j)], o[static_cast<size_t>(j)], tol)
          << "position " << i << " element " << j;
      ++checked;
    }
  }
  EXPECT_EQ(checked, T * qh * D);
}

const std::vector<std::string> kSpecs = {"fp32",
                                         "bf16",
                                         "fp16",
                                         "fp8_e4m3:gran=tensor",
                                         "fp8_e4m3:gran=head",
                                         "fp8_e4m3:gran=token",
                                         "fp8_e4m3:gran=channel",
                                         "fp8_e5m2:gran=token",
                                         "fp8_e4m3fnuz:gran=head",
                                         "fp8_e4m3:scale=0.05",
                                         "fp8_e4m3:gran=head,scale=calib:CALIB",
                                         "kivi2",
                                         "kivi3",
                                         "kivi4",
                                         "kivi8",
                                         "kivi2:g=32,r=0",
                                         "kivi4:g=16,r=32,sym",
                                         "int2:k=token,v=token",
                                         "int4:k=channel,v=channel,g=16,r=32",
                                         "int3:k=token,v=channel,g=8,sym",
                                         "int8:k=token,v=token,g=dim"};

std::vector<Case> cases() {
  std::vector<Case> out;
  for (const auto& s : kSpecs) {
    out.push_back({s, 37, 2, 64, 4});
    out.push_back({s, 300, 1, 72, 3});  // T not a multiple of G or R; head_dim with a short group
  }
  for (int64_t gqa : {1, 8}) out.push_back({"kivi2", 161, 2, 64, gqa});
  out.push_back({"kivi4", 1, 2, 64, 4});  // a single token: all in the window
  out.push_back({"int2:k=token,v=token,g=32,r=0", 1, 1, 128, 1});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Schemes, AttentionOverCache, ::testing::ValuesIn(cases()), case_name);

TEST(AttentionMetrics, IdenticalCachesGiveZeroAndKivi2WorseThanFp8) {
  SyntheticSpec ks{{400, 2, 64}, 2, 12.0f, 3};
  SyntheticSpec vs{{400, 2, 64}, 0, 1.0f, 4};
  const Tensor3 k = synthetic_kv(ks), v = synthetic_kv(vs);
  const auto q = random_q(2 * 4 * 64, 5);
  const SchemeSpec f32 = parse_spec("fp32");
  const auto kr = make_side(f32, Role::Key, k), vr = make_side(f32, Role::Value, v);
  const auto same = attention_metrics(q.data(), 8, *kr, *vr, *kr, *vr, 16);
  EXPECT_EQ(same.kl, 0.0);
  EXPECT_EQ(same.output_nmse, 0.0);
  EXPECT_EQ(same.topk_overlap, 1.0);
  auto metrics_of = [&](const char* s) {
    const SchemeSpec sp = parse_spec(s);
    return attention_metrics(q.data(), 8, *kr, *vr, *make_side(sp, Role::Key, k),
                             *make_side(sp, Role::Value, v), 16);
  };
  const auto f8 = metrics_of("fp8_e4m3:gran=token"), k2 = metrics_of("kivi2:g=32,r=0");
  EXPECT_GT(f8.kl, 0.0);
  EXPECT_GT(k2.kl, f8.kl);
  EXPECT_GT(k2.output_nmse, f8.output_nmse);
  EXPECT_LE(k2.topk_overlap, f8.topk_overlap);
}

TEST(Attention, BadShapesAreErrors) {
  const auto k = make_side(parse_spec("fp32"), Role::Key, 2, 8),
             v = make_side(parse_spec("fp32"), Role::Value, 2, 8);
  std::vector<float> q(3 * 8), o(3 * 8);
  EXPECT_THROW(decode_attention(q.data(), 3, *k, *v, o.data()), Error);  // empty cache
  std::vector<float> x(2 * 8, 1.0f);
  k->append(x.data(), 1);
  v->append(x.data(), 1);
  EXPECT_THROW(decode_attention(q.data(), 3, *k, *v, o.data()), Error);  // 3 % 2 != 0
}

}  // namespace
}  // namespace kvq
