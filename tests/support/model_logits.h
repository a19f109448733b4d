// The model's logits for tests that compare two forward passes (backend cuda's model against
// backend cpu's, tests/cuda/model_cuda_test.cpp; the device model's host code against the CPU,
// tests/kernels/cuda/device_model_host_test.cpp): the fixtures, a prompt, every position's logits
// over a fresh cache, and the tolerance rule for a quantized cache both tests state.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "core/spec.h"
#include "model/llama.h"

namespace kvq::testing {

/// \brief A tests/fixtures/hf/ checkpoint folder: KVQ_HF_FIXTURES, else the source tree's, else
/// tests/fixtures/hf under the working directory (a binary built elsewhere by
/// scripts/device-pack.sh, run from the repo root by scripts/device-check.sh).
inline std::string hf_fixture(const std::string& family) {
  if (const char* e = std::getenv("KVQ_HF_FIXTURES"); e && *e) return std::string(e) + "/" + family;
  const std::string built = std::string(KVQ_SOURCE_DIR) + "/tests/fixtures/hf/" + family;
  return std::filesystem::is_directory(built) ? built : "tests/fixtures/hf/" + family;
}

/// \brief n token ids (mul * i + add) mod vocab: a prompt that visits the vocabulary.
inline std::vector<int32_t> prompt_ids(int vocab, int n, int mul = 37, int add = 11) {
  std::vector<int32_t> ids;
  for (int i = 0; i < n; ++i) ids.push_back(static_cast<int32_t>((mul * i + add) % vocab));
  return ids;
}

/// \brief Every position's logits [n, vocab] of `ids` on the model's current backend, one chunk
/// over a fresh cache in `spec`, one thread.
inline std::vector<float> all_logits(const LlamaModel& m, std::span<const int32_t> ids,
                                     const std::string& spec = "fp32") {
  CacheOptions o;
  o.spec = parse_spec(spec);
  LlamaCache cache(m.config(), o);
  std::vector<float> logits;
  m.forward(ids, cache, logits, true, 1);
  return logits;
}

inline double max_abs(const std::vector<float>& a) {
  double m = 0;
  for (float x : a) m = std::max(m, static_cast<double>(std::fabs(x)));
  return m;
}

inline double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    m = std::max(m, static_cast<double>(std::fabs(a[i] - b[i])));
  return m;
}

/// \brief float32 summation order, x max |logit| (hf_model_test's 1e-4).
constexpr double kOrderTol = 1e-4;

/// \brief How far another forward pass over the same quantized cache scheme may land from the
/// CPU's logits `cpu`: 2 D + kOrderTol x max |cpu|, D = max |exact - cpu| the cache's whole
/// rounding on the CPU (`exact`: the fp32 cache's logits). A K or V value computed 1e-6 apart can
/// round to the neighbouring code, one step where the whole rounding moves every value by up to
/// half a step.
inline double quantized_cache_tolerance(const std::vector<float>& exact,
                                        const std::vector<float>& cpu) {
  return 2 * max_diff(exact, cpu) + kOrderTol * max_abs(cpu);
}

}  // namespace kvq::testing
