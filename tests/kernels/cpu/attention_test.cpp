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
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "evaluation/synthetic.h"
#include "fp8/format.h"
#include "fp8/scale.h"
#include "kernels/cpu/isa.h"
#include "kivi/layout.h"
#include "reference_cpu/attention.h"
#include "tests/support/names.h"
#include "tests/support/random.h"

namespace kvq::cpu {
namespace {

constexpr double kExactTol = 2e-5;

using kvq::testing::random_q;

struct Case {
  std::string spec;
  int64_t tokens, heads, dim;
  int gqa;
  int threads;
  bool fast;  // whether the SIMD path must take it (on an AVX2 build)
};

std::string name_of(const ::testing::TestParamInfo<Case>& i) {
  const Case& c = i.param;
  return kvq::testing::test_name(c.spec) + "_T" + std::to_string(c.tokens) + "_H" +
         std::to_string(c.heads) + "_D" + std::to_string(c.dim) + "_gqa" + std::to_string(c.gqa) +
         "_thr" + std::to_string(c.threads);
}

// A case's cache: synthetic keys with x12 outlier channels and plain values (experiments/
// synthetic.h), [tokens, heads, dim], stored by the case's scheme.
struct Sides {
  std::unique_ptr<SideStore> k, v;
};
Sides case_sides(const std::string& spec, int64_t tokens, int64_t heads, int64_t dim) {
  const SchemeSpec s = parse_spec(spec);
  return {make_side(s, Role::Key, synthetic_kv({{tokens, heads, dim}, 2, 12.0f, 1})),
          make_side(s, Role::Value, synthetic_kv({{tokens, heads, dim}, 0, 1.0f, 2}))};
}
Sides case_sides(const Case& c) { return case_sides(c.spec, c.tokens, c.heads, c.dim); }

struct Result {
  double max_err = 0, max_v = 0, out_norm = 0;
};

Result run(const Case& c, IntMode mode) {
  const auto [k, v] = case_sides(c);
  const int64_t qh = c.heads * c.gqa;
  const auto q = random_q(qh * c.dim, 3);
  std::vector<float> want(static_cast<size_t>(qh * c.dim)), got(want.size() + 1, 7.0f);
  decode_attention(q.data(), qh, *k, *v, want.data());
  cpu::decode_attention(q.data(), qh, k->stored(), v->stored(), got.data(), {c.threads, mode});
  EXPECT_EQ(got.back(), 7.0f) << "wrote past the output";
  EXPECT_EQ(has_fast_path(k->stored(), v->stored(), qh), c.fast && path().avx2) << c.spec;
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

// A ratio for RecordProperty, three significant digits.
std::string sig3(double x) {
  char b[32];
  std::snprintf(b, sizeof b, "%.3g", x);
  return b;
}

// Where the AMX tiles are granted, fp8 sides of GQA <= 5 and head_dim a multiple of 64 take them
// in the exact mode too (exact products, kernels/cpu/attention.h); both kernels must meet the
// tolerance, the vector ones run with the tiles switched off.
TEST_P(cpuDecodeAttention, exactMode_withinTolOfReference) {
  const bool was = cpu::amx();
  for (const bool tiles : {false, true}) {
    if (tiles && !cpu::amx_granted()) continue;
    SCOPED_TRACE(tiles ? "amx tiles" : "vector kernels");
    cpu::set_amx(tiles);
    const Result r = run(GetParam(), IntMode::Exact);
    EXPECT_GT(r.out_norm, 0.0);
    RecordProperty(tiles ? "amx_err_over_max_v" : "err_over_max_v", sig3(r.max_err / r.max_v));
    EXPECT_LE(r.max_err, kExactTol * r.max_v) << "max err " << r.max_err << " max |V| " << r.max_v;
  }
  cpu::set_amx(was);
}

// Where a call's sides exceed a sixth of the L3 (cpu::set_l3_bytes), a decode step streams them
// (dense sides through the address-order kernels with prefetch, int sides prefetching ahead);
// else it reads them as cached. The same arithmetic in another order of reads
// (kernels/cpu/attention.h): equal outputs, bit for bit, in both modes.
TEST_P(cpuDecodeAttention, streamedAndCached_sameBits) {
  const Case c = GetParam();
  if (!path().avx2 || !c.fast)
    GTEST_SKIP() << "the portable path has one order of reads: nothing to compare";
  const auto [k, v] = case_sides(c);
  const int64_t qh = c.heads * c.gqa;
  const auto q = random_q(qh * c.dim, 3);
  for (const IntMode mode : {IntMode::Exact, IntMode::Int8}) {
    std::vector<float> streamed(static_cast<size_t>(qh * c.dim)), cached(streamed.size());
    cpu::set_l3_bytes(0);  // every call streams
    cpu::decode_attention(q.data(), qh, k->stored(), v->stored(), streamed.data(),
                          {c.threads, mode});
    cpu::set_l3_bytes(int64_t{1} << 50);  // no call does
    cpu::decode_attention(q.data(), qh, k->stored(), v->stored(), cached.data(), {c.threads, mode});
    cpu::set_l3_bytes(-1);
    EXPECT_EQ(0, std::memcmp(streamed.data(), cached.data(), streamed.size() * sizeof(float)))
        << (mode == IntMode::Int8 ? "int8 mode" : "exact mode");
  }
}

std::vector<Case> grid() {
  std::vector<Case> v;
  const char* fast_specs[] = {"fp32", "bf16", "fp16", "fp8_e4m3:gran=token", "fp8_e4m3:gran=tensor",
                              "fp8_e5m2:gran=channel", "fp8_e4m3fnuz:gran=head", "kivi2", "kivi4",
                              "int8:k=channel,v=token,g=32,r=64", "kivi2:g=64,r=128,sym",
                              "int3:k=channel,v=token,g=32,r=32",
                              // per-token keys (llama.cpp's q4_0/q8_0 and HF's layout)
                              "int4:k=token,v=token,g=32,r=32", "int8:k=token,v=token,g=32,sym",
                              "int2:k=token,v=token,g=8,r=128"};
  for (const char* s : fast_specs) {
    const bool fast = std::string(s).rfind("int3", 0) != 0;  // 3-bit values: portable
    v.push_back({s, 1000, 2, 128, 4, 1, fast});
    v.push_back({s, 300, 3, 72, 3, 3, fast});
    v.push_back({s, 1, 2, 64, 8, 1, fast});
    v.push_back({s, 161, 1, 64, 1, 2, fast});
  }
  for (int gqa : {1, 3, 4, 8}) v.push_back({"kivi2", 555, 2, 128, gqa, 1, true});
  v.push_back({"kivi4", 1100, 2, 64, 4, 3, true});
  // per-channel key groups of 16 (one 16-token slice a group), 128 and 8-bit codes at 64
  v.push_back({"int4:k=channel,v=token,g=16,r=32", 300, 2, 128, 4, 1, true});
  v.push_back({"kivi2:g=128,r=128", 1000, 2, 128, 4, 2, true});
  v.push_back({"int8:k=channel,v=token,g=64,r=64", 500, 2, 64, 3, 1, true});
  v.push_back({"bf16", 20, 2, 20, 4, 1, false});                               // ragged head_dim
  v.push_back({"kivi2:g=8,r=16", 45, 2, 20, 2, 1, false});                     // ragged head_dim
  v.push_back({"int4:k=token,v=channel,g=32,r=32", 300, 2, 64, 4, 1, false});  // mirror axes
  return v;
}

INSTANTIATE_TEST_SUITE_P(Grid, cpuDecodeAttention, ::testing::ValuesIn(grid()), name_of);

// Int8 mode (kernels/cpu/attention.h): the definition, computed here in double from the stored
// bytes. Keys (per-channel, 2 and 4 bits, G and head_dim multiples of 32; others exact): for each
// key group g, kv head h and query head j,
//   qs_d = float(q_jd * scale_gd), amax = max_d |qs_d|, q8_d = rne(float(qs_d * float(127 /
//   amax))), s_t = (sum_d q8_d * code_td) * amax / 127 + sum_d q_jd * min_gd   (quantized tokens)
//   s_t = <q_j, k_t>                                                            (residual window)
// Values (per-token, 2 and 4 bits, G a multiple of 32 dividing head_dim), with the softmax
// weights p_t = e^(s_t / sqrt(D) - max) / sum: for each run of 32 quantized tokens counted from
// token 0 (the kernel's sub-blocks; these cases' blocks are 256 tokens), channel group c and query
// head j,
//   w_t = p_t * scale_tc, wmax = max_t w_t, u_t = rne(w_t * 255 / wmax),
//   o_d += (wmax / 255) * sum_t u_t * code_td + sum_t p_t * min_tc
// and o_d += p_t * v_td over the window. Backend cpu must equal it within kExactTol * max |V| (the
// integer sums are exact; the rest is float arithmetic in another order), plus, on the outputs of
// each w_t whose w_t * 255 / wmax lies within kTie of a rounding tie (where the kernel's float
// weights and these double ones may round apart), one step of u: (wmax / 255) * code_td. Its
// distance to the exact reference is recorded (err_vs_exact_over_max_v) and reported in
// docs/benchmarks.md; a worst-case bound on that distance (the int8 rounding of q * scale moves a
// score by up to 0.5 (amax / 127) sum_d code_td, a weight by e^(that / sqrt(D))) is far too loose
// to test against keys with outlier channels. Scores carry float rounding of ~1e-6 relative, so w_t
// / wmax differs from the kernel's by a few 1e-6 relative and w_t * 255 / wmax by up to ~1e-4 near
// 255.
constexpr double kTie = 2e-4;

// The mode names configs, the CLI and Python take (kernels/cpu/attention.h): exactly these two.
TEST(cpuIntMode, parse_namesExactAndInt8Only) {
  EXPECT_EQ(cpu::parse_int_mode("exact"), IntMode::Exact);
  EXPECT_EQ(cpu::parse_int_mode("int8"), IntMode::Int8);
  for (const char* bad : {"", "Int8", "int4", "exact ", "both"})
    EXPECT_FALSE(cpu::parse_int_mode(bad).has_value()) << bad;
}

class cpuDecodeAttentionInt8 : public ::testing::TestWithParam<Case> {};

TEST_P(cpuDecodeAttentionInt8, int8Mode_equalsItsDefinition) {
  if (!path().avx2)
    GTEST_SKIP() << "the int8 mode is an AVX2 path; the portable path reads codes exactly";
  const Case c = GetParam();
  const auto [k, v] = case_sides(c);
  const StoredSide ks = k->stored();
  const Tensor3 vv = v->dequantize();
  const int64_t qh = c.heads * c.gqa, D = c.dim, T = c.tokens, H = c.heads;
  const auto q = random_q(qh * D, 3);
  const kivi::ChannelLayout L{H, D, ks.group, ks.bits};
  const StoredSide vs = v->stored();
  const kivi::TokenLayout VL{H, D, vs.group, vs.bits};
  const Tensor3 kd = k->dequantize();
  const bool int8_keys = ks.axis == Axis::Channel && (ks.bits == 2 || ks.bits == 4) &&
                         ks.group % 32 == 0 && D % 32 == 0;
  const bool int8_values = vs.axis == Axis::Token && (vs.bits == 2 || vs.bits == 4) &&
                           vs.group % 32 == 0 && D % vs.group == 0;
  std::vector<double> want(static_cast<size_t>(qh * D), 0.0);
  std::vector<double> ties(want.size(), 0.0);  // per output: the allowance for rounding ties
  for (int64_t j = 0; j < qh; ++j) {
    const int64_t h = j / c.gqa;
    const float* qj = q.data() + j * D;
    std::vector<double> sc(static_cast<size_t>(T));
    const int64_t kq = int8_keys ? ks.quantized_tokens : 0;
    for (int64_t t = kq; t < T; ++t) {  // exact keys: the dequantized ones (and the window)
      double a = 0;
      for (int64_t d = 0; d < D; ++d) a += static_cast<double>(qj[d]) * kd.at(t, h, d);
      sc[static_cast<size_t>(t)] = a;
    }
    for (int64_t g = 0; g < kq / ks.group; ++g) {
      std::vector<float> qs(static_cast<size_t>(D));
      float amax = 0;
      double base = 0;
      for (int64_t d = 0; d < D; ++d) {
        const int64_t pi = L.param_index(g, h, d);
        const float scale = half_bits_to_float(ks.scales[pi]);
        const float mn = ks.sym ? -static_cast<float>(1 << (ks.bits - 1)) * scale
                                : half_bits_to_float(ks.mins[pi]);
        qs[static_cast<size_t>(d)] = qj[d] * scale;
        amax = std::max(amax, std::fabs(qs[static_cast<size_t>(d)]));
        base += static_cast<double>(qj[d]) * mn;
      }
      const float inv = amax > 0 ? 127.0f / amax : 0.0f;
      for (int64_t t = g * ks.group; t < (g + 1) * ks.group; ++t) {
        int64_t acc = 0;
        for (int64_t d = 0; d < D; ++d)
          acc += static_cast<int64_t>(std::nearbyint(qs[static_cast<size_t>(d)] * inv)) *
                 L.code(ks.words, t, h, d);
        sc[static_cast<size_t>(t)] = static_cast<double>(acc) * (amax / 127.0f) + base;
      }
    }
    double mx = -INFINITY, z = 0;
    for (double& x : sc) mx = std::max(mx, x /= std::sqrt(static_cast<double>(D)));
    for (double& x : sc) z += x = std::exp(x - mx);
    for (double& x : sc) x /= z;
    double* wj = want.data() + j * D;
    const int64_t vq = int8_values ? vs.quantized_tokens : 0;
    for (int64_t t = vq; t < T; ++t)
      for (int64_t d = 0; d < D; ++d) wj[d] += sc[static_cast<size_t>(t)] * vv.at(t, h, d);
    for (int64_t t0 = 0; t0 < vq; t0 += 32)
      for (int64_t c = 0; c < D / vs.group; ++c) {
        const int64_t t1 = std::min(vq, t0 + 32);
        std::vector<double> w;
        double wmax = 0;
        for (int64_t t = t0; t < t1; ++t) {
          const int64_t pi = VL.param_index(t, h, c);
          const double scale = half_bits_to_float(vs.scales[pi]);
          const double mn = vs.sym ? -static_cast<double>(1 << (vs.bits - 1)) * scale
                                   : half_bits_to_float(vs.mins[pi]);
          w.push_back(sc[static_cast<size_t>(t)] * scale);
          wmax = std::max(wmax, w.back());
          for (int64_t d = c * vs.group; d < (c + 1) * vs.group; ++d)
            wj[d] += sc[static_cast<size_t>(t)] * mn;
        }
        for (int64_t t = t0; t < t1; ++t) {
          const double r = wmax > 0 ? w[static_cast<size_t>(t - t0)] * 255.0 / wmax : 0.0;
          const bool tie = std::fabs(r - std::floor(r) - 0.5) < kTie;
          const double u = std::nearbyint(r);
          for (int64_t d = c * vs.group; d < (c + 1) * vs.group; ++d) {
            const double code = VL.code(vs.words, t, h, d);
            wj[d] += wmax / 255.0 * u * code;
            if (tie) ties[static_cast<size_t>(j * D + d)] += wmax / 255.0 * code;
          }
        }
      }
  }
  std::vector<float> got(want.size()), exact(want.size());
  cpu::decode_attention(q.data(), qh, ks, vs, got.data(), {c.threads, IntMode::Int8});
  decode_attention(q.data(), qh, *k, *v, exact.data());
  double max_v = 0, err = 0, err_exact = 0, max_ties = 0;
  for (float x : vv.data) max_v = std::max(max_v, std::fabs(static_cast<double>(x)));
  for (size_t i = 0; i < want.size(); ++i) {
    err = std::max(err, std::fabs(got[i] - want[i]) - ties[i]);
    max_ties = std::max(max_ties, ties[i]);
    err_exact = std::max(err_exact, std::fabs(static_cast<double>(got[i]) - exact[i]));
  }
  RecordProperty("err_vs_exact_over_max_v", std::to_string(err_exact / max_v));
  RecordProperty("int8_values", int8_values ? "yes" : "no");
  EXPECT_GT(err_exact, 0.0);  // the int8 path really ran
  EXPECT_LE(err, kExactTol * max_v)
      << "vs exact reference: " << err_exact / max_v << ", largest near-tie allowance " << max_ties;
}

INSTANTIATE_TEST_SUITE_P(Grid, cpuDecodeAttentionInt8,
                         ::testing::Values(Case{"kivi2", 1000, 2, 128, 4, 1, true},
                                           Case{"kivi4", 1000, 2, 128, 4, 3, true},
                                           Case{"kivi2", 555, 3, 64, 8, 1, true},
                                           Case{"kivi4:g=64,r=64,sym", 300, 2, 128, 3, 2, true},
                                           Case{"kivi2", 700, 1, 256, 2, 2, true},
                                           // four value groups a head (weights_sub4): sym,
                                           // GQA 3, 8 and 1
                                           Case{"kivi2:g=32,r=32,sym", 333, 2, 128, 3, 1, true},
                                           Case{"kivi4:g=32,r=64", 500, 1, 128, 8, 2, true},
                                           Case{"kivi2", 300, 2, 128, 1, 1, true},
                                           // int8 keys beside exact values (g=16)
                                           Case{"k=kivi2;v=kivi2:g=16", 300, 2, 64, 4, 1, true},
                                           // exact per-token keys beside int8 values
                                           Case{"int4:k=token,v=token,g=32", 300, 2, 64, 4, 1,
                                                true},
                                           // key groups of 64 tokens (words not contiguous)
                                           Case{"kivi2:g=64,r=64", 400, 2, 128, 4, 1, true},
                                           Case{"kivi4:g=64,r=0", 300, 2, 64, 2, 2, true},
                                           // one value group of the whole head, no window
                                           Case{"kivi4:g=128,r=0", 600, 2, 128, 4, 2, true},
                                           // fewer tokens than one sub-block; GQA 5
                                           Case{"kivi2:g=32,r=0", 21, 1, 64, 5, 1, true},
                                           // head_dim 96: 512-bit values end on one 32-channel
                                           // slice; quantized tokens not a multiple of 4
                                           Case{"kivi2:g=32,r=32", 333, 2, 96, 8, 1, true},
                                           Case{"kivi4:g=32,r=32", 333, 2, 96, 3, 2, true},
                                           Case{"kivi4:g=32,r=32", 334, 2, 96, 3, 1, true}),
                         name_of);

// Int8 mode on fp8 sides (kernels/cpu/attention.h; paths with bf16 dot products, path().bf16dot):
// the definition, computed here in double from the stored bytes. With b(x) the float x rounded to
// bf16 (nearest-even, core/half.h's round_to_bf16), val(c) = fp8::decode(c) but 0 for the subnormal
// codes (exponent field 0), g_hd the per-channel scale (gran=channel, else 1) and f_th the
// per-(token, head) scale (else 1):
//   s_t = f_th * sum_d b(float(q_jd * g_hd)) * val(k_thd)
//   o_d = g_hd * sum_t b(float(p_t * f_th)) * val(v_thd) / sum_t p_t,
// where p_t = e^(s_t / sqrt(D) - M) with M the running max the kernel's online softmax holds at
// t's block: the max of the scores from t's segment start (segments of 2 blocks of 256 tokens,
// counted from token 0) to the end of t's block, then rescaled to the global max. The weights
// p_t * f_th whose mantissa lies within kTieBf16 of a bf16 rounding tie may round apart from the
// kernel's float ones: their outputs get one bf16 step of the weight times |val| of allowance. The
// kernel's weights carry float rounding of the scores (|s| up to ~30, a few ulps: ~5e-6 relative
// after exp) and the polynomial exp's; a weight's position between bf16 steps, w / 2^floor(log2
// w) * 128 in [128, 256), moves by up to 256 times that: ~1.3e-3, so kTieBf16 is 4e-3.
constexpr double kTieBf16 = 4e-3;
class cpuDecodeAttentionFp8Bf16 : public ::testing::TestWithParam<Case> {};

TEST_P(cpuDecodeAttentionFp8Bf16, int8Mode_equalsItsDefinition) {
  if (!path().bf16dot)
    GTEST_SKIP() << "fp8 bf16 dot products need AVX-512 BF16 and VBMI; fp8 reads exactly";
  const Case c = GetParam();
  const auto [k, v] = case_sides(c);
  const StoredSide ks = k->stored(), vs = v->stored();
  ASSERT_EQ(ks.kind, SchemeKind::Fp8);
  const int64_t qh = c.heads * c.gqa, D = c.dim, T = c.tokens, H = c.heads;
  const auto q = random_q(qh * D, 3);
  if (D % 32 != 0) {  // head_dim not a multiple of 32: the exact path, as in exact mode
    std::vector<float> got(static_cast<size_t>(qh * D)), want(got.size());
    cpu::decode_attention(q.data(), qh, ks, vs, got.data(), {c.threads, IntMode::Int8});
    cpu::decode_attention(q.data(), qh, ks, vs, want.data(), {c.threads, IntMode::Exact});
    for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], want[i]) << i;
    return;
  }
  auto val = [](const StoredSide& x, uint8_t code) {
    const int mant = x.format == Fp8Format::E5M2 ? 2 : 3;
    return (code & 0x7f) >> mant == 0 ? 0.0 : static_cast<double>(fp8::decode(x.format, code));
  };
  auto g = [](const StoredSide& x, int64_t t, int64_t h, int64_t d) {
    return x.gran == Granularity::Channel
               ? x.fp8_scales[fp8::scale_index(x.gran, t, h, d, x.heads, x.dim)]
               : 1.0f;
  };
  auto f = [](const StoredSide& x, int64_t t, int64_t h) {
    return x.gran == Granularity::Channel
               ? 1.0f
               : x.fp8_scales[fp8::scale_index(x.gran, t, h, 0, x.heads, x.dim)];
  };
  std::vector<double> want(static_cast<size_t>(qh * D), 0.0), ties(want.size(), 0.0);
  int64_t subnormal = 0;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < H * D; ++i) subnormal += val(ks, ks.codes[t * H * D + i]) == 0.0;
  for (int64_t j = 0; j < qh; ++j) {
    const int64_t h = j / c.gqa;
    std::vector<double> sc(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) {
      double a = 0;
      for (int64_t d = 0; d < D; ++d)
        a +=
            static_cast<double>(round_to_bf16(q[static_cast<size_t>(j * D + d)] * g(ks, t, h, d))) *
            val(ks, ks.codes[(t * H + h) * D + d]);
      sc[static_cast<size_t>(t)] = a * f(ks, t, h) / std::sqrt(static_cast<double>(D));
    }
    double gmax = -INFINITY, z = 0;
    for (double x : sc) gmax = std::max(gmax, x);
    for (double x : sc) z += std::exp(x - gmax);
    double* wj = want.data() + j * D;
    for (int64_t seg = 0; seg < T; seg += 512) {
      double run = -INFINITY;
      for (int64_t b0 = seg; b0 < std::min(T, seg + 512); b0 += 256) {
        const int64_t b1 = std::min(T, b0 + 256);
        for (int64_t t = b0; t < b1; ++t) run = std::max(run, sc[static_cast<size_t>(t)]);
        for (int64_t t = b0; t < b1; ++t) {
          const double w = std::exp(sc[static_cast<size_t>(t)] - run) * f(vs, t, h);
          const float wf = static_cast<float>(w);
          const double wb = round_to_bf16(wf);
          // one bf16 step (2^-7 of the leading power of two) where w lies near a tie
          const double lead = std::exp2(std::floor(std::log2(w > 0 ? w : 1e-300)));
          const double r = w / lead * 128.0;
          const bool tie = w > 0 && std::fabs(r - std::floor(r) - 0.5) < kTieBf16;
          const double back = std::exp(run - gmax) / z;
          for (int64_t d = 0; d < D; ++d) {
            const double x = val(vs, vs.codes[(t * H + h) * D + d]) * g(vs, t, h, d);
            wj[d] += wb * x * back;
            if (tie) ties[static_cast<size_t>(j * D + d)] += lead / 128.0 * std::fabs(x) * back;
          }
        }
      }
    }
  }
  std::vector<float> got(want.size()), exact(want.size()), exact_mode(want.size());
  cpu::decode_attention(q.data(), qh, ks, vs, exact_mode.data(), {c.threads, IntMode::Exact});
  decode_attention(q.data(), qh, *k, *v, exact.data());
  double max_v = 0;
  for (float x : v->dequantize().data) max_v = std::max(max_v, std::fabs(static_cast<double>(x)));
  RecordProperty("subnormal_key_codes", std::to_string(subnormal));
  // Both int8 kernels where the CPU has them: vdpbf16ps, then AMX tiles (tdpbf16ps, where
  // cpu::amx_granted()) over the same bf16 operands; each sums in its own order, and each must
  // meet the definition above.
  const bool was = cpu::amx();
  for (const bool tiles : {false, true}) {
    if (tiles && !cpu::amx_granted()) continue;
    SCOPED_TRACE(tiles ? "amx tiles" : "vdpbf16ps");
    cpu::set_amx(tiles);
    cpu::decode_attention(q.data(), qh, ks, vs, got.data(), {c.threads, IntMode::Int8});
    double err = 0, err_exact = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      err = std::max(err, std::fabs(got[i] - want[i]) - ties[i]);
      err_exact = std::max(err_exact, std::fabs(static_cast<double>(got[i]) - exact[i]));
    }
    RecordProperty(tiles ? "amx_err_vs_exact_over_max_v" : "err_vs_exact_over_max_v",
                   std::to_string(err_exact / max_v));
    // the bf16 path really ran: not the exact mode's bits
    EXPECT_NE(std::memcmp(got.data(), exact_mode.data(), got.size() * 4), 0);
    EXPECT_LE(err, kExactTol * max_v) << "vs exact reference: " << err_exact / max_v;
  }
  cpu::set_amx(was);
}

