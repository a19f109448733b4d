// Tests for kernels/cuda/kivi_kernels.cu (kivi_quantize) and kernels/cuda/kivi_cache_device.cu
// (KiviSideCache) against the CPU reference, kivi::SideCache (kivi/cache.cpp).
//
// Where expected values come from: kivi::SideCache fed the same tokens in the same appends (the
// spec, STYLE 1). Words, scales and minima must be bit-equal, and so must the float32 residual
// (both sides copy the input bits). Launcher outputs have sentinel bytes on both sides that must
// survive (STYLE 4). Inputs (STYLE 5): bf16-rounded normals with some exact float32 rows, an
// outlier channel, constant groups, exact ties k + 1/2, -0, float subnormals; the special set adds
// NaN, +-inf, values that overflow fp16. A failing case writes its input to an .npy file in the
// test temp dir. Without a device the device tests skip with a visible message; the
// configuration tests run everywhere.
//
// KVQ_KIVI_FULL_SWEEP (the `full` label binary, cuda_kivi_kernel_full_test): only the cache
// sweep, over every T x H x head_dim of the issue (FullSweep/...); else (the quick binary) a sweep
// covering every bits x axis x sym x G x R with a few shapes, plus every other test here.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <ostream>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/footprint.h"
#include "core/half.h"
#include "core/npy.h"
#include "core/spec.h"
#include "core/tensor.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/kivi_cache_device.cuh"
#include "kernels/cuda/kivi_kernels.cuh"
#include "kivi/cache.h"
#include "kivi/minmax.h"
#include "kivi/pack.h"
#include "tests/cuda/cuda_test_util.h"
#include "tests/support/expect_error.h"

namespace kvq::cuda {
namespace {

using kvq::testing::expect_error;

using testing::GuardedBuffer;

// ---- cases ------------------------------------------------------------------------------------

constexpr int kGroupDim = kGroupWholeDim;  // g=dim (per-token side only)

struct Case {
  int bits;
  Axis axis;
  bool sym;
  int group;  ///< G, or kGroupDim
  int rmul;   ///< R = rmul * G (rmul * 32 for g=dim)
  int64_t T, H, D;

