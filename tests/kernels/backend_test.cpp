// The backend interface (kernels/backend.h): the one list of names and its parser, the refusal of
// a backend that cannot run here (cuda), and the attention calls against the backends' own calls
// written out as every caller wrote them before (bit for bit), and against the reference
// (rot= and sink= handled: within the kernels' tolerance).
#include "kernels/backend.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "core/rotation.h"
#include "core/spec.h"
#include "experiments/synthetic.h"
#include "reference_cpu/attention.h"
#include "tests/support/expect_error.h"
#include "tests/support/names.h"
#include "tests/support/random.h"

namespace kvq {
namespace {

constexpr double kExactTol = 2e-5;  // backend cpu's exact mode against the reference (as its tests)

TEST(BackendNames, oneListInOrder_parseRoundTrips) {
  EXPECT_EQ(backend_names(), "ref, cpu, cpu-int8, cuda");
  EXPECT_EQ(backend_names(" | ", true), "ref | cpu | cpu-int8");
  for (const BackendInfo& b : backends()) {
    EXPECT_EQ(parse_backend(b.name), b.id) << b.name;
    EXPECT_STREQ(to_string(b.id), b.name);
    EXPECT_EQ(&backend_info(b.id), &b);
  }
  EXPECT_FALSE(backend_info(AttentionBackend::kCuda).host);
  EXPECT_EQ(backend_info(AttentionBackend::kCpuInt8).int_mode, cpu::IntMode::Int8);
}

TEST(BackendNames, unknownName_oneLineNamingEveryBackend) {
  const std::string msg =
      testing::expect_error([] { parse_backend("gpu"); }, "unknown backend 'gpu'");
  for (const BackendInfo& b : backends())
    EXPECT_NE(msg.find(std::string(b.name) + ", "), std::string::npos) << b.name << ": " << msg;
  testing::expect_error([] { parse_backend("CPU"); }, "unknown backend 'CPU'");
  testing::expect_error([] { parse_backend(""); }, "unknown backend ''");
}

TEST(BackendNames, cudaIsKnownButRefusedWhereItCannotRun) {
  EXPECT_EQ(parse_backend("cuda"), AttentionBackend::kCuda);
  testing::expect_error([] { require_host(AttentionBackend::kCuda); }, "scripts/device-check.sh");
  for (const BackendInfo& b : backends()) {
    if (b.host) {
      EXPECT_NO_THROW(require_host(b.id)) << b.name;
    }
  }
  const SchemeSpec s = parse_spec("bf16");
  const auto k = make_side(s, Role::Key, 2, 16), v = make_side(s, Role::Value, 2, 16);
  const std::vector<float> x(4 * 16, 1.0f);
  k->append(x.data(), 1);
  v->append(x.data(), 1);
  std::vector<float> out(4 * 16);
  testing::expect_error(
      [&] { attend_decode(AttentionBackend::kCuda, x.data(), 4, *k, *v, out.data()); },
      "backend cuda runs today");
  testing::expect_error(
      [&] {
        CausalCall(AttentionBackend::kCuda, {x.data(), 1, 4, 0, k.get(), v.get(), {}, {}}, 1);
      },
      "backend cuda runs today");
}

// Sides holding T tokens of synthetic K/V (outlier key channels), built with `b`'s quantizers.
struct Sides {
  std::unique_ptr<SideStore> k, v;
};
constexpr int64_t kH = 2, kD = 64, kGqa = 2, kQh = kH * kGqa, kT = 200;
Sides sides(const std::string& spec, AttentionBackend b) {
  const SchemeSpec s = parse_spec(spec);
  const Tensor3 kx = synthetic_kv({{kT, kH, kD}, 2, 12.0f, 1}),
                vx = synthetic_kv({{kT, kH, kD}, 0, 1.0f, 2});
  Sides out{make_side(s, Role::Key, kH, kD, 0, side_kernels(b)),
            make_side(s, Role::Value, kH, kD, 0, side_kernels(b))};
  out.k->append(kx.data.data(), kT);
  out.v->append(vx.data.data(), kT);
  return out;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

class BackendCalls : public ::testing::TestWithParam<std::string> {};

// attend_decode is the block throughput.cpp and bench_attention.cpp wrote: ref's decode_attention,
// else q rotated into a rot= key side's space, cpu::decode_attention, the output rotated back.
TEST_P(BackendCalls, decode_bitIdenticalToTheCallersBlock_andNearTheReference) {
  const std::vector<float> q = testing::random_q(kQh * kD, 3);
  const Sides s = sides(GetParam(), AttentionBackend::kCpu);
  std::vector<float> ref(q.size()), want(q.size()), got(q.size());
  decode_attention(q.data(), kQh, *s.k, *s.v, ref.data(), 1);
  attend_decode(AttentionBackend::kRef, q.data(), kQh, *s.k, *s.v, got.data());
  EXPECT_TRUE(same_bits(got, ref)) << "backend ref";
  for (const auto b : {AttentionBackend::kCpu, AttentionBackend::kCpuInt8}) {
    std::vector<float> qr = q;
    if (const Rotation* r = s.k->rotation()) r->rotate(qr.data(), kQh);
    cpu::decode_attention(qr.data(), kQh, s.k->stored(), s.v->stored(), want.data(),
                          {1, backend_info(b).int_mode, 0});
    if (const Rotation* r = s.v->rotation()) r->unrotate(want.data(), kQh);
    attend_decode(b, q.data(), kQh, *s.k, *s.v, got.data());
    EXPECT_TRUE(same_bits(got, want)) << to_string(b);
  }
  attend_decode(AttentionBackend::kCpu, q.data(), kQh, *s.k, *s.v, got.data());
  for (size_t i = 0; i < ref.size(); ++i)
    ASSERT_NEAR(got[i], ref[i], kExactTol * (1 + std::abs(ref[i]))) << "element " << i;
}

// CausalCall (the model's items, merges and finish) and attend_causal (Python's one call) give the
// same bits as the block python/kvq_ext.cpp and model/llama.cpp wrote for backend cpu, and as
// causal_attention for ref: the last n tokens of a stream attend over the cache as it grows.
TEST_P(BackendCalls, causal_itemsEqualOneCall_andTheCallersBlock) {
  constexpr int64_t n = 24, t0 = kT - n, row = kH * kD;
  const std::vector<float> q = testing::random_q(n * kQh * kD, 5);
  const SchemeSpec sp = parse_spec(GetParam());
  const Tensor3 kx = synthetic_kv({{kT, kH, kD}, 2, 12.0f, 1}),
                vx = synthetic_kv({{kT, kH, kD}, 0, 1.0f, 2});
  for (const BackendInfo& info : backends()) {
    if (!info.host) continue;
    const AttentionBackend b = info.id;
    const auto k = make_side(sp, Role::Key, kH, kD, 0, side_kernels(b)),
               v = make_side(sp, Role::Value, kH, kD, 0, side_kernels(b));
    k->append(kx.data.data(), t0);
    v->append(vx.data.data(), t0);
    std::vector<float> kt, vt;
    const int64_t kb = gather_exact_tail(*k, kx.data.data() + t0 * row, n, kt, tail_space(b));
    const int64_t vb = gather_exact_tail(*v, vx.data.data() + t0 * row, n, vt, tail_space(b));
    k->append(kx.data.data() + t0 * row, n);
    v->append(vx.data.data() + t0 * row, n);
    const ExactTail ke{kt.data(), kb}, ve{vt.data(), vb};
    const CausalArgs a{q.data(), n, kQh, t0, k.get(), v.get(), ke, ve};
    std::vector<float> one(q.size()), items(q.size()), want(q.size());
    attend_causal(b, a, one.data(), 2);
    CausalCall call(b, a, 1);
    CausalCall::Workspace w;
    for (int64_t i = 0; i < call.items(); ++i) call.run(i, items.data(), w);
    for (int64_t m = 0; m < call.merges(); ++m) call.merge(m, items.data());
    if (call.rotates_output()) call.finish(items.data(), n * kQh);
    EXPECT_TRUE(same_bits(items, one)) << info.name;
    if (b == AttentionBackend::kRef) {
      causal_attention(q.data(), n, kQh, t0, *k, *v, ke, ve, want.data(), 1);
    } else {
      CpuCausalBuffers buf;
      cpu::CausalInput in = cpu_causal_input(q.data(), n, kQh, t0, *k, *v, ke, ve, buf);
      in.int_mode = info.int_mode;
      cpu::causal_attention(in, want.data(), 1);
      unrotate_output(*v, want.data(), n * kQh);
    }
    EXPECT_TRUE(same_bits(one, want)) << info.name;
  }
}

INSTANTIATE_TEST_SUITE_P(Specs, BackendCalls,
                         ::testing::Values("kivi2", "kivi4:g=32,r=64",
                                           "kivi2:g=32,r=128,rot=hadamard:7,sink=4",
                                           "fp8_e4m3:gran=token,rot=hadamard",
                                           "fp8_e4m3:gran=channel,first=16,sink=5", "bf16"),
                         [](const auto& i) { return testing::test_name(i.param); });

}  // namespace
}  // namespace kvq
