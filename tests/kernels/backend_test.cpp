// The backend interface (kernels/backend.h): the one list of names and its parser, the support
// table (checked against kernels/cuda/dispatch.h, which the CUDA kernels are compiled from) and its
// errors, the refusals of backend cuda where it cannot run (causal, the model, host sides, no
// device), and the attention calls against the backends' own calls
// written out as every caller wrote them before (bit for bit), and against the reference
// (rot= and sink= handled: within the kernels' tolerance).
#include "kernels/backend.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "core/rotation.h"
#include "core/spec.h"
#include "evaluation/synthetic.h"
#include "kernels/cuda/dispatch.h"
#include "reference_cpu/attention.h"
#include "tests/support/expect_error.h"
#include "tests/support/names.h"
#include "tests/support/random.h"
#include "tests/support/stored_counts.h"

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
}

TEST(BackendNames, unknownName_oneLineNamingEveryBackend) {
  const std::string msg =
      testing::expect_error([] { parse_backend("gpu"); }, "unknown backend 'gpu'");
  for (const BackendInfo& b : backends())
    EXPECT_NE(msg.find(std::string(b.name) + ", "), std::string::npos) << b.name << ": " << msg;
  testing::expect_error([] { parse_backend("CPU"); }, "unknown backend 'CPU'");
  testing::expect_error([] { parse_backend(""); }, "unknown backend ''");
}

// Backend cuda is parsed; it runs the model (model/llama_cuda.cpp) but keeps its cache in device
// memory: a host-only caller refuses it with the table's one line, naming the backends that can.
TEST(BackendNames, cudaIsKnownButRefusedWhereItCannotRun) {
  EXPECT_EQ(parse_backend("cuda"), AttentionBackend::kCuda);
  testing::expect_error(
      [] { require_host(AttentionBackend::kCuda); },
      "backend cuda keeps its cache in device memory, and this reads host caches");
  testing::expect_error([] { require_host(AttentionBackend::kCuda); },
                        "backends with host caches: ref, cpu, cpu-int8)");
  for (const BackendInfo& b : backends()) {
    EXPECT_NO_THROW(require_model(b.id)) << b.name;
    if (b.host) {
      EXPECT_NO_THROW(require_host(b.id)) << b.name;
    }
  }
  const SchemeSpec s = parse_spec("bf16");
  const auto k = make_side(s, Role::Key, 2, 64), v = make_side(s, Role::Value, 2, 64);
  const std::vector<float> x(4 * 64, 1.0f);
  k->append(x.data(), 1);
  v->append(x.data(), 1);
  std::vector<float> out(4 * 64);
  // host sides: cuda reads device sides only (whether or not a device is present)
  testing::expect_error(
      [&] { attend_decode(AttentionBackend::kCuda, x.data(), 4, *k, *v, out.data()); },
      cuda_unavailable().find("built without CUDA") == std::string::npos
          ? "backend cuda reads sides made by make_backend_side"
          : "built without CUDA");
  testing::expect_error(
      [&] { attend_decode(AttentionBackend::kCuda, x.data(), 4, *k, *v, out.data()); },
      "backend cuda");
  // a head_dim the kernels are not compiled for is refused first, from the table
  const auto k2 = make_side(s, Role::Key, 2, 16), v2 = make_side(s, Role::Value, 2, 16);
  testing::expect_error(
      [&] { attend_decode(AttentionBackend::kCuda, x.data(), 4, *k2, *v2, out.data()); },
      "backend cuda cannot run decode attention over head_dim 16 (head_dim: 64, 128)");
  // causal: one device call over device sides (attend_causal), never CausalCall's host items
  testing::expect_error(
      [&] {
        CausalCall(AttentionBackend::kCuda, {x.data(), 1, 4, 0, k.get(), v.get(), {}, {}}, 1);
      },
      "backend cuda's causal attention is one device call (attend_causal, prefill_device), not "
      "host work items (CausalCall)");
  testing::expect_error(
      [&] {
        attend_causal(AttentionBackend::kCuda, {x.data(), 1, 4, 0, k.get(), v.get(), {}, {}},
                      out.data());
      },
      cuda_unavailable().find("built without CUDA") == std::string::npos
          ? "backend cuda reads sides made by make_backend_side"
          : "built without CUDA");
}