  int g() const { return group == kGroupDim ? static_cast<int>(D) : group; }
  int r() const { return rmul * (group == kGroupDim ? 32 : group); }
  IntSpec spec() const {
    IntSpec q;
    q.bits = bits;
    q.key_axis = q.value_axis = axis;  // the role does not matter then; Role::Key throughout
    q.group = group;
    q.residual = r();
    q.sym = sym;
    return q;
  }
  std::string name() const {
    // Built by appending: GCC 12 reports a false -Wrestrict on "literal" + std::string.
    std::string n = "b";
    n += std::to_string(bits);
    n += axis == Axis::Channel ? "_channel" : "_token";
    n += sym ? "_sym" : "_asym";
    n += group == kGroupDim ? std::string("_gdim") : "_g" + std::to_string(group);
    n += "_r" + std::to_string(r());
    n += "_T" + std::to_string(T);
    n += "_H" + std::to_string(H);
    n += "_D" + std::to_string(D);
    return n;
  }
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.name(); }

/// The sweep: every bits x axis x sym x G x R, each with the shapes of the tier. The per-token
/// side needs G <= head_dim (kivi::SideCache rejects the rest; BadConfiguration tests that).
std::vector<Case> sweep() {
  struct Shape {
    int64_t T, H, D;
  };
#if defined(KVQ_KIVI_FULL_SWEEP)
  std::vector<Shape> shapes;
  for (int64_t T : {1, 31, 33, 257, 1000})
    for (int64_t H : {1, 3, 8})
      for (int64_t D : {64, 72, 128}) shapes.push_back({T, H, D});
#else
  std::vector<Shape> shapes = {{1, 1, 64}, {33, 3, 72}, {257, 8, 128}, {1000, 3, 72}};
#endif
  // An odd head_dim: scalar loads, a short last channel group, unaligned append offsets.
  shapes.push_back({45, 2, 75});
  std::vector<Case> cases;
  for (int bits : {2, 3, 4, 8})
    for (Axis axis : {Axis::Channel, Axis::Token})
      for (bool sym : {false, true})
        for (int group : {8, 32, 128, kGroupDim})
          for (int rmul : {0, 1, 4})
            for (const Shape& s : shapes) {
              const Case c{bits, axis, sym, group, rmul, s.T, s.H, s.D};
              if (axis == Axis::Channel && group == kGroupDim) continue;
              if (axis == Axis::Token && c.g() > s.D) continue;
              cases.push_back(c);
            }
  return cases;
}

// ---- inputs -----------------------------------------------------------------------------------

/// Adversarial, finite input (STYLE 5), [T, H, D], fixed seed.
Tensor3 make_input(int64_t T, int64_t H, int64_t D, uint32_t seed) {
  Tensor3 x(Shape3{T, H, D});
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t d = 0; d < D; ++d) {
        const float v = normal(rng) * (d % 7 == 3 ? 40.0f : 1.0f);
        x.at(t, h, d) = t % 5 == 4 ? v : round_to_bf16(v);  // model dtype, some exact rows
      }
  for (int64_t t = 0; t < T; ++t) {
    x.at(t, 0, 1) = t % 2 ? -0.0f : 0.0f;   // a zero channel, signed zeros
    if (D > 5) x.at(t, H - 1, 5) = 0.75f;   // a constant channel
  }
  if (T > 1)
    for (int64_t d = 0; d < D; ++d) x.at(1, 0, d) = -2.5f;  // a constant token
  if (T > 2)  // ties: min 0, max 3, values k + 1/2 (exact ties at b=2, asym and sym)
    for (int64_t d = 0; d < D; ++d) x.at(2, H - 1, d) = static_cast<float>(d % 7) * 0.5f;
  if (T > 3)  // ties down a channel: tokens 0..T-1 of (h=0, d=D-1) walk k/2
    for (int64_t t = 0; t < T; ++t) x.at(t, 0, D - 1) = static_cast<float>(t % 7) * 0.5f - 1.5f;
  x.at(0, 0, 2 % D) = 1e-40f;  // float subnormals
  if (D > 6) x.at(T - 1, H - 1, 6) = -3e-42f;
  return x;
}

/// make_input plus NaN, +-inf and fp16-overflowing values in a few groups of each axis.
[[maybe_unused]] Tensor3 make_special_input(int64_t T, int64_t H, int64_t D, uint32_t seed) {
  Tensor3 x = make_input(T, H, D, seed);
  const float nan = std::numeric_limits<float>::quiet_NaN(),
              inf = std::numeric_limits<float>::infinity();
  x.at(5, 1 % H, 10 % D) = nan;
  x.at(T / 2, H - 1, D - 1) = inf;
  x.at(T - 3, 0, 0) = -inf;
  x.at(40 % T, 0, 20 % D) = 1e5f;    // beyond fp16: the group's parameters overflow
  x.at(70 % T, H - 1, 33 % D) = 3e38f;
  for (int64_t d = 0; d < D; ++d) x.at(T - 1, 0, d) = d % 3 == 0 ? -1e5f : 1.0f;
  return x;
}

/// A random partition of n tokens into appends (empty, single tokens, chunks), fixed seed.
std::vector<int64_t> random_partition(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int64_t> parts;
  int64_t left = n;
  while (left > 0) {
    const int kind = static_cast<int>(rng() % 6);
    int64_t k = kind == 0 ? 0 : kind <= 2 ? 1 : kind == 3 ? static_cast<int64_t>(rng() % 5)
                                                          : static_cast<int64_t>(rng() % 97);
    k = std::min(k, left);
    parts.push_back(k);
    left -= k;
  }
  return parts;
}

// ---- comparison -------------------------------------------------------------------------------

/// Where storage index i of `what` lives, for failure messages.
std::string locate(const kivi::SideCache& c, const char* what, int64_t i) {
  const bool word = std::strcmp(what, "words") == 0;
  char buf[160];
  if (c.axis() == Axis::Channel) {
    const kivi::ChannelLayout lay = c.channel_layout();
    const int64_t p = word ? i / lay.words_per_group() : i;
    std::snprintf(buf, sizeof buf, " (token group %lld, head %lld, channel %lld%s)",
                  static_cast<long long>(p / (lay.heads * lay.dim)),
                  static_cast<long long>(p / lay.dim % lay.heads),
                  static_cast<long long>(p % lay.dim), word ? ", a word" : "");
  } else {
    const kivi::TokenLayout lay = c.token_layout();
    const int64_t per = word ? lay.words_per_token_head() : lay.channel_groups();
    std::snprintf(buf, sizeof buf, " (token %lld, head %lld, %s %lld)",
                  static_cast<long long>(i / per / lay.heads),
                  static_cast<long long>(i / per % lay.heads), word ? "word" : "channel group",
                  static_cast<long long>(i % per));
  }
  return buf;
}

template <typename T>
int64_t count_mismatches(const kivi::SideCache& ref, const char* what, const std::vector<T>& got,
                         std::span<const T> want) {
  EXPECT_EQ(got.size(), want.size()) << what;
  int64_t bad = 0;
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
    if (got[i] == want[i]) continue;
    if (++bad <= 6)
      ADD_FAILURE() << what << "[" << i << "]" << locate(ref, what, static_cast<int64_t>(i))
                    << ": device 0x" << std::hex << static_cast<uint64_t>(got[i]) << " cpu 0x"
                    << static_cast<uint64_t>(want[i]) << std::dec;
  }
  return bad;
}

