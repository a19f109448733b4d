// The model on backend cuda (model/llama_cuda.cpp, kernels/cuda/device_model.h) against the same
// model on backend cpu, on the tiny transformers checkpoints of tests/fixtures/hf/ (llama, llama3,
// mistral, qwen2, qwen3, smollm2: every row of model/arch.h's table a folder loads) and on the
// SmolLM2 GGUF when the model cache holds it (its adjacent RoPE pairs and Q4_1/Q8_0 weights).
//
// Where expected values come from: backend cpu's logits for the same prompt and the same cache
// scheme (itself tested against transformers, tests/model/hf_model_test.cpp). Backend cuda has no
// fp32 cache, so both sides hold the cache as bf16 (or the scheme under test). The two differ by:
//   - float32 summation order (matrix products, RMSNorm, softmax): ~1e-6 relative per layer;
//   - the cache's rounding: a K or V value computed 1e-6 apart on the two sides can round to
//     neighbouring bf16 values (or KIVI / FP8 codes), a change of one step in a few elements.
// The second is bounded by the cache's whole rounding, measured on the CPU: D = max |logits(cpu,
// fp32 cache) - logits(cpu, scheme)| over every position. The tolerance is 2 D + 1e-4 x max
// |logit| (the first term: a flip moves a value by at most one step where the whole rounding
// moves every value by up to half a step; the second: the summation order, as hf_model_test's
// 1e-4). A wrong kernel (RoPE pairing, a norm, a bias, the residual) moves logits by 1e-1 or more
// on these fixtures. Weights: float32 on the device (the CPU's values exactly), and bf16 where the
// checkpoint's own dtype is BF16 (the same values). Greedy tokens must agree at every position
// whose CPU top-2 gap exceeds twice the tolerance.
// The model's step appends K and V to its cache sides from device memory (append_device: the
// device-pointer append, whose bytes tests/cuda/backend_cuda_test.cpp compares with the host
// append's) and attends with q and the output in device memory; every case here runs that path.
// Without a device every case skips with cuda_unavailable()'s line; one case checks that line.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <tuple>
#include <vector>

#include "core/error.h"
#include "core/spec.h"
#include "kernels/backend.h"
#include "model/hf_checkpoint.h"
#include "model/llama.h"
#include "tests/support/expect_error.h"
#include "tests/support/model.h"
#include "tests/support/model_logits.h"
#include "tests/support/skip_cuda.h"