// The table's cuda limits are dispatch.h's lists (what the kernels are compiled for), not a copy.
TEST(BackendSupport, cudaLimitsAreDispatchHsLists) {
  const BackendSupport& c = backend_info(AttentionBackend::kCuda).support;
  EXPECT_TRUE(std::equal(c.head_dims.begin(), c.head_dims.end(), cuda::HeadDims::values.begin(),
                         cuda::HeadDims::values.end()));
  EXPECT_TRUE(std::equal(c.bits.begin(), c.bits.end(), cuda::BitWidths::values.begin(),
                         cuda::BitWidths::values.end()));
  EXPECT_EQ(c.max_gqa, cuda::kMaxGqa);
  EXPECT_EQ(c.max_batch, cuda::kMaxBatch);
  EXPECT_TRUE(c.decode);
  EXPECT_TRUE(c.causal);
  EXPECT_TRUE(c.model);
  EXPECT_FALSE(c.pre_rope);
  for (const BackendInfo& b : backends())
    if (b.host) {
      EXPECT_TRUE(b.support.causal && b.support.model && b.support.sink && b.support.pre_rope &&
                  b.support.head_dims.empty() && b.support.max_gqa == 0)
          << b.name;
    }
}

// What each backend runs, spec by spec: the host backends every scheme; cuda the kinds its decode
// kernels read (bf16, fp8 with per-token or fixed scales, int) with rot=, and the error names the
// first thing it does not run and the backends that do.
TEST(BackendSupport, specsByBackend_oneErrorNamingWhyAndWhoCan) {
  const std::vector<std::string> cuda_runs{"bf16",
                                           "kivi2",
                                           "kivi4:g=32,r=64",
                                           "int3:k=channel,v=token,g=32,r=64",
                                           "int8:k=token,v=channel,sym",
                                           "fp8_e4m3:gran=token",
                                           "fp8_e5m2:scale=0.05",
                                           "kivi2:rot=hadamard:7",
                                           "k=kivi2;v=kivi2:r=64"};
  const std::vector<std::pair<std::string, std::string>> cuda_refuses{
      {"fp32", "fp32 caches"},
      {"fp16", "fp16 caches"},
      {"kivi2:sink=4", "sink=S"},
      {"fp8_e4m3", "dynamic fp8 scales"},
      {"fp8_e4m3:gran=channel,first=16", "dynamic fp8 scales"},
      {"kivi2:arith=fp16", "arith=fp16"},
      {"k=kivi2;v=kivi4", "different kinds, bits"},
      {"k=fp8_e4m3:gran=token;v=kivi4", "different kinds"},
      {"kivi2@1=fp32", "fp32 caches"},  // every layer's scheme counts
  };
  for (const BackendInfo& b : backends()) {
    for (const auto& op : {AttentionOp::kDecode, AttentionOp::kCausal}) {
      for (const auto& t : cuda_runs) {
        const SchemeSpec sp = parse_spec(t);
        EXPECT_EQ(unsupported(b.id, sp, op), "") << b.name << " " << t;
      }
      for (const auto& [t, why] : cuda_refuses) {
        const std::string u = unsupported(b.id, parse_spec(t), op);
        if (b.host)
          EXPECT_EQ(u, "") << b.name << " " << t;
        else
          EXPECT_NE(u.find(why), std::string::npos) << t << ": " << u;
      }
    }
  }
  EXPECT_EQ(backends_for(parse_spec("kivi2:sink=4"), AttentionOp::kDecode), "ref, cpu, cpu-int8");
  EXPECT_EQ(backends_for(parse_spec("kivi2"), AttentionOp::kDecode), "ref, cpu, cpu-int8, cuda");
  testing::expect_error(
      [] { require_supported(AttentionBackend::kCuda, parse_spec("fp32"), AttentionOp::kDecode); },
      "backend cuda cannot run decode attention over 'fp32': it does not run fp32 caches "
      "(backends that can: ref, cpu, cpu-int8)");
  EXPECT_NO_THROW(
      require_supported(AttentionBackend::kCpu, parse_spec("fp32"), AttentionOp::kCausal));
  // make_backend_side checks the table before anything touches a device
  testing::expect_error(
      [] {
        make_backend_side(AttentionBackend::kCuda, parse_spec("kivi2:sink=4"), Role::Key, 2, 64);
      },
      "backend cuda cannot run decode attention over 'kivi2:");
}

