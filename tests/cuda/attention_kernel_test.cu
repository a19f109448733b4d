// Tests for kernels/cuda/attention_kernels.cu (fused decode attention) against the CPU reference,
// kvq::decode_attention (reference_cpu/attention.cpp) over caches built by kvq::make_side.
//
// Where expected values come from: the CPU reference reads the same stored bytes: the test
// builds each cache on the host (bf16 bits, fp8::compute_scales + fp8::quantize, kivi::SideCache)
// exactly as make_side stores it (checked: both read back bit-equal) and uploads those bytes.
//
// Tolerances (STYLE 3): both backends accumulate in float32 over the same stored values, in a
// different order (the kernel splits the context and merges partial softmaxes; the CPU takes one
// softmax with a double sum). Per-operation relative error is 2^-24; scores over <= 128 channels
// with |s| of a few units carry absolute errors ~1e-6, so probabilities carry relative errors
// ~1e-6 and the output NMSE is ~1e-12. kNmseExact = 1e-6 (bf16, fp8) leaves a 10^5 margin. Int
// caches also fold scales differently (per-token values: the CPU sums p * scale * code and
// p * min apart, the kernel dequantizes code * scale + min first), which adds a cancellation
// error of ~ulp(|min|) per value: kNmseInt = 1e-5. Max |error| is bounded relative to max |V|
// (outputs are convex combinations of V rows): 1e-5 and 1e-4.
//
// No vacuous pass (STYLE 4): output buffers carry sentinel bytes on both sides, every output
// must be finite, and its norm > 0. Without a device the device tests skip with a visible
// message; the helper, plan and configuration tests run everywhere.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "cache/side.h"
#include "core/error.h"
#include "core/half.h"
#include "core/npy.h"
#include "core/spec.h"
#include "core/tensor.h"
#include "fp8/scale.h"
#include "kernels/cuda/attention_kernels.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/dispatch.h"
#include "kernels/cuda/kivi_cache_device.cuh"
#include "kivi/cache.h"
#include "reference_cpu/attention.h"
#include "tests/cuda/cuda_test_util.h"
#include "tests/support/expect_error.h"
#include "tests/support/names.h"

namespace kvq::cuda {
namespace {

using kvq::testing::expect_error;

constexpr double kNmseExact = 1e-6;    // bf16 and fp8 caches
constexpr double kNmseInt = 1e-5;      // int caches (scale / min folded differently)
constexpr double kMaxAbsExact = 1e-5;  // x max |V|
constexpr double kMaxAbsInt = 1e-4;    // x max |V|

/// Device allocations of one test case, freed together.
class Arena {
 public:
  Arena() = default;
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;
  ~Arena() {
    for (void* p : ptrs_) cudaFree(p);
  }
  /// A device copy of `x` (null when empty).
  template <typename T>
  const T* upload(std::span<const T> x) {
    if (x.empty()) return nullptr;
    void* p = nullptr;
    KVQ_CUDA_CHECK(cudaMalloc(&p, x.size_bytes()));
    ptrs_.push_back(p);
    KVQ_CUDA_CHECK(cudaMemcpy(p, x.data(), x.size_bytes(), cudaMemcpyHostToDevice));
    return static_cast<const T*>(p);
  }
  template <typename T>
  const T* upload(const std::vector<T>& x) {
    return upload(std::span<const T>(x));
  }
  void* scratch(size_t bytes) {
    void* p = nullptr;
    KVQ_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(bytes, 1)));
    ptrs_.push_back(p);
    return p;
  }

 private:
  std::vector<void*> ptrs_;
};

/// A float device output with sentinel guard bytes around it.
using GuardedOutput = testing::GuardedBuffer<float>;

// ---- inputs (STYLE 5): fixed seeds, outlier key channels, a constant token group -------------

Tensor3 make_kv(Shape3 s, uint32_t seed, bool keys) {
  Tensor3 x(s);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t t = 0; t < s.tokens; ++t)
    for (int64_t h = 0; h < s.heads; ++h)
      for (int64_t d = 0; d < s.dim; ++d) {
        const float outlier = keys && d % 17 == 5 ? 8.0f : 1.0f;  // KIVI's outlier key channels
        x.at(t, h, d) = round_to_bf16(normal(rng) * outlier + (keys ? 0.5f : 0.0f));
      }
  // A constant stretch (zero-scale groups on both axes): tokens 32..63 of head 0, channel 3.
  for (int64_t t = 32; t < std::min<int64_t>(s.tokens, 64); ++t) x.at(t, 0, 3) = 0.75f;
  if (s.tokens > 5)
    for (int64_t d = 0; d < s.dim; ++d) x.at(5, 0, d) = -1.25f;
  return x;
}

std::vector<float> make_q(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> q(static_cast<size_t>(n));
  for (float& v : q) v = normal(rng);
  return q;
}

// ---- caches: host bytes as make_side stores them, uploaded -------------------------------------

void expect_same_readback(const SideStore& cpu, const Tensor3& mine, const char* what) {
  const Tensor3 want = cpu.dequantize();
  ASSERT_EQ(want.data.size(), mine.data.size()) << what;
  int64_t bad = 0;
  for (size_t i = 0; i < want.data.size(); ++i)
    bad += float_bits(want.data[i]) != float_bits(mine.data[i]) &&
           !(std::isnan(want.data[i]) && std::isnan(mine.data[i]));
  ASSERT_EQ(bad, 0) << what << ": the uploaded bytes are not what make_side stores";
}