/// Writes the input of a failing case where it can be found again (STYLE 6).
void dump_input(const std::string& name, const Tensor3& x) {
  const std::string path = ::testing::TempDir() + "kivi_kernel_test_" + name + "_x.npy";
  try {
    write_npy(path, {x.shape.tokens, x.shape.heads, x.shape.dim}, x.data.data());
    ADD_FAILURE() << "input written to " << path;
  } catch (const Error& e) {
    ADD_FAILURE() << "could not write the input: " << e.what();
  }
}

/// Everything the device cache stores equals what the CPU cache stores, bit for bit.
void expect_same_storage(const KiviSideCache& dev, const kivi::SideCache& ref,
                         const std::string& what, const Tensor3& x) {
  ASSERT_EQ(dev.tokens(), ref.tokens()) << what;
  ASSERT_EQ(dev.quantized_tokens(), ref.quantized_tokens()) << what;
  ASSERT_EQ(dev.residual_tokens(), ref.residual_tokens()) << what;
  ASSERT_EQ(dev.residual_start(), ref.quantized_tokens()) << what;
  KiviSideCacheHost got;
  KVQ_CUDA_CHECK(dev.copy_to_host(got));
  ASSERT_EQ(dev.word_count(), static_cast<int64_t>(ref.words().size())) << what;
  ASSERT_EQ(dev.param_count(), static_cast<int64_t>(ref.scales().size())) << what;
  int64_t bad = count_mismatches(ref, "words", got.words, ref.words());
  bad += count_mismatches(ref, "scales", got.scales, ref.scales());
  bad += count_mismatches(ref, "mins", got.mins, ref.mins());
  if (ref.sym()) {
    EXPECT_EQ(dev.mins(), nullptr) << what;
  } else if (dev.param_count() > 0) {
    EXPECT_NE(dev.mins(), nullptr) << what;
  }
  std::vector<uint32_t> rg(got.residual.size()), rw(ref.residual().size());
  std::memcpy(rg.data(), got.residual.data(), rg.size() * sizeof(float));
  std::memcpy(rw.data(), ref.residual().data(), rw.size() * sizeof(float));
  bad += count_mismatches(ref, "residual bits", rg, std::span<const uint32_t>(rw));
  EXPECT_EQ(bad, 0) << what;
  if (bad != 0) dump_input(what, x);
}

