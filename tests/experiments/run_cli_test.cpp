// `kvq run`: results appear row by row, a rerun resumes (skips finished rows), bad configs fail
// with one line.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tests/support/run_cli.h"

namespace kvq {
namespace {

using testing::run_kvq;

std::vector<nlohmann::json> jsonl(const std::filesystem::path& p) {
  std::vector<nlohmann::json> rows;
  std::istringstream in(testing::slurp(p));
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) rows.push_back(nlohmann::json::parse(line));
  return rows;
}

class RunCli : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = testing::temp_dir("run"); }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string config(const std::string& schemes) const {
    const auto p = dir_ / "c.toml";
    std::ofstream(p) << "name = \"t\"\nout = \"" << (dir_ / "out").string() << "\"\nschemes = [" << schemes
                     << "]\n[synthetic]\ntokens = 96\nheads = 2\nhead_dim = 64\nqueries = 2\n";
    return p.string();
  }
  std::filesystem::path dir_;
};

TEST_F(RunCli, WritesRowsAndResumes) {
  auto r = run_kvq("run " + config("\"fp8_e4m3:gran=token\", \"kivi2:g=32,r=32\""));
  ASSERT_EQ(r.status, 0) << r.err;
  auto rows = jsonl(dir_ / "out" / "synthetic.jsonl");
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0]["scheme"], "fp8_e4m3:gran=token,scale=dynamic");
  EXPECT_EQ(rows[1]["scheme"], "kivi2:g=32,r=32");
  // 2-bit keys lose far more than FP8 (a check that the rows hold real measurements).
  EXPECT_GT(rows[0]["key_snr_db"].get<double>(), rows[1]["key_snr_db"].get<double>() + 10);
  EXPECT_TRUE(std::filesystem::exists(dir_ / "out" / "synthetic.csv"));
  const std::string before = testing::slurp(dir_ / "out" / "synthetic.jsonl");
  // Rerun with one more scheme: the two finished rows are skipped, the new one is appended.
  r = run_kvq("run " + config("\"fp8_e4m3:gran=token\", \"kivi2:g=32,r=32\", \"kivi4\""));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("fp8_e4m3:gran=token,scale=dynamic: done already"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("kivi2:g=32,r=32: done already"), std::string::npos) << r.err;
  rows = jsonl(dir_ / "out" / "synthetic.jsonl");
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[2]["scheme"], "kivi4:g=32,r=128");
  EXPECT_EQ(testing::slurp(dir_ / "out" / "synthetic.jsonl").substr(0, before.size()), before)
      << "finished rows are kept byte for byte";
}

TEST_F(RunCli, BadConfigsFailWithOneLine) {
  const auto check = [&](const std::string& args, const std::string& needle) {
    const auto r = run_kvq(args);
    EXPECT_NE(r.status, 0) << args;
    EXPECT_EQ(r.err_lines(), 1) << r.err;
    EXPECT_NE(r.err.find(needle), std::string::npos) << r.err;
  };
  check("run " + config("\"kivi5\""), "5 bits not supported");
  check("run " + (dir_ / "missing.toml").string(), "no such file");
  std::ofstream(dir_ / "bad.toml") << "schemes = [\"kivi2\"]\nfoo = 1\n";
  check("run " + (dir_ / "bad.toml").string(), "unknown key 'foo'");
  std::ofstream(dir_ / "syntax.toml") << "schemes = [\n";
  check("run " + (dir_ / "syntax.toml").string(), "syntax.toml:");
}

}  // namespace
}  // namespace kvq