TEST(BackendSupport, shapes_cudaHeadDimAndGqaLimits) {
  const auto cuda = AttentionBackend::kCuda;
  EXPECT_EQ(unsupported_shape(cuda, 8, 128, 32), "");
  EXPECT_EQ(unsupported_shape(cuda, 3, 64, 9), "");
  EXPECT_NE(unsupported_shape(cuda, 8, 96, 32).find("head_dim 96 (head_dim: 64, 128)"),
            std::string::npos);
  EXPECT_NE(unsupported_shape(cuda, 2, 64, 32).find("16 query heads per kv head (at most 8)"),
            std::string::npos);
  EXPECT_NE(unsupported_shape(AttentionBackend::kCpu, 8, 64, 12).find("positive multiple"),
            std::string::npos);
  EXPECT_EQ(unsupported_shape(AttentionBackend::kCpu, 8, 96, 128), "");
}

// --help's lines: one per backend, in the list's order, each saying what it runs.
TEST(BackendSupport, helpHasOneLinePerBackend) {
  const std::string h = support_help();
  size_t at = 0;
  for (const BackendInfo& b : backends()) {
    const size_t p = h.find(fmt::format("  {}: {}", b.name, b.what), at);
    ASSERT_NE(p, std::string::npos) << b.name << "\n" << h;
    at = p + 1;
  }
  EXPECT_NE(
      h.find("cuda: the CUDA kernels (decode and causal attention, and the model on a GPU); "
             "decode and causal attention over bf16, fp8, int/kivi; head_dim 64, 128; bits 2, 3, "
             "4, 8; GQA <= 8"),
      std::string::npos)
      << h;
  EXPECT_NE(h.find("not: fp8 dynamic tensor/head/channel scales, arith=fp16, sink=, k/v of "
                   "different kinds, pre_rope"),
            std::string::npos)
      << h;
}

// Without a device (or without CUDA) a cuda side is one line naming why; with one, see
// tests/cuda/backend_cuda_test.cpp.
TEST(BackendSupport, cudaSideWithoutDevice_oneLineNamingTheDevice) {
  const std::string why = cuda_unavailable();
  if (why.empty()) GTEST_SKIP() << "a CUDA device is present (tests/cuda/backend_cuda_test.cpp)";
  EXPECT_EQ(why.rfind("backend cuda: ", 0), 0u) << why;
  EXPECT_TRUE(why.find("no CUDA device") != std::string::npos ||
              why.find("built without CUDA") != std::string::npos)
      << why;
  EXPECT_EQ(why.find('\n'), std::string::npos);
  testing::expect_error(
      [] { make_backend_side(AttentionBackend::kCuda, parse_spec("kivi2"), Role::Key, 2, 64); },
      why);
  testing::expect_error([] { device_report(AttentionBackend::kCuda); }, why);
  testing::expect_error([] { device_report(AttentionBackend::kCpu); }, "runs on the host");
}

// The model on a backend (kvq run's [model] / [needle] / [ruler], kvq model, Python's Model):
// what each backend runs the model with, from the table alone (no device asked), and the
// reference cache its quality rows measure against.
TEST(BackendModel, modelUnsupported_byTheTable_oneErrorNamingWhoCan) {
  for (const BackendInfo& b : backends())  // the host backends run every scheme, pre_rope too
    if (b.host)
      for (const char* s : {"fp32", "kivi2:sink=4", "k=kivi2;v=fp8", "kivi2@0=fp32", "fp8_e4m3"}) {
        EXPECT_EQ(model_unsupported(b.id, parse_spec(s), true), "") << b.name << " " << s;
      }
  const AttentionBackend cu = AttentionBackend::kCuda;
  // cuda runs the model (model/llama_cuda.cpp: chunked prefill, decode steps): its list decides
  for (const char* s :
       {"kivi2", "kivi4:g=32,r=64", "bf16", "fp8_e4m3:gran=token", "kivi2:rot=hadamard"})
    EXPECT_EQ(model_unsupported(cu, parse_spec(s)), "") << s;
  EXPECT_EQ(model_unsupported(cu, parse_spec("kivi2"), true), "pre_rope (pre-RoPE keys)");
  EXPECT_EQ(model_unsupported(cu, parse_spec("kivi2:sink=4")), "sink=S (exact sink tokens)");
  EXPECT_EQ(model_unsupported(cu, parse_spec("fp32")), "fp32 caches");
  // a per-layer spec: any layer's scheme the backend does not read
  EXPECT_EQ(model_unsupported(cu, parse_spec("kivi2@0=fp32")), "fp32 caches");
  testing::expect_error(
      [&] { require_model(cu, parse_spec("kivi2:sink=4")); },
      "backend cuda cannot run the model with the cache 'kivi2:g=32,r=128,sink=4': it does not "
      "run sink=S (exact sink tokens) (backends that can: ref, cpu, cpu-int8)");
  testing::expect_error([&] { require_model(cu, parse_spec("kivi2"), true); },
                        "with the cache 'kivi2:g=32,r=128' and pre_rope: it does not run pre_rope");
  EXPECT_NO_THROW(require_model(cu, parse_spec("kivi2")));
}