Bf16SideView upload_side(Arena& arena, const SchemeSpec&, Role, const Tensor3& x,
                         const SideStore& cpu, Bf16SideView*) {
  std::vector<uint16_t> bits(x.data.size());
  Tensor3 back(x.shape);
  for (size_t i = 0; i < bits.size(); ++i) {
    bits[i] = float_to_bf16_bits(x.data[i]);
    back.data[i] = bf16_bits_to_float(bits[i]);
  }
  expect_same_readback(cpu, back, "bf16");
  return Bf16SideView{arena.upload(bits), x.shape.tokens};
}

Fp8SideView upload_side(Arena& arena, const SchemeSpec& spec, Role role, const Tensor3& x,
                        const SideStore& cpu, Fp8SideView*) {
  const Fp8Spec& f = spec.side(role).fp8();  // a split spec: this side's granularity
  const std::vector<float> scales = fp8::prefill_scales(f, role, x);
  std::vector<uint8_t> codes;
  fp8::quantize(f, scales, x, codes);
  Tensor3 back(x.shape);
  fp8::dequantize(f, scales, codes, back);
  expect_same_readback(cpu, back, "fp8");
  return Fp8SideView{arena.upload(codes), arena.upload(scales), x.shape.tokens, f.format, f.gran};
}

IntSideView upload_side(Arena& arena, const SchemeSpec& spec, Role role, const Tensor3& x,
                        const SideStore& cpu, IntSideView*) {
  kivi::SideCache c(spec.q(), role, x.shape.heads, x.shape.dim);
  c.append(x.data.data(), x.shape.tokens);
  expect_same_readback(cpu, c.dequantize(), "int");
  IntSideView v;
  v.words = arena.upload(c.words());
  v.scales = arena.upload(c.scales());
  v.mins = c.sym() ? nullptr : arena.upload(c.mins());
  v.residual = arena.upload(c.residual());
  v.quantized_tokens = c.quantized_tokens();
  v.tokens = c.tokens();
  v.group = c.group();
  v.bits = c.bits();
  v.axis = c.axis();
  v.sym = c.sym();
  return v;
}

// ---- one launch over a batch, compared per sequence
// ----------------------------------------------

struct Comparison {
  double nmse = 0, max_abs = 0, max_v = 0;
};

/// Expected: got[b] (sequence b's [q_heads, dim] outputs, back to back) matches refs[b] within the
/// file's tolerances (int caches: kNmseInt / kMaxAbsInt x max |V|, else the exact ones), every
/// output finite and not all zero. A failing sequence's outputs are written as .npy files.
/// detail(b) adds what names sequence b (length, split).
template <class Detail>
void expect_outputs_match(const std::vector<float>& got,
                          const std::vector<std::vector<float>>& refs,
                          const std::vector<double>& vmax, bool is_int, int q_heads, int dim,
                          const std::string& name, Detail detail) {
  const double nmse_limit = is_int ? kNmseInt : kNmseExact;
  const double abs_limit = is_int ? kMaxAbsInt : kMaxAbsExact;
  const size_t per = static_cast<size_t>(q_heads) * dim;
  ASSERT_EQ(got.size(), refs.size() * per);
  for (int b = 0; b < static_cast<int>(refs.size()); ++b) {
    const std::vector<float>& ref = refs[static_cast<size_t>(b)];
    Comparison c;
    double se = 0, sr = 0, sg = 0;
    size_t worst = 0;
    int64_t nonfinite = 0;
    for (size_t i = 0; i < per; ++i) {
      const double g = got[b * per + i], r = ref[i];
      nonfinite += !std::isfinite(g);
      se += (g - r) * (g - r);
      sr += r * r;
      sg += g * g;
      if (std::fabs(g - r) > c.max_abs || !std::isfinite(g)) {
        c.max_abs = std::isfinite(g) ? std::fabs(g - r) : INFINITY;
        worst = i;
      }
    }
    c.nmse = sr > 0 ? se / sr : se;
    const std::string where = name + " sequence " + std::to_string(b) + detail(b);
    EXPECT_EQ(nonfinite, 0) << where;
    EXPECT_GT(sg, 0.0) << where << ": all-zero output";
    EXPECT_LE(c.nmse, nmse_limit) << where;
    EXPECT_LE(c.max_abs, abs_limit * vmax[static_cast<size_t>(b)])
        << where << ": worst element " << worst << " (query head " << worst / dim << ", channel "
        << worst % dim << ") device " << got[b * per + worst] << " cpu " << ref[worst];
    if (::testing::Test::HasFailure()) {
      const std::string base =
          ::testing::TempDir() + "attention_kernel_test_" + name + "_b" + std::to_string(b);
      write_npy(base + "_got.npy", {q_heads, dim}, got.data() + b * per);
      write_npy(base + "_ref.npy", {q_heads, dim}, ref.data());
      ADD_FAILURE() << "outputs written to " << base << "_{got,ref}.npy";
      return;
    }
  }
}

