// Reproducible random inputs for tests (fixed seeds, never random_device).
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace kvq::testing {

/// \brief n values from N(0, 1), std::mt19937_64 seeded with `seed` (queries for attention tests).
inline std::vector<float> random_q(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> q(static_cast<size_t>(n));
  for (float& x : q) x = nd(rng);
  return q;
}

}  // namespace kvq::testing
