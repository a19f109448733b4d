// cache/side.h with rot= and sink= (issue 15): what each option stores, from its
// definition. Sinks: the first S tokens read back bit-exact, and the rest is exactly what the
// scheme without sinks stores for tokens S.. (a second cache fed only those tokens). Rotation:
// with no quantization it is invisible to attention up to float rounding; with per-token int4
// keys that have outlier channels it lowers the error (what it is for). round_trip (the whole-
// tensor path of `kvq quant` / `compare`) stores what the streaming side stores, bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "cache/round_trip.h"
#include "cache/side.h"
#include "core/footprint.h"
#include "core/stored_side.h"
#include "evaluation/synthetic.h"
#include "reference_cpu/attention.h"
#include "reference_cpu/metrics.h"
#include "tests/support/random.h"

namespace kvq {
namespace {

Tensor3 rows(const Tensor3& x, int64_t t0, int64_t t1) {
  Tensor3 y({t1 - t0, x.shape.heads, x.shape.dim});
  const int64_t row = x.shape.heads * x.shape.dim;
  std::copy(x.data.begin() + t0 * row, x.data.begin() + t1 * row, y.data.begin());
  return y;
}

void feed(SideStore& s, const Tensor3& x, const std::vector<int64_t>& chunks) {
  const int64_t row = x.shape.heads * x.shape.dim;
  int64_t t = 0;
  for (size_t i = 0; t < x.shape.tokens; ++i) {
    const int64_t n = std::min(chunks[i % chunks.size()], x.shape.tokens - t);
    s.append(x.data.data() + t * row, n);
    t += n;
  }
}

bool same_bits(const float* a, const float* b, int64_t n) {
  return std::memcmp(a, b, static_cast<size_t>(n) * sizeof(float)) == 0;
}

TEST(Sinks, FirstTokensExactRestAsSchemeFromTokenS) {
  const Tensor3 x = synthetic_kv({{70, 2, 64}, 2, 12.0f, 5});
  for (const char* spec :
       {"kivi2:g=8,r=8", "fp8_e4m3:gran=tensor,first=16", "int4:k=token,v=token"})
    for (Role role : {Role::Key, Role::Value}) {
      SCOPED_TRACE(std::string(spec) + (role == Role::Key ? " key" : " value"));
      const SchemeSpec base = parse_spec(spec), with = parse_spec(std::string(spec) + ",sink=5");
      auto s = make_side(with, role, 2, 64);
      feed(*s, x, {3, 4, 30});
      auto own = make_side(base, role, 2, 64);
      feed(*own, rows(x, 5, 70), {30});
      const Tensor3 got = s->dequantize(), rest = own->dequantize();
      const int64_t row = 2 * 64;
      EXPECT_EQ(s->tokens(), 70);
      EXPECT_TRUE(same_bits(got.data.data(), x.data.data(), 5 * row)) << "sinks not exact";
      EXPECT_TRUE(same_bits(got.data.data() + 5 * row, rest.data.data(), 65 * row));
      EXPECT_FALSE(same_bits(got.data.data() + 5 * row, x.data.data() + 5 * row, 65 * row))
          << "vacuous: the scheme stored the rest exactly";
      EXPECT_EQ(s->quantized_tokens_at(3), 3);
      EXPECT_EQ(s->quantized_tokens_at(70), 5 + own->quantized_tokens_at(65));
      const Footprint f = s->footprint(), g = footprint(with, role, x.shape);
      EXPECT_EQ(f.total_bytes(), g.total_bytes());
      EXPECT_EQ(f.residual_elements, g.residual_elements);
      // The whole-tensor path stores the same.
      const RoundTrip r = round_trip(with, role, x);
      EXPECT_TRUE(same_bits(r.values.data.data(), got.data.data(), 70 * row));
    }
}

// core/footprint.h: what a stored view holds, counted from the view alone (the cpu kernels' L3
// rule), equals what the spec form counts for the scheme that wrote it, field by field, at a token
// count that leaves a partial window (the spec form is checked by hand in tests/core).
TEST(Footprint, StoredViewCountsWhatItsSpecCounts) {
  const Tensor3 x = synthetic_kv({{77, 2, 64}, 2, 12.0f, 5});
  for (const char* spec :
       {"fp32", "bf16", "fp16", "kivi2", "kivi4:g=32,r=64,sym", "kivi2:g=8,r=8,sink=5",
        "int4:k=token,v=token,g=16", "int8:k=token,v=token,g=32,sym", "fp8_e4m3:gran=token",
        "fp8_e5m2:gran=channel,first=16", "fp8_e4m3:gran=head,first=8,sink=3",
        "fp8_e4m3:gran=tensor,first=40", "fp8_e4m3:gran=token,scale=1"})
    for (Role role : {Role::Key, Role::Value}) {
      SCOPED_TRACE(std::string(spec) + (role == Role::Key ? " key" : " value"));
      const SchemeSpec sp = parse_spec(spec);
      auto s = make_side(sp, role, 2, 64);
      feed(*s, x, {5, 30});
      const Footprint got = footprint(s->stored()), want = footprint(sp, role, x.shape);
      EXPECT_EQ(got.code_bytes, want.code_bytes);
      EXPECT_EQ(got.scale_bytes, want.scale_bytes);
      EXPECT_EQ(got.zero_bytes, want.zero_bytes);
      EXPECT_EQ(got.residual_bytes, want.residual_bytes);
      EXPECT_EQ(got.quantized_elements, want.quantized_elements);
      EXPECT_EQ(got.residual_elements, want.residual_elements);
    }
  // Dynamic fp8 scales of a granularity wider than a token hold their first tokens exact until
  // `first` have arrived: the view then holds floats, by hand 10 x 2 x 64 x 4 B.
  auto p = make_side(parse_spec("fp8_e4m3:gran=channel,first=16"), Role::Key, 2, 64);
  p->append(x.data.data(), 10);
  EXPECT_EQ(footprint(p->stored()).total_bytes(), 5120.0);
}

TEST(Rotation, RoundTripEqualsStreamingSide) {
  const Tensor3 x = synthetic_kv({{50, 3, 64}, 2, 12.0f, 6});
  for (const char* spec : {"int4:k=token,v=token,g=32,rot=hadamard:3",
                           "kivi2:g=8,r=16,rot=hadamard,sink=3", "fp8:gran=channel,rot=hadamard:9"})
    for (Role role : {Role::Key, Role::Value}) {
      SCOPED_TRACE(spec);
      const SchemeSpec sp = parse_spec(spec);
      const Tensor3 a = round_trip(sp, role, x).values, b = make_side(sp, role, x)->dequantize();
      EXPECT_TRUE(same_bits(a.data.data(), b.data.data(), x.shape.numel()));
    }
}

// Attention over rotated / sink fp32 sides equals the plain fp32 cache's up to float rounding
// (the rotation is orthonormal; the sinks store the same values).
TEST(Rotation, InvisibleToAttentionWithoutQuantization) {
  const Tensor3 k = synthetic_kv({{90, 2, 96}, 2, 12.0f, 7}),
                v = synthetic_kv({{90, 2, 96}, 0, 1.0f, 8});
  const std::vector<float> q = testing::random_q(6 * 96, 9);
  std::vector<float> want(6 * 96), got(6 * 96);
  decode_attention(q.data(), 6, *make_side(parse_spec("fp32"), Role::Key, k),
                   *make_side(parse_spec("fp32"), Role::Value, v), want.data());
  for (const char* spec : {"fp32:rot=hadamard", "fp32:rot=hadamard:4,sink=7", "fp32:sink=90"}) {
    SCOPED_TRACE(spec);
    const SchemeSpec sp = parse_spec(spec);
    decode_attention(q.data(), 6, *make_side(sp, Role::Key, k), *make_side(sp, Role::Value, v),
                     got.data());
    double err = 0;
    for (size_t i = 0; i < got.size(); ++i)
      err = std::max(err, std::fabs(double(got[i]) - want[i]));
    EXPECT_LT(err, 1e-5);
    if (std::string(spec).find("rot") != std::string::npos) {
      EXPECT_GT(err, 0.0) << "not rotated";
    }
  }
}

// What rotation is for: per-token int4 keys with x12 outlier channels lose less after a
// Hadamard rotation spreads those channels over the head (QuaRot's argument), for both sign rules.
TEST(Rotation, LowersPerTokenErrorOnOutlierChannels) {
  const Tensor3 k = synthetic_kv({{256, 2, 64}, 2, 12.0f, 10});
  auto nmse = [&](const char* spec) {
    return recon_metrics(k.data, round_trip(parse_spec(spec), Role::Key, k).values.data).nmse;
  };
  const double plain = nmse("int4:k=token,v=token,g=64");
  EXPECT_LT(nmse("int4:k=token,v=token,g=64,rot=hadamard"), 0.5 * plain);
  EXPECT_LT(nmse("int4:k=token,v=token,g=64,rot=hadamard:1"), 0.5 * plain);
}

}  // namespace
}  // namespace kvq
