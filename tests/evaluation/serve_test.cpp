// evaluation/serve.h: admission under a KV memory cap and the batch order of each step.
// Expected values: a hand-computed schedule (bf16 bytes per token by hand), the planner's own
// capacity column (make_plan's `requests`, an independent use of the same footprint formula) for
// how many equal requests a cap holds per scheme, and invariants every step must keep
// (reserved <= cap, live <= reserved, first come first served, every token generated once).
#include "evaluation/serve.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <numeric>
#include <random>

#include "evaluation/model_files.h"
#include "tests/support/expect_error.h"
#include "tests/support/run_cli.h"

namespace kvq::eval {
namespace {

// 2 layers x 1 kv head x head_dim 4, K and V, bf16: 2 x 2 x 4 x 2 bytes = 32 bytes per token.
const planner::ModelDims kTiny{"tiny", 2, 1, 4, 0};

TEST(Serve, HandComputed_bf16_fcfsHeadOfLineAndRelease) {
  const SchemeSpec bf16 = parse_spec("bf16");
  // A: 50 + 10 tokens = 1,920 bytes; B: 30 + 10 = 1,280; C: 10 + 5 = 480. Cap 3,200 bytes.
  const std::vector<ServeRequest> r{{50, 10}, {30, 10}, {10, 5}};
  const ServeSchedule s = schedule_serve(kTiny, bf16, r, {3200, 0});
  EXPECT_EQ(s.request_bytes, (std::vector<double>{1920, 1280, 480}));
  // A and B fill the cap exactly; C waits until both leave after their 10th token (step 9).
  ASSERT_EQ(s.steps.size(), 15u);
  EXPECT_EQ(s.steps[0].admitted, (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(s.steps[0].prefill_tokens, 80);
  EXPECT_EQ(s.steps[0].reserved_bytes, 3200);
  // after step 0 the caches hold the prompts: (50 + 30) x 32 bytes
  EXPECT_EQ(s.steps[0].live_bytes, 80 * 32);
  EXPECT_EQ(s.steps[9].finished, (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(s.steps[9].live_bytes, (59 + 39) * 32);
  EXPECT_EQ(s.steps[10].admitted, (std::vector<int64_t>{2}));
  EXPECT_EQ(s.steps[10].batch, (std::vector<int64_t>{2}));
  EXPECT_EQ(s.steps[14].finished, (std::vector<int64_t>{2}));
  EXPECT_EQ(s.max_held, 2);
  EXPECT_EQ(s.output_tokens, 25);
  EXPECT_EQ(s.peak_reserved_bytes, 3200);
}

// No overtaking: a small request behind one that does not fit waits, even though it would fit.
TEST(Serve, FirstComeFirstServed_noOvertaking_andTheBatchLimit) {
  const SchemeSpec bf16 = parse_spec("bf16");
  const std::vector<ServeRequest> r{{90, 10}, {60, 10}, {1, 1}};  // 3,200; 2,240; 64 bytes
  const ServeSchedule s = schedule_serve(kTiny, bf16, r, {4000, 0});
  EXPECT_EQ(s.steps[0].admitted, (std::vector<int64_t>{0}));
  EXPECT_EQ(s.steps[10].admitted, (std::vector<int64_t>{1, 2}));  // after request 0 leaves
  const ServeSchedule b =
      schedule_serve(kTiny, bf16, std::vector<ServeRequest>(5, {1, 3}), {1e9, 2});
  for (const ServeStep& st : b.steps) EXPECT_LE(st.batch.size(), 2u);
  EXPECT_EQ(b.steps[0].batch, (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(b.steps[3].batch, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(b.output_tokens, 15);
}

// Equal requests: the first step holds exactly the planner's `requests` (floor(mem / request
// bytes)) for every scheme, so kivi2 holds ~5x bf16's under the same cap (bytes say so).
TEST(Serve, EqualRequests_holdThePlannersCapacity_perScheme_smollm2Shape) {
  const planner::ModelDims m{"smollm2-135m", 30, 3, 64, 0};
  const double cap = 2e9;
  // 16,511 tokens at the end: kivi's per-channel window is then full (16,384 quantized + 127), so
  // the footprint peaks at the end and the reservation is the planner's request bytes
  const int64_t prompt = 16384 + 127 - 64, out = 64;
  int64_t bf16_held = 0;
  for (const char* kv : {"bf16", "fp8_e4m3:gran=token", "kivi4", "kivi2"}) {
    planner::PlanInput in;
    in.model = m;
    in.gpu = planner::gpu_preset("h100-sxm");
    in.weight_bytes = 0;
    in.mem_bytes = cap;
    in.ctx = prompt + out;
    in.kv = {kv};
    const int64_t want = planner::make_plan(in).rows.at(0).requests;
    const ServeSchedule s = schedule_serve(
        m, parse_spec(kv), std::vector<ServeRequest>(static_cast<size_t>(want + 3), {prompt, out}),
        {cap, 0});
    EXPECT_EQ(static_cast<int64_t>(s.steps[0].batch.size()), want) << kv;
    EXPECT_LE(want * s.request_bytes[0], cap) << kv;
    EXPECT_EQ(s.request_bytes[0],
              planner::request_footprint(m, parse_spec(kv), prompt + out).total_bytes())
        << kv;
    if (std::string(kv) == "bf16") bf16_held = want;
    if (std::string(kv) == "kivi2") {
      EXPECT_GE(want, 4 * bf16_held) << bf16_held;
    }
  }
}

// A KIVI cache's bytes drop when a block of B = R tokens is quantized: a request ending at 256
// tokens peaks at 255 (128 quantized + 127 exact), and that is what it reserves.
TEST(Serve, KiviReservesItsPeak_beforeTheLastBlockIsQuantized) {
  const planner::ModelDims m{"d32", 2, 1, 32, 0};
  const SchemeSpec kivi2 = parse_spec("kivi2");  // g=32, r=128
  const double at255 = planner::request_footprint(m, kivi2, 255).total_bytes(),
               at256 = planner::request_footprint(m, kivi2, 256).total_bytes();
  ASSERT_GT(at255, at256);
  const ServeSchedule s =
      schedule_serve(m, kivi2, std::vector<ServeRequest>{{200, 56}, {1, 255}}, {1e9, 0});
  EXPECT_EQ(s.request_bytes[0], at255);
  EXPECT_EQ(s.request_bytes[1], at255);
}

// A request reserves the most bytes its cache takes at any token count from its prompt to its
// full length: here the definition itself, the footprint at every count, against the schedule's
// drop points (footprint_drops), with sinks in front of a per-channel side (its blocks complete
// S tokens later) and of an FP8 side with first=N scales, keys and values of different periods.
TEST(Serve, ReservationIsTheMaxOverEveryTokenCount_sinksWindowsAndFirstN) {
  const planner::ModelDims m{"d32", 2, 1, 32, 0};
  for (const char* kv :
       {"kivi2", "kivi2:sink=5", "kivi4:g=32,r=32,sink=3", "int4:k=channel,v=channel,g=16,sink=7",
        "int2:k=channel,v=token,r=64,sink=1", "fp8_e4m3:gran=head,first=40,sink=4",
        "fp8_e4m3:gran=tensor,first=9"}) {
    const SchemeSpec spec = parse_spec(kv);
    std::vector<ServeRequest> r;
    for (int64_t p : {1, 2, 6, 8, 31, 37, 100, 129})
      for (int64_t o : {1, 3, 40, 170}) r.push_back({p, o});
    const ServeSchedule s = schedule_serve(m, spec, r, {1e12, 0});
    for (size_t i = 0; i < r.size(); ++i) {
      double want = 0;
      for (int64_t t = r[i].prompt_tokens; t <= r[i].prompt_tokens + r[i].output_tokens; ++t)
        want = std::max(want, planner::request_footprint(m, spec, t).total_bytes());
      EXPECT_EQ(s.request_bytes[i], want)
          << kv << " prompt " << r[i].prompt_tokens << " output " << r[i].output_tokens;
    }
  }
}

// Random requests: every step keeps reserved <= cap and live <= reserved, every request is
// admitted once in arrival order and generates exactly its output tokens.
TEST(Serve, RandomRequests_invariantsEveryStep) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int64_t> p(1, 400), o(1, 60);
  std::vector<ServeRequest> r(200);
  for (auto& x : r) x = {p(rng), o(rng)};
  for (const char* kv : {"bf16", "kivi2", "kivi4:r=32"}) {
    const ServeSchedule s = schedule_serve(kTiny, parse_spec(kv), r, {40000, 16});
    std::vector<int64_t> order, tokens(r.size(), 0);
    for (const ServeStep& st : s.steps) {
      EXPECT_LE(st.reserved_bytes, 40000 + 1e-6) << kv;
      EXPECT_LE(st.live_bytes, st.reserved_bytes + 1e-6) << kv;
      EXPECT_FALSE(st.batch.empty()) << kv;
      order.insert(order.end(), st.admitted.begin(), st.admitted.end());
      for (const int64_t i : st.batch) ++tokens[static_cast<size_t>(i)];
    }
    std::vector<int64_t> want(r.size());
    std::iota(want.begin(), want.end(), 0);
    EXPECT_EQ(order, want) << kv;
    for (size_t i = 0; i < r.size(); ++i) EXPECT_EQ(tokens[i], r[i].output_tokens) << kv << i;
  }
}

TEST(Serve, BadInput_oneLineNamingTheRequest) {
  const SchemeSpec bf16 = parse_spec("bf16");
  testing::expect_error(
      [&] {
        schedule_serve(kTiny, bf16, std::vector<ServeRequest>{{10, 1}, {200, 10}}, {3200, 0});
      },
      "serve: request 1 (200 + 10 tokens) takes 6720 bytes of bf16 cache, more than the "
      "3200-byte cap alone");
  testing::expect_error(
      [&] {
        schedule_serve(kTiny, bf16, std::vector<ServeRequest>{{10, 0}}, {3200, 0});
      },
      "serve: request 0 has 10 prompt and 0 output tokens");
  testing::expect_error([&] { schedule_serve(kTiny, bf16, {}, {0, 0}); }, "--mem must be positive");
  EXPECT_TRUE(schedule_serve(kTiny, bf16, {}, {1, 0}).steps.empty());
}

// kvq model serve-bench on SmolLM2 (backend cpu): the caches' measured peak bytes equal the
// schedule's prediction (LlamaCache::bytes and the planner share kvq::footprint), the schedule is
// the one schedule_serve gives for SmolLM2's shape, and every output token is decoded once.
TEST(ServeBenchCli, SmolLM2_measuredPeakIsThePrediction_heldAsScheduled) {
  if (!std::filesystem::exists(cli::model_dir() + "/SmolLM2-135M-Instruct.Q4_1.gguf") ||
      !std::filesystem::exists(cli::model_dir() + "/kjv.txt"))
    GTEST_SKIP() << "model or text not fetched (scripts/fetch-model.sh, scripts/fetch-text.sh)";
  const auto dir = testing::temp_dir("serve_bench");
  const auto json = dir / "sb.json";
  const auto r = testing::run_kvq(
      "model serve-bench --kv kivi2:r=32 --mem 0.002 --requests 5 --prompt-tokens 48 --gen 6 "
      "--threads 1 --json " +
      json.string());
  ASSERT_EQ(r.status, 0) << r.err;
  const auto j = nlohmann::json::parse(testing::slurp(json));
  // the requests the command makes (its --help): prompt 24 + 37 i mod 25, output 3 + 13 i mod 4
  std::vector<ServeRequest> reqs;
  int64_t outputs = 0;
  for (int64_t i = 0; i < 5; ++i) {
    reqs.push_back({24 + (37 * i) % 25, 3 + (13 * i) % 4});
    outputs += reqs.back().output_tokens;
  }
  const ServeSchedule s =
      schedule_serve({"smollm2", 30, 3, 64, 0}, parse_spec("kivi2:r=32"), reqs, {2e6, 0});
  EXPECT_EQ(j["steps"], s.steps.size());
  EXPECT_EQ(j["max_held"], s.max_held);
  EXPECT_GT(s.max_held, 1);  // the cap holds a real batch, and not everything at once
  EXPECT_LT(s.max_held, 5);
  EXPECT_EQ(j["decode_tokens"], outputs - 5);  // each request's first token comes from its prefill
  EXPECT_EQ(j["peak_cache_bytes"].get<double>(), s.peak_live_bytes);
  EXPECT_LE(j["peak_reserved_bytes"].get<double>(), 2e6);
}

}  // namespace
}  // namespace kvq::eval
