// evaluation/serve_run.h: the model calls a schedule's steps make (which requests decode in one
// call, at which positions, reading how many cache bytes), the planner's bound on them, and a run
// on a fixture model (backend cpu: a step's decodes one after another; backend cuda's batched
// calls are tests/cuda/model_cuda_test.cpp's). Expected values: a hand-derived schedule (bf16
// bytes per token by hand, as serve_test's), invariants every request must keep (its decodes at
// P .. P + O - 2, one a step, never at its admission step), and for the run each request's greedy
// tokens from a plain loop over its own cache (forward on the prompt, then a token at a time).
#include "evaluation/serve_run.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <vector>

#include "tests/support/expect_error.h"
#include "tests/support/model_logits.h"

namespace kvq::eval {
namespace {

// 2 layers x 1 kv head x head_dim 4, K and V, bf16: 2 x 2 x 4 x 2 bytes = 32 bytes per token.
const planner::ModelDims kTiny{"tiny", 2, 1, 4, 0};

TEST(ServeCalls, HandComputed_bf16_positionsBytesAndBound) {
  const SchemeSpec bf16 = parse_spec("bf16");
  // every request fits: all admitted at step 0; request 2 (one output token) leaves at once,
  // request 1 after step 1, request 0 after step 2
  const std::vector<ServeRequest> r{{3, 3}, {2, 2}, {4, 1}};
  const ServeSchedule s = schedule_serve(kTiny, bf16, r, {1e9, 0});
  const std::vector<ServeStepCalls> c = serve_calls(kTiny, bf16, r, s);
  ASSERT_EQ(c.size(), 3u);
  EXPECT_EQ(c[0].prefill, (std::vector<int64_t>{0, 1, 2}));
  EXPECT_TRUE(c[0].decode.requests.empty());
  EXPECT_EQ(c[0].decode.kv_bytes, 0);
  // step 1: requests 0 and 1 feed their first outputs at positions 3 and 2; their caches then hold
  // 4 and 3 tokens: 7 x 32 bytes
  EXPECT_TRUE(c[1].prefill.empty());
  EXPECT_EQ(c[1].decode.requests, (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(c[1].decode.positions, (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(c[1].decode.kv_bytes, 7 * 32);
  EXPECT_EQ(c[2].decode.requests, (std::vector<int64_t>{0}));
  EXPECT_EQ(c[2].decode.positions, (std::vector<int64_t>{4}));
  EXPECT_EQ(c[2].decode.kv_bytes, 5 * 32);
  EXPECT_EQ(c[0].finished, (std::vector<int64_t>{2}));  // who leaves after each step, by hand
  EXPECT_EQ(c[1].finished, (std::vector<int64_t>{1}));
  EXPECT_EQ(c[2].finished, (std::vector<int64_t>{0}));
  EXPECT_EQ(max_decode_batch(c), 2);
  // the bound: 1,000 bytes of weights at 100 bytes/s; (1,000 + 224) / 100 + (1,000 + 160) / 100
  const DecodeBound b = decode_bound(c, 1000, 100);
  EXPECT_EQ(b.tokens, 3);
  EXPECT_DOUBLE_EQ(b.seconds, 12.24 + 11.6);
  EXPECT_DOUBLE_EQ(b.tokens_per_s(), 3 / 23.84);
  EXPECT_EQ(decode_bound({}, 1000, 100).tokens_per_s(), 0);
}

// Under a cap that holds a few at a time, with a batch limit: every request decodes O - 1 tokens
// at P, P + 1, ..., P + O - 2 in consecutive steps after its admission, a call's requests keep
// the batch order, and no call is larger than the schedule's held count.
TEST(ServeCalls, EveryRequestDecodesItsTokensInOrder_kivi2) {
  const SchemeSpec spec = parse_spec("kivi2:g=8,r=8");
  const planner::ModelDims dims{"small", 2, 1, 32, 0};
  std::vector<ServeRequest> r;
  for (int64_t i = 0; i < 12; ++i) r.push_back({5 + (7 * i) % 11, 2 + (5 * i) % 6});
  const std::vector<double> each = schedule_serve(dims, spec, r, {1e12, 0}).request_bytes;
  const ServeSchedule s =
      schedule_serve(dims, spec, r, {3 * *std::max_element(each.begin(), each.end()), 4});
  ASSERT_GE(s.max_held, 3);
  const std::vector<ServeStepCalls> c = serve_calls(dims, spec, r, s);
  ASSERT_EQ(c.size(), s.steps.size());
  std::map<int64_t, std::vector<std::pair<size_t, int64_t>>> seen;  // request: (step, position)
  int64_t decodes = 0;
  for (size_t k = 0; k < c.size(); ++k) {
    EXPECT_EQ(c[k].prefill, s.steps[k].admitted);
    EXPECT_EQ(c[k].decode.requests.size() + c[k].prefill.size(), s.steps[k].batch.size());
    EXPECT_LE(static_cast<int64_t>(c[k].decode.requests.size()), s.max_held);
    double bytes = 0;
    for (size_t j = 0; j < c[k].decode.requests.size(); ++j) {
      const int64_t i = c[k].decode.requests[j], pos = c[k].decode.positions[j];
      seen[i].push_back({k, pos});
      bytes += planner::request_footprint(dims, spec, pos + 1).total_bytes();
      ++decodes;
    }
    EXPECT_DOUBLE_EQ(c[k].decode.kv_bytes, bytes);
  }
  EXPECT_EQ(decodes, s.output_tokens - static_cast<int64_t>(r.size()));
  for (size_t i = 0; i < r.size(); ++i) {
    const auto& v = seen[static_cast<int64_t>(i)];
    ASSERT_EQ(static_cast<int64_t>(v.size()), r[i].output_tokens - 1) << i;
    for (size_t t = 0; t < v.size(); ++t) {
      EXPECT_EQ(v[t].second, r[i].prompt_tokens + static_cast<int64_t>(t)) << i;
      if (t > 0) {
        EXPECT_EQ(v[t].first, v[t - 1].first + 1) << i;
      }
    }
  }
}

// A run on the smollm2 fixture (backend cpu): each request's outputs are its own greedy tokens,
// the caches' bytes after every step are the schedule's live bytes (LlamaCache::bytes and the
// planner share kvq::footprint), and the counts add up.
TEST(ServeRun, Smollm2Fixture_cpu_outputsAreEachRequestsOwn) {
  const LlamaModel m = LlamaModel::load(testing::hf_fixture("smollm2"));
  const LlamaConfig& cfg = m.config();
  CacheOptions co;
  co.spec = parse_spec("kivi2:g=8,r=0");
  const std::vector<ServeRequest> r{{6, 3}, {3, 4}, {5, 2}, {2, 3}};
  const planner::ModelDims dims{"smollm2", cfg.layers, cfg.kv_heads, cfg.head_dim, 0};
  // room for two of the largest reservations at once: a real batch, not everything
  const std::vector<double> each = schedule_serve(dims, co.spec, r, {1e12, 0}).request_bytes;
  const ServeSchedule s =
      schedule_serve(dims, co.spec, r, {2 * *std::max_element(each.begin(), each.end()), 0});
  ASSERT_GE(s.max_held, 2);
  ASSERT_LT(s.max_held, 4);
  const std::vector<ServeStepCalls> c = serve_calls(dims, co.spec, r, s);
  const std::vector<int32_t> prompt = testing::prompt_ids(cfg.vocab, 6);
  const ServeRunResult got = run_serve(m, prompt, r, co, c, 1);
  EXPECT_FALSE(got.batched);
  EXPECT_EQ(got.step_cache_bytes.size(), s.steps.size());
  for (size_t k = 0; k < s.steps.size(); ++k)
    EXPECT_EQ(got.step_cache_bytes[k], s.steps[k].live_bytes) << "step " << k;
  EXPECT_EQ(got.peak_cache_bytes, s.peak_live_bytes);
  EXPECT_EQ(got.decode_tokens, 3 + 4 + 2 + 3 - 4);
  EXPECT_EQ(got.prefill_tokens, 6 + 3 + 5 + 2);
  EXPECT_EQ(got.device_bytes_peak, 0);
  for (size_t i = 0; i < r.size(); ++i) {
    LlamaCache cache(cfg, co);
    std::vector<float> logits;
    std::vector<int32_t> want;
    auto pick = [&] {
      want.push_back(static_cast<int32_t>(
          std::max_element(logits.begin(), logits.begin() + cfg.vocab) - logits.begin()));
    };
    m.forward({prompt.data(), static_cast<size_t>(r[i].prompt_tokens)}, cache, logits, false, 1);
    pick();
    while (static_cast<int64_t>(want.size()) < r[i].output_tokens) {
      const int32_t t = want.back();
      m.forward({&t, 1}, cache, logits, false, 1);
      pick();
    }
    EXPECT_EQ(got.outputs[i], want) << "request " << i;
  }
  // the run releases the caches the schedule names, and refuses a schedule whose departures
  // disagree with the tokens generated (here a request leaving one step early)
  std::vector<ServeStepCalls> early = c;
  size_t k = 1;
  while (k < early.size() && early[k].finished.empty()) ++k;
  ASSERT_LT(k, early.size());
  early[k - 1].finished.push_back(early[k].finished.front());
  early[k].finished.erase(early[k].finished.begin());
  testing::expect_error([&] { run_serve(m, prompt, r, co, early, 1); }, "leaves with");
}

}  // namespace
}  // namespace kvq::eval