/// Appends x to a CPU and a device cache in the given parts (device x uploaded once) and
/// compares them after the last part, and after every `check_every`-th part if > 0.
void run_partition(const Case& c, const Tensor3& x, const std::vector<int64_t>& parts,
                   const std::string& what, int check_every = 0) {
  kivi::SideCache ref(c.spec(), Role::Key, c.H, c.D);
  KiviSideCache dev(c.spec(), Role::Key, c.H, c.D);
  GuardedBuffer<float> dx(x.data.size());
  dx.upload(x.data);
  const int64_t row = c.H * c.D;
  int64_t at = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    ref.append(x.data.data() + at * row, parts[i]);
    KVQ_CUDA_CHECK(dev.append(dx.get() + at * row, parts[i]));
    at += parts[i];
    if (check_every > 0 && (i + 1) % static_cast<size_t>(check_every) == 0)
      expect_same_storage(dev, ref, what + "_after" + std::to_string(at), x);
  }
  ASSERT_EQ(at, c.T);
  expect_same_storage(dev, ref, what, x);
  EXPECT_EQ(dx.damaged_guard_bytes(), 0u) << what << ": the input was written to";
  // Not vacuous: the residual rule held and, when tokens were quantized, some word is not zero.
  EXPECT_EQ(ref.quantized_tokens(), kvq::quantized_tokens(c.spec(), c.axis, c.T));
  if (ref.quantized_tokens() > 0) {
    EXPECT_TRUE(std::any_of(ref.words().begin(), ref.words().end(), [](uint32_t w) { return w; }))
        << what;
  }
}

// ---- the sweep: one append, and a random partition --------------------------------------------

class KiviCacheDevice : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override { KVQ_SKIP_WITHOUT_DEVICE(); }
};

uint32_t seed_of(const Case& c) {
  return static_cast<uint32_t>(c.bits * 1000003 + c.group * 7919 + c.rmul * 131 + c.T * 17 +
                               c.H * 5 + c.D + (c.sym ? 1 : 0) + (c.axis == Axis::Token ? 2 : 0));
}

// Expected: kivi::SideCache after the same single append, then after a random partition.
TEST_P(KiviCacheDevice, MatchesCpuCache) {
  const Case& c = GetParam();
  const Tensor3 x = make_input(c.T, c.H, c.D, seed_of(c));
  run_partition(c, x, {c.T}, c.name() + "_prefill");
  run_partition(c, x, random_partition(c.T, seed_of(c) + 1), c.name() + "_partition");
}

#if defined(KVQ_KIVI_FULL_SWEEP)
#define KVQ_KIVI_SWEEP_NAME FullSweep  // test names must differ from the quick binary's
#else
#define KVQ_KIVI_SWEEP_NAME Sweep
#endif
INSTANTIATE_TEST_SUITE_P(KVQ_KIVI_SWEEP_NAME, KiviCacheDevice, ::testing::ValuesIn(sweep()),
                         [](const ::testing::TestParamInfo<Case>& p) { return p.param.name(); });

// The full binary runs the sweep above only; everything below is in the quick binary.
#if !defined(KVQ_KIVI_FULL_SWEEP)

// ---- special values, streaming, reserve -------------------------------------------------------

class KiviCacheDeviceSpecial : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override { KVQ_SKIP_WITHOUT_DEVICE(); }
};

std::vector<Case> special_cases() {
  std::vector<Case> cases;
  for (int bits : {2, 3, 4, 8})
    for (Axis axis : {Axis::Channel, Axis::Token})
      for (bool sym : {false, true})
        for (int rmul : {0, 2}) cases.push_back(Case{bits, axis, sym, 32, rmul, 100, 3, 72});
  return cases;
}

// Expected: kivi::SideCache; NaN / inf / fp16-overflow groups get NaN scales (and mins) and zero
// codes on both sides (kivi/minmax.h), and the residual keeps the special values bit for bit.
TEST_P(KiviCacheDeviceSpecial, NaNInfAndOverflowGroups) {
  const Case& c = GetParam();
  const Tensor3 x = make_special_input(c.T, c.H, c.D, seed_of(c));
  run_partition(c, x, {c.T}, c.name() + "_prefill");
  run_partition(c, x, random_partition(c.T, seed_of(c) + 2), c.name() + "_partition");
  // Not vacuous: the CPU cache did store NaN parameters.
  kivi::SideCache ref(c.spec(), Role::Key, c.H, c.D);
  ref.append(x.data.data(), c.T);
  EXPECT_TRUE(std::ranges::count(ref.scales(), kivi::kHalfNaN) > 0) << c.name();
}

INSTANTIATE_TEST_SUITE_P(Special, KiviCacheDeviceSpecial, ::testing::ValuesIn(special_cases()),
                         [](const ::testing::TestParamInfo<Case>& p) { return p.param.name(); });