TEST(BackendModel, referenceCache_fp32OnTheHost_bf16OnCuda) {
  for (const BackendInfo& b : backends()) {
    const SchemeSpec r = reference_spec(b.id);
    // the reference is the unquantized cache the backend stores, and the model runs it there
    EXPECT_EQ(r.canonical(), b.host ? "fp32" : "bf16") << b.name;
    EXPECT_EQ(model_unsupported(b.id, r), "") << b.name;
  }
}

TEST(BackendModel, requireAvailable_hostAlways_cudaItsOneLine) {
  for (const BackendInfo& b : backends())
    if (b.host) {
      EXPECT_NO_THROW(require_available(b.id)) << b.name;
    }
  const std::string why = cuda_unavailable();
  if (why.empty()) {
    EXPECT_NO_THROW(require_available(AttentionBackend::kCuda));
  } else {
    EXPECT_EQ(testing::expect_error([] { require_available(AttentionBackend::kCuda); }, why), why);
  }
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
    cpu::decode_attention(
        qr.data(), kQh, s.k->stored(), s.v->stored(), want.data(),
        {1, b == AttentionBackend::kCpuInt8 ? cpu::IntMode::Int8 : cpu::IntMode::Exact, 0});
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
      in.int_mode = b == AttentionBackend::kCpuInt8 ? cpu::IntMode::Int8 : cpu::IntMode::Exact;
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

// Backend cuda's causal call is one decode launch over per-position views (causal_position_view):
// position t_begin + i of a chunk reads the chunk-appended side's codes cut at
// quantized_tokens_at(t_begin + i + 1) and the rest from the tail gathered before the append
// (gather_exact_tail, kStored). Checked here on host sides, where the views can be read: at every
// position of ragged chunks (1, 37, 130, 1, 200, 64 tokens: windows fill, groups complete, one
// token at a time) the view holds the same counts and bytes as a side appended token by token
// up to that position (the independent definition of what a decode there reads), and backend
// cpu's decode kernel over the two views gives the same bits.
class CausalPositionView : public ::testing::TestWithParam<std::string> {};

// n elements of a and b hold the same bytes (n == 0: nothing to compare).
template <typename T>
bool same_memory(const T* a, const T* b, int64_t n) {
  return n == 0 || (a && b && std::memcmp(a, b, static_cast<size_t>(n) * sizeof(T)) == 0);
}

TEST_P(CausalPositionView, raggedChunks_eachPositionReadsWhatTokenByTokenStores) {
  const SchemeSpec sp = parse_spec(GetParam());
  constexpr int64_t T = 433, row = kH * kD;
  const Tensor3 kx = synthetic_kv({{T, kH, kD}, 2, 12.0f, 1}),
                vx = synthetic_kv({{T, kH, kD}, 0, 1.0f, 2});
  const SideKernels kern = side_kernels(AttentionBackend::kCpu);
  Sides chunked{make_side(sp, Role::Key, kH, kD, 0, kern),
                make_side(sp, Role::Value, kH, kD, 0, kern)};
  Sides token{make_side(sp, Role::Key, kH, kD, 0, kern),
              make_side(sp, Role::Value, kH, kD, 0, kern)};
  const std::vector<float> q = testing::random_q(kQh * kD, 9);
  std::vector<float> got(q.size()), want(q.size());
  int64_t t0 = 0;
  for (const int64_t n : {1, 37, 130, 1, 200, 64}) {
    std::vector<float> tails[2];
    int64_t begins[2];
    const Tensor3* xs[2] = {&kx, &vx};
    SideStore* cs[2] = {chunked.k.get(), chunked.v.get()};
    SideStore* ts[2] = {token.k.get(), token.v.get()};
    for (int s = 0; s < 2; ++s) {
      begins[s] =
          gather_exact_tail(*cs[s], xs[s]->data.data() + t0 * row, n, tails[s], TailSpace::kStored);
      cs[s]->append(xs[s]->data.data() + t0 * row, n);
    }
    const StoredSide stored[2] = {cs[0]->stored(), cs[1]->stored()};
    for (int64_t i = 0; i < n; ++i) {
      const int64_t t = t0 + i + 1;
      StoredSide views[2], wants[2];
      for (int s = 0; s < 2; ++s) {
        const std::string at = fmt::format("{} {} position {} of the chunk [{}, {})", GetParam(),
                                           s == 0 ? "K" : "V", t - 1, t0, t0 + n);
        ts[s]->append(xs[s]->data.data() + (t - 1) * row, 1);
        const StoredSide v =
            causal_position_view(*cs[s], stored[s], t - 1, tails[s].data(), begins[s]);
        const StoredSide w = ts[s]->stored();
        ASSERT_EQ(v.tokens, t) << at;
        ASSERT_EQ(w.tokens, t) << at;
        const int64_t qt = w.kind == SchemeKind::Int ? w.quantized_tokens : t;
        if (w.kind == SchemeKind::Int) {
          ASSERT_EQ(v.quantized_tokens, qt) << at;
          ASSERT_EQ(qt, cs[s]->quantized_tokens_at(t)) << at;
        }
        const testing::StoredCounts c = testing::stored_counts(w, qt);
        EXPECT_TRUE(same_memory(v.codes, w.codes, c.codes)) << at;
        EXPECT_TRUE(same_memory(v.words, w.words, c.words)) << at;
        EXPECT_TRUE(same_memory(v.scales, w.scales, c.params)) << at;
        EXPECT_TRUE(same_memory(v.mins, w.mins, w.mins ? c.params : 0)) << at;
        if (w.kind == SchemeKind::Fp8 && w.gran == Granularity::Token) {
          EXPECT_TRUE(same_memory(v.fp8_scales, w.fp8_scales, c.scales)) << at;
        }
        if (w.kind == SchemeKind::Bf16) {
          EXPECT_TRUE(same_memory(v.half16, w.half16, t * row)) << at;
        }
        EXPECT_TRUE(same_memory(v.residual, w.residual, (t - qt) * row))
            << at << ": the exact rows [" << qt << ", " << t << ")";
        views[s] = v;
        wants[s] = w;
      }
      cpu::decode_attention(q.data(), kQh, views[0], views[1], got.data(),
                            {1, cpu::IntMode::Exact, 0});
      cpu::decode_attention(q.data(), kQh, wants[0], wants[1], want.data(),
                            {1, cpu::IntMode::Exact, 0});
      ASSERT_TRUE(same_bits(got, want)) << GetParam() << " position " << t - 1;
    }
    t0 += n;
  }
}

INSTANTIATE_TEST_SUITE_P(Specs, CausalPositionView,
                         ::testing::Values("bf16", "kivi2", "kivi4:g=32,r=64", "kivi2:g=64,r=128",
                                           "int3:k=channel,v=token,g=32,r=64",
                                           "int8:k=token,v=channel,sym", "kivi2:rot=hadamard:7",
                                           "fp8_e4m3:gran=token", "fp8_e5m2:scale=0.05"),
                         [](const auto& i) { return testing::test_name(i.param); });

// Positions a view cannot describe: one the side does not hold, a tail that starts after the
// position's codes end, a tail missing where exact rows are read, and sink=S sides.
TEST(CausalPositionView, badPositionsAndTails_oneLineNamingThem) {
  const SchemeSpec sp = parse_spec("kivi2:g=32,r=32");
  const Tensor3 x = synthetic_kv({{80, kH, kD}, 0, 1.0f, 4});
  const auto k = make_side(sp, Role::Key, kH, kD);
  k->append(x.data.data(), 80);
  const StoredSide st = k->stored();
  const std::vector<float> tail(static_cast<size_t>(80 * kH * kD));
  testing::expect_error([&] { causal_position_view(*k, st, 80, tail.data(), 0); },
                        "causal attention: position 80 of a side holding 80 tokens");
  const int64_t q = k->quantized_tokens_at(70);
  ASSERT_GT(70, q);
  testing::expect_error([&] { causal_position_view(*k, st, 69, tail.data(), q + 1); },
                        fmt::format("the exact tail starts at {}", q + 1));
  testing::expect_error([&] { causal_position_view(*k, st, 69, nullptr, 0); }, "(no tail given)");
  EXPECT_NO_THROW(causal_position_view(*k, st, 69, tail.data(), q));
  const auto sink = make_side(parse_spec("kivi2:sink=4"), Role::Key, kH, kD);
  sink->append(x.data.data(), 8);
  testing::expect_error([&] { causal_position_view(*sink, sink->stored(), 5, tail.data(), 0); },
                        "a side with sink=S has no per-position view");
}

}  // namespace
}  // namespace kvq