template <class View>
void run_batch(const std::string& spec_text, const std::vector<int64_t>& lengths, int64_t heads,
               int gqa, int dim, const std::string& name, DecodeKernel kernel,
               int64_t split_tokens = 0) {
  const SchemeSpec spec = parse_spec(spec_text);
  const bool is_int = spec.kind() == SchemeKind::Int;
  const int batch = static_cast<int>(lengths.size());
  const int q_heads = static_cast<int>(heads) * gqa;
  Arena arena;
  std::vector<View> kv, vv;
  std::vector<float> q_all;
  std::vector<std::vector<float>> refs;
  std::vector<double> vmax;
  for (int b = 0; b < batch; ++b) {
    const Shape3 s{lengths[static_cast<size_t>(b)], heads, dim};
    const uint32_t seed =
        static_cast<uint32_t>(lengths[static_cast<size_t>(b)] * 7919 + b * 31 + dim + gqa);
    const Tensor3 k = make_kv(s, seed, true), v = make_kv(s, seed + 1, false);
    const auto kc = make_side(spec, Role::Key, k), vc = make_side(spec, Role::Value, v);
    const std::vector<float> q = make_q(q_heads * dim, seed + 2);
    std::vector<float> ref(q.size());
    kvq::decode_attention(q.data(), q_heads, *kc, *vc, ref.data(), 0);
    kv.push_back(upload_side(arena, spec, Role::Key, k, *kc, static_cast<View*>(nullptr)));
    vv.push_back(upload_side(arena, spec, Role::Value, v, *vc, static_cast<View*>(nullptr)));
    if (::testing::Test::HasFatalFailure()) return;
    q_all.insert(q_all.end(), q.begin(), q.end());
    refs.push_back(ref);
    double m = 0;
    for (float x : vc->dequantize().data) m = std::max(m, static_cast<double>(std::fabs(x)));
    vmax.push_back(m);
  }
  DecodeShape shape{batch, static_cast<int>(heads), q_heads, dim};
  shape.split_tokens = split_tokens;
  const DecodePlan plan = plan_decode(shape, std::span<const View>(kv), std::span<const View>(vv));
  ASSERT_EQ(plan.workspace_bytes,
            static_cast<size_t>(batch) * q_heads * plan.splits * (dim + 2) * 4);
  const float* dq = arena.upload(q_all);
  void* ws = arena.scratch(plan.workspace_bytes);
  GuardedOutput out(q_all.size());
  KVQ_CUDA_CHECK(decode_attention(shape, std::span<const View>(kv), std::span<const View>(vv), dq,
                                  out.get(), ws, plan.workspace_bytes, nullptr, kernel));
  KVQ_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<float> got = out.download();
  EXPECT_EQ(out.damaged_guard_bytes(), 0u) << "writes outside the output";

  expect_outputs_match(got, refs, vmax, is_int, q_heads, dim, name, [&](int b) {
    return " (T=" + std::to_string(lengths[static_cast<size_t>(b)]) + ", split " +
           std::to_string(plan.split_tokens) + ")";
  });
}

/// Runs `spec` through the view type its kind needs.
void run_spec(const std::string& spec, const std::vector<int64_t>& lengths, int64_t heads, int gqa,
              int dim, const std::string& name, DecodeKernel kernel, int64_t split_tokens = 0) {
  switch (parse_spec(spec).kind()) {
    case SchemeKind::Bf16:
      return run_batch<Bf16SideView>(spec, lengths, heads, gqa, dim, name, kernel, split_tokens);
    case SchemeKind::Fp8:
      return run_batch<Fp8SideView>(spec, lengths, heads, gqa, dim, name, kernel, split_tokens);
    case SchemeKind::Int:
      return run_batch<IntSideView>(spec, lengths, heads, gqa, dim, name, kernel, split_tokens);
    default:
      FAIL() << "no device attention for " << spec;
  }
}

// ---- the sweep: specs from the dispatch lists x odd lengths x GQA x head_dim -------------------

std::vector<std::string> all_specs() {
  std::vector<std::string> s{"bf16"};
  for (Fp8Format f : kFp8Formats)
    for (const char* g : {"tensor", "head", "token", "channel"})
      s.push_back(std::string(to_string(f)) + ":gran=" + g);
  for (int b : BitWidths::values) s.push_back("kivi" + std::to_string(b));  // g=32, r=128
  // Layout corners (G: a power of two 8..256, or g=dim): per-token keys and per-channel
  // values; 3-bit words (10 codes) that do not divide the group (G=8: one partial word; G=64:
  // 7 words); groups wider than a warp (G=128: lanes take several tokens); g=dim; R=0; sym.
  s.push_back("int4:k=token,v=channel,g=32,r=0");
  s.push_back("int3:k=channel,v=token,g=8,r=40");
  s.push_back("int4:k=token,v=token,g=dim,r=16");
  s.push_back("int2:k=channel,v=channel,g=16,r=32,sym");
  s.push_back("int2:k=channel,v=channel,g=128,r=0");
  s.push_back("int8:k=channel,v=token,g=64,r=0");
  s.push_back("int3:k=token,v=token,g=64,r=5,sym");
  return s;
}

// spec, T, gqa, head_dim, kernel
using SweepCase = std::tuple<std::string, int64_t, int, int, DecodeKernel>;

std::string sweep_name(const ::testing::TestParamInfo<SweepCase>& p) {
  const auto& [spec, T, gqa, dim, kernel] = p.param;
  return kvq::testing::test_name(spec) + "_T" + std::to_string(T) + "_gqa" + std::to_string(gqa) +
         "_d" + std::to_string(dim) + "_" + to_string(kernel);
}