// Expected: decode-style appends (one token at a time, KIVI's g=32, r=128) match the CPU cache
// at every checkpoint, not only at the end.
TEST(KiviCacheDeviceStream, OneTokenAtATime) {
  KVQ_SKIP_WITHOUT_DEVICE();
  for (int bits : {2, 4})
    for (Axis axis : {Axis::Channel, Axis::Token}) {
      const Case c{bits, axis, false, 32, 4, 300, 8, 128};
      const Tensor3 x = make_input(c.T, c.H, c.D, 7);
      run_partition(c, x, std::vector<int64_t>(300, 1), c.name() + "_decode", 37);
      std::vector<int64_t> parts = {200};  // a prefill, then decode
      parts.resize(101, 1);
      run_partition(c, x, parts, c.name() + "_prefill_decode", 9);
    }
}

// Expected: after reserve(T), appends up to T tokens keep every device pointer in place, and the
// stored bytes still match the CPU cache.
TEST(KiviCacheDeviceStream, ReserveKeepsPointers) {
  KVQ_SKIP_WITHOUT_DEVICE();
  for (Axis axis : {Axis::Channel, Axis::Token}) {
    const Case c{2, axis, false, 32, 4, 500, 3, 72};
    const Tensor3 x = make_input(c.T, c.H, c.D, 11);
    GuardedBuffer<float> dx(x.data.size());
    dx.upload(x.data);
    kivi::SideCache ref(c.spec(), Role::Key, c.H, c.D);
    KiviSideCache dev(c.spec(), Role::Key, c.H, c.D);
    KVQ_CUDA_CHECK(dev.reserve(c.T));
    const uint32_t* words = dev.words();
    const uint16_t* scales = dev.scales();
    ASSERT_NE(words, nullptr);
    const uint16_t* mins = dev.mins();
    int64_t at = 0;
    for (int64_t n : random_partition(c.T, 5)) {
      ref.append(x.data.data() + at * c.H * c.D, n);
      KVQ_CUDA_CHECK(dev.append(dx.get() + at * c.H * c.D, n));
      at += n;
      EXPECT_EQ(dev.words(), words);
      EXPECT_EQ(dev.scales(), scales);
      EXPECT_EQ(dev.mins(), mins);
    }
    expect_same_storage(dev, ref, c.name() + "_reserved", x);
  }
}

// ---- many requests' caches appended together (append_batch) ------------------------------------

