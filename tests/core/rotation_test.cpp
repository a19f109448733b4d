// core/rotation.h: the Walsh-Hadamard transform and rot=hadamard[:SEED]'s rotation against their
// definitions, computed here independently in double: H_n[i][j] = (-1)^popcount(i & j) / sqrt(n)
// (Sylvester order), R = blockdiag(H_b) diag(s) with b the largest power of two dividing head_dim
// and s_i from the low bit of the i-th splitmix64 output (the constants of Steele, Lea and Flood's
// splitmix64, written out again here).
#include "core/rotation.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/error.h"

namespace kvq {
namespace {

double sylvester(int64_t i, int64_t j, int64_t n) {
  return (__builtin_popcountll(static_cast<uint64_t>(i & j)) % 2 ? -1.0 : 1.0) /
         std::sqrt(static_cast<double>(n));
}

std::vector<double> signs(uint64_t seed, int64_t d) {
  std::vector<double> s;
  uint64_t x = seed;
  for (int64_t i = 0; i < d; ++i) {
    x += 0x9e3779b97f4a7c15ULL;
    uint64_t z = x;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    s.push_back(z & 1 ? -1.0 : 1.0);
  }
  return s;
}

std::vector<float> wave(int64_t n, double phase) {
  std::vector<float> x(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    x[static_cast<size_t>(i)] =
        static_cast<float>(std::sin(0.7 * static_cast<double>(i) + phase) * 3.0);
  return x;
}

TEST(Hadamard, MatchesSylvesterDefinitionAndIsItsOwnInverse) {
  for (int64_t n : {1, 2, 8, 64, 128}) {
    const std::vector<float> x = wave(n, 0.3);
    std::vector<float> y = x;
    hadamard_transform(y.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      double want = 0;
      for (int64_t j = 0; j < n; ++j) want += sylvester(i, j, n) * x[static_cast<size_t>(j)];
      EXPECT_NEAR(y[static_cast<size_t>(i)], want, 1e-5) << "n=" << n << " i=" << i;
    }
    hadamard_transform(y.data(), n);  // H is symmetric and orthonormal: H H = I
    for (int64_t i = 0; i < n; ++i)
      EXPECT_NEAR(y[static_cast<size_t>(i)], x[static_cast<size_t>(i)], 1e-5);
  }
}

TEST(Rotation, BlockIsLargestPowerOfTwoDividingHeadDim) {
  EXPECT_EQ(rotation_block(128), 128);
  EXPECT_EQ(rotation_block(64), 64);
  EXPECT_EQ(rotation_block(96), 32);
  EXPECT_EQ(rotation_block(72), 8);
  EXPECT_EQ(rotation_block(20), 0);
  try {
    Rotation r(RotSpec{true}, 20);
    FAIL() << "head_dim 20 has no block of 8";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("head_dim divisible by 8"), std::string::npos) << e.what();
  }
}

// R x against the matrix written out, for both sign rules and ragged block counts; then R^T R = I
// (unrotate undoes rotate) and <R q, R k> = <q, k>, to float rounding.
TEST(Rotation, EqualsDefinitionOrthonormalPreservesDotProducts) {
  for (int64_t d : {64, 96, 72, 128})
    for (const RotSpec& spec :
         {RotSpec{true}, RotSpec{true, true, 7}, RotSpec{true, true, 12345}}) {
      SCOPED_TRACE(::testing::Message()
                   << "d=" << d << " seed=" << spec.seed << " seeded=" << spec.seeded);
      const Rotation r(spec, d);
      const int64_t b = rotation_block(d);
      const std::vector<double> s = spec.seeded ? signs(spec.seed, d) : std::vector<double>(d, 1.0);
      const std::vector<float> q = wave(d, 0.1), k = wave(d, 1.9);
      std::vector<float> rq = q, rk = k;
      r.rotate(rq.data(), 1);
      r.rotate(rk.data(), 1);
      double dot = 0, rdot = 0, scale = 0;
      for (int64_t i = 0; i < d; ++i) {
        double want = 0;
        const int64_t blk = i / b * b;
        for (int64_t j = blk; j < blk + b; ++j)
          want += sylvester(i - blk, j - blk, b) * s[static_cast<size_t>(j)] *
                  q[static_cast<size_t>(j)];
        EXPECT_NEAR(rq[static_cast<size_t>(i)], want, 1e-5) << "i=" << i;
        dot += static_cast<double>(q[static_cast<size_t>(i)]) * k[static_cast<size_t>(i)];
        rdot += static_cast<double>(rq[static_cast<size_t>(i)]) * rk[static_cast<size_t>(i)];
        scale +=
            std::fabs(static_cast<double>(q[static_cast<size_t>(i)]) * k[static_cast<size_t>(i)]);
      }
      EXPECT_NEAR(rdot, dot, 1e-6 * scale);
      r.unrotate(rq.data(), 1);
      for (int64_t i = 0; i < d; ++i)
        EXPECT_NEAR(rq[static_cast<size_t>(i)], q[static_cast<size_t>(i)], 1e-5);
    }
}

TEST(Rotation, SeedsGiveDifferentSignsAndNoSeedIsPlainHadamard) {
  const std::vector<double> a = signs(7, 64), b = signs(8, 64);
  int neg = 0, differ = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    neg += a[i] < 0;
    differ += a[i] != b[i];
  }
  EXPECT_GT(neg, 16);  // a fair coin: 32 of 64 expected
  EXPECT_LT(neg, 48);
  EXPECT_GT(differ, 16);
  std::vector<float> x = wave(64, 0.5), y = x;
  Rotation(RotSpec{true}, 64).rotate(x.data(), 1);
  hadamard_transform(y.data(), 64);
  EXPECT_EQ(x, y);
}

}  // namespace
}  // namespace kvq
