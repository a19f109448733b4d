// Backend cuda through the backend interface (kernels/backend.h): cache sides in device memory
// (make_backend_side(cuda, ...)), decode attention over them (attend_decode) and chunked causal
// prefill (prefill_device, attend_causal), against backend cpu's host sides built from the same
// appends and against token-by-token decode on cuda.
//
// Where expected values come from:
//   - stored bytes: the CPU sides' stored() (cache/side.h with backend cpu's
//     quantizers, themselves tested bit for bit against the reference), compared bit for bit with
//     the device bytes read back (stored_copy); the footprint and quantized_tokens_at likewise;
//   - attention: backend ref's decode_attention over the CPU sides (the scalar definition). The
//     tolerances are tests/cuda/attention_kernel_test.cu's, for the same reasons (float32
//     accumulation in another order; int caches fold scales differently): NMSE <= 1e-5 and
//     max |error| <= 1e-4 x max |V| for every kind.
// Without a device every test skips with the one line cuda_unavailable() gives.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "core/spec.h"
#include "evaluation/synthetic.h"
#include "kernels/backend.h"
#include "kernels/cuda/device_side.h"
#include "kivi/layout.h"
#include "reference_cpu/attention.h"
#include "tests/support/names.h"
#include "tests/support/random.h"
#include "tests/support/skip_cuda.h"