/// Requests of one configuration, each with its own tokens, appended round by round through
/// KiviSideCache::append_batch. Request r's tokens: make_input(T_r, H, D, seed + r) with T_r
/// spread over [0, c.T]; round 0 is a prefill of a different length per request (empty, one
/// token, around R), then each request appends the next part of its own random partition (0
/// once it is exhausted), so rounds mix decodes, chunks and idle requests. `long_prefill`: every
/// request's round 0 is min(T, 2R + G + 5) tokens instead, so that round quantizes for most
/// requests at once; `odd_offsets`: odd requests' tokens start 4 bytes past a 16-byte boundary
/// (scalar loads and copies beside float4 ones in the same launch).
void run_batched_requests(const Case& c, int requests, uint32_t seed, const std::string& what,
                          bool long_prefill = false, bool odd_offsets = false) {
  struct Request {
    Request(const Case& c, Tensor3 input, std::vector<int64_t> split, int64_t offset)
        : x(std::move(input)),
          parts(std::move(split)),
          dx(x.data.size() + 1),
          ref(c.spec(), Role::Key, c.H, c.D),
          dev(c.spec(), Role::Key, c.H, c.D),
          base(dx.get() + offset) {
      KVQ_CUDA_CHECK(
          cudaMemcpy(base, x.data.data(), x.data.size() * sizeof(float), cudaMemcpyHostToDevice));
    }
    Tensor3 x;
    std::vector<int64_t> parts;
    GuardedBuffer<float> dx;
    kivi::SideCache ref;
    KiviSideCache dev;
    float* base;
    int64_t at = 0;
  };
  std::vector<std::unique_ptr<Request>> reqs;
  const int64_t row = c.H * c.D;
  const int64_t firsts[] = {0, 1, c.r() - 1, c.r(), c.r() + 1, c.g() + 3, 2 * c.r() + 5};
  for (int r = 0; r < requests; ++r) {
    const int64_t T = c.T * (r % 5 + 1) / 5;
    Tensor3 x = make_input(std::max<int64_t>(T, 1), c.H, c.D, seed + static_cast<uint32_t>(r));
    const int64_t first =
        std::clamp<int64_t>(long_prefill ? 2 * c.r() + c.g() + 5 : firsts[r % 7], 0, T);
    std::vector<int64_t> parts = {first};
    for (int64_t p : random_partition(T - first, seed + 100 + static_cast<uint32_t>(r)))
      parts.push_back(p);
    reqs.push_back(
        std::make_unique<Request>(c, std::move(x), std::move(parts), odd_offsets ? r % 2 : 0));
  }
  size_t rounds = 0;
  for (const auto& q : reqs) rounds = std::max(rounds, q->parts.size());
  for (size_t k = 0; k < rounds; ++k) {
    std::vector<KiviSideCache*> caches;
    std::vector<const float*> xs;
    std::vector<int64_t> ns;
    for (const auto& q : reqs) {
      const int64_t n = k < q->parts.size() ? q->parts[k] : 0;
      q->ref.append(q->x.data.data() + q->at * row, n);
      caches.push_back(&q->dev);
      xs.push_back(q->base + q->at * row);
      ns.push_back(n);
      q->at += n;
    }
    KVQ_CUDA_CHECK(KiviSideCache::append_batch(caches, xs, ns));
    if (k == 0 || k + 1 == rounds || k % 7 == 3)
      for (size_t r = 0; r < reqs.size(); ++r)
        expect_same_storage(reqs[r]->dev, reqs[r]->ref,
                            what + "_request" + std::to_string(r) + "_round" + std::to_string(k),
                            reqs[r]->x);
  }
  for (const auto& q : reqs) EXPECT_EQ(q->dx.damaged_guard_bytes(), 0u) << what;
}

// Expected: every request's cache holds what kivi::SideCache holds after the same appends,
// after the prefill round, every few rounds and at the end; no input written to. The long
// prefill rounds of 70 and 140 requests make 70 and 84 quantize jobs and 70 and 140 pushes in
// one append_batch (chunks of 64 jobs and 128 copies), and odd offsets mix float4 and scalar
// paths in one launch.
TEST(KiviCacheDeviceBatch, ManyRequestsMatchCpuCaches) {
  KVQ_SKIP_WITHOUT_DEVICE();
  for (const Case& c : {Case{2, Axis::Channel, false, 32, 4, 300, 8, 128},
                        Case{4, Axis::Token, false, 32, 4, 300, 8, 128},
                        Case{3, Axis::Channel, true, 16, 0, 100, 3, 72},
                        Case{8, Axis::Token, true, kGroupDim, 1, 100, 3, 72},
                        Case{2, Axis::Token, false, 32, 0, 90, 2, 64}})
    run_batched_requests(c, 9, 31, c.name() + "_batch9");
  run_batched_requests(Case{2, Axis::Token, false, 32, 1, 200, 1, 64}, 70, 47, "token_batch70",
                       true);
  run_batched_requests(Case{4, Axis::Channel, false, 32, 1, 70, 1, 64}, 140, 53, "channel_batch140",
                       true, true);
  run_batched_requests(Case{4, Axis::Token, false, 32, 1, 90, 3, 72}, 9, 59, "token_odd_offsets",
                       false, true);
}

// ---- the launcher alone, with sentinels around every output ------------------------------------

class KiviQuantizeLauncher : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override { KVQ_SKIP_WITHOUT_DEVICE(); }
};

std::vector<Case> launcher_cases() {
  std::vector<Case> cases;
  for (int bits : {2, 3, 4, 8})
    for (Axis axis : {Axis::Channel, Axis::Token})
      for (bool sym : {false, true})
        for (int group : {8, 16, 32, 64, 128, 256, kGroupDim}) {
          if (axis == Axis::Channel && group == kGroupDim) continue;
          for (const Case& c : {Case{bits, axis, sym, group, 0, 256, 3, 72},
                                Case{bits, axis, sym, group, 0, 512, 2, 200},
                                Case{bits, axis, sym, group, 0, 300, 3, 75}}) {
            if (axis == Axis::Token && c.g() > c.D) continue;
            cases.push_back(c);
          }
        }
  return cases;
}

