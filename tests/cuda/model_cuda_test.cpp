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
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "core/error.h"
#include "core/spec.h"
#include "evaluation/planner.h"
#include "evaluation/serve.h"
#include "evaluation/serve_run.h"
#include "kernels/backend.h"
#include "model/hf_checkpoint.h"
#include "model/llama.h"
#include "tests/support/expect_error.h"
#include "tests/support/model.h"
#include "tests/support/model_logits.h"
#include "tests/support/skip_cuda.h"
#include "tests/support/stored_counts.h"

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
  if (!bf16_checkpoint(hf_fixture(GetParam())))
    GTEST_SKIP() << GetParam() << " is not stored as BF16";
  LlamaModel m = LlamaModel::load(hf_fixture(GetParam()));
  m.set_device_weights(LlamaModel::DeviceWeights::kBf16);
  expect_matches_cpu(m, "bf16", 8, GetParam() + "_bf16w");
  // 24 tokens: the prefill's dense part over 24 rows runs on the tensor-core GEMM
  // (gemm::kGemmMinRows = 9; x split into high + low bf16), same tolerance; families whose window
  // is shorter than the prompt (mistral: 8) keep the 8 above.
  bool windowed = false;
  for (int l = 0; l < m.config().layers; ++l)
    windowed = windowed || (m.config().window_of(l) > 0 && m.config().window_of(l) < 24);
  if (!windowed) expect_matches_cpu(m, "bf16", 24, GetParam() + "_bf16w_gemm");
  // bf16 weights take half the bytes of float32 ones
  const int64_t b16 = m.device_weight_bytes();
  m.set_device_weights(LlamaModel::DeviceWeights::kFp32);
  m.set_backend(AttentionBackend::kCuda);
  (void)all_logits(m, prompt_ids(m.config().vocab, 1), "bf16");
  EXPECT_EQ(m.device_weight_bytes(), 2 * b16);
}