INSTANTIATE_TEST_SUITE_P(Grid, cpuDecodeAttentionFp8Bf16,
                         ::testing::Values(Case{"fp8_e4m3:gran=token", 1000, 2, 128, 4, 1, true},
                                           Case{"fp8_e4m3:gran=tensor", 1300, 2, 128, 4, 3, true},
                                           Case{"fp8_e5m2:gran=channel", 555, 3, 64, 8, 1, true},
                                           Case{"fp8_e4m3fnuz:gran=head", 333, 2, 96, 3, 2, true},
                                           Case{"fp8_e4m3:gran=token", 161, 1, 64, 1, 1, true},
                                           Case{"fp8_e5m2:gran=token", 77, 2, 128, 2, 1, true},
                                           Case{"fp8_e4m3:gran=channel", 700, 1, 256, 5, 2, true},
                                           Case{"fp8_e4m3:gran=token", 1, 2, 64, 8, 1, true},
                                           Case{"fp8_e4m3:gran=token", 300, 2, 72, 4, 1,
                                                true}),  // exact: D % 32
                         name_of);

// FP8 NaN codes in the exact mode. A cache whose inputs hold no NaN says so
// (StoredSide::fp8_nan false: the kernels skip e4m3's NaN decode); one NaN input at (token 200,
// head 1) makes it say otherwise, and then the outputs must be NaN exactly where the reference's
// (reference_cpu's decode_attention over the same stored bytes) are, all in head 1's query heads,
// and within kExactTol of the reference elsewhere. Keys and values, each format. Token 200
// is past the 128 tokens that dynamic tensor / head / channel scales come from, so those caches
// hold a NaN code under a finite scale (the decode's NaN path); per token, the scale is NaN too.
TEST(cpuDecodeAttentionFp8NaN, nanCode_propagatesAsInTheReference) {
  const int64_t T = 300, H = 2, D = 128, gqa = 4, qh = H * gqa;
  const auto q = random_q(qh * D, 5);
  int checked = 0;
  for (const char* spec : {"fp8_e4m3:gran=head", "fp8_e4m3fnuz:gran=channel",
                           "fp8_e5m2:gran=tensor", "fp8_e4m3:gran=token"})
    for (Role role : {Role::Key, Role::Value}) {
      const SchemeSpec s = parse_spec(spec);
      Tensor3 kx = synthetic_kv({{T, H, D}, 2, 12.0f, 1}),
              vx = synthetic_kv({{T, H, D}, 0, 1.0f, 2});
      EXPECT_FALSE(make_side(s, Role::Key, kx)->stored().fp8_nan) << spec;
      EXPECT_FALSE(make_side(s, Role::Value, vx)->stored().fp8_nan) << spec;
      Tensor3& x = role == Role::Key ? kx : vx;
      x.data[static_cast<size_t>((200 * H + 1) * D + 17)] = std::nanf("");
      const auto k = make_side(s, Role::Key, kx), v = make_side(s, Role::Value, vx);
      EXPECT_TRUE((role == Role::Key ? k : v)->stored().fp8_nan) << spec;
      std::vector<float> want(static_cast<size_t>(qh * D)), got(want.size());
      decode_attention(q.data(), qh, *k, *v, want.data());
      cpu::decode_attention(q.data(), qh, k->stored(), v->stored(), got.data(),
                            {1, IntMode::Exact});
      double max_v = 0;
      for (float y : vx.data)
        if (std::isfinite(y)) max_v = std::max(max_v, std::fabs(static_cast<double>(y)));
      int nan_want = 0;
      for (size_t i = 0; i < want.size(); ++i) {
        const bool head1 = static_cast<int64_t>(i) / D / gqa == 1;
        if (!head1) {
          EXPECT_FALSE(std::isnan(want[i])) << spec << " " << i;
        }
        nan_want += std::isnan(want[i]);
        EXPECT_EQ(std::isnan(got[i]), std::isnan(want[i]))
            << spec << (role == Role::Key ? " key " : " value ") << i;
        if (!std::isnan(want[i]) && !std::isnan(got[i])) {
          EXPECT_NEAR(got[i], want[i], kExactTol * max_v) << spec << " " << i;
        }
      }
      // a NaN key spoils its head's every output; a NaN value its channel (17), or its whole row
      // where the token's scale is NaN too (per token)
      EXPECT_GE(nan_want, gqa) << spec;
      ++checked;
    }
  EXPECT_EQ(checked, 8);
}