class DecodeAttention : public ::testing::TestWithParam<SweepCase> {
 protected:
  void SetUp() override { KVQ_SKIP_WITHOUT_DEVICE(); }
};

// Expected: kvq::decode_attention on the CPU over the same cache (see the file comment).
// Every split kernel (DecodeKernel), each against the reference with the same tolerances; GQA 3
// pads the tiled kernel's group of 4 (masked query heads) and fills 3 of the Mma kernel's 8 rows
// (bf16 caches and FP8 with tensor, head, token or channel scales, with the tiled kernel's
// tolerances, and kivi2 / kivi4 with the int tolerances, all read on tensor cores; on the other
// kinds Mma runs the tiled kernel).
TEST_P(DecodeAttention, MatchesCpuReference) {
  const auto& [spec, T, gqa, dim, kernel] = GetParam();
  run_spec(spec, {T}, 2, gqa, dim, sweep_name({GetParam(), 0}), kernel);
}

INSTANTIATE_TEST_SUITE_P(Sweep, DecodeAttention,
                         ::testing::Combine(::testing::ValuesIn(all_specs()),
                                            ::testing::Values<int64_t>(1, 37, 1000, 4099),
                                            ::testing::Values(1, 3, 4, 8),
                                            ::testing::ValuesIn(HeadDims::values),
                                            ::testing::Values(DecodeKernel::Baseline,
                                                              DecodeKernel::Tiled,
                                                              DecodeKernel::Mma)),
                         sweep_name);
// GQA 6 pads the tiled kernel's group of 8 (two masked query heads). FP8 keys and values scaled
// differently (channel keys with token values, and the reverse): the Mma kernel's four folds.
INSTANTIATE_TEST_SUITE_P(
    Gqa6, DecodeAttention,
    ::testing::Combine(
        ::testing::Values("bf16", "fp8_e4m3:gran=token", "fp8_e5m2:gran=channel",
                          "k=fp8_e4m3:gran=channel;v=fp8_e4m3:gran=token",
                          "k=fp8_e5m2:gran=token;v=fp8_e5m2:gran=channel", "kivi2", "kivi4"),
        ::testing::Values<int64_t>(37, 1000), ::testing::Values(6), ::testing::Values(128),
        ::testing::Values(DecodeKernel::Baseline, DecodeKernel::Tiled, DecodeKernel::Mma)),
    sweep_name);
// KIVI at G = 64 on the Mma kernel, D 128 (two value channel groups; at D 64 one group, which
// the Mma kernel leaves to the tiled one): kivi2's mma_int_split_kernel<128, 2, 2, T> (transposed
// at GQA 1 / 4, direct at 8) and the 2-bit keys' strided run copies (token groups wider than 32),
// which no other case reaches; kivi4's beside them. T 37: every token in the residual window.
INSTANTIATE_TEST_SUITE_P(Group64, DecodeAttention,
                         ::testing::Combine(::testing::Values("kivi2:g=64,r=40", "kivi4:g=64,r=40"),
                                            ::testing::Values<int64_t>(37, 1000, 4099),
                                            ::testing::Values(1, 4, 8), ::testing::Values(128),
                                            ::testing::Values(DecodeKernel::Mma)),
                         sweep_name);

// Long splits (several 64-token tiles a block: the Mma kernel's cp.async pipeline and a partial
// last tile; the tiled kernel's many warp steps): split_tokens 4096 / gqa, the most a split holds,
// and 200 (three full tiles and a partial one), at contexts that end inside a tile.
using LongSplitCase = std::tuple<int64_t, int, int, int64_t, DecodeKernel>;  // T, gqa, dim, split

class DecodeAttentionLongSplits : public ::testing::TestWithParam<LongSplitCase> {
 protected:
  void SetUp() override { KVQ_SKIP_WITHOUT_DEVICE(); }
};

// Expected: kvq::decode_attention on the CPU (the file comment), bf16 and FP8 (head scales: the
// Mma kernel's FP8 tiles; channel keys with token values: q folded once, the split-wide value
// scale maximum over several tiles) caches, and KIVI caches (G 32 and, at D 128, value groups of
// 64: two channel groups; GQA 1 / 4 run the transposed value product through several 128-token
// tiles, GQA 8 the direct one).
TEST_P(DecodeAttentionLongSplits, MatchesCpuReference) {
  const auto& [T, gqa, dim, split, kernel] = GetParam();
  const int64_t st = split > 0 ? split : 4096 / gqa;
  for (const char* spec :
       {"bf16", "fp8_e5m2:gran=head", "k=fp8_e4m3:gran=channel;v=fp8_e4m3:gran=token", "kivi2",
        "kivi4:g=64,r=40"})
    run_spec(spec, {T, T / 3 + 1}, 2, gqa, dim,
             kvq::testing::test_name(spec) + "_T" + std::to_string(T) + "_gqa" +
                 std::to_string(gqa) + "_d" + std::to_string(dim) + "_split" + std::to_string(st) +
                 "_" + to_string(kernel),
             kernel, st);
}

std::string long_split_name(const ::testing::TestParamInfo<LongSplitCase>& p) {
  const auto& [T, gqa, dim, split, kernel] = p.param;
  std::string name = "T";  // (appended piece by piece: GCC 12's -Wrestrict misfires on "T" + ...)
  name += std::to_string(T);
  name += "_gqa";
  name += std::to_string(gqa);
  name += "_d";
  name += std::to_string(dim);
  name += "_split";
  name += split > 0 ? std::to_string(split) : "max";
  name += "_";
  name += to_string(kernel);
  return name;
}

