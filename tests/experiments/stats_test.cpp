// `kvq stats` and experiments/channel_stats: per-channel moments against values worked out by
// hand in the comments, outlier channels against the threshold rule, and the CLI on an npy and on
// a dump-like safetensors file (every tensor, one line per tensor and head, JSON on request).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "core/npy.h"
#include "core/safetensors.h"
#include "evaluation/channel_stats.h"
#include "evaluation/model_files.h"
#include "tests/support/run_cli.h"

namespace kvq {
namespace {

// [4 tokens, 1 head, 4 channels]:
//   ch 0: 1, -1, 1, -1  mean 0, m2 1, m4 1: std 1, kurtosis 1, amax 1
//   ch 1: 0, 0, 0, 4    mean 1, deviations -1 -1 -1 3: m2 12/4 = 3, m4 84/4 = 21, kurtosis 21/9
//   ch 2: 2, 2, 2, 2    std 0: kurtosis undefined (NaN), amax 2
//   ch 3: -9, 1, 1, 1   mean -1.5, deviations -7.5 2.5 2.5 2.5: m2 75/4, m4 (3164.0625 + 3 *
//                       39.0625) / 4 = 820.3125; kurtosis 820.3125 / 18.75^2 = 2.3333..., amax 9
Tensor3 hand_tensor() {
  Tensor3 x({4, 1, 4});
  const float v[4][4] = {{1, 0, 2, -9}, {-1, 0, 2, 1}, {1, 0, 2, 1}, {-1, 4, 2, 1}};
  for (int t = 0; t < 4; ++t)
    for (int d = 0; d < 4; ++d) x.at(t, 0, d) = v[t][d];
  return x;
}

TEST(ChannelStats, MomentsAndOutliers_matchHandComputation) {
  const auto hs = channel_stats(hand_tensor(), 2.0);
  ASSERT_EQ(hs.size(), 1u);
  const auto& c = hs[0].channels;
  ASSERT_EQ(c.size(), 4u);
  EXPECT_DOUBLE_EQ(c[0].mean, 0);
  EXPECT_DOUBLE_EQ(c[0].std, 1);
  EXPECT_DOUBLE_EQ(c[0].kurtosis, 1);
  EXPECT_DOUBLE_EQ(c[1].mean, 1);
  EXPECT_DOUBLE_EQ(c[1].std, std::sqrt(3.0));
  EXPECT_NEAR(c[1].kurtosis, 21.0 / 9.0, 1e-12);
  EXPECT_DOUBLE_EQ(c[1].amax, 4);
  EXPECT_DOUBLE_EQ(c[2].std, 0);
  EXPECT_TRUE(std::isnan(c[2].kurtosis));
  EXPECT_DOUBLE_EQ(c[3].mean, -1.5);
  EXPECT_NEAR(c[3].kurtosis, 820.3125 / (18.75 * 18.75), 1e-12);
  EXPECT_DOUBLE_EQ(c[3].amax, 9);
  // amax 1, 4, 2, 9: median (2 + 4) / 2 = 3; above 2 x 3 = 6: channel 3 only.
  EXPECT_DOUBLE_EQ(hs[0].amax_median, 3);
  EXPECT_EQ(hs[0].outliers, (std::vector<int64_t>{3}));
  EXPECT_TRUE(channel_stats(hand_tensor(), 4.0)[0].outliers.empty()) << "9 is not above 12";
}

TEST(StatsCli, DumpLikeFile_everyTensorAndHead_flagsTheOutlierChannel_json) {
  const auto dir = testing::temp_dir("stats");
  // Keys with channel 5 of head 1 scaled x20; values without outliers.
  const int64_t T = 64, H = 2, D = 16;
  std::vector<float> k(static_cast<size_t>(T * H * D)), v(k.size());
  for (size_t i = 0; i < k.size(); ++i) {
    const float base = static_cast<float>(static_cast<int>(i * 7919 % 97) - 48) / 24.0f;
    k[i] = base * ((i / D) % H == 1 && i % D == 5 ? 20.0f : 1.0f);
    v[i] = base;
  }
  write_safetensors((dir / "kv.safetensors").string(),
                    {{"layer.0.k", {T, H, D}, k}, {"layer.0.v", {T, H, D}, v}});
  const auto r = testing::run_kvq("stats " + (dir / "kv.safetensors").string() + " --json " +
                                  (dir / "s.json").string());
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("layer.0.k"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("layer.0.v"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("1 outlier channel of 64"), std::string::npos) << r.out;
  const auto j = nlohmann::json::parse(testing::slurp(dir / "s.json"));
  ASSERT_EQ(j["heads"].size(), 4u) << "2 tensors x 2 heads";
  EXPECT_EQ(j["heads"][0]["outliers"].size(), 0u);
  EXPECT_EQ(j["heads"][1]["tensor"], "layer.0.k");
  EXPECT_EQ(j["heads"][1]["head"], 1);
  EXPECT_EQ(j["heads"][1]["outliers"], nlohmann::json::array({5}));
  EXPECT_EQ(j["heads"][1]["channels"].size(), static_cast<size_t>(D));
  // One tensor by name, and an npy, give the same line for it.
  write_npy((dir / "k.npy").string(), {T, H, D}, k.data());
  const auto a = testing::run_kvq("stats " + (dir / "kv.safetensors").string() + ":layer.0.k");
  const auto b = testing::run_kvq("stats " + (dir / "k.npy").string());
  ASSERT_EQ(a.status, 0) << a.err;
  ASSERT_EQ(b.status, 0) << b.err;
  EXPECT_NE(a.out.find("1 outlier channel of 32"), std::string::npos) << a.out;
  EXPECT_NE(b.out.find("1 outlier channel of 32"), std::string::npos) << b.out;
  const auto bad =
      testing::run_kvq("stats " + (dir / "kv.safetensors").string() + " --threshold 0.5");
  EXPECT_NE(bad.status, 0);
  std::filesystem::remove_all(dir);
}

// Issue 14: statistics of a live model run. The reference is the path that already existed: a
// `kvq model dump` of the same text read back by `kvq stats`; the two tables must be equal.
TEST(StatsCli, LiveModelText_sameTableAsStatsOfItsDump) {
  try {
    cli::model_path("");
  } catch (const Error&) {
    GTEST_SKIP() << "model file absent: run scripts/fetch-model.sh (the README's setup does)";
  }
  const auto dir = testing::temp_dir("stats_live");
  const std::string text = (dir / "t.txt").string();
  {
    std::ofstream(text)
        << "In the beginning God created the heaven and the earth. And the earth "
           "was without form, and void; and darkness was upon the face of the deep.";
  }
  const auto d = testing::run_kvq("model dump --text " + text + " --max-tokens 24 --out " +
                                  (dir / "kv.safetensors").string());
  ASSERT_EQ(d.status, 0) << d.err;
  const auto a = testing::run_kvq("stats " + (dir / "kv.safetensors").string());
  const auto b = testing::run_kvq("stats --text " + text + " --max-tokens 24");
  ASSERT_EQ(a.status, 0) << a.err;
  ASSERT_EQ(b.status, 0) << b.err;
  // The same lines (a dump is read back in name order, the live run goes layer by layer).
  const auto sorted_lines = [](const std::string& s) {
    std::vector<std::string> v;
    std::istringstream in(s);
    for (std::string l; std::getline(in, l);) v.push_back(l);
    std::sort(v.begin(), v.end());
    return v;
  };
  EXPECT_EQ(sorted_lines(a.out), sorted_lines(b.out));
  EXPECT_NE(b.out.find("layer.29.v"), std::string::npos) << b.out;
  const auto both =
      testing::run_kvq("stats " + (dir / "kv.safetensors").string() + " --text " + text);
  EXPECT_NE(both.status, 0);
  const auto none = testing::run_kvq("stats");
  EXPECT_NE(none.status, 0);
  EXPECT_NE(none.err.find("--text"), std::string::npos) << none.err;
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace kvq