// Chunked prefill (LlamaModel::set_device_chunk: DeviceModel::prefill, prefill_device) against
// the same tokens as decode steps (device chunk 1, which equals forward passes of one token each
// bit for bit: one path). Chunks of 3 (3, 3, 2: ragged), one chunk of 8, and the prompt over two
// forward calls (5 then 3 tokens: the second's tails start in the first's tokens). Layer 0's K
// and V are the same floats either way (a batched row computes what a single step does), so its
// stored bytes must be equal bit for bit; later layers read attention outputs summed in another
// order (the launch's split of the contexts), so logits are held to the file's rule against
// backend cpu (2 D + 1e-4 x max |logit|, D the scheme's rounding on the CPU).
TEST_P(ModelCuda, ChunkedPrefillMatchesTokenByToken) {
  KVQ_SKIP_WITHOUT_CUDA();
  LlamaModel m = LlamaModel::load(hf_fixture(GetParam()));
  m.set_device_weights(LlamaModel::DeviceWeights::kFp32);
  const int vocab = m.config().vocab;
  const std::vector<int32_t> ids = prompt_ids(vocab, 8);
  for (const char* spec : {"bf16", "kivi2:g=8,r=0", "kivi4:g=8,r=0", "fp8_e4m3:gran=token"}) {
    const std::string what = GetParam() + " " + spec;
    m.set_backend(AttentionBackend::kCpu);
    const double tol =
        testing::quantized_cache_tolerance(all_logits(m, ids), all_logits(m, ids, spec));
    m.set_backend(AttentionBackend::kCuda);
    CacheOptions o;
    o.spec = parse_spec(spec);
    m.set_device_chunk(1);
    LlamaCache tok_cache(m.config(), o);
    std::vector<float> tok;
    m.forward(ids, tok_cache, tok, true, 1);
    LlamaCache one_cache(m.config(), o);
    std::vector<float> step, steps;
    for (int32_t id : ids) {
      m.forward({&id, 1}, one_cache, step, false, 1);
      steps.insert(steps.end(), step.begin(), step.end());
    }
    ASSERT_EQ(steps.size(), tok.size()) << what;
    EXPECT_EQ(std::memcmp(steps.data(), tok.data(), tok.size() * sizeof(float)), 0)
        << what << ": device chunk 1 is decode steps";
    for (const int64_t chunk : {int64_t{3}, int64_t{8}}) {
      m.set_device_chunk(chunk);
      LlamaCache cache(m.config(), o);
      std::vector<float> got;
      m.forward(ids, cache, got, true, 1);
      EXPECT_EQ(cache.tokens(), 8) << what;
      ASSERT_EQ(got.size(), tok.size()) << what;
      EXPECT_LE(max_diff(got, tok), tol) << what << " chunk " << chunk;
      for (const bool key : {true, false}) {  // layer 0: the same K/V, the same bytes
        const StoredCopy a = stored_copy(key ? *cache.layers()[0].k : *cache.layers()[0].v),
                         b = stored_copy(key ? *tok_cache.layers()[0].k : *tok_cache.layers()[0].v);
        const int64_t qt = a.view.kind == SchemeKind::Int ? a.view.quantized_tokens : 8;
        ASSERT_EQ(b.view.quantized_tokens, a.view.quantized_tokens) << what;
        const testing::StoredCounts c = testing::stored_counts(a.view, qt);
        const int64_t row = a.view.heads * a.view.dim;
        auto same = [](const void* x, const void* y, int64_t bytes) {
          return bytes == 0 || (x && y && std::memcmp(x, y, static_cast<size_t>(bytes)) == 0);
        };
        EXPECT_TRUE(same(a.view.half16, b.view.half16, a.view.half16 ? 8 * row * 2 : 0)) << what;
        EXPECT_TRUE(same(a.view.codes, b.view.codes, c.codes)) << what;
        EXPECT_TRUE(same(a.view.fp8_scales, b.view.fp8_scales, c.scales * 4)) << what;
        EXPECT_TRUE(same(a.view.words, b.view.words, c.words * 4)) << what;
        EXPECT_TRUE(same(a.view.scales, b.view.scales, c.params * 2)) << what;
        EXPECT_TRUE(same(a.view.residual, b.view.residual,
                         a.view.kind == SchemeKind::Int ? (8 - qt) * row * 4 : 0))
            << what << (key ? " K" : " V") << " layer 0 chunk " << chunk;
      }
    }
    m.set_device_chunk(3);  // a prompt over two forward calls
    LlamaCache split(m.config(), o);
    std::vector<float> first, second;
    m.forward({ids.data(), 5}, split, first, true, 1);
    m.forward({ids.data() + 5, 3}, split, second, true, 1);
    first.insert(first.end(), second.begin(), second.end());
    ASSERT_EQ(first.size(), tok.size()) << what;
    EXPECT_LE(max_diff(first, tok), tol) << what << ": 5 + 3 tokens";
  }
  m.set_device_chunk(LlamaModel::kDefaultDeviceChunk);
  testing::expect_error([&] { m.set_device_chunk(0); },
                        "backend cuda's prefill chunk must be >= 1 token (got 0)");
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

// ---- serving steps: LlamaModel::decode_batch and evaluation/serve_run.h on backend cuda -------
//
// Expected values: each sequence decoded alone on backend cuda (forward, batch 1: the path the
// cases above compare with backend cpu), fed the same tokens. Outside attention the two take the
// same float operations per row (kernels/cuda/model_kernels.h: a batched launcher's row b computes
// exactly what the single launch computes; the host test cuda_device_model_host_test checks the
// step's host code bit for bit). The attention differs: one launch over the batch plans its
// context splits from the batch and the longest context (attention_kernels.cuh plan_decode), so a
// sequence's split boundaries, and with them the float32 order of its softmax merge, may differ
// from its launch alone; a K or V value computed 1e-7 apart in a later layer can then round to the
// neighbouring bf16 value or code. That is the same effect, smaller, that the cases above bound
// for backend cuda against backend cpu, so the same rule: 2 D + 1e-4 x max |logit|, D the cache's
// own rounding measured on the CPU over the same sequences (quantized_cache_tolerance). Contexts
// below the plan's 64-token minimum split take one split either way; the cases record whether
// those logits came out bit-identical (RecordProperty), without asserting it.

struct BatchCase {
  std::vector<int64_t> prompts;  // each sequence's prompt length (its own tokens)
  int steps = 0;                 // batched decode steps after the prompts
};

// Sequence b's tokens: prompt_ids with its own multiplier, prompt then the tokens it is fed.
std::vector<int32_t> sequence_ids(int vocab, size_t b, int64_t n) {
  return prompt_ids(vocab, static_cast<int>(n), 37 + 2 * static_cast<int>(b),
                    11 + static_cast<int>(b));
}

void expect_batched_matches_alone(LlamaModel& m, const std::string& spec, const BatchCase& bc,
                                  const std::string& what) {
  const int vocab = m.config().vocab;
  const size_t B = bc.prompts.size();
  std::vector<std::vector<int32_t>> ids;
  std::vector<std::vector<float>> exact, cpu, alone;
  m.set_backend(AttentionBackend::kCpu);
  for (size_t b = 0; b < B; ++b) {
    ids.push_back(sequence_ids(vocab, b, bc.prompts[b] + bc.steps));
    exact.push_back(all_logits(m, ids[b]));
    cpu.push_back(all_logits(m, ids[b], spec));
  }
  m.set_backend(AttentionBackend::kCuda);
  for (size_t b = 0; b < B; ++b) alone.push_back(all_logits(m, ids[b], spec));
  // the tolerance over every sequence's positions
  std::vector<float> all_exact, all_cpu;
  for (size_t b = 0; b < B; ++b) {
    all_exact.insert(all_exact.end(), exact[b].begin(), exact[b].end());
    all_cpu.insert(all_cpu.end(), cpu[b].begin(), cpu[b].end());
  }
  const double tol = testing::quantized_cache_tolerance(all_exact, all_cpu);
  CacheOptions o;
  o.spec = parse_spec(spec);
  std::vector<std::unique_ptr<LlamaCache>> caches;
  std::vector<LlamaCache*> ptrs;
  std::vector<float> logits;
  for (size_t b = 0; b < B; ++b) {
    caches.push_back(std::make_unique<LlamaCache>(m.config(), o));
    ptrs.push_back(caches.back().get());
    m.forward({ids[b].data(), static_cast<size_t>(bc.prompts[b])}, *caches[b], logits, false, 1);
  }
  double err = 0;
  bool identical = true;
  for (int t = 0; t < bc.steps; ++t) {
    std::vector<int32_t> tokens;
    for (size_t b = 0; b < B; ++b) tokens.push_back(ids[b][static_cast<size_t>(bc.prompts[b] + t)]);
    m.decode_batch(tokens, ptrs, logits);
    ASSERT_EQ(logits.size(), B * static_cast<size_t>(vocab));
    for (size_t b = 0; b < B; ++b) {
      EXPECT_EQ(caches[b]->tokens(), bc.prompts[b] + t + 1) << what;
      const float* got = logits.data() + b * static_cast<size_t>(vocab);
      const float* want = alone[b].data() + static_cast<size_t>(bc.prompts[b] + t) * vocab;
      for (int i = 0; i < vocab; ++i) {
        ASSERT_TRUE(std::isfinite(got[i])) << what << " sequence " << b << " step " << t;
        err = std::max(err, static_cast<double>(std::fabs(got[i] - want[i])));
      }
      identical = identical && std::memcmp(got, want, static_cast<size_t>(vocab) * 4) == 0;
    }
  }
  EXPECT_GT(max_abs(logits), 0) << what;
  EXPECT_LE(err, tol) << what << " " << spec << ": max |batched - alone| = " << err;
  ::testing::Test::RecordProperty(what + "_" + spec + "_bit_identical", identical ? 1 : 0);
  m.set_backend(AttentionBackend::kCpu);
}

// Three sequences of 2, 4 and 5 prompt tokens, three batched steps (8 tokens at most: mistral's
// window), every family; bf16, KIVI (one batched append) and FP8 per-token (an append a side).
TEST_P(ModelCuda, BatchedDecodeMatchesEachSequenceAlone) {
  KVQ_SKIP_WITHOUT_CUDA();
  LlamaModel m = LlamaModel::load(hf_fixture(GetParam()));
  m.set_device_weights(LlamaModel::DeviceWeights::kFp32);
  for (const char* spec : {"bf16", "kivi2:g=8,r=0", "fp8_e4m3:gran=token"})
    expect_batched_matches_alone(m, spec, {{2, 4, 5}, 3}, GetParam());
}

// More sequences than one decode launch or bf16 conversion launch takes (kMaxBatch + 3 = 67: the
// decoder's second launch, the append's second conversion job list, KIVI's append_batch over 67
// caches), and contexts of 100-230 tokens (several splits a sequence), on the smollm2 fixture
// (context 256).
TEST(ModelCudaBatch, SixtySevenSequencesAndLongContexts) {
  KVQ_SKIP_WITHOUT_CUDA();
  LlamaModel m = LlamaModel::load(hf_fixture("smollm2"));
  m.set_device_weights(LlamaModel::DeviceWeights::kFp32);
  BatchCase many{{}, 2};
  for (int64_t i = 0; i < 67; ++i) many.prompts.push_back(1 + (7 * i) % 13);
  for (const char* spec : {"bf16", "kivi2:g=8,r=0"})
    expect_batched_matches_alone(m, spec, many, "smollm2_b67");
  for (const char* spec : {"bf16", "kivi2:g=32,r=32", "kivi4:g=32,r=32"})
    expect_batched_matches_alone(m, spec, {{100, 180, 230}, 4}, "smollm2_long");
}

// A rot= cache takes the single-sequence calls inside the batched step (rotation on the host).
TEST(ModelCudaBatch, RotatedCacheMatchesEachSequenceAlone) {
  KVQ_SKIP_WITHOUT_CUDA();
  LlamaModel m = LlamaModel::load(hf_fixture("smollm2"));
  m.set_device_weights(LlamaModel::DeviceWeights::kFp32);
  expect_batched_matches_alone(m, "kivi2:g=8,r=0,rot=hadamard:7", {{2, 4}, 2}, "smollm2_rot");
}

TEST(ModelCudaBatch, RefusedInOneLine) {
  KVQ_SKIP_WITHOUT_CUDA();
  LlamaModel m = LlamaModel::load(hf_fixture("smollm2"));
  CacheOptions o;
  o.spec = parse_spec("bf16");
  LlamaCache a(m.config(), o), b(m.config(), o);
  CacheOptions k2;
  k2.spec = parse_spec("kivi2:g=8,r=0");
  LlamaCache c(m.config(), k2);
  std::vector<float> logits;
  const std::vector<int32_t> two = {1, 2};
  std::vector<LlamaCache*> ab = {&a, &b}, aa = {&a, &a}, ac = {&a, &c};
  testing::expect_error([&] { m.decode_batch(two, ab, logits); },
                        "decode_batch runs on backend cuda");
  m.set_backend(AttentionBackend::kCuda);
  testing::expect_error([&] { m.decode_batch(two, aa, logits); },
                        "sequences 0 and 1 share one cache");
  testing::expect_error([&] { m.decode_batch(two, ac, logits); }, "one launch reads one scheme");
  const std::vector<int32_t> bad = {1, m.config().vocab};
  testing::expect_error([&] { m.decode_batch(bad, ab, logits); },
                        "sequence 1's token id " + std::to_string(m.config().vocab));
}

// kvq model serve-bench's accounting on backend cuda (evaluation/serve_run.h, the run the command
// makes): ten equal requests under a cap of 3.5 reservations hold three at a time (requests held x
// bytes per request <= the cap at every step), the caches' bytes after each step are the
// schedule's prediction (kvq::footprint on both sides), and every request gets its tokens. The
// device memory the run added is not compared with the caches' bytes here: the fixture's caches
// (~50 KB a request) can fit in memory the driver already reserved, which cudaMemGetInfo does not
// show as new (device-check's serve-bench smoke reads it on the SmolLM2-135M shape).
TEST(ServeCuda, AccountingHoldsUnderTheCap) {
  KVQ_SKIP_WITHOUT_CUDA();
  LlamaModel m = LlamaModel::load(hf_fixture("smollm2"));
  m.set_backend(AttentionBackend::kCuda);
  const LlamaConfig& cfg = m.config();
  CacheOptions co;
  co.spec = parse_spec("kivi2:g=32,r=32");
  const std::vector<eval::ServeRequest> r(10, {40, 6});
  const planner::ModelDims dims{"smollm2", cfg.layers, cfg.kv_heads, cfg.head_dim, 0};
  const double one = eval::schedule_serve(dims, co.spec, r, {1e12, 0}).request_bytes[0];
  const double cap = 3.5 * one;
  const eval::ServeSchedule s = eval::schedule_serve(dims, co.spec, r, {cap, 0});
  ASSERT_EQ(s.max_held, 3);
  const std::vector<eval::ServeStepCalls> calls = eval::serve_calls(dims, co.spec, r, s);
  const std::vector<int32_t> prompt = prompt_ids(cfg.vocab, 40);
  const eval::ServeRunResult got = eval::run_serve(m, prompt, r, co, calls);
  EXPECT_TRUE(got.batched);
  ASSERT_EQ(got.step_cache_bytes.size(), s.steps.size());
  for (size_t k = 0; k < s.steps.size(); ++k) {
    EXPECT_LE(static_cast<double>(s.steps[k].batch.size()) * one, cap) << "step " << k;
    EXPECT_EQ(got.step_cache_bytes[k], s.steps[k].live_bytes) << "step " << k;
    EXPECT_LE(got.step_cache_bytes[k], cap) << "step " << k;
  }
  EXPECT_EQ(got.decode_tokens, 10 * 5);
  EXPECT_EQ(eval::max_decode_batch(calls), 3);
  EXPECT_GT(got.device_bytes_start, 0);  // the weights and activations at least
  EXPECT_GE(got.device_bytes_peak, got.device_bytes_start);
  for (const std::vector<int32_t>& out : got.outputs) EXPECT_EQ(out.size(), 6u);
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