INSTANTIATE_TEST_SUITE_P(
    Splits, DecodeAttentionLongSplits,
    ::testing::Combine(::testing::Values<int64_t>(3001, 8197), ::testing::Values(1, 4, 8),
                       ::testing::ValuesIn(HeadDims::values), ::testing::Values<int64_t>(0, 200),
                       ::testing::Values(DecodeKernel::Tiled, DecodeKernel::Mma)),
    long_split_name);

// ---- batches of different lengths -------------------------------------------------------------

using BatchCase = std::tuple<std::string, DecodeKernel>;

class DecodeAttentionBatch : public ::testing::TestWithParam<BatchCase> {
 protected:
  void SetUp() override { KVQ_SKIP_WITHOUT_DEVICE(); }
};

// Expected: each sequence equals the CPU reference over its own cache; lengths differ so some
// blocks of the grid have no tokens (shorter sequences) and the merge counts splits per sequence.
TEST_P(DecodeAttentionBatch, FiveSequencesOfDifferentLengths) {
  const auto& [spec, kernel] = GetParam();
  run_spec(spec, {1000, 37, 4099, 1, 300}, 3, 4, 128,
           kvq::testing::test_name(spec) + "_batch5_" + to_string(kernel), kernel);
}

// Expected: as above at the largest batch the launcher takes (kMaxBatch), short contexts.
TEST_P(DecodeAttentionBatch, LargestBatch) {
  std::vector<int64_t> lengths;
  for (int b = 0; b < kMaxBatch; ++b) lengths.push_back(1 + (b * 37) % 300);
  const auto& [spec, kernel] = GetParam();
  run_spec(spec, lengths, 2, 8, 64, kvq::testing::test_name(spec) + "_batch64_" + to_string(kernel),
           kernel);
}

INSTANTIATE_TEST_SUITE_P(
    Kinds, DecodeAttentionBatch,
    ::testing::Combine(::testing::Values("bf16", "fp8_e4m3:gran=token", "fp8_e5m2:gran=channel",
                                         "k=fp8_e5m2:gran=token;v=fp8_e5m2:gran=channel", "kivi2",
                                         "kivi4", "int3:k=token,v=channel,g=8,r=0"),
                       ::testing::Values(DecodeKernel::Baseline, DecodeKernel::Tiled,
                                         DecodeKernel::Mma)),
    [](const ::testing::TestParamInfo<BatchCase>& p) {
      return kvq::testing::test_name(std::get<0>(p.param)) + "_" + to_string(std::get<1>(p.param));
    });

// ---- the device streaming cache feeding the kernels ---------------------------------------------

using StreamCase = std::tuple<std::string, DecodeKernel>;

class DecodeAttentionDeviceCache : public ::testing::TestWithParam<StreamCase> {
 protected:
  void SetUp() override { KVQ_SKIP_WITHOUT_DEVICE(); }
};