// Scores of -inf (fp32 keys holding +inf in a channel where every query head is negative): the
// reference's softmax gives those tokens weight 0 beside any finite score, and NaN outputs where
// every score is -inf. Backend cpu's online softmax must agree: the first 300 of 700 tokens at -inf
// (its first blocks see nothing else), then all 700; one and two threads.
TEST(cpuDecodeAttentionInfScores, minusInfScores_asInTheReference) {
  const int64_t T = 700, H = 2, D = 64, gqa = 4, qh = H * gqa;
  auto q = random_q(qh * D, 6);
  for (int64_t i = 0; i < qh; ++i) q[static_cast<size_t>(i * D)] = -1.0f;
  const SchemeSpec s = parse_spec("fp32");
  int checked = 0;
  for (int64_t ninf : {int64_t{300}, T})
    for (int threads : {1, 2}) {
      Tensor3 kx = synthetic_kv({{T, H, D}, 2, 12.0f, 1}),
              vx = synthetic_kv({{T, H, D}, 0, 1.0f, 2});
      for (int64_t t = 0; t < ninf; ++t)
        for (int64_t h = 0; h < H; ++h) kx.data[static_cast<size_t>((t * H + h) * D)] = INFINITY;
      const auto k = make_side(s, Role::Key, kx), v = make_side(s, Role::Value, vx);
      std::vector<float> want(static_cast<size_t>(qh * D)), got(want.size());
      decode_attention(q.data(), qh, *k, *v, want.data());
      cpu::decode_attention(q.data(), qh, k->stored(), v->stored(), got.data(),
                            {threads, IntMode::Exact});
      double max_v = 0;
      for (float y : vx.data) max_v = std::max(max_v, std::fabs(static_cast<double>(y)));
      for (size_t i = 0; i < want.size(); ++i) {
        EXPECT_EQ(std::isnan(want[i]), ninf == T) << ninf << " " << i;
        EXPECT_EQ(std::isnan(got[i]), std::isnan(want[i])) << ninf << " thr" << threads << " " << i;
        if (!std::isnan(want[i]) && !std::isnan(got[i])) {
          EXPECT_NEAR(got[i], want[i], kExactTol * max_v) << ninf << " thr" << threads << " " << i;
        }
      }
      ++checked;
    }
  EXPECT_EQ(checked, 4);
}

