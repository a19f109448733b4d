// evaluation/advisor.h (kvq advise) on hand-made results whose right answer is known from the
// rule and hand arithmetic. The workload is the design note's: llama-3.1-8b (16.06 GB of bf16
// weights), 55 GB of KV memory, an H100 SXM (3.35 TB/s), 64 requests of 2,000 tokens. bf16 K+V is
// 131,072 B per token (32 layers x 8 heads x 128 x 2 x 2 B): 64 x 2,000 tokens = 16.8 GB, so the
// whole batch fits and the step reads 16.06 + 16.8 GB; fp8 halves the KV read (~1.34x tokens/s),
// kivi4 (~5 bits) and kivi2 (~3 bits) cut it further (~1.5x, ~1.67x). Quality rows, made up:
// fp8 KLD 0.001, kivi4 0.02, kivi2 0.3.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "evaluation/advisor.h"
#include "tests/support/names.h"

namespace kvq::advisor {
namespace {

using planner::PlanInput;

class Advise : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("kvq_advise_" + kvq::testing::test_name(
                                ::testing::UnitTest::GetInstance()->current_test_info()->name()));
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    rows({{"fp8_e4m3:gran=tensor", 2048, 0.001, 0.01},
          {"kivi4", 2048, 0.02, 0.05},
          {"kivi2", 2048, 0.3, 0.9},
          {"fp32@3=kivi2", 2048, 0.0001, 0.0}});  // a per-layer study row: never a candidate
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  struct R {
    std::string scheme;
    int ctx;
    double kld, dppl;
  };
  void rows(const std::vector<R>& rs, const std::string& sub = "a") {
    std::filesystem::create_directories(dir_ / sub);
    std::ofstream f(dir_ / sub / "model.jsonl", std::ios::app);
    for (const R& r : rs)
      f << "{\"scheme\":\"" << r.scheme << "\",\"settings\":{\"ctx\":" << r.ctx
        << "},\"kld\":" << r.kld << ",\"delta_ppl\":" << r.dppl << ",\"top1\":0.9}\n";
  }
  std::vector<Quality> quality() { return read_quality({(dir_ / "a").string()}); }
  static PlanInput workload(int64_t ctx = 2000, int64_t batch = 64) {
    PlanInput in;
    in.model = planner::model_preset("llama-3.1-8b");
    in.gpu = planner::gpu_preset("h100-sxm");
    in.ctx = in.decode_ctx = ctx;
    in.batch = batch;
    return in;  // 55 GB of KV memory
  }
  std::filesystem::path dir_;
};

TEST_F(Advise, FastestSchemeWithinTheBudget) {
  const Advice a = advise(workload(), quality(), Budget{0.05, {}});
  EXPECT_TRUE(a.quantize);
  EXPECT_EQ(a.choice, "kivi4:g=32,r=128");  // kivi2 is faster but over the budget
  ASSERT_EQ(a.table.size(), 4u);            // bf16 + three schemes; the per-layer row left out
  EXPECT_EQ(a.table[0].scheme, "bf16");
  EXPECT_EQ(a.table[1].scheme, "kivi2:g=32,r=128");  // by tokens/s
  EXPECT_FALSE(a.table[1].eligible);
  EXPECT_EQ(a.table[1].why, "KLD 0.3 > 0.05");
  EXPECT_NEAR(a.table[2].plan.speedup, 1.5, 0.05);
  const std::string t = format_advice(a, Budget{0.05, {}});
  EXPECT_NE(t.find("answer     kivi4:g=32,r=128"), std::string::npos) << t;
  EXPECT_NE(t.find("bf16 holds the whole batch"), std::string::npos) << t;
  // A tighter budget leaves fp8; a perplexity budget alone works the same way.
  EXPECT_EQ(advise(workload(), quality(), Budget{0.005, {}}).choice,
            "fp8_e4m3:gran=tensor,scale=dynamic");
  EXPECT_EQ(advise(workload(), quality(), Budget{{}, 0.02}).choice,
            "fp8_e4m3:gran=tensor,scale=dynamic");
}

TEST_F(Advise, DoNotQuantize_whenNothingMeetsTheBudget) {
  const Advice a = advise(workload(), quality(), Budget{1e-6, {}});
  EXPECT_FALSE(a.quantize);
  EXPECT_EQ(a.choice, "bf16");
  EXPECT_NE(a.reasons.back().find("no measured quantized scheme meets the quality budget"),
            std::string::npos);
}

// One 256-token request: the KV cache is 33.5 MB against 16 GB of weights, so even kivi2 gains
// under 1%: the design note's "short contexts, small batches: do not quantize".
TEST_F(Advise, DoNotQuantize_whenTheStepIsBoundByTheWeights) {
  const Advice a = advise(workload(256, 1), quality(), Budget{1.0, {}});
  EXPECT_FALSE(a.quantize);
  EXPECT_EQ(a.choice, "bf16");
  EXPECT_NE(a.reasons.back().find("bound by the weights"), std::string::npos) << a.reasons.back();
  // The same with the gain threshold at 1: the fastest eligible scheme (kivi2) wins.
  EXPECT_EQ(advise(workload(256, 1), quality(), Budget{1.0, {}}, 1.0).choice, "kivi2:g=32,r=128");
}

// 64 requests of 32,768 tokens: bf16 needs 4.29 GB each, so 12 fit in 55 GB; kivi4 holds more.
TEST_F(Advise, CapacityBound_bf16DoesNotHoldTheBatch) {
  const Advice a = advise(workload(32768, 64), quality(), Budget{0.05, {}});
  EXPECT_TRUE(a.quantize);
  EXPECT_EQ(a.choice, "kivi4:g=32,r=128");
  EXPECT_NE(a.reasons[0].find("bf16 holds only 12 of the 64 requests"), std::string::npos)
      << a.reasons[0];
  EXPECT_EQ(a.table[0].plan.decode_batch, 12);
  // kivi4 at 32,768 tokens: 32 x (32,768 x 640 + 32,640 x 640 + 128 x 2,048) = 1.348 GB per
  // request, so 40 fit in 55 GB.
  EXPECT_NE(a.reasons[1].find("40 of the 64 requests in memory"), std::string::npos)
      << a.reasons[1];
  // Measured at 2,048 tokens, asked about 32,768: the answer says so.
  EXPECT_NE(a.reasons.back().find("caution: its quality was measured at 2048 tokens"),
            std::string::npos)
      << a.reasons.back();
}

// kvq run's hadamard = true rows carry the plain name in `scheme`: the rotation is added back;
// pre-RoPE rows are another cache and are left out.
TEST_F(Advise, RowSettingsNameTheCacheThatRan) {
  std::filesystem::create_directories(dir_ / "s");
  std::ofstream(dir_ / "s" / "model.jsonl")
      << "{\"scheme\":\"kivi2\",\"settings\":{\"ctx\":512,\"hadamard\":true},\"kld\":0.1,"
         "\"delta_ppl\":0.2}\n"
      << "{\"scheme\":\"kivi4\",\"settings\":{\"ctx\":512,\"pre_rope\":true},\"kld\":0.1,"
         "\"delta_ppl\":0.2}\n";
  const auto q = read_quality({(dir_ / "s").string()});
  ASSERT_EQ(q.size(), 1u);
  EXPECT_EQ(q[0].scheme, "kivi2:g=32,r=128,rot=hadamard");
}

// The row nearest the workload's context (log distance), the worst of several there.
TEST_F(Advise, QualityFromTheNearestContext) {
  rows({{"kivi4", 512, 0.01, 0.0}, {"kivi4", 8192, 0.08, 0.0}, {"kivi4", 8192, 0.09, 0.0}}, "b");
  const auto q = read_quality({(dir_ / "b").string()});
  auto kivi4 = [](const Advice& a) {
    for (const auto& c : a.table)
      if (c.scheme == "kivi4:g=32,r=128") return *c.quality;
    return Quality{};
  };
  EXPECT_EQ(kivi4(advise(workload(2000), q, Budget{1.0, {}})).ctx, 512);  // ln 3.9 < ln 4.1
  const Quality far = kivi4(advise(workload(4096), q, Budget{1.0, {}}));
  EXPECT_EQ(far.ctx, 8192);
  EXPECT_EQ(far.kld, 0.09);
}

// Issue 50: a row whose scored positions read (almost) nothing quantized measured the exact window,
// not the scheme: kivi2 (r=128) in 128-token windows reads KLD 0. Such rows are skipped with their
// reason, from the row's "quantized" or, for a row written before kvq recorded it, from its
// settings (FP8's first 128 tokens cover 128-token windows: 0). The answer is then kivi4, the
// fastest scheme whose rows measured it.
TEST_F(Advise, RowsThatQuantizedTooLittleAreSkippedWithTheirReason) {
  std::filesystem::create_directories(dir_ / "w");
  std::ofstream(dir_ / "w" / "model.jsonl")
      << "{\"scheme\":\"kivi2\",\"settings\":{\"ctx\":128,\"stride\":0,\"max_tokens\":256},"
         "\"kld\":0.0,\"delta_ppl\":0.0,\"quantized\":0.0}\n"
      << "{\"scheme\":\"kivi4\",\"settings\":{\"ctx\":2048},\"kld\":0.02,\"delta_ppl\":0.05,"
         "\"quantized\":0.81}\n"
      << "{\"scheme\":\"fp8_e4m3\",\"settings\":{\"ctx\":128,\"stride\":0,\"max_tokens\":256},"
         "\"kld\":0.0,\"delta_ppl\":0.0}\n"
      << "{\"scheme\":\"fp32\",\"settings\":{\"ctx\":128,\"stride\":0,\"max_tokens\":256},"
         "\"kld\":0.0,\"delta_ppl\":0.0,\"quantized\":0.0}\n";
  const auto q = read_quality({(dir_ / "w").string()});
  ASSERT_EQ(q.size(), 4u);
  ASSERT_TRUE(q[2].quantized.has_value());
  EXPECT_EQ(*q[2].quantized, 0.0);
  const Advice a = advise(workload(), q, Budget{0.05, {}});
  EXPECT_EQ(a.choice, "kivi4:g=32,r=128");
  ASSERT_EQ(a.skipped.size(), 2u) << "kivi2 and fp8; fp32 quantizes nothing by design";
  EXPECT_NE(a.skipped[0].find("model.jsonl:1: kivi2:g=32,r=128 at ctx 128: only 0.0% of the K/V"),
            std::string::npos)
      << a.skipped[0];
  EXPECT_NE(a.skipped[1].find("model.jsonl:3: fp8_e4m3:gran=tensor,scale=dynamic at ctx 128"),
            std::string::npos)
      << a.skipped[1];
  for (const Candidate& c : a.table)
    EXPECT_NE(c.scheme, "kivi2:g=32,r=128") << "a skipped row is no measurement";
  const std::string t = format_advice(a, Budget{0.05, {}});
  EXPECT_NE(t.find("skipped    2 rows (under 20% of the attended K/V quantized)"),
            std::string::npos)
      << t;
}

TEST_F(Advise, BadInputsAreOneLineErrors) {
  EXPECT_THROW((void)advise(workload(), quality(), Budget{}), Error);
  try {
    (void)read_quality({(dir_ / "missing").string()});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no model rows (model.jsonl)"), std::string::npos);
  }
  std::filesystem::create_directories(dir_ / "bad");
  std::ofstream(dir_ / "bad" / "model.jsonl") << "{\"scheme\":\"kivi2\"}\n";
  try {
    (void)read_quality({(dir_ / "bad").string()});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.jsonl:1: not a kvq run model row"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace kvq::advisor
