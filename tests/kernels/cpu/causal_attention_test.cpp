// Tests for kernels/cpu/attention.h's causal calls: backend cpu's causal attention (prefill, a
// chunk after earlier ones, one decode step) against reference_cpu's causal_attention over the
// same cache, and the streaming property the model relies on: a cache fed in chunks and the same
// cache fed token by token give bit-identical outputs for every position on this backend, for any
// thread count.
//
// Inputs: synthetic keys with x12 outlier channels and plain values (evaluation/synthetic.h),
// chunk sizes that cross the block (256), the segment (512), the key group and the residual
// window at ragged points. Tolerance against the reference: kExactTol * max |V|, the bound of
// tests/kernels/cpu/attention_test.cpp (the same kernels; float arithmetic in another order and a
// polynomial exp).
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "evaluation/synthetic.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/isa.h"
#include "model/llama.h"
#include "reference_cpu/attention.h"
#include "tests/support/names.h"
#include "tests/support/random.h"

namespace kvq::cpu {
namespace {

constexpr double kExactTol = 2e-5;

using kvq::testing::random_q;

struct Case {
  std::string spec;
  int64_t heads, dim;
  int gqa;
  std::vector<int64_t> chunks;  // appended in this order
};

std::string name_of(const ::testing::TestParamInfo<Case>& i) {
  const Case& c = i.param;
  std::string s = kvq::testing::test_name(c.spec);
  s += fmt::format("_H{}_D{}_gqa{}_chunks_{}", c.heads, c.dim, c.gqa, fmt::join(c.chunks, "_"));
  return s;
}

int64_t total(const Case& c) {
  int64_t t = 0;
  for (int64_t n : c.chunks) t += n;
  return t;
}

// A case's inputs: synthetic keys with x12 outlier channels, plain values and random queries for
// every position.
struct Inputs {
  Tensor3 kx, vx;
  std::vector<float> q;
};
Inputs inputs(const Case& c) {
  const int64_t T = total(c), qh = c.heads * c.gqa, D = c.dim;
  return {synthetic_kv({{T, c.heads, D}, 2, 12.0f, 1}), synthetic_kv({{T, c.heads, D}, 0, 1.0f, 2}),
          random_q(T * qh * D, 3)};
}

// A K and a V side fed chunk by chunk; each step returns the positions' outputs from backend
// cpu (and from the reference when asked).
struct Stream {
  std::unique_ptr<SideStore> k, v;
  int64_t H, D, qh;
  Stream(const SchemeSpec& s, int64_t heads, int64_t dim, int64_t q_heads)
      : k(make_side(s, Role::Key, heads, dim)),
        v(make_side(s, Role::Value, heads, dim)),
        H(heads),
        D(dim),
        qh(q_heads) {}

