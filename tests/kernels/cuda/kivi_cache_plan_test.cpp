// Host test of kernels/cuda/kivi_cache_device.cu's own code: the append planning (what is copied
// and quantized where, in which launch) of KiviSideCache::append and append_batch, run on the CPU.
// The file is compiled here as C++ against host_runtime/cuda_runtime_api.h (device memory is host
// memory) with the two launchers it calls defined below as host executors:
// - kivi_quantize_batch runs every job through backend cpu's quantizer (kvq::cpu::kivi_quantize,
//   bit-exact to the reference by tests/kernels/cpu), into the job's output pointers;
// - copy_floats_batch copies, after checking that no two copies of one launch touch the same
//   bytes and that no copy overlaps itself (the device runs a launch's copies concurrently).
// Each executor call counts the launches the device launcher makes for it: one per
// kKiviJobsPerLaunch quantize jobs or kCopiesPerLaunch copies that have work.
//
// Where expected values come from: kivi::SideCache (kivi/cache.cpp, the spec) fed the same
// appends: words, scales, minima and the residual's float bits must be equal. The device kernels
// themselves are tested on a GPU by tests/cuda/ (they skip without one).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/kivi.h"
#include "kernels/cuda/kivi_cache_device.cu"  // NOLINT(bugprone-suspicious-include): see above
#include "kivi/cache.h"
#include "tests/support/expect_error.h"