namespace kvq {
namespace {

using testing::all_logits;
using testing::hf_fixture;
using testing::max_abs;
using testing::max_diff;
using testing::prompt_ids;

// Compares backend cuda's logits with backend cpu's for `spec` (see the file comment).
void expect_matches_cpu(LlamaModel& m, const std::string& spec, int n, const std::string& what) {
  const int vocab = m.config().vocab;
  const std::vector<int32_t> ids = prompt_ids(vocab, n);
  m.set_backend(AttentionBackend::kCpu);
  const std::vector<float> exact = all_logits(m, ids), cpu = all_logits(m, ids, spec);
  m.set_backend(AttentionBackend::kCuda);
  const std::vector<float> gpu = all_logits(m, ids, spec);
  const double d = max_diff(exact, cpu);
  const double tol = testing::quantized_cache_tolerance(exact, cpu);
  const double err = max_diff(gpu, cpu);
  EXPECT_LE(err, tol) << what << " " << spec << ": max |gpu - cpu| = " << err
                      << ", the cache's own rounding D = " << d;
  // greedy picks where the CPU's margin is clear of the tolerance
  int compared = 0;
  for (int t = 0; t < n; ++t) {
    const float* c = cpu.data() + static_cast<size_t>(t) * vocab;
    const float* g = gpu.data() + static_cast<size_t>(t) * vocab;
    const int top = static_cast<int>(std::max_element(c, c + vocab) - c);
    float second = -INFINITY;
    for (int i = 0; i < vocab; ++i)
      if (i != top) second = std::max(second, c[i]);
    if (c[top] - second <= 2 * tol) continue;
    ++compared;
    EXPECT_EQ(static_cast<int>(std::max_element(g, g + vocab) - g), top)
        << what << " " << spec << " position " << t;
  }
  ::testing::Test::RecordProperty(what + "_" + spec + "_greedy_compared", compared);
  m.set_backend(AttentionBackend::kCpu);
}

bool bf16_checkpoint(const std::string& dir) {
  const HfCheckpoint c = HfCheckpoint::open(dir);
  const SafetensorsEntry* e = c.find(c.config().tied ? "model.embed_tokens.weight"
                                                     : "model.layers.0.self_attn.q_proj.weight");
  return e && e->dtype == "BF16";
}

class ModelCuda : public ::testing::TestWithParam<std::string> {};

// Every family, fp32 device weights, bf16 / kivi2 / kivi4 / fp8 (per-token scales) caches; 8 tokens
// (mistral's window is 8: the whole prompt fits it); groups of 8 tokens without a residual
// window, so the codes are read, not only the exact tail.
TEST_P(ModelCuda, LogitsMatchBackendCpu) {
  KVQ_SKIP_WITHOUT_CUDA();
  LlamaModel m = LlamaModel::load(hf_fixture(GetParam()));
  m.set_device_weights(LlamaModel::DeviceWeights::kFp32);
  for (const char* spec : {"bf16", "kivi2:g=8,r=0", "kivi4:g=8,r=0", "fp8_e4m3:gran=token"})
    expect_matches_cpu(m, spec, 8, GetParam() + "_fp32w");
  EXPECT_GT(m.device_weight_bytes(), 0);
}

// A rot= cache (kivi2 over Hadamard-rotated K/V): the step's one path that leaves the device
// (backend.h's append_device / attend_decode_device rotate on the host), same tolerance rule.
TEST_P(ModelCuda, RotatedCacheMatchesBackendCpu) {
  KVQ_SKIP_WITHOUT_CUDA();
  LlamaModel m = LlamaModel::load(hf_fixture(GetParam()));
  m.set_device_weights(LlamaModel::DeviceWeights::kFp32);
  expect_matches_cpu(m, "kivi2:g=8,r=0,rot=hadamard:7", 8, GetParam() + "_fp32w_rot");
}

// bf16 device weights on the checkpoints stored as BF16: the same values, the same tolerance.
TEST_P(ModelCuda, Bf16WeightsOnBf16Checkpoints) {
  KVQ_SKIP_WITHOUT_CUDA();
  if (!bf16_checkpoint(hf_fixture(GetParam()))) GTEST_SKIP() << GetParam() << " is not stored as BF16";
  LlamaModel m = LlamaModel::load(hf_fixture(GetParam()));
  m.set_device_weights(LlamaModel::DeviceWeights::kBf16);
  expect_matches_cpu(m, "bf16", 8, GetParam() + "_bf16w");
  // bf16 weights take half the bytes of float32 ones
  const int64_t b16 = m.device_weight_bytes();
  m.set_device_weights(LlamaModel::DeviceWeights::kFp32);
  m.set_backend(AttentionBackend::kCuda);
  (void)all_logits(m, prompt_ids(m.config().vocab, 1), "bf16");
  EXPECT_EQ(m.device_weight_bytes(), 2 * b16);
}

// A chunk and the same tokens one at a time give the same bits (one path on backend cuda), and the
// cache holds every token.
TEST_P(ModelCuda, ChunkEqualsTokenByToken) {
  KVQ_SKIP_WITHOUT_CUDA();
  LlamaModel m = LlamaModel::load(hf_fixture(GetParam()));
  m.set_backend(AttentionBackend::kCuda);
  const std::vector<int32_t> ids = prompt_ids(m.config().vocab, 8);
  const std::vector<float> chunk = all_logits(m, ids, "kivi2:g=8,r=0");
  CacheOptions o;
  o.spec = parse_spec("kivi2:g=8,r=0");
  LlamaCache cache(m.config(), o);
  std::vector<float> step, all;
  for (int32_t id : ids) {
    m.forward({&id, 1}, cache, step, false, 1);
    all.insert(all.end(), step.begin(), step.end());
  }
  EXPECT_EQ(cache.tokens(), 8);
  ASSERT_EQ(all.size(), chunk.size());
  EXPECT_EQ(std::memcmp(all.data(), chunk.data(), all.size() * sizeof(float)), 0);
}

INSTANTIATE_TEST_SUITE_P(Families, ModelCuda,
                         ::testing::Values("llama", "llama3", "mistral", "qwen2", "qwen3",
                                           "smollm2"),
                         [](const auto& i) { return i.param; });

// The SmolLM2 GGUF (adjacent RoPE pairs, Q4_1/Q8_0 blocks dequantized on the host): 16 tokens,
// float32 and bf16 device weights (bf16: each weight rounded, so only greedy agreement at clear
// margins and the bf16-weight logits within 5% of the logits' range are asserted).
TEST(ModelCudaGguf, SmolLM2MatchesBackendCpu) {
  KVQ_SKIP_WITHOUT_CUDA();
  KVQ_REQUIRE_MODEL();
  LlamaModel m = LlamaModel::load(M->file);
  m.set_device_weights(LlamaModel::DeviceWeights::kFp32);
  expect_matches_cpu(m, "bf16", 16, "smollm2_gguf_fp32w");
  expect_matches_cpu(m, "kivi2:g=8,r=0", 16, "smollm2_gguf_fp32w");
  m.set_device_weights(LlamaModel::DeviceWeights::kBf16);
  const std::vector<int32_t> ids = prompt_ids(m.config().vocab, 16);
  m.set_backend(AttentionBackend::kCpu);
  const std::vector<float> cpu = all_logits(m, ids, "bf16");
  m.set_backend(AttentionBackend::kCuda);
  const std::vector<float> gpu = all_logits(m, ids, "bf16");
  EXPECT_LE(max_diff(gpu, cpu), 0.05 * max_abs(cpu));
}

// What backend cuda refuses, each in one line naming it.
TEST(ModelCudaErrors, RefusedInOneLine) {
  KVQ_SKIP_WITHOUT_CUDA();
  LlamaModel m = LlamaModel::load(hf_fixture("mistral"));  // sliding window 8
  m.set_backend(AttentionBackend::kCuda);
  const std::vector<int32_t> ids = prompt_ids(m.config().vocab, 9);
  testing::expect_error([&] { (void)all_logits(m, ids, "bf16"); }, "no sliding-window attention");
  testing::expect_error([&] { (void)all_logits(m, {ids.data(), 2}, "fp32"); }, "backend cuda");
  CacheOptions pre;
  pre.spec = parse_spec("bf16");
  pre.pre_rope = true;
  LlamaCache c1(m.config(), pre);
  std::vector<float> logits;
  testing::expect_error([&] { m.forward({ids.data(), 2}, c1, logits, false, 1); }, "pre_rope");
  // a cache written on a host backend is not moved to the device
  CacheOptions o;
  o.spec = parse_spec("bf16");
  LlamaCache c2(m.config(), o);
  m.set_backend(AttentionBackend::kCpu);
  m.forward({ids.data(), 2}, c2, logits, false, 1);
  m.set_backend(AttentionBackend::kCuda);
  testing::expect_error(
      [&] {
        m.forward({ids.data() + 2, 1}, c2, logits, false, 1);
      },
      "starts from an empty cache");
}

// Without a device (this test runs only then): set_backend(cuda) throws cuda_unavailable()'s line.
TEST(ModelCudaNoDevice, SetBackendSaysWhy) {
  const std::string why = cuda_unavailable();
  if (why.empty()) GTEST_SKIP() << "a CUDA device is present";
  LlamaModel m = LlamaModel::load(hf_fixture("smollm2"));
  testing::expect_error([&] { m.set_backend(AttentionBackend::kCuda); }, why);
  EXPECT_EQ(m.backend(), AttentionBackend::kCpu);
}

}  // namespace
}  // namespace kvq