  // Appends rows [t0, t0 + n) of kx / vx and attends with q rows [t0, t0 + n).
  void step(const Tensor3& kx, const Tensor3& vx, const std::vector<float>& q, int64_t t0,
            int64_t n, int threads, float* out, float* ref_out, IntMode mode = IntMode::Exact) {
    const int64_t row = H * D;
    // The tails each backend reads: as stored for cpu (rot= sides rotated), un-rotated for ref.
    std::vector<float> kt, vt, kr, vr;
    const float *kc = kx.data.data() + t0 * row, *vc = vx.data.data() + t0 * row;
    const ExactTail ke{nullptr, gather_exact_tail(*k, kc, n, kt, TailSpace::kStored)},
        ve{nullptr, gather_exact_tail(*v, vc, n, vt, TailSpace::kStored)};
    const ExactTail kre{nullptr, gather_exact_tail(*k, kc, n, kr, TailSpace::kModel)},
        vre{nullptr, gather_exact_tail(*v, vc, n, vr, TailSpace::kModel)};
    k->append(kx.data.data() + t0 * row, n);
    v->append(vx.data.data() + t0 * row, n);
    // The model's own call (model/llama.h): a rot= key side gets q rotated.
    CpuCausalBuffers buf;
    CausalInput in = cpu_causal_input(q.data() + t0 * qh * D, n, qh, t0, *k, *v,
                                      {kt.data(), ke.begin}, {vt.data(), ve.begin}, buf);
    in.int_mode = mode;
    causal_attention(in, out, threads);
    unrotate_output(*v, out, n * qh);
    if (ref_out)  // the sides' own reads (rot= undone inside them), the exact tails as given
      causal_attention(q.data() + t0 * qh * D, n, qh, t0, *k, *v, {kr.data(), kre.begin},
                       {vr.data(), vre.begin}, ref_out, threads);
  }
};

class cpuCausalAttention : public ::testing::TestWithParam<Case> {};

TEST_P(cpuCausalAttention, chunked_withinTolOfReference_andBitIdenticalToDecode) {
  const Case c = GetParam();
  const SchemeSpec spec = parse_spec(c.spec);
  const int64_t T = total(c), qh = c.heads * c.gqa, D = c.dim;
  const auto [kx, vx, q] = inputs(c);
  double max_v = 0;
  for (float x : vx.data) max_v = std::max(max_v, std::fabs(static_cast<double>(x)));

  std::vector<float> chunked(static_cast<size_t>(T * qh * D)), ref(chunked.size());
  Stream a(spec, c.heads, D, qh);
  int64_t t0 = 0;
  for (int64_t n : c.chunks) {
    a.step(kx, vx, q, t0, n, 2, chunked.data() + t0 * qh * D, ref.data() + t0 * qh * D);
    t0 += n;
  }
  double err = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    ASSERT_TRUE(std::isfinite(chunked[i])) << i;
    err = std::max(err, std::fabs(static_cast<double>(chunked[i]) - ref[i]));
  }
  RecordProperty("err_over_max_v", std::to_string(err / max_v));
  EXPECT_LE(err, kExactTol * max_v) << "max err " << err << " max |V| " << max_v;

  // The same tokens one at a time, alternating 1 and 3 threads: every bit equal.
  std::vector<float> decoded(chunked.size());
  Stream b(spec, c.heads, D, qh);
  for (int64_t t = 0; t < T; ++t)
    b.step(kx, vx, q, t, 1, t % 2 ? 3 : 1, decoded.data() + t * qh * D, nullptr);
  int64_t first_diff = -1;
  for (size_t i = 0; i < chunked.size() && first_diff < 0; ++i)
    if (std::memcmp(&chunked[i], &decoded[i], sizeof(float)) != 0)
      first_diff = static_cast<int64_t>(i);
  EXPECT_EQ(first_diff, -1) << "position " << first_diff / (qh * D);