/// Requests b = 0 .. appends.size() - 1, each with its own device K and V caches filled by the
/// appends appends[b] (token counts), taken round-robin over the requests (request b's s-th
/// append right after request b - 1's, as a serving loop appends), then one launch over all of
/// them; each sequence is compared with the CPU reference over kivi::SideCache caches of the same
/// tensors (make_side: one append). Appends of any partition store the same bytes
/// (cuda_kivi_kernel_test checks that); the kernels read them through int_side_view. `batched`:
/// each round is one KiviSideCache::append_batch over every request (K, then V; requests whose
/// appends are done append 0 tokens), as a serving step appends.
void run_device_caches(const std::string& spec_text,
                       const std::vector<std::vector<int64_t>>& appends, DecodeKernel kernel,
                       bool batched = false) {
  const SchemeSpec spec = parse_spec(spec_text);
  constexpr int64_t kHeads = 4;
  constexpr int kGqa = 4, kDim = 128;
  const int batch = static_cast<int>(appends.size());
  const size_t per = static_cast<size_t>(kHeads) * kGqa * kDim;
  Arena arena;
  std::vector<float> q_all;
  std::vector<std::vector<float>> refs;
  std::vector<double> vmax;
  std::vector<const float*> dk, dv;
  std::vector<KiviSideCache> kc, vc;
  std::vector<int64_t> filled(appends.size(), 0);
  for (int b = 0; b < batch; ++b) {
    int64_t T = 0;
    for (int64_t n : appends[static_cast<size_t>(b)]) T += n;
    const Shape3 s{T, kHeads, kDim};
    const uint32_t seed = 4242 + 10 * static_cast<uint32_t>(b);
    const Tensor3 k = make_kv(s, seed, true), v = make_kv(s, seed + 1, false);
    const std::vector<float> q = make_q(static_cast<int64_t>(per), seed + 2);
    std::vector<float> ref(per);
    kvq::decode_attention(q.data(), kHeads * kGqa, *make_side(spec, Role::Key, k),
                          *make_side(spec, Role::Value, v), ref.data(), 0);
    double m = 0;
    for (float x : v.data) m = std::max(m, static_cast<double>(std::fabs(x)));
    vmax.push_back(m);
    refs.push_back(ref);
    q_all.insert(q_all.end(), q.begin(), q.end());
    dk.push_back(arena.upload(k.data));
    dv.push_back(arena.upload(v.data));
    kc.emplace_back(spec.q(), Role::Key, kHeads, kDim);
    vc.emplace_back(spec.q(), Role::Value, kHeads, kDim);
  }
  size_t rounds = 0;
  for (const auto& a : appends) rounds = std::max(rounds, a.size());
  for (size_t r = 0; r < rounds; ++r) {
    std::vector<KiviSideCache*> kp, vp;
    std::vector<const float*> kx, vx;
    std::vector<int64_t> ns;
    for (size_t b = 0; b < appends.size(); ++b) {
      const int64_t n = r < appends[b].size() ? appends[b][r] : 0, at = filled[b] * kHeads * kDim;
      filled[b] += n;
      if (batched) {
        kp.push_back(&kc[b]);
        vp.push_back(&vc[b]);
        kx.push_back(dk[b] + at);
        vx.push_back(dv[b] + at);
        ns.push_back(n);
      } else if (r < appends[b].size()) {
        KVQ_CUDA_CHECK(kc[b].append(dk[b] + at, n));
        KVQ_CUDA_CHECK(vc[b].append(dv[b] + at, n));
      }
    }
    if (batched) {
      KVQ_CUDA_CHECK(KiviSideCache::append_batch(kp, kx, ns));
      KVQ_CUDA_CHECK(KiviSideCache::append_batch(vp, vx, ns));
    }
  }
  std::vector<IntSideView> kv, vv;
  for (int b = 0; b < batch; ++b) {
    kv.push_back(int_side_view(kc[static_cast<size_t>(b)]));
    vv.push_back(int_side_view(vc[static_cast<size_t>(b)]));
  }
  const DecodeShape shape{batch, static_cast<int>(kHeads), static_cast<int>(kHeads) * kGqa, kDim};
  const DecodePlan plan =
      plan_decode(shape, std::span<const IntSideView>(kv), std::span<const IntSideView>(vv));
  const float* dq = arena.upload(q_all);
  void* ws = arena.scratch(plan.workspace_bytes);
  GuardedOutput out(q_all.size());
  KVQ_CUDA_CHECK(decode_attention(shape, std::span<const IntSideView>(kv),
                                  std::span<const IntSideView>(vv), dq, out.get(), ws,
                                  plan.workspace_bytes, nullptr, kernel));
  KVQ_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<float> got = out.download();
  EXPECT_EQ(out.damaged_guard_bytes(), 0u) << "writes outside the output";
  expect_outputs_match(got, refs, vmax, true, static_cast<int>(kHeads) * kGqa, kDim,
                       kvq::testing::test_name(spec_text) + "_device_cache", [&](int b) {
                         return " (" + std::to_string(filled[static_cast<size_t>(b)]) + " tokens)";
                       });
}

// Expected: the CPU reference (run_device_caches). One request in uneven appends (1, 37, 500,
// 462): the residual window fills, spills, and groups complete inside one append.
TEST_P(DecodeAttentionDeviceCache, AppendedInChunksMatchesCpuReference) {
  const auto& [spec, kernel] = GetParam();
  run_device_caches(spec, {{1, 37, 500, 462}}, kernel);
}

/// Five requests' appends as a serving loop makes them: a prefill each (200, 37, 64, 1 and 1
/// tokens), then one token per step until each has its length (264, 37, 300, 1, 129).
std::vector<std::vector<int64_t>> serving_appends() {
  std::vector<std::vector<int64_t>> appends;
  const std::pair<int64_t, int64_t> prefill_total[] = {
      {200, 264}, {37, 37}, {64, 300}, {1, 1}, {1, 129}};
  for (const auto& [prefill, total] : prefill_total) {
    std::vector<int64_t> a{prefill};
    a.resize(static_cast<size_t>(total - prefill + 1), 1);
    appends.push_back(a);
  }
  return appends;
}

// Expected: the CPU reference per sequence (run_device_caches). Five requests as a serving loop
// builds them (serving_appends), each append its own call, round-robin; one launch reads all.
TEST_P(DecodeAttentionDeviceCache, ManyRequestsDecodedRoundRobinMatchCpuReference) {
  const auto& [spec, kernel] = GetParam();
  run_device_caches(spec, serving_appends(), kernel);
}

// Expected: as above (the same requests and appends), with each step's appends of all five
// requests made by one KiviSideCache::append_batch per side.
TEST_P(DecodeAttentionDeviceCache, ManyRequestsBatchedAppendsMatchCpuReference) {
  const auto& [spec, kernel] = GetParam();
  run_device_caches(spec, serving_appends(), kernel, true);
}

INSTANTIATE_TEST_SUITE_P(
    Kinds, DecodeAttentionDeviceCache,
    ::testing::Combine(::testing::Values("kivi2", "kivi4", "int4:k=channel,v=token,g=32,r=64,sym"),
                       ::testing::Values(DecodeKernel::Baseline, DecodeKernel::Tiled,
                                         DecodeKernel::Mma)),
    [](const ::testing::TestParamInfo<StreamCase>& p) {
      return kvq::testing::test_name(std::get<0>(p.param)) + "_" + to_string(std::get<1>(p.param));
    });

// ---- host-only: register helpers ---------------------------------------------------------------

