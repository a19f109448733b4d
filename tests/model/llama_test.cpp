// The real model (SmolLM2-135M-Instruct, Q4_1 GGUF) with quantized KV caches.
#include "model/llama.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "core/io.h"
#include "experiments/model_eval.h"
#include "tests/support/model.h"

namespace kvq {
namespace {

std::vector<int32_t> kjv_tokens(const Tokenizer& t, size_t n) {
  // Genesis 1:1-5 repeated is enough text; the KJV file itself is tested by the ppl test.
  const std::string text =
      "In the beginning God created the heaven and the earth. And the earth was without form, and "
      "void; and darkness was upon the face of the deep. And the Spirit of God moved upon the face "
      "of the waters. And God said, Let there be light: and there was light. And God saw the light, "
      "that it was good: and God divided the light from the darkness. And God called the light Day, "
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
    const size_t len = std::min<size_t>(static_cast<size_t>(chunks[i % chunks.size()]), ids.size() - a);
    m.forward({ids.data() + a, len}, cache, part, true, 2);
    all.insert(all.end(), part.begin(), part.end());
    a += len;
  }
  return all;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, static_cast<double>(std::fabs(a[i] - b[i])));
  return m;
}

class Streaming : public ::testing::TestWithParam<std::pair<std::string, bool>> {};

// Chunked prefill and token-by-token decode must read the same cache states. The model's matrix
// products are row-deterministic (reference_cpu/matmul.h), so the stated tolerance is zero: the
// logits are bit-identical. Guard against a vacuous pass: the scheme itself must move the logits
// away from the fp32 cache's.
TEST_P(Streaming, ChunkedPrefillEqualsTokenByToken) {
  KVQ_REQUIRE_MODEL();
  const auto [spec, pre] = GetParam();
  const auto ids = kjv_tokens(M->tok, 48);
  const auto o = opts(spec, pre);
  const auto chunked = run(M->model, o, ids, {19, 11, 5});
  const auto single = run(M->model, o, ids, {1});
  const auto fp32 = run(M->model, opts("fp32"), ids, {19, 11, 5});
  const double d = max_abs_diff(chunked, single), q = max_abs_diff(chunked, fp32);
  std::printf("%s%s: chunked vs token-by-token %.3g, vs fp32 cache %.3g\n", spec.c_str(), pre ? " pre-rope" : "", d, q);
  EXPECT_EQ(d, 0.0) << "streaming inconsistency";
  if (spec != "fp32") {
    EXPECT_GT(q, 0.01) << "vacuous: the scheme did not change the logits";
  }
}

INSTANTIATE_TEST_SUITE_P(Model, Streaming,
                         // Small groups and windows so 48 tokens cross several flushes; FP8
                         // dynamic tensor / head / channel scales from the first 20 or 16
                         // tokens, which the chunks {19, 11, 5} straddle (issue 10).
                         ::testing::Values(std::make_pair("fp8_e4m3:gran=token", false),
                                           std::make_pair("fp8_e4m3:gran=tensor,first=20", false),
                                           std::make_pair("fp8_e5m2:gran=head,first=16", false),
                                           std::make_pair("fp8_e4m3:gran=channel,first=20", false),
                                           std::make_pair("int4:k=token,v=token,g=8,r=8", false),
                                           std::make_pair("kivi2:g=8,r=16", false),
                                           std::make_pair("kivi4:g=8,r=8", true)),
                         [](const auto& i) {
                           std::string s = i.param.first + (i.param.second ? "_prerope" : "");
                           for (char& c : s)
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           return s;
                         });

TEST(ModelEval, Fp32CacheNeverDivergesFromItself) {
  KVQ_REQUIRE_MODEL();
  const auto ids = kjv_tokens(M->tok, 40);
  const auto r = eval::diverge(M->model, opts("fp32"), opts("fp32"), ids, 8, 2);
  EXPECT_EQ(r.first_diff, -1);
  EXPECT_EQ(r.top1, 1.0);
  ASSERT_EQ(r.ref.size(), 8u);
  EXPECT_EQ(r.ref, r.test);
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
  std::printf("ppl fp32 %.4f, fp8 %.4f (KL %.5f), kivi2 %.4f (KL %.5f)\n", f8.ppl_ref, f8.ppl, f8.kld, k2.ppl, k2.kld);
}

}  // namespace
}  // namespace kvq
