// The real model (SmolLM2-135M-Instruct, Q4_1 GGUF) with quantized KV caches.
#include "model/llama.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <tuple>

#include "core/error.h"
#include "core/io.h"
#include "evaluation/model_eval.h"
#include "kernels/cpu/isa.h"
#include "tests/support/model.h"
#include "tests/support/names.h"

namespace kvq {
namespace {

std::vector<int32_t> kjv_tokens(const Tokenizer& t, size_t n) {
  // Genesis 1:1-5 repeated is enough text; the KJV file itself is tested by the ppl test.
  const std::string text =
      "In the beginning God created the heaven and the earth. And the earth was without form, and "
      "void; and darkness was upon the face of the deep. And the Spirit of God moved upon the face "
      "of the waters. And God said, Let there be light: and there was light. And God saw the "
      "light, "
      "that it was good: and God divided the light from the darkness. And God called the light "
      "Day, "
      "and the darkness he called Night. And the evening and the morning were the first day. ";
  std::vector<int32_t> ids;
  while (ids.size() < n) {
    const auto more = t.encode(text);
    ids.insert(ids.end(), more.begin(), more.end());
  }
  ids.resize(n);
  return ids;
}

CacheOptions opts(const std::string& spec, bool pre_rope = false) {
  CacheOptions o;
  o.spec = parse_spec(spec);
  o.pre_rope = pre_rope;
  return o;
}

// All logits of `ids`, appended in the given chunk sizes (cycled).
std::vector<float> run(const LlamaModel& m, const CacheOptions& o, const std::vector<int32_t>& ids,
                       std::vector<int> chunks) {
  LlamaCache cache(m.config(), o);
  std::vector<float> all, part;
  size_t a = 0;
  for (size_t i = 0; a < ids.size(); ++i) {
    const size_t len =
        std::min<size_t>(static_cast<size_t>(chunks[i % chunks.size()]), ids.size() - a);
    m.forward({ids.data() + a, len}, cache, part, true, 2);
    all.insert(all.end(), part.begin(), part.end());
    a += len;
  }
  return all;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i)
    m = std::max(m, static_cast<double>(std::fabs(a[i] - b[i])));
  return m;
}

using StreamCase = std::tuple<std::pair<const char*, bool>, AttentionBackend>;
class Streaming : public ::testing::TestWithParam<StreamCase> {};

// Chunked prefill and token-by-token decode must read the same cache states. The model's matrix
// products are row-deterministic (model/packed_matrix.h) and each backend's attention computes a
// position the same way whatever the chunk (kernels/cpu/attention.h: fixed segments folded in
// order), so the stated tolerance is zero on both backends: the logits are bit-identical. Guard
// against a vacuous pass: the scheme itself must move the logits away from the fp32 cache's.
TEST_P(Streaming, ChunkedPrefillEqualsTokenByToken) {
  KVQ_REQUIRE_MODEL();
  const auto& [sp, backend] = GetParam();
  const std::string spec = sp.first;
  const bool pre = sp.second;
  const LlamaModel& m = testing::model_with(backend);
  const auto ids = kjv_tokens(M->tok, 48);
  const auto o = opts(spec, pre);
  const auto chunked = run(m, o, ids, {19, 11, 5});
  const auto single = run(m, o, ids, {1});
  const auto fp32 = run(m, opts("fp32"), ids, {19, 11, 5});
  const double d = max_abs_diff(chunked, single), q = max_abs_diff(chunked, fp32);
  std::printf("%s%s (%s): chunked vs token-by-token %.3g, vs fp32 cache %.3g\n", spec.c_str(),
              pre ? " pre-rope" : "", to_string(backend), d, q);
  EXPECT_EQ(d, 0.0) << "streaming inconsistency";
  if (spec != "fp32") {
    EXPECT_GT(q, 0.01) << "vacuous: the scheme did not change the logits";
  }
}

INSTANTIATE_TEST_SUITE_P(
    Model, Streaming,
    // Small groups and windows so 48 tokens cross several flushes; FP8 dynamic tensor / head /
    // channel scales from the first 20 or 16 tokens, which the chunks {19, 11, 5} straddle
    // (issue 10).
    ::testing::Combine(
        ::testing::Values(
            std::make_pair("fp8_e4m3:gran=token", false),
            std::make_pair("fp8_e4m3:gran=tensor,first=20", false),
            std::make_pair("fp8_e5m2:gran=head,first=16", false),
            std::make_pair("fp8_e4m3:gran=channel,first=20", false),
            std::make_pair("int4:k=token,v=token,g=8,r=8", false),
            std::make_pair("kivi2:g=8,r=16", false), std::make_pair("kivi4:g=8,r=8", true),
            std::make_pair("k=kivi2:g=8,r=16;v=fp8_e4m3:gran=token", false),
            // issue 15: sinks and rotation, with pre-RoPE keys too
            std::make_pair("kivi2:g=8,r=16,rot=hadamard:3,sink=4", false),
            std::make_pair("kivi4:g=8,r=8,rot=hadamard:5,sink=24", true),
            std::make_pair("k=int4:k=token,v=token,g=8,r=8,rot=hadamard;v=fp16", true),
            std::make_pair("fp8_e4m3:gran=tensor,first=20,sink=2,rot=hadamard", false)),
        ::testing::Values(AttentionBackend::kCpu, AttentionBackend::kRef)),
    [](const auto& i) {
      const auto& sp = std::get<0>(i.param);
      return testing::test_name(std::string(sp.first) + (sp.second ? "_prerope_" : "_") +
                                to_string(std::get<1>(i.param)));
    });

// Backend cpu-int8: the int8 mode's paths need key groups and value groups of 32 (head_dim 64),
// so these specs differ from the ones above; the same zero tolerance.
INSTANTIATE_TEST_SUITE_P(
    ModelInt8, Streaming,
    ::testing::Combine(::testing::Values(std::make_pair("kivi2:g=32,r=0", false),
                                         std::make_pair("kivi4:g=32,r=0,rot=hadamard:3,sink=4",
                                                        true),
                                         std::make_pair("int4:k=token,v=token,g=32,r=8", false)),
                       ::testing::Values(AttentionBackend::kCpuInt8)),
    [](const auto& i) {
      const auto& sp = std::get<0>(i.param);
      return testing::test_name(std::string(sp.first) + (sp.second ? "_prerope_" : "_") +
                                to_string(std::get<1>(i.param)));
    });

// Mean KL(p || q) of the next-token distributions of two [n, vocab] logit arrays, in nats, and
// the number of positions whose top-1 token differs.
std::pair<double, int> mean_kl(const std::vector<float>& a, const std::vector<float>& b,
                               int64_t vocab) {
  const int64_t n = static_cast<int64_t>(a.size()) / vocab;
  double kl = 0;
  int top_diff = 0;
  for (int64_t t = 0; t < n; ++t) {
    const float* x = a.data() + t * vocab;
    const float* y = b.data() + t * vocab;
    const double mx = *std::max_element(x, x + vocab), my = *std::max_element(y, y + vocab);
    double zx = 0, zy = 0;
    for (int64_t i = 0; i < vocab; ++i) {
      zx += std::exp(x[i] - mx);
      zy += std::exp(y[i] - my);
    }
    for (int64_t i = 0; i < vocab; ++i) {
      const double lp = x[i] - mx - std::log(zx), lq = y[i] - my - std::log(zy);
      kl += std::exp(lp) * (lp - lq);
    }
    top_diff += std::max_element(x, x + vocab) - x != std::max_element(y, y + vocab) - y;
  }
  return {kl / static_cast<double>(n), top_diff};
}

// Backend cpu-int8 against backend cpu: the int8 mode rounds q * scale (keys) and p * scale
// (values) to 8 bits, an error of its own on top of the scheme's. Measured here as each backend's
// damage (KL against the fp32 cache, which takes no int path and is the same on both): the int8
// mode's may be at most 1.5x backend cpu's, a bound that fails if the mode's rounding came to rival
// the scheme's own error (observed on these 192 tokens in session 13: kivi4 1.12x, kivi2 1.01x,
// fp8 e4m3 per token 0.82x where the int8 mode's bf16 dot products are compiled in; over 4,096 KJV
// tokens at ctx 2,048: 1.27x / 0.98x / 1.00x, docs/results.md). The two must differ (the int8
// paths ran).
TEST(Backends, CpuInt8DamageWithinHalfMoreThanCpu) {
  KVQ_REQUIRE_MODEL();
  if (!cpu::path().avx2)
    GTEST_SKIP() << "the int8 mode is an AVX2 path; the portable path reads codes exactly";
  const auto ids = kjv_tokens(M->tok, 192);
  const int64_t V = M->model.config().vocab;
  const LlamaModel& cpu = testing::model_with(AttentionBackend::kCpu);
  const LlamaModel& int8 = testing::model_with(AttentionBackend::kCpuInt8);
  const auto f32 = run(cpu, opts("fp32"), ids, {100, 92});
  std::vector<const char*> specs = {"kivi4:g=32,r=32", "kivi2:g=32,r=32"};
  if (cpu::path().bf16dot) specs.push_back("fp8_e4m3:gran=token");  // bf16 dot products
  for (const char* spec : specs) {
    const auto a = run(cpu, opts(spec), ids, {100, 92}), b = run(int8, opts(spec), ids, {100, 92});
    const double d_cpu = mean_kl(f32, a, V).first, d_int8 = mean_kl(f32, b, V).first;
    std::printf("%s: damage KL cpu %.4g, cpu-int8 %.4g (ratio %.3f)\n", spec, d_cpu, d_int8,
                d_int8 / d_cpu);
    EXPECT_GT(max_abs_diff(a, b), 0.0) << "vacuous: the int8 paths did not run";
    EXPECT_LE(d_int8, 1.5 * d_cpu) << spec;
  }
}

// Backend cpu against backend ref on the same prompt (chunks 40, 1, 55).
//  - fp32 cache: the attention outputs differ by float rounding only (another summation order,
//    a polynomial exp; one call is within 2e-5 max |V|, tests/kernels/cpu/), so the logits agree:
//    mean KL(ref || cpu) <= 1e-6 nats (observed 1.5e-10) and the same top-1 everywhere.
//  - quantized caches: the same rounding moves the next layers' K/V by ~1e-6 relative, and a value
//    that sits on a rounding boundary of the quantizer takes the other code; from then on the two
//    runs see two equally valid quantization noises (observed: layer-by-layer K agree to 2e-5 up to
//    layer 3, then drift to 0.1-0.8). So each backend's damage (KL against its own fp32 cache) is
//    compared instead: within a factor 1.5 of each other on these 96 tokens (observed 1.02-1.08),
//    and layer 1's keys agree to 1e-5 * max |K| (layer 0's codes are the same on both).
TEST(Backends, CpuMatchesRef_logitsWithExactCache_damageWithQuantized) {
  KVQ_REQUIRE_MODEL();
  const auto ids = kjv_tokens(M->tok, 96);
  const int64_t V = M->model.config().vocab,
                kvd = static_cast<int64_t>(M->model.config().kv_heads) * M->model.config().head_dim;
  const LlamaModel& ref = testing::model_with(AttentionBackend::kRef);
  const LlamaModel& cpu = testing::model_with(AttentionBackend::kCpu);
  const auto f_ref = run(ref, opts("fp32"), ids, {40, 1, 55});
  const auto f_cpu = run(cpu, opts("fp32"), ids, {40, 1, 55});
  const auto [kl, top] = mean_kl(f_ref, f_cpu, V);
  std::printf(
      "fp32 cache: mean KL(ref || cpu) %.3g nats, max |logit diff| %.3g, top-1 differs %d\n", kl,
      max_abs_diff(f_ref, f_cpu), top);
  EXPECT_LE(kl, 1e-6);
  EXPECT_EQ(top, 0);
  EXPECT_GT(max_abs_diff(f_ref, f_cpu), 0.0) << "vacuous: both runs took the same backend";
  for (const char* spec : {"kivi2:g=32,r=32", "fp8_e4m3:gran=token", "int4:k=token,v=token"}) {
    const double d_ref = mean_kl(f_ref, run(ref, opts(spec), ids, {40, 1, 55}), V).first;
    const double d_cpu = mean_kl(f_cpu, run(cpu, opts(spec), ids, {40, 1, 55}), V).first;
    std::printf("%s: damage KL ref %.4g, cpu %.4g (ratio %.3f)\n", spec, d_ref, d_cpu,
                d_cpu / d_ref);
    EXPECT_GT(d_ref, 1e-4) << "vacuous: the scheme did not move the logits";
    EXPECT_LE(d_cpu, 1.5 * d_ref) << spec;
    EXPECT_GE(d_cpu, d_ref / 1.5) << spec;
    // Keys of layer 1: layer 0's K/V are identical on both backends (so are its codes), and its
    // attention over them differs by rounding only; prefill of all 96 tokens.
    std::vector<float> keys[2];
    for (int b = 0; b < 2; ++b) {
      LlamaCache cache(M->model.config(), opts(spec));
      std::vector<float> lg;
      (b ? cpu : ref)
          .forward(ids, cache, lg, false, 2,
                   [&](int l, int64_t, int64_t n, const float*, const float* k, const float*) {
                     if (l == 1) keys[b].insert(keys[b].end(), k, k + n * kvd);
                   });
    }
    double dk = 0, mk = 0;
    for (size_t i = 0; i < keys[0].size(); ++i) {
      dk = std::max(dk, static_cast<double>(std::fabs(keys[0][i] - keys[1][i])));
      mk = std::max(mk, static_cast<double>(std::fabs(keys[0][i])));
    }
    EXPECT_LE(dk, 1e-5 * mk) << spec << ": layer-1 keys differ by " << dk;
  }
}

TEST(ModelEval, Fp32CacheNeverDivergesFromItself) {
  KVQ_REQUIRE_MODEL();
  const auto ids = kjv_tokens(M->tok, 40);
  const auto r = eval::diverge(M->model, opts("fp32"), opts("fp32"), ids, 8, 2);
  EXPECT_EQ(r.first_diff, -1);
  EXPECT_EQ(r.top1, 1.0);
  ASSERT_EQ(r.ref.size(), 8u);
  EXPECT_EQ(r.ref, r.test);
}

// Layer presets (issue 49 item 5): kivi2@first=1,last=1 on SmolLM2 (30 layers) stores layers 0
// and 29 in the exact cache: after a 160-token prefill their footprints equal the fp32 cache's
// (4 bytes per element, core/footprint.h); layer 0, whose input does not depend on the cache,
// holds the fp32 run's values bit for bit. Layer 1 is quantized (under half the exact bytes:
// non-vacuous), and a preset that keeps all 30 layers is refused before any work.
TEST(LayerPreset, FirstAndLastLayerHoldTheExactCache) {
  KVQ_REQUIRE_MODEL();
  const LlamaConfig& c = M->model.config();
  ASSERT_EQ(c.layers, 30);
  const auto ids = kjv_tokens(M->tok, 160);
  auto prefill = [&](const char* spec) {
    auto cache = std::make_unique<LlamaCache>(c, opts(spec));
    std::vector<float> lg;
    M->model.forward(ids, *cache, lg, false, 2);
    return cache;
  };
  const auto exact = prefill("fp32");
  const auto preset = prefill("kivi2:g=32,r=32@first=1,last=1");
  EXPECT_EQ(preset->options().spec.canonical(), "kivi2:g=32,r=32@first=1,last=1");
  for (int l : {0, 29})
    for (bool key : {true, false}) {
      const SideStore& a = *(key ? exact->layers()[l].k : exact->layers()[l].v);
      const SideStore& b = *(key ? preset->layers()[l].k : preset->layers()[l].v);
      EXPECT_EQ(b.footprint().total_bytes(), a.footprint().total_bytes()) << "layer " << l;
      EXPECT_EQ(b.footprint().total_bytes(), 4.0 * 160 * c.kv_heads * c.head_dim);
      if (l == 0) {
        EXPECT_EQ(b.dequantize().data, a.dequantize().data) << "layer 0 values";
      }
    }
  EXPECT_LT(preset->layers()[1].k->footprint().total_bytes(),
            exact->layers()[1].k->footprint().total_bytes() / 2);
  CacheOptions all = opts("kivi2@first=15,last=15");
  try {
    check_cache_options(all, c);
    ADD_FAILURE() << "a preset keeping every layer was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("none would be quantized"), std::string::npos) << e.what();
  }
}

std::vector<int32_t> kjv_file_tokens(const Tokenizer& t, size_t n) {
  const std::string p = cli::model_dir() + "/kjv.txt";
  if (!std::filesystem::exists(p)) return {};
  auto ids = t.encode(read_file(p).substr(0, 20000));
  ids.resize(std::min(ids.size(), n));
  return ids;
}

// Perplexity of the first 256 KJV tokens (two 128-token windows). Plausible range: a 135M model
// on Genesis; llama.cpp's own run of this GGUF gives the same order (see docs/results.md). The
// bounds are wide on purpose: they catch a broken model (ppl in the hundreds or thousands) and a
// degenerate one (ppl near 1), not a regression of a few percent.
TEST(ModelEval, ShortKjvPerplexityIsPlausibleAndFp8TokenKlFarBelowKivi2) {
  KVQ_REQUIRE_MODEL();
  const auto ids = kjv_file_tokens(M->tok, 256);
  if (ids.size() < 256) GTEST_SKIP() << "KJV text absent: run scripts/fetch-text.sh";
  eval::PplOptions o;
  o.ctx = 128;
  o.chunk = 64;
  o.threads = 2;
  const auto f8 = eval::perplexity(M->model, opts("fp8_e4m3:gran=token"), ids, o);
  const auto k2 = eval::perplexity(M->model, opts("kivi2:g=32,r=32"), ids, o);
  EXPECT_EQ(f8.scored, 254);
  EXPECT_GT(f8.ppl_ref, 2.0);
  EXPECT_LT(f8.ppl_ref, 30.0);
  EXPECT_EQ(f8.ppl_ref, k2.ppl_ref) << "the fp32 reference run is deterministic";
  EXPECT_GT(f8.kld, 0.0) << "vacuous: fp8 changed nothing";
  EXPECT_LT(10.0 * f8.kld, k2.kld) << "fp8 per-token KL " << f8.kld << " vs kivi2 " << k2.kld;
  EXPECT_GT(f8.top1, k2.top1);
  std::printf("ppl fp32 %.4f, fp8 %.4f (KL %.5f), kivi2 %.4f (KL %.5f)\n", f8.ppl_ref, f8.ppl,
              f8.kld, k2.ppl, k2.kld);
}

// Scoring several schemes in one pass against one fp32 reference gives exactly what scoring each
// alone gives (the reference is deterministic, and each scheme's cache is its own).
TEST(ModelEval, ManySchemesInOnePassEqualOneAtATime) {
  KVQ_REQUIRE_MODEL();
  const auto ids = kjv_tokens(M->tok, 96);
  eval::PplOptions o;
  o.ctx = 48;
  o.chunk = 16;
  o.score_from = 8;
  o.threads = 2;
  const std::vector<CacheOptions> both{opts("kivi4:g=8,r=8"), opts("fp8_e5m2:gran=head,first=12")};
  const auto together = eval::perplexity(M->model, both, ids, o);
  ASSERT_EQ(together.size(), 2u);
  for (size_t i = 0; i < both.size(); ++i) {
    const auto alone = eval::perplexity(M->model, both[i], ids, o);
    EXPECT_EQ(alone.scored, 2 * (48 - 1 - 8));
    EXPECT_EQ(together[i].scored, alone.scored);
    EXPECT_EQ(together[i].ppl, alone.ppl) << both[i].spec.canonical();
    EXPECT_EQ(together[i].ppl_ref, alone.ppl_ref);
    EXPECT_EQ(together[i].kld, alone.kld);
    EXPECT_EQ(together[i].top1, alone.top1);
    EXPECT_GT(alone.kld, 0.0) << "vacuous: the scheme changed nothing";
  }
}

// Rotating q, k and v (and the output back) changes nothing in exact arithmetic: with an fp32
// cache the logits move by float rounding only. With a per-token 4-bit cache the rotation must
// change the logits (what the quantizer sees differs), and chunked prefill still equals decode.
TEST(Hadamard, RotationIsInvisibleWithExactCacheAndStreamsWithQuantizedOne) {
  KVQ_REQUIRE_MODEL();
  const auto ids = kjv_tokens(M->tok, 24);
  for (const char* rot : {"rot=hadamard", "rot=hadamard:11"}) {
    SCOPED_TRACE(rot);
    const auto plain = run(M->model, opts("fp32"), ids, {24});
    const auto rotated = run(M->model, opts(std::string("fp32:") + rot), ids, {24});
    const double d = max_abs_diff(plain, rotated);
    EXPECT_GT(d, 0.0) << "the rotation was not applied";
    EXPECT_LT(d, 2e-3)
        << "an orthonormal rotation must leave the logits (scale ~10) unchanged up to rounding";
    const CacheOptions q4 = opts(std::string("int4:k=token,v=token,g=32,") + rot);
    const auto chunked = run(M->model, q4, ids, {7, 5});
    EXPECT_EQ(max_abs_diff(chunked, run(M->model, q4, ids, {1})), 0.0);
    EXPECT_GT(max_abs_diff(chunked, run(M->model, opts("int4:k=token,v=token,g=32"), ids, {7, 5})),
              1e-3);
  }
}

// sink=S on an fp32 cache stores the same values: the logits are the plain cache's up to the
// order of float sums (the sinks are a separate partial). On a quantized cache they must change
// the logits, and chunked prefill still equals decode on both backends.
TEST(Sinks, InvisibleWithExactCacheAndStreamWithQuantizedOne) {
  KVQ_REQUIRE_MODEL();
  const auto ids = kjv_tokens(M->tok, 24);
  for (AttentionBackend b : {AttentionBackend::kCpu, AttentionBackend::kRef}) {
    SCOPED_TRACE(to_string(b));
    const LlamaModel& m = testing::model_with(b);
    EXPECT_LT(max_abs_diff(run(m, opts("fp32"), ids, {24}), run(m, opts("fp32:sink=4"), ids, {24})),
              2e-3);
    const CacheOptions s = opts("kivi2:g=8,r=8,sink=4");
    const auto chunked = run(m, s, ids, {3, 7});
    EXPECT_EQ(max_abs_diff(chunked, run(m, s, ids, {1})), 0.0);
    EXPECT_GT(max_abs_diff(chunked, run(m, opts("kivi2:g=8,r=8"), ids, {3, 7})), 1e-3);
  }
}

// With an exact (fp32) cache, sinks and a rotation change only float rounding, post- and pre-RoPE
// (the pre-RoPE view splits its sinks off as the stored side does), on both backends: the logits
// agree with the plain fp32 cache's on backend ref as closely as the two backends agree with each
// other on a plain cache (KL <= 1e-6, the same top-1; Backends.CpuMatchesRef_...).
TEST(Sinks, ExactCacheWithSinksAndRotationMatchesPlainOnBothBackends_preRopeToo) {
  KVQ_REQUIRE_MODEL();
  const auto ids = kjv_tokens(M->tok, 64);
  const int64_t V = M->model.config().vocab;
  const LlamaModel& ref = testing::model_with(AttentionBackend::kRef);
  const auto plain = run(ref, opts("fp32"), ids, {30, 1, 33});
  for (bool pre : {false, true})
    for (AttentionBackend b : {AttentionBackend::kCpu, AttentionBackend::kRef}) {
      SCOPED_TRACE(::testing::Message() << to_string(b) << (pre ? " pre-RoPE" : ""));
      const auto got =
          run(testing::model_with(b), opts("fp32:rot=hadamard:3,sink=4", pre), ids, {30, 1, 33});
      const auto [kl, top] = mean_kl(plain, got, V);
      EXPECT_LE(kl, 1e-6);
      EXPECT_EQ(top, 0);
      EXPECT_GT(max_abs_diff(plain, got), 0.0) << "vacuous: nothing was rotated";
    }
}

// Pre-RoPE keys in a rot= cache with a window: backend cpu reads the keys through the un-rotated
// view and its exact tail, backend ref through the side's own reads. Their damage against each
// backend's own fp32 cache agrees within the factor of Backends.CpuMatchesRef_... (1.5).
TEST(Hadamard, PreRopeRotatedWindowedCacheDamageAgreesAcrossBackends) {
  KVQ_REQUIRE_MODEL();
  const auto ids = kjv_tokens(M->tok, 64);
  const int64_t V = M->model.config().vocab;
  double d[2];
  for (int i = 0; i < 2; ++i) {
    const LlamaModel& m = testing::model_with(i ? AttentionBackend::kCpu : AttentionBackend::kRef);
    d[i] = mean_kl(run(m, opts("fp32"), ids, {30, 1, 33}),
                   run(m, opts("kivi4:g=8,r=8,rot=hadamard:5,sink=2", true), ids, {30, 1, 33}), V)
               .first;
  }
  std::printf("pre-RoPE kivi4 rot+sink: damage KL ref %.4g, cpu %.4g\n", d[0], d[1]);
  EXPECT_GT(d[0], 1e-4) << "vacuous: the scheme did not move the logits";
  EXPECT_LE(d[1], 1.5 * d[0]);
  EXPECT_GE(d[1], d[0] / 1.5);
}

}  // namespace
}  // namespace kvq