// Expected: the bytes kivi::SideCache (R = 0) stores for the same tokens; not one guard byte
// changed (words, scales, mins; mins untouched entirely when sym).
TEST_P(KiviQuantizeLauncher, MatchesCpuAndStaysInBounds) {
  const Case& c = GetParam();
  const Tensor3 x = make_special_input(c.T, c.H, c.D, seed_of(c));
  kivi::SideCache ref(c.spec(), Role::Key, c.H, c.D);
  ref.append(x.data.data(), c.T);
  const int64_t tq = ref.quantized_tokens();
  ASSERT_GT(tq, 0);
  GuardedBuffer<float> dx(x.data.size());
  dx.upload(x.data);
  GuardedBuffer<uint32_t> words(ref.words().size());
  GuardedBuffer<uint16_t> scales(ref.scales().size()), mins(ref.scales().size());
  KVQ_CUDA_CHECK(kivi_quantize(c.axis, c.bits, c.sym, c.g(), Shape3{tq, c.H, c.D}, dx.get(),
                               words.get(), scales.get(), mins.get()));
  KVQ_CUDA_CHECK(cudaDeviceSynchronize());
  int64_t bad = count_mismatches(ref, "words", words.download(), ref.words());
  bad += count_mismatches(ref, "scales", scales.download(), ref.scales());
  if (!c.sym) {
    bad += count_mismatches(ref, "mins", mins.download(), ref.mins());
  } else {
    const std::vector<uint16_t> m = mins.download();
    EXPECT_TRUE(std::all_of(m.begin(), m.end(), [](uint16_t v) { return v == 0xA5A5; }))
        << "sym wrote minima";
  }
  EXPECT_EQ(bad, 0);
  if (bad != 0) dump_input(c.name() + "_launcher", x);
  EXPECT_EQ(words.damaged_guard_bytes(), 0u) << "words";
  EXPECT_EQ(scales.damaged_guard_bytes(), 0u) << "scales";
  EXPECT_EQ(mins.damaged_guard_bytes(), 0u) << "mins";
  EXPECT_EQ(dx.damaged_guard_bytes(), 0u) << "x";
}

INSTANTIATE_TEST_SUITE_P(Groups, KiviQuantizeLauncher, ::testing::ValuesIn(launcher_cases()),
                         [](const ::testing::TestParamInfo<Case>& p) { return p.param.name(); });

// Expected: an empty tensor launches nothing and touches nothing.
TEST(KiviQuantizeLauncherEmpty, ZeroTokens) {
  KVQ_SKIP_WITHOUT_DEVICE();
  GuardedBuffer<float> x(1);
  GuardedBuffer<uint32_t> words(1);
  GuardedBuffer<uint16_t> scales(1), mins(1);
  for (Axis axis : {Axis::Channel, Axis::Token})
    KVQ_CUDA_CHECK(kivi_quantize(axis, 2, false, 32, Shape3{0, 3, 64}, x.get(), words.get(),
                                 scales.get(), mins.get()));
  KVQ_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(words.download()[0], 0xA5A5A5A5u);
  EXPECT_EQ(scales.download()[0], 0xA5A5u);
  EXPECT_EQ(mins.download()[0], 0xA5A5u);
  EXPECT_EQ(words.damaged_guard_bytes() + scales.damaged_guard_bytes() +
                mins.damaged_guard_bytes(),
            0u);
}

// ---- configuration errors (host only: these run without a device) ----------------------------

IntSpec spec_of(int bits, Axis axis, int group, int residual) {
  IntSpec q = Case{bits, axis, false, group, 0, 1, 1, 64}.spec();
  q.residual = residual;
  return q;
}