// A thread's workspace outlives a call (the model keeps one per thread) and the int8 mode's fp8
// keys hold q as bf16 in it: a second call with the same q buffer, rewritten, must read the new q
// (the same bits as a fresh workspace).
TEST(cpuDecodeAttentionFp8Bf16Reuse, keptWorkspace_rewrittenQ_sameAsFresh) {
  if (!path().bf16dot) GTEST_SKIP() << "fp8 reads exactly: no bf16 query is kept";
  const int64_t T = 600, H = 2, D = 128, qh = 8;
  const auto [k, v] = case_sides("fp8_e4m3:gran=token", T, H, D);
  const auto q1 = random_q(qh * D, 3), q2 = random_q(qh * D, 4);
  std::vector<float> buf = q1;
  CausalInput in;
  in.q = buf.data();
  in.n = 1;
  in.q_heads = qh;
  in.t_begin = T - 1;
  in.k = k->stored();
  in.v = v->stored();
  in.int_mode = IntMode::Int8;
  auto run = [&](CausalAttention::Workspace& w, float* out) {
    CausalAttention a(in, 1);
    for (int64_t i = 0; i < a.items(); ++i) a.run(i, out, w);
    for (int64_t p = 0; p < a.merges(); ++p) a.merge(p, out);
  };
  std::vector<float> o1(static_cast<size_t>(qh * D)), o2(o1.size()), o3(o1.size());
  CausalAttention::Workspace kept, fresh;
  run(kept, o1.data());
  buf = q2;
  run(kept, o2.data());
  run(fresh, o3.data());
  EXPECT_NE(std::memcmp(o1.data(), o2.data(), o1.size() * 4), 0);
  EXPECT_EQ(std::memcmp(o2.data(), o3.data(), o2.size() * 4), 0);
}

TEST(cpuDecodeAttentionErrors, mismatchedSidesAndBadGqa_throw) {
  const auto k = make_side(parse_spec("bf16"), Role::Key, synthetic_kv({{8, 2, 64}, 0, 1.0f, 1}));
  const auto v = make_side(parse_spec("bf16"), Role::Value, synthetic_kv({{9, 2, 64}, 0, 1.0f, 1}));
  std::vector<float> q(4 * 64), o(4 * 64);
  EXPECT_THROW(cpu::decode_attention(q.data(), 4, k->stored(), v->stored(), o.data()), Error);
  EXPECT_THROW(cpu::decode_attention(q.data(), 3, k->stored(), k->stored(), o.data()), Error);
}

}  // namespace
}  // namespace kvq::cpu