namespace kvq {
namespace {

constexpr double kNmse = 1e-5, kMaxAbsOfV = 1e-4;

template <typename T>
bool same(const T* a, const T* b, int64_t n) {
  return n == 0 || (a && b && std::memcmp(a, b, static_cast<size_t>(n) * sizeof(T)) == 0);
}

// Every byte a view holds, for the kinds backend cuda stores (the CPU side's view against the
// device side's read back).
void expect_same_bytes(const StoredSide& want, const StoredSide& got, const std::string& what) {
  ASSERT_EQ(got.kind, want.kind) << what;
  ASSERT_EQ(got.tokens, want.tokens) << what;
  const int64_t n = want.tokens * want.heads * want.dim;
  switch (want.kind) {
    case SchemeKind::Bf16:
      EXPECT_TRUE(same(got.half16, want.half16, n)) << what;
      break;
    case SchemeKind::Fp8: {
      EXPECT_EQ(got.gran, want.gran) << what;
      EXPECT_TRUE(same(got.codes, want.codes, n)) << what;
      const int64_t ns = want.gran == Granularity::Tensor  ? 1
                         : want.gran == Granularity::Head  ? want.heads
                         : want.gran == Granularity::Token ? want.tokens * want.heads
                                                           : want.heads * want.dim;
      EXPECT_TRUE(same(got.fp8_scales, want.fp8_scales, ns)) << what;
      break;
    }
    case SchemeKind::Int: {
      ASSERT_EQ(got.quantized_tokens, want.quantized_tokens) << what;
      ASSERT_EQ(got.group, want.group) << what;
      // the words and parameters the quantized tokens take (kivi/layout.h)
      const int64_t tq = want.quantized_tokens;
      const bool ch = want.axis == Axis::Channel;
      const kivi::ChannelLayout cl{want.heads, want.dim, want.group, want.bits};
      const kivi::TokenLayout tl{want.heads, want.dim, want.group, want.bits};
      const int64_t words = ch ? cl.words_for_tokens(tq) : tl.words_for_tokens(tq);
      const int64_t params = ch ? cl.params_for_tokens(tq) : tl.params_for_tokens(tq);
      EXPECT_TRUE(same(got.words, want.words, words)) << what;
      EXPECT_TRUE(same(got.scales, want.scales, params)) << what;
      if (!want.sym) {
        EXPECT_TRUE(same(got.mins, want.mins, params)) << what;
      }
      EXPECT_TRUE(same(got.residual, want.residual,
                       (want.tokens - want.quantized_tokens) * want.heads * want.dim))
          << what;
      break;
    }
    default:
      ADD_FAILURE() << what << ": backend cuda does not store this kind";
  }
}

struct Pair {
  std::unique_ptr<SideStore> k, v;
};

constexpr int64_t kH = 2, kD = 64, kGqa = 3, kQh = kH * kGqa;

class BackendCuda : public ::testing::TestWithParam<std::string> {};

// Appends in ragged chunks (1, 37, 130, 1, 200 tokens: windows fill, blocks complete, one token at
// a time); after each, the bytes, the counts and the footprint equal backend cpu's, and decode
// attention on cuda is the reference's within the tolerances.
TEST_P(BackendCuda, sidesStoreTheCpuBytes_andDecodeMatchesTheReference) {
  KVQ_SKIP_WITHOUT_CUDA();
  const SchemeSpec spec = parse_spec(GetParam());
  const int64_t T = 369;
  const Tensor3 kx = synthetic_kv({{T, kH, kD}, 2, 12.0f, 1}),
                vx = synthetic_kv({{T, kH, kD}, 0, 1.0f, 2});
  Pair cpu{make_backend_side(AttentionBackend::kCpu, spec, Role::Key, kH, kD),
           make_backend_side(AttentionBackend::kCpu, spec, Role::Value, kH, kD)};
  Pair dev{make_backend_side(AttentionBackend::kCuda, spec, Role::Key, kH, kD),
           make_backend_side(AttentionBackend::kCuda, spec, Role::Value, kH, kD)};
  ASSERT_TRUE(on_device(*dev.k) && on_device(*dev.v) && !on_device(*cpu.k));
  const std::vector<float> q = testing::random_q(kQh * kD, 11);
  int64_t t = 0;
  for (const int64_t n : {1, 37, 130, 1, 200}) {
    const int64_t row = kH * kD;
    for (Pair* p : {&cpu, &dev}) {
      p->k->append(kx.data.data() + t * row, n);
      p->v->append(vx.data.data() + t * row, n);
    }
    t += n;
    const std::string at = GetParam() + " after " + std::to_string(t) + " tokens";
    for (const auto& [c, d, side] :
         {std::tuple{cpu.k.get(), dev.k.get(), "K"}, std::tuple{cpu.v.get(), dev.v.get(), "V"}}) {
      ASSERT_EQ(d->tokens(), t) << at;
      const StoredCopy got = stored_copy(*d);
      expect_same_bytes(c->stored(), got.view, at + " " + side);
      EXPECT_EQ(d->footprint().total_bytes(), c->footprint().total_bytes()) << at << side;
      for (int64_t u = 0; u <= t + 70; u += 7)
        ASSERT_EQ(d->quantized_tokens_at(u), c->quantized_tokens_at(u)) << at << side << u;
      std::vector<float> ce, de;
      c->exact_tail(ce);
      d->exact_tail(de);
      EXPECT_TRUE(ce.size() == de.size() &&
                  same(ce.data(), de.data(), static_cast<int64_t>(ce.size())))
          << at << side << ": the exact tail (model space)";
    }
    std::vector<float> ref(q.size()), got(q.size());
    decode_attention(q.data(), kQh, *cpu.k, *cpu.v, ref.data(), 1);
    attend_decode(AttentionBackend::kCuda, q.data(), kQh, *dev.k, *dev.v, got.data());
    double se = 0, sr = 0, worst = 0, vmax = 0;
    for (float x : vx.data) vmax = std::max(vmax, static_cast<double>(std::fabs(x)));
    for (size_t i = 0; i < q.size(); ++i) {
      ASSERT_TRUE(std::isfinite(got[i])) << at << " element " << i;
      se += (got[i] - ref[i]) * (got[i] - ref[i]);
      sr += ref[i] * ref[i];
      worst = std::max(worst, static_cast<double>(std::fabs(got[i] - ref[i])));
    }
    ASSERT_GT(sr, 0) << at;
    EXPECT_LE(se / sr, kNmse) << at;
    EXPECT_LE(worst, kMaxAbsOfV * vmax) << at;
  }
}

// cuda::DeviceSide::append_device (rows already in device memory, as the model's step appends
// them) in the same ragged chunks: after each, the bytes read back (host_copy) equal those of the
// host append (append: upload, then the same kernels) and of backend cpu's side of the same
// one-side scheme (rot= off: the device side takes the base scheme; the backend layer rotates).
TEST_P(BackendCuda, deviceAppend_sameBytesAsHostAppend) {
  KVQ_SKIP_WITHOUT_CUDA();
  const SchemeSpec spec = parse_spec(GetParam());
  const int64_t T = 369, row = kH * kD;
  const Tensor3 kx = synthetic_kv({{T, kH, kD}, 2, 12.0f, 1}),
                vx = synthetic_kv({{T, kH, kD}, 0, 1.0f, 2});
  for (const auto& [role, x] : {std::pair{Role::Key, &kx}, std::pair{Role::Value, &vx}}) {
    const SchemeSpec one = spec.side(role).base();
    cuda::DeviceSide host(one, role, kH, kD), dev(one, role, kH, kD);
    const auto cpu = make_backend_side(AttentionBackend::kCpu, one, role, kH, kD);
    cuda::DeviceFloats xd(T * row);
    xd.upload(x->data.data(), T * row);
    int64_t t = 0;
    for (const int64_t n : {1, 37, 130, 1, 200}) {
      host.append(x->data.data() + t * row, n);
      dev.append_device(xd.get() + t * row, n);
      cpu->append(x->data.data() + t * row, n);
      t += n;
      const std::string at = GetParam() + (role == Role::Key ? " K" : " V") + " after " +
                             std::to_string(t) + " tokens";
      ASSERT_EQ(dev.tokens(), t) << at;
      const cuda::DeviceSide::HostCopy want = host.host_copy(), got = dev.host_copy();
      expect_same_bytes(want.view, got.view, at + ": device append vs host append");
      expect_same_bytes(cpu->stored(), got.view, at + ": device append vs backend cpu");
    }
  }
}

// kernels/backend.h's append_device_batch (a serving step's appends: one KiviSideCache::
// append_batch for int sides, one conversion launch for bf16 ones, a launch a side for fp8, the
// single path for rot=) over 70 sides (more than one bf16 conversion launch and one KIVI job list
// take), each request its own rows, in rounds of the same n for every side: after each round every
// side's bytes equal those of a side appended alone by append_device with the same rows.
TEST_P(BackendCuda, batchedAppend_sameBytesAsEachSideAlone) {
  KVQ_SKIP_WITHOUT_CUDA();
  const SchemeSpec spec = parse_spec(GetParam());
  constexpr int kSides = 70;
  const int64_t T = 169, row = kH * kD, span = T + 3 * kSides;
  const Tensor3 x = synthetic_kv({{span, kH, kD}, 2, 12.0f, 3});
  cuda::DeviceFloats xd(span * row);
  xd.upload(x.data.data(), span * row);
  for (const Role role : {Role::Key, Role::Value}) {
    std::vector<std::unique_ptr<SideStore>> batched, alone;
    std::vector<SideStore*> ptrs;
    for (int i = 0; i < kSides; ++i) {
      batched.push_back(make_backend_side(AttentionBackend::kCuda, spec, role, kH, kD));
      alone.push_back(make_backend_side(AttentionBackend::kCuda, spec, role, kH, kD));
      ptrs.push_back(batched.back().get());
    }
    int64_t t = 0;
    for (const int64_t n : {1, 37, 1, 130}) {
      std::vector<const float*> rows;
      for (int i = 0; i < kSides; ++i) {
        rows.push_back(xd.get() + (3 * i + t) * row);  // request i: its own rows
        append_device(*alone[static_cast<size_t>(i)], rows.back(), n);
      }
      append_device_batch(ptrs, rows, n);
      t += n;
      for (int i = 0; i < kSides; ++i) {
        const std::string at = GetParam() + (role == Role::Key ? " K" : " V") + " side " +
                               std::to_string(i) + " after " + std::to_string(t) + " tokens";
        ASSERT_EQ(batched[static_cast<size_t>(i)]->tokens(), t) << at;
        const StoredCopy want = stored_copy(*alone[static_cast<size_t>(i)]),
                         got = stored_copy(*batched[static_cast<size_t>(i)]);
        expect_same_bytes(want.view, got.view, at + ": batched vs alone");
      }
    }
  }
}

// Chunked causal prefill on cuda (prefill_device: rows in device memory, q|k|v-strided as the
// model's buffer holds them) in ragged chunks (1, 37, 130, 1, 200: windows fill, groups complete,
// one token at a time) against, at every position:
//   - token-by-token decode on cuda (append_device + attend_decode_device a token): the bytes bit
//     for bit after every chunk; the outputs within kChunkNmse / kChunkMaxAbsOfV (1,000x / 10x
//     below the tolerances against the reference): the same kernels over the same bytes, summed
//     in another order (the launch splits a chunk's longest context, not each position's own,
//     and the tensor-core kernel's bf16 high/low parts of p are taken relative to each split's
//     maximum: ~2^-17 relative a probability);
//   - backend cpu's causal call over host sides of the same appends (attend_causal, tails
//     gathered as stored): within the decode tolerances above (kNmse, kMaxAbsOfV);
//   - attend_causal on backend cuda (host rows: gather_exact_tail, append, the call) over a third
//     pair of device sides: the same bytes, and the same bits as prefill_device (one launch over
//     the same views).
constexpr double kChunkNmse = 1e-8, kChunkMaxAbsOfV = 1e-5;

struct Err {
  double nmse = 0, worst = 0;
};
Err error_of(const std::vector<float>& got, const std::vector<float>& want) {
  double se = 0, sr = 0, worst = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    se += (got[i] - want[i]) * (got[i] - want[i]);
    sr += want[i] * want[i];
    worst = std::max(worst, static_cast<double>(std::fabs(got[i] - want[i])));
  }
  return {sr > 0 ? se / sr : (se > 0 ? 1.0 : 0.0), worst};
}

TEST_P(BackendCuda, chunkedPrefill_equalsTokenByTokenDecode_andCpusCausalCall) {
  KVQ_SKIP_WITHOUT_CUDA();
  const SchemeSpec spec = parse_spec(GetParam());
  const int64_t T = 369, row = kH * kD, qrow = kQh * kD, stride = qrow + 2 * row;
  const Tensor3 kx = synthetic_kv({{T, kH, kD}, 2, 12.0f, 1}),
                vx = synthetic_kv({{T, kH, kD}, 0, 1.0f, 2});
  const std::vector<float> q = testing::random_q(T * qrow, 13);
  double vmax = 0;
  for (float x : vx.data) vmax = std::max(vmax, static_cast<double>(std::fabs(x)));
  // the model's q|k|v buffer: row t = q_t | k_t | v_t
  std::vector<float> qkv(static_cast<size_t>(T * stride));
  for (int64_t t = 0; t < T; ++t) {
    std::copy_n(q.data() + t * qrow, qrow, qkv.data() + t * stride);
    std::copy_n(kx.data.data() + t * row, row, qkv.data() + t * stride + qrow);
    std::copy_n(vx.data.data() + t * row, row, qkv.data() + t * stride + qrow + row);
  }
  cuda::DeviceFloats qkv_d(T * stride), q_d(T * qrow), out_d(T * qrow);
  qkv_d.upload(qkv.data(), T * stride);
  q_d.upload(q.data(), T * qrow);
  auto pair = [&](AttentionBackend b) {
    return Pair{make_backend_side(b, spec, Role::Key, kH, kD),
                make_backend_side(b, spec, Role::Value, kH, kD)};
  };
  Pair chunked = pair(AttentionBackend::kCuda), token = pair(AttentionBackend::kCuda),
       host_rows = pair(AttentionBackend::kCuda), cpu = pair(AttentionBackend::kCpu);
  std::vector<float> tok(static_cast<size_t>(T * qrow)), chk(tok.size()), hst(tok.size()),
      cpu_out(tok.size());
  int64_t t0 = 0;
  for (const int64_t n : {1, 37, 130, 1, 200}) {
    const std::string at =
        GetParam() + " chunk [" + std::to_string(t0) + ", " + std::to_string(t0 + n) + ")";
    // token by token on cuda
    for (int64_t t = t0; t < t0 + n; ++t) {
      append_device(*token.k, qkv_d.get() + t * stride + qrow, 1);
      append_device(*token.v, qkv_d.get() + t * stride + qrow + row, 1);
      attend_decode_device(q_d.get() + t * qrow, kQh, *token.k, *token.v, out_d.get() + t * qrow);
    }
    cuda::download_floats(out_d.get() + t0 * qrow, n * qrow, tok.data() + t0 * qrow);
    // the chunk on cuda, rows in device memory
    prefill_device(*chunked.k, *chunked.v, qkv_d.get() + t0 * stride + qrow,
                   qkv_d.get() + t0 * stride + qrow + row, stride, n, q_d.get() + t0 * qrow, kQh,
                   out_d.get() + t0 * qrow);
    cuda::download_floats(out_d.get() + t0 * qrow, n * qrow, chk.data() + t0 * qrow);
    // host rows: attend_causal on cuda and on cpu
    for (const auto& [p, b, out] : {std::tuple{&host_rows, AttentionBackend::kCuda, &hst},
                                    std::tuple{&cpu, AttentionBackend::kCpu, &cpu_out}}) {
      std::vector<float> kt, vt;
      const int64_t kb = gather_exact_tail(*p->k, kx.data.data() + t0 * row, n, kt, tail_space(b));
      const int64_t vb = gather_exact_tail(*p->v, vx.data.data() + t0 * row, n, vt, tail_space(b));
      p->k->append(kx.data.data() + t0 * row, n);
      p->v->append(vx.data.data() + t0 * row, n);
      attend_causal(b,
                    CausalArgs{q.data() + t0 * qrow,
                               n,
                               kQh,
                               t0,
                               p->k.get(),
                               p->v.get(),
                               {kt.data(), kb},
                               {vt.data(), vb}},
                    out->data() + t0 * qrow);
    }
    t0 += n;
    for (const auto& [c, d, side] :
         {std::tuple{token.k.get(), chunked.k.get(), " K"},
          std::tuple{token.v.get(), chunked.v.get(), " V"},
          std::tuple{token.k.get(), host_rows.k.get(), " K (host rows)"},
          std::tuple{token.v.get(), host_rows.v.get(), " V (host rows)"}}) {
      ASSERT_EQ(d->tokens(), t0) << at << side;
      const StoredCopy want = stored_copy(*c), got = stored_copy(*d);
      expect_same_bytes(want.view, got.view, at + side + ": chunked vs token by token");
    }
    for (int64_t t = t0 - n; t < t0; ++t) {
      const auto slice = [&](const std::vector<float>& v) {
        return std::vector<float>(v.begin() + t * qrow, v.begin() + (t + 1) * qrow);
      };
      const std::string pos = at + " position " + std::to_string(t);
      const std::vector<float> c = slice(chk);
      for (float x : c) ASSERT_TRUE(std::isfinite(x)) << pos;
      const Err e_tok = error_of(c, slice(tok)), e_cpu = error_of(c, slice(cpu_out));
      EXPECT_LE(e_tok.nmse, kChunkNmse) << pos << ": chunked vs token by token on cuda";
      EXPECT_LE(e_tok.worst, kChunkMaxAbsOfV * vmax) << pos << ": chunked vs token by token";
      EXPECT_LE(e_cpu.nmse, kNmse) << pos << ": chunked cuda vs cpu's causal call";
      EXPECT_LE(e_cpu.worst, kMaxAbsOfV * vmax) << pos << ": chunked cuda vs cpu's causal call";
      EXPECT_EQ(std::memcmp(c.data(), hst.data() + t * qrow, c.size() * sizeof(float)), 0)
          << pos << ": prefill_device vs attend_causal(cuda) with host rows";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Specs, BackendCuda,
                         ::testing::Values("bf16", "kivi2", "kivi4:g=32,r=64", "kivi2:g=64,r=128",
                                           "int3:k=channel,v=token,g=32,r=64",
                                           "int8:k=token,v=channel,sym", "kivi2:rot=hadamard:7",
                                           "fp8_e4m3:gran=token", "fp8_e5m2:scale=0.05"),
                         [](const auto& i) { return testing::test_name(i.param); });

// The bf16 side's device rounding (model::to_bf16, core/half.h's float_to_bf16_bits compiled for
// the device) on the values a rounding gets wrong: ties to even either way, the largest values
// that round to infinity and those that do not, subnormals, signed zeros, infinities and NaNs
// (quiet, signalling, negative: kept NaN). Expected: float_to_bf16_bits on the host.
TEST(BackendCudaSides, bf16DeviceAppendRoundsAsTheHost) {
  KVQ_SKIP_WITHOUT_CUDA();
  const std::vector<uint32_t> bits = {
      0x3f800000u, 0x3f808000u, 0x3f818000u, 0x3f807fffu, 0x3f808001u, 0x7f7f8000u, 0x7f7f7fffu,
      0x7f7fffffu, 0x00008000u, 0x00018000u, 0x00000001u, 0x807fffffu, 0x00000000u, 0x80000000u,
      0x7f800000u, 0xff800000u, 0x7fc00000u, 0x7f800001u, 0xffbfffffu, 0x7fff0000u};
  const int64_t n = static_cast<int64_t>(bits.size());  // 20 = one token of kH x 10 channels
  std::vector<float> x(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) x[i] = bits_float(bits[i]);
  cuda::DeviceSide side(parse_spec("bf16"), Role::Key, kH, n / kH);
  cuda::DeviceFloats xd(n);
  xd.upload(x.data(), n);
  side.append_device(xd.get(), 1);
  const cuda::DeviceSide::HostCopy got = side.host_copy();
  ASSERT_EQ(static_cast<int64_t>(got.half16.size()), n);
  for (size_t i = 0; i < bits.size(); ++i)
    EXPECT_EQ(got.half16[i], float_to_bf16_bits(x[i])) << std::hex << "0x" << bits[i];
}

// Host reads of a device side, and a host backend over one, are refused with one line.
TEST(BackendCudaSides, hostReadsRefused) {
  KVQ_SKIP_WITHOUT_CUDA();
  const SchemeSpec s = parse_spec("kivi2");
  const auto k = make_backend_side(AttentionBackend::kCuda, s, Role::Key, kH, kD);
  const auto v = make_backend_side(AttentionBackend::kCuda, s, Role::Value, kH, kD);
  const std::vector<float> x(static_cast<size_t>(kH * kD * 40), 0.5f);
  k->append(x.data(), 40);
  v->append(x.data(), 40);
  std::vector<float> out(static_cast<size_t>(kQh * kD));
  EXPECT_THROW(k->dequantize(), Error);
  EXPECT_THROW(k->stored(), Error);
  EXPECT_THROW(attend_decode(AttentionBackend::kCpu, x.data(), kQh, *k, *v, out.data()), Error);
  EXPECT_THROW(attend_decode(AttentionBackend::kRef, x.data(), kQh, *k, *v, out.data()), Error);
}

// The [throughput] task's device calls: the GPU's report, a device copy, timed decode steps.
TEST(BackendCudaTiming, deviceReportCopyAndTimedSteps) {
  KVQ_SKIP_WITHOUT_CUDA();
  const DeviceReport d = device_report(AttentionBackend::kCuda);
  EXPECT_FALSE(d.name.empty());
  EXPECT_GT(d.driver_version, 0);
  EXPECT_GT(d.peak_gbps, 100);
  EXPECT_GT(d.memory_bytes, int64_t{1} << 30);
  const double copy = device_copy_gbps(AttentionBackend::kCuda, 64 << 20, 3);
  EXPECT_GT(copy, 10);
  EXPECT_LT(copy, d.peak_gbps);  // bytes copied per second: DRAM moves twice that
  const SchemeSpec s = parse_spec("kivi2");
  std::vector<std::unique_ptr<SideStore>> ks, vs;
  std::vector<const SideStore*> kp, vp;
  const Tensor3 x = synthetic_kv({{512, kH, kD}, 2, 12.0f, 3});
  for (int i = 0; i < 3; ++i) {
    ks.push_back(make_backend_side(AttentionBackend::kCuda, s, Role::Key, kH, kD));
    vs.push_back(make_backend_side(AttentionBackend::kCuda, s, Role::Value, kH, kD));
    ks.back()->append(x.data.data(), 512);
    vs.back()->append(x.data.data(), 512);
    kp.push_back(ks.back().get());
    vp.push_back(vs.back().get());
  }
  const std::vector<float> q = testing::random_q(kQh * kD, 5);
  const double us = time_device_decode_us(AttentionBackend::kCuda, kp, vp, 5, q.data(), kQh, 3);
  EXPECT_GT(us, 0);
  EXPECT_LT(us, 1e6);
}

}  // namespace
}  // namespace kvq