// Expected: float(c) for every code of up to 8 bits and a few up to 2^23 - 1.
TEST(AttentionHelpers, CodeToFloatIsExact) {
  for (uint32_t c = 0; c < 256; ++c) EXPECT_EQ(code_to_float(c), static_cast<float>(c)) << c;
  for (uint32_t c : {1000u, 65535u, 8388607u})
    EXPECT_EQ(code_to_float(c), static_cast<float>(c)) << c;
}

// ---- host-only: plans and configuration errors -------------------------------------------------

// Fake (never dereferenced) device pointers: every check below throws before any CUDA call.
alignas(16) uint16_t g_fake16[8];
alignas(16) float g_fake32[8];
alignas(16) uint32_t g_fake_words[8];

IntSideView int_view(int64_t tokens, int64_t quantized, int group, Axis axis) {
  IntSideView v;
  v.words = g_fake_words;
  v.scales = g_fake16;
  v.mins = g_fake16;
  v.residual = g_fake32;
  v.quantized_tokens = quantized;
  v.tokens = tokens;
  v.group = group;
  v.bits = 2;
  v.axis = axis;
  return v;
}

/// A stand-in with the accessors of kernels/cuda/kivi_cache_device.cuh's KiviSideCache.
struct FakeDeviceCache {
  bool is_sym = false;
  const uint32_t* words() const { return g_fake_words; }
  const uint16_t* scales() const { return g_fake16; }
  const uint16_t* mins() const { return g_fake16 + 1; }
  const float* residual() const { return g_fake32; }
  int64_t quantized_tokens() const { return 96; }
  int64_t tokens() const { return 100; }
  int group() const { return 32; }
  int bits() const { return 3; }
  Axis axis() const { return Axis::Token; }
  bool sym() const { return is_sym; }
};

// Expected: int_side_view copies every accessor of a device cache, and drops mins for sym.
TEST(AttentionViews, IntSideViewFromDeviceCacheAccessors) {
  FakeDeviceCache c;
  IntSideView v = int_side_view(c);
  EXPECT_EQ(v.words, g_fake_words);
  EXPECT_EQ(v.scales, g_fake16);
  EXPECT_EQ(v.mins, g_fake16 + 1);
  EXPECT_EQ(v.residual, g_fake32);
  EXPECT_EQ(v.quantized_tokens, 96);
  EXPECT_EQ(v.tokens, 100);
  EXPECT_EQ(v.group, 32);
  EXPECT_EQ(v.bits, 3);
  EXPECT_EQ(v.axis, Axis::Token);
  EXPECT_FALSE(v.sym);
  c.is_sym = true;
  v = int_side_view(c);
  EXPECT_TRUE(v.sym);
  EXPECT_EQ(v.mins, nullptr);
}

// Expected: splits hold whole per-channel groups, cover the longest context, fit the shared
// score buffer, and the workspace is batch * q_heads * splits * (D + 2) floats.
TEST(AttentionPlan, SplitsAlignToGroupsAndCoverTheContext) {
  for (int gqa : {1, 4, 8})
    for (int64_t T : {1, 37, 1000, 4099, 131072})
      for (int G : {16, 32, 48, 128}) {
        const IntSideView k = int_view(T, T / G * G, G, Axis::Channel);
        const IntSideView v = int_view(T, 0, 32, Axis::Token);
        const DecodeShape s{1, 8, 8 * gqa, 128};
        const DecodePlan p = plan_decode(s, std::span<const IntSideView>(&k, 1),
                                         std::span<const IntSideView>(&v, 1));
        EXPECT_EQ(p.split_tokens % G, 0) << "G=" << G << " T=" << T;
        EXPECT_GE(p.split_tokens * p.splits, T);
        EXPECT_LT(p.split_tokens * (p.splits - 1), T);
        EXPECT_LE(p.split_tokens * gqa, 4096);
        EXPECT_EQ(p.workspace_bytes, static_cast<size_t>(8 * gqa) * p.splits * 130 * 4);
      }
}

// Expected (hand computation): a chosen split_tokens is kept when it is a multiple of the
// per-channel group (100 tokens of 1000: 10 splits), rounded up to one otherwise (100 with
// G = 48: 144 tokens, 7 splits), and refused, naming the limit, when it is negative or exceeds
// the shared score buffer (4096 / GQA 4 = 1024 tokens).
TEST(AttentionPlan, ChosenSplitTokensRoundToTheGroupAndFitTheBuffer) {
  const auto plan = [](int64_t split, int G) {
    const IntSideView k = int_view(1000, 1000 / G * G, G, Axis::Channel);
    const IntSideView v = int_view(1000, 0, 32, Axis::Token);
    DecodeShape s{1, 8, 32, 128};
    s.split_tokens = split;
    return plan_decode(s, std::span<const IntSideView>(&k, 1), std::span<const IntSideView>(&v, 1));
  };
  EXPECT_EQ(plan(100, 20).split_tokens, 100);
  EXPECT_EQ(plan(100, 20).splits, 10);
  EXPECT_EQ(plan(100, 48).split_tokens, 144);
  EXPECT_EQ(plan(100, 48).splits, 7);
  EXPECT_EQ(plan(1024, 32).splits, 1);
  EXPECT_EQ(plan(0, 32).split_tokens, 64);  // automatic: 1024 blocks wanted, 64 tokens at least
  expect_error([&] { (void)plan(-1, 32); }, "split_tokens -1 is negative");
  expect_error([&] { (void)plan(1025, 32); },
               "split_tokens 1025 (1056 as a multiple of group 32) exceeds the 1024 tokens");
}