namespace kvq::cuda {

int g_launches = 0;  // executor calls with work, since the last reset

cudaError_t kivi_quantize_batch(Axis axis, int bits, bool sym, int group, int64_t heads,
                                int64_t dim, std::span<const KiviQuantizeJob> jobs, cudaStream_t) {
  IntSpec spec;
  spec.bits = bits;
  spec.sym = sym;
  spec.group = group;
  spec.residual = 0;
  spec.key_axis = spec.value_axis = axis;
  int with_work = 0;
  for (const KiviQuantizeJob& j : jobs) {
    if (j.tokens == 0) continue;
    ++with_work;
    cpu::KiviPacked out;
    cpu::kivi_quantize(spec, Role::Key, j.x, j.tokens, heads, dim, out);
    EXPECT_EQ(out.quantized_tokens, j.tokens) << "a per-channel job that is not whole groups";
    std::memcpy(j.words, out.words.data(), out.words.size() * sizeof(uint32_t));
    std::memcpy(j.scales, out.scales.data(), out.scales.size() * sizeof(uint16_t));
    if (!sym) std::memcpy(j.mins, out.mins.data(), out.mins.size() * sizeof(uint16_t));
  }
  g_launches += (with_work + kKiviJobsPerLaunch - 1) / kKiviJobsPerLaunch;
  return cudaSuccess;
}

cudaError_t copy_floats_batch(std::span<const FloatCopy> copies, cudaStream_t) {
  const auto overlap = [](const float* a, int64_t na, const float* b, int64_t nb) {
    return a < b + nb && b < a + na;
  };
  for (size_t a = 0; a < copies.size(); ++a) {
    const FloatCopy& x = copies[a];
    EXPECT_FALSE(overlap(x.src, x.count, x.dst, x.count)) << "copy " << a << " overlaps itself";
    for (size_t b = 0; b < copies.size(); ++b) {
      if (a == b) continue;
      const FloatCopy& y = copies[b];
      EXPECT_FALSE(overlap(x.dst, x.count, y.src, y.count) ||
                   overlap(x.dst, x.count, y.dst, y.count))
          << "copy " << a << " writes bytes that copy " << b << " of the same launch touches";
    }
  }
  int with_work = 0;
  for (const FloatCopy& c : copies) {
    if (c.count == 0) continue;
    ++with_work;
    std::memcpy(c.dst, c.src, static_cast<size_t>(c.count) * sizeof(float));
  }
  g_launches += (with_work + kCopiesPerLaunch - 1) / kCopiesPerLaunch;
  return cudaSuccess;
}

namespace {

using kvq::testing::expect_error;

struct Config {
  int bits;
  Axis axis;
  bool sym;
  int group;  ///< G, or kGroupWholeDim
  int residual;
  std::string name() const {
    // Built by appending: GCC 12 reports a false -Wrestrict on "literal" + std::string.
    std::string n = "b";
    n += std::to_string(bits);
    n += axis == Axis::Channel ? "_channel" : "_token";
    n += sym ? "_sym" : "_asym";
    n += "_g";
    n += group == kGroupWholeDim ? std::string("dim") : std::to_string(group);
    n += "_r";
    n += std::to_string(residual);
    return n;
  }
  IntSpec spec() const {
    IntSpec q;
    q.bits = bits;
    q.key_axis = q.value_axis = axis;
    q.group = group;
    q.residual = residual;
    q.sym = sym;
    return q;
  }
};

/// Every bits x axis x sym x G x R (R = 0, one group, three groups) the cache accepts.
std::vector<Config> configs() {
  std::vector<Config> out;
  for (int bits : {2, 3, 4, 8})
    for (Axis axis : {Axis::Channel, Axis::Token})
      for (bool sym : {false, true})
        for (int group : {8, 32, kGroupWholeDim})
          for (int rmul : {0, 1, 3}) {
            if (axis == Axis::Channel && group == kGroupWholeDim) continue;
            out.push_back({bits, axis, sym, group, rmul * (group == kGroupWholeDim ? 16 : group)});
          }
  return out;
}

bool same_bits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// Expected: after every round of append_batch (1-64 requests of one configuration, each appending
// 0, 1, a few or up to 60 tokens, so rounds mix decodes, chunks and idle requests), every
// request's cache stores kivi::SideCache's bytes for the same appends; with 32 requests or fewer
// a round takes at most 4 launches (top-up copies, quantize, window moves, residual pushes),
// where appending request by request would take up to 4 per request.
TEST(KiviCachePlan, BatchedAppendsStoreTheCpuCachesBytes) {
  std::mt19937 rng(20261202);
  for (const Config& c : configs()) {
    SCOPED_TRACE(c.name());
    const int64_t heads = 1 + static_cast<int64_t>(rng() % 3), dim = rng() % 2 ? 64 : 72;
    const int64_t row = heads * dim, tokens = 300;
    const int requests = 1 + static_cast<int>(rng() % 64);
    std::vector<kivi::SideCache> refs;
    std::vector<std::unique_ptr<KiviSideCache>> devs;
    std::vector<std::vector<float>> xs;
    std::normal_distribution<float> normal;
    for (int r = 0; r < requests; ++r) {
      refs.emplace_back(c.spec(), Role::Key, heads, dim);
      devs.push_back(std::make_unique<KiviSideCache>(c.spec(), Role::Key, heads, dim));
      std::vector<float> x(static_cast<size_t>(tokens * row));
      for (float& v : x) v = normal(rng);
      xs.push_back(std::move(x));
    }
    std::vector<int64_t> at(static_cast<size_t>(requests), 0);
    for (int round = 0; round < 30; ++round) {
      std::vector<KiviSideCache*> caches;
      std::vector<const float*> x;
      std::vector<int64_t> n;
      for (size_t r = 0; r < static_cast<size_t>(requests); ++r) {
        const int kind = static_cast<int>(rng() % 6);
        int64_t k = kind == 0 ? 0 : kind <= 3 ? 1 : kind == 4 ? rng() % 5 : rng() % 60;
        k = std::min(k, tokens - at[r]);
        refs[r].append(xs[r].data() + at[r] * row, k);
        caches.push_back(devs[r].get());
        x.push_back(xs[r].data() + at[r] * row);
        n.push_back(k);
        at[r] += k;
      }
      g_launches = 0;
      ASSERT_EQ(KiviSideCache::append_batch(caches, x, n), cudaSuccess);
      if (requests <= 32) {
        EXPECT_LE(g_launches, 4) << "round " << round;
      }
      for (size_t r = 0; r < static_cast<size_t>(requests); ++r) {
        KiviSideCacheHost got;
        ASSERT_EQ(devs[r]->copy_to_host(got), cudaSuccess);
        const kivi::SideCache& want = refs[r];
        ASSERT_EQ(devs[r]->tokens(), want.tokens()) << "request " << r << " round " << round;
        ASSERT_EQ(devs[r]->quantized_tokens(), want.quantized_tokens());
        const bool ok = std::ranges::equal(got.words, want.words()) &&
                        std::ranges::equal(got.scales, want.scales()) &&
                        std::ranges::equal(got.mins, want.mins()) &&
                        same_bits(got.residual, want.residual());
        ASSERT_TRUE(ok) << "request " << r << " round " << round << " (" << want.tokens()
                        << " tokens)";
      }
    }
  }
}

// Expected: one request appended by append() stores the same bytes as kivi::SideCache (append is
// append_batch of one), token by token and in chunks, for both axes.
TEST(KiviCachePlan, SingleAppendsStoreTheCpuCachesBytes) {
  for (const Config& c :
       {Config{2, Axis::Channel, false, 32, 128}, Config{4, Axis::Token, false, 32, 128},
        Config{3, Axis::Token, true, kGroupWholeDim, 0}}) {
    SCOPED_TRACE(c.name());
    const int64_t heads = 2, dim = 64, row = heads * dim, tokens = 700;
    std::vector<float> x(static_cast<size_t>(tokens * row));
    std::mt19937 rng(7);
    std::normal_distribution<float> normal;
    for (float& v : x) v = normal(rng);
    kivi::SideCache want(c.spec(), Role::Key, heads, dim);
    KiviSideCache dev(c.spec(), Role::Key, heads, dim);
    int64_t at = 0;
    for (int64_t k : {1, 1, 200, 0, 1, 37, 129, 1, 300}) {
      want.append(x.data() + at * row, k);
      g_launches = 0;
      ASSERT_EQ(dev.append(x.data() + at * row, k), cudaSuccess);
      EXPECT_LE(g_launches, 4);
      at += k;
    }
    KiviSideCacheHost got;
    ASSERT_EQ(dev.copy_to_host(got), cudaSuccess);
    EXPECT_TRUE(std::ranges::equal(got.words, want.words()));
    EXPECT_TRUE(std::ranges::equal(got.scales, want.scales()));
    EXPECT_TRUE(std::ranges::equal(got.mins, want.mins()));
    EXPECT_TRUE(same_bits(got.residual, want.residual()));
    EXPECT_GT(want.quantized_tokens(), 0);
  }
}

// Expected: append_batch checks every request before queuing or changing anything and names the
// request (STYLE 9).
TEST(KiviCachePlan, BatchedAppendNamesTheBadRequest) {
  const IntSpec kivi2 = Config{2, Axis::Token, false, 32, 0}.spec();
  KiviSideCache a(kivi2, Role::Key, 2, 64), b(kivi2, Role::Key, 2, 64);
  KiviSideCache other(Config{4, Axis::Token, false, 32, 0}.spec(), Role::Key, 2, 64);
  KiviSideCache wide(kivi2, Role::Key, 3, 64);
  std::vector<float> f(static_cast<size_t>(4 * 3 * 64), 1.0f);
  const auto batch = [&](KiviSideCache* c0, KiviSideCache* c1, const float* x1, int64_t n1) {
    KiviSideCache* cs[] = {c0, c1};
    const float* x[] = {f.data(), x1};
    const int64_t n[] = {1, n1};
    (void)KiviSideCache::append_batch(cs, x, n);
  };
  expect_error(
      [&] {
        KiviSideCache* cs[] = {&a, &b};
        const float* x[] = {f.data()};
        const int64_t n[] = {1, 1};
        (void)KiviSideCache::append_batch(cs, x, n);
      },
      "2 caches with 1 inputs");
  expect_error([&] { batch(&a, nullptr, f.data(), 1); }, "request 1: the cache is null");
  expect_error([&] { batch(&a, &b, f.data(), -2); }, "request 1: append of n=-2");
  expect_error([&] { batch(&a, &b, nullptr, 4); }, "request 1: append of n=4 tokens from a null");
  expect_error([&] { batch(&a, &other, f.data(), 1); }, "request 1: its spec or shape differs");
  expect_error([&] { batch(&a, &wide, f.data(), 1); }, "3 heads x 64");
  expect_error([&] { batch(&a, &a, f.data(), 1); }, "request 1: the same cache as request 0");
  EXPECT_EQ(a.tokens(), 0);  // the failed calls changed nothing
  EXPECT_EQ(b.tokens(), 0);
  batch(&a, &b, f.data(), 3);  // and the caches still take a good batch
  EXPECT_EQ(a.tokens(), 1);
  EXPECT_EQ(b.tokens(), 3);
}

}  // namespace
}  // namespace kvq::cuda