// Expected: the offending value appears in the message (STYLE 9); the cache's rules and messages
// are kivi::SideCache's.
TEST(KiviKernelConfig, BadConfigurationThrowsNamingTheValue) {
  expect_error([] { KiviSideCache(spec_of(5, Axis::Token, 32, 0), Role::Value, 2, 64); }, "5 bits");
  expect_error([] { KiviSideCache(spec_of(2, Axis::Channel, kGroupDim, 0), Role::Key, 2, 64); },
               "g=dim");
  expect_error([] { KiviSideCache(spec_of(2, Axis::Channel, 32, 48), Role::Key, 2, 64); }, "r=48");
  expect_error([] { KiviSideCache(spec_of(2, Axis::Token, 128, 0), Role::Key, 2, 64); }, "g=128");
  expect_error([] { KiviSideCache(spec_of(2, Axis::Token, 32, 0), Role::Key, 0, 64); }, "heads=0");
  KiviSideCache ok(spec_of(2, Axis::Token, 32, 0), Role::Key, 2, 64);
  expect_error([&] { (void)ok.append(nullptr, -1); }, "n=-1");
  expect_error([&] { (void)ok.append(nullptr, 3); }, "null pointer");
  expect_error([&] { (void)ok.reserve(-2); }, "tokens=-2");
  float f = 0;
  uint32_t w = 0;
  uint16_t s = 0;
  const Shape3 shape{32, 2, 64};
  expect_error([&] { (void)kivi_quantize(Axis::Token, 7, false, 32, shape, &f, &w, &s, &s); },
               "7 bits");
  expect_error([&] { (void)kivi_quantize(Axis::Token, 2, false, 0, shape, &f, &w, &s, &s); },
               "g=0");
  expect_error(
      [&] {
        (void)kivi_quantize(Axis::Channel, 2, false, 32, {33, 2, 64}, &f, &w, &s, &s);
      },
      "T=33");
  expect_error([&] { (void)kivi_quantize(Axis::Token, 2, false, 128, shape, &f, &w, &s, &s); },
               "g=128");
  expect_error(
      [&] {
        (void)kivi_quantize(Axis::Token, 2, false, 32, {-1, 2, 64}, &f, &w, &s, &s);
      },
      "T=-1");
  expect_error([&] { (void)kivi_quantize(Axis::Token, 2, false, 32, shape, nullptr, &w, &s, &s); },
               "x is null");
  expect_error([&] { (void)kivi_quantize(Axis::Token, 2, false, 32, shape, &f, nullptr, &s, &s); },
               "words is null");
  expect_error(
      [&] { (void)kivi_quantize(Axis::Channel, 2, false, 32, shape, &f, &w, nullptr, &s); },
      "scales is null");
  expect_error(
      [&] { (void)kivi_quantize(Axis::Channel, 2, false, 32, shape, &f, &w, &s, nullptr); },
      "mins is null");
  expect_error(
      [&] { (void)kivi_quantize(static_cast<Axis>(9), 2, false, 32, shape, &f, &w, &s, &s); },
      "unknown Axis value 9");
}

// Expected: kivi_quantize_batch checks every job before launching and names it (the batched
// append's own checks: tests/kernels/cuda/kivi_cache_plan_test.cpp, which runs without CUDA).
TEST(KiviKernelConfig, BatchedQuantizeNamesTheBadJob) {
  float f = 0;
  uint32_t w = 0;
  uint16_t s = 0;
  const KiviQuantizeJob jobs[] = {{&f, 32, &w, &s, &s}, {&f, 33, &w, &s, &s}};
  expect_error([&] { (void)kivi_quantize_batch(Axis::Channel, 2, false, 32, 2, 64, jobs); },
               "job 1: per-channel: T=33");
}

// The sweep list itself (host only): every bits x axis x sym x G x R is present.
TEST(KiviKernelConfig, SweepCoversEveryConfiguration) {
  const std::vector<Case> cases = sweep();
  for (int bits : {2, 3, 4, 8})
    for (Axis axis : {Axis::Channel, Axis::Token})
      for (bool sym : {false, true})
        for (int group : {8, 32, 128})
          for (int rmul : {0, 1, 4})
            EXPECT_TRUE(std::ranges::any_of(cases, [&](const Case& c) {
              return c.bits == bits && c.axis == axis && c.sym == sym && c.group == group &&
                     c.rmul == rmul;
            })) << bits << " " << to_string(axis) << " " << sym << " " << group << " " << rmul;
}

#endif  // !KVQ_KIVI_FULL_SWEEP

}  // namespace
}  // namespace kvq::cuda