// Expected: each bad value is named in the message (STYLE 9).
TEST(AttentionConfig, BadConfigurationThrowsNamingTheValue) {
  const Bf16SideView b{g_fake16, 10};
  const std::span<const Bf16SideView> one(&b, 1);
  float q = 0, o = 0;
  char ws[1 << 12];
  auto bf16 = [&](DecodeShape s, std::span<const Bf16SideView> k, std::span<const Bf16SideView> v,
                  size_t ws_bytes = sizeof ws) {
    (void)decode_attention(s, k, v, &q, &o, ws, ws_bytes);
  };
  expect_error(
      [&] {
        bf16({1, 2, 4, 96}, one, one);
      },
      "unsupported head_dim 96 (supported: 64, 128)");
  expect_error([&] { bf16({0, 2, 4, 64}, {}, {}); }, "batch 0");
  expect_error([&] { bf16({65, 2, 4, 64}, one, one); }, "batch 65");
  expect_error(
      [&] {
        bf16({1, 2, 5, 64}, one, one);
      },
      "q_heads 5 is not a positive multiple of kv_heads 2");
  expect_error([&] { bf16({1, 2, 32, 64}, one, one); }, "GQA ratio 16");
  expect_error([&] { bf16({2, 2, 4, 64}, one, one); }, "batch 2 but 1 K and 1 V views");
  const Bf16SideView shorter{g_fake16, 9}, empty{g_fake16, 0}, null{nullptr, 10};
  expect_error(
      [&] {
        bf16({1, 2, 4, 64}, one, std::span<const Bf16SideView>(&shorter, 1));
      },
      "tokens 10 != V tokens 9");
  expect_error(
      [&] {
        bf16({1, 2, 4, 64}, std::span<const Bf16SideView>(&empty, 1),
             std::span<const Bf16SideView>(&empty, 1));
      },
      "tokens 0");
  expect_error(
      [&] {
        bf16({1, 2, 4, 64}, std::span<const Bf16SideView>(&null, 1), one);
      },
      "sequence 0 K: data is null");
  expect_error([&] { bf16({1, 2, 4, 64}, one, one, 16); }, "workspace of 16 bytes");
  expect_error(
      [&] {
        (void)decode_attention(DecodeShape{1, 2, 4, 64}, one, one, &q, &o, ws, sizeof ws, nullptr,
                               static_cast<DecodeKernel>(5));
      },
      "unknown DecodeKernel value 5");

  const Fp8SideView f8{reinterpret_cast<const uint8_t*>(g_fake16), g_fake32, 10, Fp8Format::E4M3,
                       Granularity::Token};
  Fp8SideView f8b = f8;
  f8b.format = Fp8Format::E5M2;
  expect_error(
      [&] {
        (void)decode_attention(DecodeShape{1, 2, 4, 64}, std::span<const Fp8SideView>(&f8, 1),
                               std::span<const Fp8SideView>(&f8b, 1), &q, &o, ws, sizeof ws);
      },
      "one format per launch");
  f8b = f8;
  f8b.gran = static_cast<Granularity>(7);
  expect_error(
      [&] {
        (void)decode_attention(DecodeShape{1, 2, 4, 64}, std::span<const Fp8SideView>(&f8, 1),
                               std::span<const Fp8SideView>(&f8b, 1), &q, &o, ws, sizeof ws);
      },
      "unknown Granularity value 7");

  auto run_int = [&](IntSideView k, IntSideView v) {
    (void)decode_attention(DecodeShape{1, 2, 4, 64}, std::span<const IntSideView>(&k, 1),
                           std::span<const IntSideView>(&v, 1), &q, &o, ws, sizeof ws);
  };
  IntSideView k = int_view(100, 96, 32, Axis::Channel), v = int_view(100, 90, 32, Axis::Token);
  IntSideView bad = k;
  bad.bits = 5;
  expect_error([&] { run_int(bad, v); }, "unsupported bits 5 (supported: 2, 3, 4, 8)");
  bad = v;
  bad.bits = 4;
  expect_error([&] { run_int(k, bad); }, "bits 4 differ from sequence 0's K bits 2");
  bad = k;
  bad.quantized_tokens = 90;
  expect_error([&] { run_int(bad, v); }, "quantized_tokens 90 is not a multiple of group 32");
  bad = k;
  bad.quantized_tokens = 101;
  expect_error([&] { run_int(bad, v); }, "quantized_tokens 101 outside [0, 100]");
  bad = v;
  bad.group = 65;
  expect_error([&] { run_int(k, bad); }, "per-token group 65 exceeds head_dim 64");
  bad = v;
  bad.mins = nullptr;
  expect_error([&] { run_int(k, bad); }, "sequence 0 V: mins is null");
  bad = k;
  bad.residual = nullptr;
  expect_error([&] { run_int(bad, v); }, "sequence 0 K: residual is null");
  bad = k;
  bad.group = 4096;
  bad.quantized_tokens = 0;
  expect_error([&] { run_int(bad, v); }, "group 4096 exceeds the 2048 tokens a split holds");
  bad = k;
  bad.axis = static_cast<Axis>(3);
  expect_error([&] { run_int(bad, v); }, "unknown Axis value 3");
}

}  // namespace
}  // namespace kvq::cuda