  // A decode step over the sides as stored (no tails: the window read from the cache) equals the
  // last position above.
  std::vector<float> last(static_cast<size_t>(qh * D));
  std::vector<float> ql(q.begin() + (T - 1) * qh * D, q.begin() + T * qh * D);
  if (b.k->rotation()) b.k->rotation()->rotate(ql.data(), qh);
  decode_attention(ql.data(), qh, b.k->stored(), b.v->stored(), last.data(), {2, IntMode::Exact});
  unrotate_output(*b.v, last.data(), qh);
  EXPECT_EQ(std::memcmp(last.data(), decoded.data() + (T - 1) * qh * D, last.size() * 4), 0);
}

// The int8 mode keeps the streaming property too (its roundings are per key group, per 32-token
// run from the block's start and per position, never per call): chunked == token by token, bit
// for bit, for kivi (byte dots) and fp8 (bf16 dots, where compiled) sides.
class cpuCausalAttentionInt8 : public ::testing::TestWithParam<Case> {};

TEST_P(cpuCausalAttentionInt8, chunkedBitIdenticalToDecode) {
  const Case c = GetParam();
  const SchemeSpec spec = parse_spec(c.spec);
  const int64_t T = total(c), qh = c.heads * c.gqa, D = c.dim;
  const auto [kx, vx, q] = inputs(c);
  std::vector<float> chunked(static_cast<size_t>(T * qh * D)), decoded(chunked.size()),
      exact(chunked.size());
  Stream a(spec, c.heads, D, qh), e(spec, c.heads, D, qh);
  int64_t t0 = 0;
  for (int64_t n : c.chunks) {
    a.step(kx, vx, q, t0, n, 2, chunked.data() + t0 * qh * D, nullptr, IntMode::Int8);
    e.step(kx, vx, q, t0, n, 2, exact.data() + t0 * qh * D, nullptr, IntMode::Exact);
    t0 += n;
  }
  Stream b(spec, c.heads, D, qh);
  for (int64_t t = 0; t < T; ++t)
    b.step(kx, vx, q, t, 1, t % 2 ? 3 : 1, decoded.data() + t * qh * D, nullptr, IntMode::Int8);
  int64_t first_diff = -1;
  for (size_t i = 0; i < chunked.size() && first_diff < 0; ++i)
    if (std::memcmp(&chunked[i], &decoded[i], sizeof(float)) != 0)
      first_diff = static_cast<int64_t>(i);
  EXPECT_EQ(first_diff, -1) << "position " << first_diff / (qh * D);
  // the int8 paths really ran: kivi's on every AVX2 build, fp8's where bf16 dots are compiled
  if (c.spec.find("kivi") != std::string::npos ? path().avx2 : path().bf16dot) {
    EXPECT_NE(std::memcmp(chunked.data(), exact.data(), chunked.size() * 4), 0);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Grid, cpuCausalAttentionInt8,
    ::testing::Values(Case{"fp8_e4m3:gran=token", 2, 128, 4, {300, 1, 250, 77}},
                      Case{"fp8_e5m2:gran=channel", 2, 64, 8, {520, 3}},
                      Case{"fp8_e4m3:gran=tensor,first=64", 3, 96, 3, {40, 1, 300}},
                      Case{"kivi2", 2, 128, 4, {300, 1, 250, 77}},
                      Case{"k=kivi4;v=fp8_e4m3:gran=token", 2, 64, 2, {200, 3, 60}}),
    name_of);

std::vector<Case> grid() {
  std::vector<Case> v;
  const char* specs[] = {"fp32", "bf16", "fp16", "fp8_e4m3:gran=token", "fp8_e4m3:gran=channel",
                         "fp8_e5m2:gran=head,first=64", "kivi2", "kivi4:g=64,r=128",
                         "int8:k=channel,v=token,g=32,r=64",
                         "int3:k=channel,v=token,g=32,r=32",  // 3-bit values: portable path
                         "int4:k=token,v=channel,g=32,r=32",  // mirror axes: portable path
                         // per-token keys (llama.cpp / HF layout): the fast path
                         "int4:k=token,v=token,g=32,r=32", "int2:k=token,v=token,g=32,r=128",
                         "int8:k=token,v=token,g=32,sym", "int4:k=token,v=token,g=dim,r=16"};
  for (const char* s : specs) v.push_back({s, 2, 64, 3, {300, 1, 250, 77}});
  v.push_back({"kivi2", 3, 72, 4, {1, 160, 530}});
  v.push_back({"fp8_e4m3:gran=tensor,first=200", 2, 128, 2, {150, 120, 3}});
  v.push_back({"bf16", 2, 20, 2, {40, 9}});             // ragged head_dim: portable path
  v.push_back({"kivi2:g=8,r=16", 2, 20, 1, {33, 12}});  // ragged head_dim: portable path
  v.push_back({"kivi4", 1, 64, 8, {1100}});
  // Dense and fp8 sides at other head counts and widths: tiles of several positions (chunks)
  // against the streaming single-position kernels (decode), which read every head in address order.
  v.push_back({"bf16", 8, 128, 4, {300, 1, 40}});
  v.push_back({"fp16", 3, 64, 1, {520, 2}});
  v.push_back({"fp32", 1, 64, 8, {600, 1}});
  v.push_back({"fp8_e4m3:gran=channel", 4, 128, 2, {300, 1}});
  v.push_back({"fp8_e4m3fnuz:gran=token", 5, 64, 2, {260, 3}});
  // Keys and values in different schemes (issue 14), windows of different lengths per side.
  v.push_back({"k=kivi2;v=fp8_e4m3:gran=token", 2, 64, 3, {300, 1, 250, 77}});
  v.push_back({"k=fp8_e4m3:gran=head;v=kivi4:g=32,r=64", 2, 64, 4, {200, 3, 60}});
  v.push_back({"k=kivi4;v=bf16", 3, 64, 3, {150, 1, 90}});
  // sink=S (exact first tokens; chunks that end before S, at S and after it) and rot= (the query
  // and tails rotated, the output back), alone and together, fast and portable paths (issue 15).
  v.push_back({"kivi2:sink=4", 2, 64, 3, {300, 1, 250, 77}});
  v.push_back({"kivi2:rot=hadamard:7", 2, 64, 3, {300, 1, 250, 77}});
  v.push_back({"fp8_e4m3:gran=tensor,first=64,sink=16,rot=hadamard", 2, 128, 2, {10, 1, 5, 300}});
  v.push_back(
      {"k=kivi4:sink=8;v=fp8_e4m3:gran=token,sink=8,rot=hadamard:2", 3, 64, 4, {5, 1, 4, 200}});
  v.push_back({"int4:k=token,v=channel,g=32,r=32,sink=5", 2, 64, 2, {3, 40, 100}});
  v.push_back({"bf16:sink=3", 2, 20, 2, {2, 40, 9}});        // ragged head_dim: portable path
  v.push_back({"fp32:rot=hadamard:1", 1, 96, 8, {600, 1}});  // three blocks of 32
  // One side rotated: quantized keys only (exact tails on both sides), per-token keys only.
  v.push_back({"k=kivi2:rot=hadamard;v=kivi2", 2, 64, 3, {300, 1, 250, 77}});
  v.push_back({"k=int4:k=token,v=token,g=32,r=16,rot=hadamard:2;v=fp16", 2, 64, 4, {40, 1, 90}});
  v.push_back({"kivi4:g=32,r=32,sink=600", 2, 64, 2, {300, 400}});  // sinks past a segment
  v.push_back(
      {"fp8_e4m3:gran=channel,first=16,sink=5", 2, 64, 3, {3, 40, 300}});  // scales at the end
  return v;
}

INSTANTIATE_TEST_SUITE_P(Grid, cpuCausalAttention, ::testing::ValuesIn(grid()), name_of);

TEST(cpuCausalAttentionErrors, badInput_throws) {
  const auto k = make_side(parse_spec("kivi2"), Role::Key, synthetic_kv({{40, 2, 64}, 0, 1.0f, 1}));
  const auto v =
      make_side(parse_spec("kivi2"), Role::Value, synthetic_kv({{40, 2, 64}, 0, 1.0f, 2}));
  std::vector<float> q(10 * 4 * 64), o(q.size()), tail(40 * 2 * 64);
  std::vector<int64_t> qt(10, 0);
  CausalInput in;
  in.q = q.data();
  in.n = 10;
  in.q_heads = 4;
  in.t_begin = 30;
  in.k = k->stored();
  in.v = v->stored();
  EXPECT_THROW(causal_attention(in, o.data()), Error);  // several positions need tails
  in.k_exact = {tail.data(), 0};
  in.v_exact = {tail.data(), 0};
  EXPECT_THROW(causal_attention(in, o.data()), Error);  // no quantized-token counts
  in.k_quantized = qt;
  in.v_quantized = qt;
  in.k_exact.begin = 5;  // the tail starts after position 30's window (0 quantized)
  EXPECT_THROW(causal_attention(in, o.data()), Error);
  in.k_exact.begin = 0;
  in.t_begin = 29;  // 29 + 10 != 40 tokens
  EXPECT_THROW(causal_attention(in, o.data()), Error);
}

}  // namespace
}  // namespace kvq::cpu
