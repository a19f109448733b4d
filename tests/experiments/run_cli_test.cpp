// `kvq run`: results appear row by row, a rerun resumes (skips finished rows), bad configs fail
// with one line naming the file, the line and the [table].key before anything is written, every
// scheme is checked against the shapes it will meet before the first row runs, a [sweep] skips its
// invalid combinations with a line each, and a changed config is not mixed into an existing
// directory without --append.
#include "tests/support/run_cli.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <fstream>
#include <chrono>
#include <cmath>
#include <set>
#include <nlohmann/json.hpp>
#include <sstream>

#include "evaluation/model_files.h"
#include "experiments/run_task.h"
#include "kernels/backend.h"

namespace kvq {
namespace {

using testing::run_kvq;

using testing::jsonl;

class RunCli : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = testing::temp_dir("run"); }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string config(const std::string& schemes) const {
    const auto p = dir_ / "c.toml";
    std::ofstream(p) << "name = \"t\"\nout = \"" << (dir_ / "out").string() << "\"\nschemes = ["
                     << schemes
                     << "]\n[synthetic]\ntokens = 96\nheads = 2\nhead_dim = 64\nqueries = 2\n";
    return p.string();
  }
  std::filesystem::path dir_;
};

// `kvq run --help` lists every task of the one table (experiments/run_tasks.cpp) with what its
// rows measure, in the table's order: the help is made from the table, so a new task shows there.
TEST(RunCliHelp, ListsEveryRegisteredTaskInOrder) {
  const auto r = run_kvq("run --help");
  ASSERT_EQ(r.status, 0) << r.err;
  size_t at = 0;
  for (const cli::run::Task& t : cli::run::run_tasks()) {
    const size_t p = r.out.find(fmt::format("  [{}] ", t.name), at);
    ASSERT_NE(p, std::string::npos) << t.name << " missing or out of order in:\n" << r.out;
    EXPECT_GT(std::string(t.help).size(), 20u) << t.name;
    at = p;
  }
  EXPECT_NE(r.out.find("  [serve] serving-style batches"), std::string::npos) << r.out;
}

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
  // Rerun with one more scheme: the two finished rows are skipped, the new one is appended
  // (--append: the directory was made by the config without kivi4).
  r = run_kvq("run --append " + config("\"fp8_e4m3:gran=token\", \"kivi2:g=32,r=32\", \"kivi4\""));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("fp8_e4m3:gran=token,scale=dynamic: done already"), std::string::npos)
      << r.err;
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
  check("run " + (dir_ / "bad.toml").string(), "bad.toml:2: unknown key foo (allowed: name, out");
  std::ofstream(dir_ / "syntax.toml") << "schemes = [\n";
  check("run " + (dir_ / "syntax.toml").string(), "syntax.toml:");
}

// Findings of issue 14 (each failed before: unknown keys inside tables were ignored, a wrong type
// was reported without its place after the output directory was made, a config with nothing to
// run exited 0).
TEST_F(RunCli, SectionKeysTypesAndEmptyConfigs_oneLineBeforeAnythingIsWritten) {
  const auto out = dir_ / "never";
  const auto check = [&](const std::string& body, const std::string& needle,
                         const std::string& flags = "") {
    std::ofstream(dir_ / "x.toml") << "out = \"" << out.string() << "\"\n" << body;
    const auto r = run_kvq("run " + flags + (dir_ / "x.toml").string());
    EXPECT_NE(r.status, 0) << body;
    EXPECT_EQ(r.err_lines(), 1) << r.err;
    EXPECT_NE(r.err.find(needle), std::string::npos) << r.err;
    EXPECT_FALSE(std::filesystem::exists(out)) << "written before the check: " << body;
  };
  check("schemes = [\"kivi2\"]\n[synthetic]\ntoken = 256\n",
        "x.toml:4: unknown key [synthetic].token (allowed: tokens, heads");
  check("schemes = [\"kivi2\"]\n[model]\nctx_len = 2048\n",
        "x.toml:4: unknown key [model].ctx_len (allowed: text, ctx");
  check("schemes = [\"kivi2\"]\n[synthetic]\ntokens = \"2048\"\n",
        "x.toml:4: [synthetic].tokens must be an integer (got a string)");
  check("schemes = [\"kivi2\"]\n[synthetic]\nheads = 0\n", "[synthetic].heads must be between 1");
  check("schemes = [\"kivi2\"]\n[model]\nctx = 1\n", "[model].ctx must be between 2");
  check("schemes = [\"kivi2\"]\n[model]\nbackend = \"gpu\"\n", "[model].backend:");
  check("schemes = [\"kivi2\"]\n",
        "nothing to run: give a [synthetic], [model], [needle], [throughput], [ruler] or [serve] table");
  // cuda is a name of the one list (kernels/backend.h): [throughput] runs it where a device is,
  // refuses what its support table does not run (naming who does), and a missing device in one
  // line (kvq run --check passes without one)
  if (const std::string why = cuda_unavailable(); !why.empty())
    check("schemes = [\"kivi2\"]\n[throughput]\nbackends = [\"cuda\"]\n",
          "[throughput].backends \"cuda\": " + why);
  check("schemes = [\"kivi2:sink=4\"]\n[throughput]\nbackends = [\"cuda\"]\n",
        "[throughput] backend cuda cannot run decode attention over 'kivi2:g=32,r=128,sink=4': it "
        "does not run sink=S (exact sink tokens) (backends that can: ref, cpu, cpu-int8)");
  check("schemes = [\"kivi2\"]\n[throughput]\nbackends = [\"cpu\", \"cuda\"]\nhead_dim = 96\n",
        "[throughput] backend cuda cannot run decode attention over head_dim 96 (head_dim: 64, 128)");
  check("schemes = [\"kivi2\"]\n[throughput]\nbackends = [\"gpu\"]\n",
        "[throughput].backends \"gpu\": unknown backend 'gpu' (choices: ref,");
  check("schemes = [\"kivi2\"]\n[throughput]\nbackends = [\"cpu-int8\"]\n",
        "backend cpu-int8 is backend cpu with int_mode = \"int8\" here");
  check("schemes = [\"kivi2\"]\n[throughput]\ncontexts = [0]\n", "[throughput].contexts 0 is outside [1, 1048576]");
  check("schemes = [\"kivi2\"]\n[throughput]\nops = [\"prefill\"]\n",
        "[throughput].ops \"prefill\" is not one of: decode, quantize");
  check("schemes = [\"kivi2\"]\n[throughput]\nint_mode = \"int4\"\n",
        "[throughput].int_mode \"int4\" is not one of: exact, int8");
  check("schemes = [\"kivi2\"]\n[throughput]\ncontext = [64]\n",
        "unknown key [throughput].context (allowed: contexts, batch");
  // Range and type checks of every table (issue 16's catalogue, docs/bad-inputs.md rows 98-):
  check("schemes = \"kivi2\"\n[synthetic]\n", "x.toml:2: schemes must be an array of strings (got a string)");
  check("schemes = [\"kivi2\"]\n[synthetic]\noutliers = 200\n",
        "[synthetic].outliers must be between 0 and head_dim 128, got 200");
  check("schemes = [\"kivi2\"]\n[synthetic]\nseed = -1\n", "[synthetic].seed must be >= 0, got -1");
  check("schemes = [\"kivi2\"]\n[synthetic]\ntokens = 16777216\nheads = 64\n",
        "tokens x heads x head_dim = 137438953472 values; at most 2^28");
  check("schemes = [\"kivi2\"]\n[model]\nctx = []\n", "[model].ctx is an empty array; give one or more window lengths");
  check("schemes = [\"kivi2\"]\n[model]\nctx = 512\nstride = 600\n",
        "[model].stride must be between 0 (= ctx) and ctx 512, got 600");
  check("schemes = [\"kivi2\"]\n[throughput]\nbatch = 4\n", "[throughput].batch must be a non-empty array of integers");
  check("schemes = [\"kivi2\"]\n[throughput]\nthreads = 0\n", "[throughput].threads must be between 1 and 256, got 0");
  check("schemes = [\"kivi2\"]\n[throughput]\ncontexts = [1048576]\nheads = 1024\n", "at most 2^30");
  check("[sweep]\nb = [2]\n[synthetic]\n", "[sweep] needs a template");
  check("[sweep]\ntemplate = \"int{b}\"\nb = []\n[synthetic]\n", "[sweep].b must be a non-empty array");
  check("[sweep]\ntemplate = \"kivi2\"\nb = [2]\n[synthetic]\n", "[sweep].b does not appear in the template as {b}");
  check("schemes = [\"kivi2\"]\n[synthetic]\ntokens = 64\n",
        "--only model but the config has no [model]", "--only model ");
  check("schemes = [\"kivi2\"]\nsynthetic = 3\n", "synthetic must be a table");
}

// [model], [needle] and [ruler] on backend cuda (issue 47): the same `backend` key as the host
// backends; --check takes it without a device and refuses, from kernels/backend.h's table alone,
// what cuda does not run the model with (each row named, then one error; nothing written); a run
// without a device stops at once with cuda_unavailable()'s line. The model is the qwen2 fixture
// (head_dim 64, context 256), the text a file of this test.
TEST_F(RunCli, ModelTasksOnCuda_checkedStatically_runRefusedWithoutADeviceInOneLine) {
  const auto text = dir_ / "text.txt";
  {
    std::ofstream t(text);
    for (int i = 0; i < 200; ++i) t << "In the beginning God created the heaven and the earth.\n";
  }
  const std::string model = std::string(KVQ_SOURCE_DIR) + "/tests/fixtures/hf/qwen2";
  const auto out = dir_ / "out";
  const auto write = [&](const std::string& schemes, const std::string& tables) {
    std::ofstream(dir_ / "m.toml") << "out = \"" << out.string() << "\"\nmodel_file = \"" << model
                                   << "\"\nschemes = [" << schemes << "]\n" << tables;
    return (dir_ / "m.toml").string();
  };
  const std::string model_cuda = "[model]\nbackend = \"cuda\"\nctx = 64\nmax_tokens = 128\ntext = \"" +
                                 text.string() + "\"\n";
  const std::string needle_cuda = "[needle]\nbackend = \"cuda\"\nctx = [256]\ntext = \"" +
                                  text.string() + "\"\n";
  // accepted: every scheme cuda runs the model with ([ruler] below: its lengths start at 1024)
  auto r = run_kvq("run --check " + write("\"kivi2\", \"kivi4:rot=hadamard\", \"bf16\", "
                                          "\"fp8_e4m3:gran=token\"",
                                          model_cuda + needle_cuda));
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("model rows (4)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("ok, nothing run (--check)"), std::string::npos) << r.out;
  // refused by the table, each row named, before the model loads or a device is asked
  r = run_kvq("run --check " + write("\"kivi2\", \"kivi2:sink=4\", \"fp32\"", model_cuda));
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("kivi2:sink=4 (model rows: heads 1, head_dim 64): backend cuda does not run "
                       "sink=S (exact sink tokens) in the model"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("fp32 (model rows: heads 1, head_dim 64): backend cuda does not run fp32 "
                       "caches in the model"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("2 invalid rows (listed above); nothing was run"), std::string::npos)
      << r.err;
  r = run_kvq("run --check " + write("\"kivi2\"", model_cuda + "pre_rope = true\n"));
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("kivi2 (model rows: heads 1, head_dim 64): backend cuda does not run "
                       "pre_rope (pre-RoPE keys) in the model"),
            std::string::npos)
      << r.err;
  r = run_kvq("run --check " + write("\"kivi2:sink=4\"", needle_cuda));
  EXPECT_NE(r.err.find("kivi2:sink=4 (needle rows: heads 1, head_dim 64): backend cuda does not run "
                       "sink=S"),
            std::string::npos)
      << r.err;
  // a name outside the one list: the parser's error under the key
  r = run_kvq("run --check " + write("\"kivi2\"", "[needle]\nbackend = \"gpu\"\nctx = [256]\n"));
  EXPECT_NE(r.err.find("[needle].backend: unknown backend 'gpu' (choices: ref, the scalar reference; "
                       "cpu, "),
            std::string::npos)
      << r.err;
  EXPECT_FALSE(std::filesystem::exists(out));
  // run without a device: the one line, nothing written
  if (const std::string why = cuda_unavailable(); !why.empty()) {
    for (const std::string& t : {model_cuda, needle_cuda}) {
      r = run_kvq("run " + write("\"kivi2\"", t));
      EXPECT_NE(r.status, 0) << t;
      EXPECT_EQ(r.err_lines(), 1) << r.err;
      EXPECT_NE(r.err.find("].backend \"cuda\": " + why), std::string::npos) << r.err;
      EXPECT_FALSE(std::filesystem::exists(out / "model.jsonl")) << t;
    }
  }
  // [ruler] (lengths of 1024 and more): on the fetched model
  if (!std::filesystem::exists(cli::model_dir() + "/SmolLM2-135M-Instruct.Q4_1.gguf"))
    GTEST_SKIP() << "[ruler] on cuda: the model is not fetched (scripts/fetch-model.sh)";
  const auto ruler = [&](const std::string& schemes) {
    std::ofstream(dir_ / "r.toml") << "out = \"" << out.string() << "\"\nschemes = [" << schemes
                                   << "]\n[ruler]\nbackend = \"cuda\"\nlengths = [1024]\n"
                                   << "haystack = \"noise\"\n";
    return (dir_ / "r.toml").string();
  };
  r = run_kvq("run --check " + ruler("\"kivi2\""));
  EXPECT_EQ(r.status, 0) << r.err;
  r = run_kvq("run --check " + ruler("\"kivi2:sink=4\""));
  EXPECT_NE(r.err.find("(ruler rows: heads 3, head_dim 64): backend cuda does not run sink=S"),
            std::string::npos)
      << r.err;
  if (const std::string why = cuda_unavailable(); !why.empty()) {
    r = run_kvq("run " + ruler("\"kivi2\""));
    EXPECT_EQ(r.err_lines(), 1) << r.err;
    EXPECT_NE(r.err.find("[ruler].backend \"cuda\": " + why), std::string::npos) << r.err;
  }
  EXPECT_FALSE(std::filesystem::exists(out));
}

TEST_F(RunCli, EveryRowCheckedAgainstItsShapeBeforeTheFirstRuns_allListed) {
  // head_dim 64: a per-token group of 128 channels does not fit; neither does a 5-bit spec. Both
  // are listed, then one error line; nothing is written.
  const auto r =
      run_kvq("run " + config("\"kivi2\", \"kivi4:g=128\", \"int2:k=token,v=token,g=128\""));
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("kivi4:g=128 (synthetic rows: heads 2, head_dim 64): kivi: group g=128"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("int2:k=token,v=token,g=128 (synthetic rows"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("2 invalid rows (listed above); nothing was run"), std::string::npos)
      << r.err;
  EXPECT_FALSE(std::filesystem::exists(dir_ / "out"));
}

TEST_F(RunCli, SweepSkipsInvalidCombinationsWithALineEach_andHonoursExclude) {
  const auto p = dir_ / "s.toml";
  std::ofstream(p) << "out = \"" << (dir_ / "out").string() << "\"\n"
                   << "[synthetic]\ntokens = 96\nheads = 2\nhead_dim = 64\nqueries = 1\n"
                   << "[sweep]\ntemplate = \"kivi2:g={g},r={r}\"\ng = [32, 64, 128]\nr = [0, 64]\n"
                   << "exclude = [\"kivi2:g=32,r=0\"]\n";
  const auto r = run_kvq("run " + p.string());
  ASSERT_EQ(r.status, 0) << r.err;
  // g=128 does not parse with r=64 (r a multiple of g) and does not fit head_dim 64 on the
  // per-token side with r=0: skipped with a line each; g=32,r=0 excluded without one.
  EXPECT_NE(r.err.find("[sweep] kivi2:g=128,r=64 skipped"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("[sweep] kivi2:g=128,r=0 skipped for synthetic"), std::string::npos)
      << r.err;
  EXPECT_EQ(r.err.find("kivi2:g=32,r=0"), std::string::npos) << r.err;
  const auto rows = jsonl(dir_ / "out" / "synthetic.jsonl");
  std::vector<std::string> got;
  for (const auto& row : rows) got.push_back(row["scheme"]);
  EXPECT_EQ(got,
            (std::vector<std::string>{"kivi2:g=32,r=64", "kivi2:g=64,r=0", "kivi2:g=64,r=64"}));
}

TEST_F(RunCli, ChangedConfigIntoExistingOut_refusedWithoutAppend_settingsAreCsvColumns) {
  auto r = run_kvq("run " + config("\"kivi2\""));
  ASSERT_EQ(r.status, 0) << r.err;
  const std::string rows = testing::slurp(dir_ / "out" / "synthetic.jsonl");
  const std::string saved = testing::slurp(dir_ / "out" / "config.toml");
  r = run_kvq("run " + config("\"kivi2\", \"kivi4\""));
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("holds results of a different config"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("--append"), std::string::npos) << r.err;
  EXPECT_EQ(testing::slurp(dir_ / "out" / "synthetic.jsonl"), rows);
  EXPECT_EQ(testing::slurp(dir_ / "out" / "config.toml"), saved) << "the first config is kept";
  r = run_kvq("run --append " + config("\"kivi2\", \"kivi4\""));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(testing::slurp(dir_ / "out" / "config.toml"), saved);
  EXPECT_TRUE(std::filesystem::exists(dir_ / "out" / "config-2.toml"));
  // The settings a row was made with are CSV columns.
  const std::string csv = testing::slurp(dir_ / "out" / "synthetic.csv");
  const std::string header = csv.substr(0, csv.find('\n'));
  EXPECT_NE(header.find(",settings.tokens,settings.heads,settings.head_dim,"), std::string::npos)
      << header;
  EXPECT_NE(csv.find(",96,2,64,"), std::string::npos) << csv;
}

// Issue 11: [model] score_from (llama-perplexity scores the second half of each window). By hand:
// ctx 64 over 128 tokens is 2 windows; positions 32 .. 62 of each predict the next token, 31 each.
TEST_F(RunCli, ModelScoreFrom_scoresTheWindowTailAndIsASetting) {
  if (!std::filesystem::exists(cli::model_dir() + "/SmolLM2-135M-Instruct.Q4_1.gguf") ||
      !std::filesystem::exists(cli::model_dir() + "/kjv.txt"))
    GTEST_SKIP() << "model or text not fetched (scripts/fetch-model.sh, scripts/fetch-text.sh)";
  const auto p = dir_ / "m.toml";
  std::ofstream(p) << "name = \"m\"\nout = \"" << (dir_ / "out").string()
                   << "\"\nschemes = [\"kivi2:g=16,r=16\"]\n[model]\nctx = 64\nmax_tokens = 128\n"
                      "score_from = 32\n";
  const auto r = run_kvq("run " + p.string());
  ASSERT_EQ(r.status, 0) << r.err;
  const auto rows = jsonl(dir_ / "out" / "model.jsonl");
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0]["scored"], 62);
  EXPECT_EQ(rows[0]["settings"]["score_from"], 32);
  EXPECT_NE(testing::slurp(dir_ / "out" / "model.csv").find("settings.score_from"), std::string::npos);
  std::ofstream(p) << "schemes = [\"kivi2\"]\n[model]\nctx = 64\nscore_from = 63\n";
  const auto bad = run_kvq("run " + p.string());
  EXPECT_NE(bad.status, 0);
  EXPECT_NE(bad.err.find("[model].score_from must be between 0 and ctx - 2 = 62"), std::string::npos) << bad.err;
}

// Issue 50: a model row records how much of the K/V its scored positions read quantized, warns when
// that is under 20% (kivi2's 128-token window covers 64-token windows: nothing), and carries a 95%
// interval of every statistic; `kvq advise` then skips the row that measured nothing instead of
// recommending its KLD of 0. By hand for kivi2:g=32,r=0: window position p attends p + 1 tokens,
// keys per channel hold floor((p + 1) / 32) * 32 of them quantized, values per token all.
TEST_F(RunCli, ModelRowsRecordTheQuantizedFractionAndIntervals_warnWhenNothingWasQuantized) {
  if (!std::filesystem::exists(cli::model_dir() + "/SmolLM2-135M-Instruct.Q4_1.gguf") ||
      !std::filesystem::exists(cli::model_dir() + "/kjv.txt"))
    GTEST_SKIP() << "model or text not fetched (scripts/fetch-model.sh, scripts/fetch-text.sh)";
  const auto p = dir_ / "m.toml";
  std::ofstream(p) << "name = \"m\"\nout = \"" << (dir_ / "out").string()
                   << "\"\nschemes = [\"kivi2\", \"kivi2:g=32,r=0\", \"fp32\", "
                      "\"fp8_e4m3:gran=channel,first=16\"]\n[model]\nctx = 64\n"
                      "max_tokens = 128\n";
  const auto r = run_kvq("run " + p.string());
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(
      r.err.find("kvq run: warning: kivi2:g=32,r=128 at ctx 64: only 0.0% of the K/V the scored "
                 "positions attend was stored quantized"),
      std::string::npos)
      << r.err;
  EXPECT_EQ(r.err.find("warning: kivi2:g=32,r=0"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("warning: fp32"), std::string::npos) << "exact by design: " << r.err;
  const auto rows = jsonl(dir_ / "out" / "model.jsonl");
  ASSERT_EQ(rows.size(), 4u);
  EXPECT_EQ(rows[0]["quantized"], 0.0);
  double want = 0;
  for (int q = 0; q < 63; ++q) want += ((q + 1) / 32 * 32 / (q + 1.0) + 1.0) / 2 / 63;
  EXPECT_NEAR(rows[1]["quantized"].get<double>(), want, 1e-12);
  EXPECT_EQ(rows[2]["quantized"], 0.0);
  // item 3: which tokens set the scales (per-channel int keys: each group of 32 tokens)
  EXPECT_EQ(rows[1]["key_scales_from"], "each 32 tokens");
  EXPECT_EQ(rows[1]["value_scales_from"], "each token");
  EXPECT_EQ(rows[2]["key_scales_from"], "-");
  // a dynamic FP8 scale from the first 16 tokens of each 64-token window, said in the row and the
  // progress line (the line read the row after it was moved into the table: a crash, before)
  EXPECT_EQ(rows[3]["key_scales_from"], "tokens 0-15 of 64");
  EXPECT_NE(r.err.find(", scales from tokens 0-15 of 64 of each window"), std::string::npos)
      << r.err;
  const auto& r0 = rows[1];
  EXPECT_EQ(r0["ci_blocks"], 4) << "2 windows of 63 scored positions, blocks of 32 and 31";
  for (const char* k : {"ppl", "ppl_fp32", "delta_ppl", "kld", "top1"}) {
    const std::string lo = std::string(k) + "_lo", hi = std::string(k) + "_hi";
    ASSERT_TRUE(r0[lo].is_number() && r0[hi].is_number()) << k << ": " << r0.dump();
    EXPECT_LE(r0[lo].get<double>(), r0[k].get<double>()) << k;
    EXPECT_GE(r0[hi].get<double>(), r0[k].get<double>()) << k;
  }
  EXPECT_LT(r0["kld_lo"].get<double>(), r0["kld_hi"].get<double>());
  EXPECT_NE(testing::slurp(dir_ / "out" / "model.csv").find(",kld_lo,kld_hi,"), std::string::npos);
  const auto a = run_kvq("advise --max-kld 0.05 --results " + (dir_ / "out").string());
  ASSERT_EQ(a.status, 0) << a.err;
  EXPECT_NE(a.out.find("skipped    1 row (under 20% of the attended K/V quantized)"),
            std::string::npos)
      << a.out;
  EXPECT_EQ(a.out.find("answer     kivi2"), std::string::npos) << a.out;
}

// Issue 11: `ctx = [a, b]` in [model] gives one set of rows per window length, ctx a setting of
// each; a rerun skips them all. By hand: 128 tokens in windows of 32 are 4 windows of 31 scored
// positions (124); in windows of 64, 2 of 63 (126).
TEST_F(RunCli, ModelCtxList_rowsPerWindowLength) {
  if (!std::filesystem::exists(cli::model_dir() + "/SmolLM2-135M-Instruct.Q4_1.gguf") ||
      !std::filesystem::exists(cli::model_dir() + "/kjv.txt"))
    GTEST_SKIP() << "model or text not fetched (scripts/fetch-model.sh, scripts/fetch-text.sh)";
  const auto p = dir_ / "m.toml";
  std::ofstream(p) << "name = \"m\"\nout = \"" << (dir_ / "out").string()
                   << "\"\nschemes = [\"kivi2:g=16,r=16\"]\n[model]\nctx = [32, 64]\nmax_tokens = 128\n";
  auto r = run_kvq("run " + p.string());
  ASSERT_EQ(r.status, 0) << r.err;
  const auto rows = jsonl(dir_ / "out" / "model.jsonl");
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0]["settings"]["ctx"], 32);
  EXPECT_EQ(rows[0]["scored"], 124);
  EXPECT_EQ(rows[1]["settings"]["ctx"], 64);
  EXPECT_EQ(rows[1]["scored"], 126);
  // Issue 50: rows per window length are drawn by plot_context.py, named beside plot_results.py.
  const std::string out = (dir_ / "out").string();
  EXPECT_NE(r.out.find(fmt::format(
                "(model.csv; plot: .venv/bin/python experiments/plots/plot_results.py {}; "
                ".venv/bin/python experiments/plots/plot_context.py {})",
                out, out)),
            std::string::npos)
      << r.out;
  r = run_kvq("run " + p.string());
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("all 2 rows done already"), std::string::npos) << r.err;
  std::ofstream(p) << "schemes = [\"kivi2\"]\n[model]\nctx = [512, 4096]\nmax_tokens = 1024\n";
  r = run_kvq("run --check " + p.string());
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("[model].max_tokens 1024 is shorter than the longest window, [model].ctx = 4096"),
            std::string::npos)
      << r.err;
}

// Issue 11: --shard I/N runs a deterministic 1/N of the rows into OUT/shard-I-of-N/, --merge
// gathers them into OUT in the config's order: the same rows as one run (the measurements are
// deterministic; only the seconds and the record fields may differ).
TEST_F(RunCli, ShardsThenMerge_sameRowsAsOneRun) {
  const std::string schemes = "\"bf16\", \"fp8_e4m3:gran=token\", \"kivi2:g=32,r=32\", \"kivi4\", \"int2\"";
  const auto whole = dir_ / "whole";
  auto r = run_kvq("run --out " + whole.string() + " " + config(schemes));
  ASSERT_EQ(r.status, 0) << r.err;
  for (int i = 1; i <= 3; ++i) {
    r = run_kvq(fmt::format("run --shard {}/3 {}", i, config(schemes)));
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_EQ(jsonl(dir_ / "out" / fmt::format("shard-{}-of-3", i) / "synthetic.jsonl").size(), i < 3 ? 2u : 1u);
    // Issue 50: a shard is plotted after the merge, from the merged folder.
    EXPECT_NE(r.out.find(fmt::format(
                  "(synthetic.csv; when every shard is done: kvq run {} --merge, then plot: "
                  ".venv/bin/python experiments/plots/plot_results.py {})",
                  (dir_ / "c.toml").string(), (dir_ / "out").string())),
              std::string::npos)
        << r.out;
  }
  r = run_kvq("run --merge " + config(schemes));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("5 synthetic rows from 3 shard folders"), std::string::npos) << r.err;
  // Issue 50: --merge names the tables it wrote, not every task's (it listed four before)
  EXPECT_NE(r.out.find("results in " + (dir_ / "out").string() + "/ (synthetic.csv)\n"),
            std::string::npos)
      << r.out;
  auto a = jsonl(whole / "synthetic.jsonl"), b = jsonl(dir_ / "out" / "synthetic.jsonl");
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    for (auto* row : {&a[i], &b[i]}) row->erase("machine"), row->erase("kvq");
    EXPECT_EQ(a[i], b[i]) << i;
  }
  for (const char* bad : {"0/3", "4/3", "2", "a/b", "1/0"}) {
    r = run_kvq(std::string("run --shard ") + bad + " " + config(schemes));
    EXPECT_NE(r.status, 0) << bad;
    EXPECT_NE(r.err.find("give I/N with 1 <= I <= N"), std::string::npos) << r.err;
  }
}

// [throughput]: rows per op x backend x context x batch x scheme, bf16 first in every group as
// the speed-up's baseline (added when the config does not name it), the memcpy it is measured
// against in each row; a rerun resumes, and 2 shards merge to the same rows.
TEST_F(RunCli, Throughput_rowsPerCase_bf16Baseline_resumesAndShards) {
  const auto p = dir_ / "tp.toml";
  std::ofstream(p) << "out = \"" << (dir_ / "tp").string() << "\"\nschemes = [\"kivi2:g=32,r=32\", \"fp8_e4m3:gran=token\"]\n"
                   << "[throughput]\ncontexts = [64, 128]\nbatch = [1, 3]\nheads = 2\nhead_dim = 32\ngqa = 2\n"
                   << "repeats = 1\n";
  auto r = run_kvq("run --dry-run " + p.string());
  ASSERT_EQ(r.status, 0) << r.err;
  // decode: 2 backends x 2 contexts x 2 batches; quantize: 2 x 2 x 1; x 3 schemes (bf16 added)
  EXPECT_NE(r.out.find("throughput rows (3): bf16, kivi2:g=32,r=32, fp8_e4m3:gran=token,scale=dynamic"),
            std::string::npos) << r.out;
  EXPECT_NE(r.out.find(": 36 rows"), std::string::npos) << r.out;
  r = run_kvq("run " + p.string());
  ASSERT_EQ(r.status, 0) << r.err;
  // Issue 50: the hint is a command that runs as printed (the scripts are not executable).
  EXPECT_NE(
      r.out.find("throughput.csv; plot: .venv/bin/python experiments/plots/plot_throughput.py " +
                 (dir_ / "tp").string() + ")"),
      std::string::npos)
      << r.out;
  const auto rows = jsonl(dir_ / "tp" / "throughput.jsonl");
  ASSERT_EQ(rows.size(), 36u);
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto& row = rows[i];
    EXPECT_EQ(row["scheme"], i % 3 == 0 ? "bf16" : i % 3 == 1 ? "kivi2:g=32,r=32" : "fp8_e4m3:gran=token,scale=dynamic");
    EXPECT_GT(row["time_us"].get<double>(), 0.0);
    EXPECT_GT(row["memcpy_gb_per_s"].get<double>(), 0.0);
    EXPECT_NEAR(row["of_memcpy"].get<double>(),
                row["gb_per_s"].get<double>() / row["memcpy_gb_per_s"].get<double>(), 1e-9);
    // bytes: the stored K+V of every sequence read (decode), or the float32 input (quantize)
    const double ctx = row["context"].get<double>(), batch = row["batch"].get<double>();
    if (row["op"] == "decode")
      EXPECT_DOUBLE_EQ(row["bytes"].get<double>(), row["stored_bytes_per_token"].get<double>() * ctx * batch);
    else
      EXPECT_DOUBLE_EQ(row["bytes"].get<double>(), 2 * ctx * 2 * 32 * 4);
    if (i % 3 == 0) {
      EXPECT_DOUBLE_EQ(row["speedup_vs_bf16"].get<double>(), 1.0);
    }
  }
  // bf16 stores 2 bytes per element: 2 (K, V) x 2 heads x 32 x 2 bytes per token.
  EXPECT_DOUBLE_EQ(rows[0]["stored_bytes_per_token"].get<double>(), 256.0);
  r = run_kvq("run " + p.string());
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(jsonl(dir_ / "tp" / "throughput.jsonl").size(), 36u) << "a rerun adds nothing";
  for (int i = 1; i <= 2; ++i) ASSERT_EQ(run_kvq(fmt::format("run --shard {}/2 --out {} {}", i, (dir_ / "sh").string(), p.string())).status, 0);
  r = run_kvq(fmt::format("run --merge --out {} {}", (dir_ / "sh").string(), p.string()));
  ASSERT_EQ(r.status, 0) << r.err;
  const auto merged = jsonl(dir_ / "sh" / "throughput.jsonl");
  ASSERT_EQ(merged.size(), rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    EXPECT_EQ(merged[i]["key"], rows[i]["key"]) << i;
    EXPECT_EQ(merged[i]["settings"], rows[i]["settings"]) << i;
  }
}

// [ruler] (evaluation/ruler.h): one row per scheme x length x task x sample with the fp32 cache's
// score on the same prompt beside it; a rerun resumes, 2 shards merge to the rows of one run, and
// its keys are checked before anything runs.
TEST_F(RunCli, Ruler_rowsPerCase_fp32Beside_resumesShardsAndBadKeys) {
  if (!std::filesystem::exists(cli::model_dir() + "/SmolLM2-135M-Instruct.Q4_1.gguf") ||
      !std::filesystem::exists(cli::model_dir() + "/kjv.txt"))
    GTEST_SKIP() << "model or text not fetched (scripts/fetch-model.sh, scripts/fetch-text.sh)";
  const auto cfg = [&](const std::string& ruler) {
    std::ofstream(dir_ / "r.toml") << "name = \"r\"\nout = \"" << (dir_ / "out").string()
                                   << "\"\nschemes = [\"kivi2\"]\n[ruler]\n" << ruler;
    return (dir_ / "r.toml").string();
  };
  // vt: RULER lets it generate 30 tokens (a needle task 128), so the test stays short
  const std::string good = cfg("tasks = [\"vt\"]\nlengths = [1024]\nsamples = 2\n");
  auto r = run_kvq("run --check " + good);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("ruler rows (1): kivi2:g=32,r=128"), std::string::npos) << r.out;
  const auto whole = dir_ / "whole";
  r = run_kvq("run --only ruler --out " + whole.string() + " " + good);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("plot_ruler.py"), std::string::npos) << r.out;
  auto rows = jsonl(whole / "ruler.jsonl");
  ASSERT_EQ(rows.size(), 2u);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(rows[i]["settings"]["sample"], i);
    EXPECT_EQ(rows[i]["settings"]["task"], "vt");
    EXPECT_EQ(rows[i]["prompt_tokens"], 1024 - 30) << "RULER's budget: 30 tokens to generate";
    EXPECT_LE(rows[i]["generated"], 30);
    // string_match_all over the chain's 5 names: a multiple of 1/5
    for (const char* k : {"score", "fp32_score"}) {
      const double x = 5 * rows[i][k].get<double>();
      EXPECT_TRUE(x >= 0 && x <= 5 && x == std::round(x)) << rows[i].dump();
    }
    EXPECT_EQ(rows[i]["answers"].get<std::string>().size(), 5u * 5 + 4 * 2) << "5 names of 5 letters";
  }
  const std::string before = testing::slurp(whole / "ruler.jsonl");
  r = run_kvq("run --out " + whole.string() + " " + good);  // resumes: nothing left to run
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(testing::slurp(whole / "ruler.jsonl"), before);
  for (int i = 1; i <= 2; ++i) ASSERT_EQ(run_kvq(fmt::format("run --shard {}/2 {}", i, good)).status, 0);
  r = run_kvq("run --merge " + good);
  ASSERT_EQ(r.status, 0) << r.err;
  auto merged = jsonl(dir_ / "out" / "ruler.jsonl");
  ASSERT_EQ(merged.size(), rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    for (auto* row : {&rows[i], &merged[i]})
      for (const char* k : {"machine", "kvq", "seconds"}) row->erase(k);
    EXPECT_EQ(rows[i], merged[i]) << i;
  }
  const auto bad = [&](const std::string& ruler, const std::string& want) {
    const auto b = run_kvq("run --check " + cfg(ruler));
    EXPECT_NE(b.status, 0) << ruler;
    EXPECT_EQ(b.err_lines(), 1) << b.err;
    EXPECT_NE(b.err.find(want), std::string::npos) << b.err;
  };
  bad("tasks = [\"qa_1\"]\n", "[ruler].tasks: ruler: no task \"qa_1\" (tasks: niah_single_1,");
  bad("lengths = [512]\n", "[ruler].lengths 512 is outside [1024, 8192] (the model's context)");
  bad("lengths = [16384]\n", "[ruler].lengths 16384 is outside [1024, 8192]");
  bad("samples = 0\n", "[ruler].samples must be between 1 and 10000, got 0");
  bad("haystack = \"/nonexistent.txt\"\n", "[ruler].haystack (\"kjv\", \"noise\" or a text file)");
  bad("depth = [0.5]\n", "unknown key [ruler].depth (allowed: tasks, lengths");
}

// Issue 16: kvq run killed with SIGKILL at 20 points spread over a sweep (some inside a write),
// resumed after each kill: every file holds whole rows only, and the final rows equal an
// uninterrupted run's, none lost, none doubled. The same for a shard killed mid-run and merged.
TEST_F(RunCli, SigkillAt20Points_resumeEqualsUninterruptedRun_andShardsMerge) {
  const auto cfg = dir_ / "k.toml";
  const auto write_cfg = [&](const std::filesystem::path& out) {
    std::ofstream(cfg) << "out = \"" << out.string() << "\"\nschemes = [\"bf16\", \"fp8_e4m3:gran=token\"]\n"
                       << "[sweep]\ntemplate = \"int{b}:k={k},v=token,g={g},r=0\"\nb = [2, 3, 4, 8]\n"
                       << "k = [\"channel\", \"token\"]\ng = [8, 16, 32]\n"
                       << "[synthetic]\ntokens = 8192\nheads = 2\nhead_dim = 64\nqueries = 2\n";
  };
  const auto whole = dir_ / "whole", killed = dir_ / "killed";
  write_cfg(whole);
  const auto t0 = std::chrono::steady_clock::now();
  auto r = run_kvq("run " + cfg.string());
  ASSERT_EQ(r.status, 0) << r.err;
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const auto want = jsonl(whole / "synthetic.jsonl");
  ASSERT_EQ(want.size(), 26u);
  auto strip = [](std::vector<nlohmann::json> rows) {
    for (auto& row : rows) row.erase("machine"), row.erase("kvq");
    return rows;
  };
  write_cfg(killed);
  // Kill after 10-25% of the whole run's time, again and again: each run resumes, gets a little
  // further and is killed again (at a row, inside a row, or inside a write); when a run finishes
  // its rows must be the uninterrupted ones, and the sweep starts over until 20 runs were killed.
  int kills = 0, finished = 0, attempts = 0;
  std::set<size_t> rows_at_kill;  // how far the sweep was at each kill: spread over it
  while (kills < 20 && attempts++ < 400) {
    r = run_kvq(fmt::format("run {}", cfg.string()),
                fmt::format("timeout -s KILL {:.3f}", secs * (0.1 + 0.05 * (attempts % 4))));
    const auto p = killed / "synthetic.jsonl";
    if (r.status == 0) {
      ++finished;
      EXPECT_EQ(strip(jsonl(p)), strip(want)) << "after " << kills << " kills";
      std::filesystem::remove_all(killed);
      continue;
    }
    ASSERT_EQ(r.status, 137) << "neither finished nor killed: " << r.err;
    ++kills;
    if (!std::filesystem::exists(p)) continue;
    const std::string text = testing::slurp(p);
    ASSERT_TRUE(text.empty() || text.back() == '\n') << "a partial line after kill " << kills;
    std::set<std::string> keys;
    for (const auto& row : jsonl(p)) EXPECT_TRUE(keys.insert(row["key"]).second) << "doubled after kill " << kills;
    rows_at_kill.insert(keys.size());
  }
  EXPECT_EQ(kills, 20);
  EXPECT_GE(finished, 1) << "no killed sweep was resumed to the end";
  EXPECT_GE(rows_at_kill.size(), 6u) << "the kills did not spread over the sweep";
  // A leftover whose writer's PID now belongs to another live program (PID 1 here; PIDs wrap, and
  // CI found one reused by a thread) is stale too.
  std::ofstream(killed / "synthetic.csv.tmp.1") << "partial";
  std::ofstream(killed / "config.toml.tmp.1") << "partial";  // a kill inside the config's copy
  r = run_kvq("run " + cfg.string());
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(strip(jsonl(killed / "synthetic.jsonl")), strip(want));
  // What a kill inside a write left (TASK.jsonl.tmp.PID, config.toml.tmp.PID) is gone once a run
  // has reopened the folder.
  for (const auto& e : std::filesystem::directory_iterator(killed))
    EXPECT_EQ(e.path().string().find(".tmp."), std::string::npos) << "left " << e.path();
  // Shard 1 of 2 killed half-way and resumed, shard 2 whole, then merged: the uninterrupted rows.
  const auto sharded = dir_ / "sharded";
  write_cfg(sharded);
  // Killed once 3 of its 13 rows are on disk (a kill at a fixed share of the whole run's time
  // could come after the shard had finished when the host got faster meanwhile), at most 120 s.
  const auto rows1 = sharded / "shard-1-of-2" / "synthetic.jsonl";
  ASSERT_EQ(testing::signal_after_rows("run --shard 1/2 " + cfg.string(), rows1, 3, "KILL"), 137)
      << "shard 1 was to be killed part-way through its rows";
  ASSERT_LT(jsonl(rows1).size(), 13u) << "shard 1 finished before the kill";
  ASSERT_EQ(run_kvq("run --shard 1/2 " + cfg.string()).status, 0);
  ASSERT_EQ(run_kvq("run --shard 2/2 " + cfg.string()).status, 0);
  ASSERT_EQ(run_kvq("run --merge " + cfg.string()).status, 0);
  EXPECT_EQ(strip(jsonl(sharded / "synthetic.jsonl")), strip(want));
}

// Issue 16/11: Ctrl-C (SIGINT) stops a run cleanly, exit 130 with a line saying how to resume;
// the files hold whole rows only, and the rerun finishes the rest without doubling any.
TEST_F(RunCli, SigintStopsCleanly_rerunResumesWithoutDuplicates) {
  if (!std::filesystem::exists(cli::model_dir() + "/SmolLM2-135M-Instruct.Q4_1.gguf") ||
      !std::filesystem::exists(cli::model_dir() + "/kjv.txt"))
    GTEST_SKIP() << "model or text not fetched (scripts/fetch-model.sh, scripts/fetch-text.sh)";
  const auto p = dir_ / "s.toml";
  std::ofstream(p) << "name = \"s\"\nout = \"" << (dir_ / "out").string()
                   << "\"\nschemes = [\"bf16\", \"fp8_e4m3:gran=token\", \"kivi4\", \"kivi2\"]\n"
                      "[synthetic]\ntokens = 512\nheads = 2\nhead_dim = 64\nqueries = 2\n"
                      "[model]\nctx = 512\nmax_tokens = 1536\n";
  const auto log = dir_ / "err.txt";
  // A background job of a non-interactive shell starts with SIGINT ignored; kvq installs its own
  // handler when the rows start, so the signal is sent after that: once the 4 synthetic rows
  // (written before the model's) are on disk, at most 120 s (a fixed 3 s wait lost the race on a
  // slow host).
  EXPECT_EQ(testing::signal_after_rows("run " + p.string(), dir_ / "out" / "synthetic.jsonl", 4,
                                       "INT", log),
            130)
      << testing::slurp(log);
  EXPECT_NE(testing::slurp(log).find("run the same command again to resume"), std::string::npos)
      << testing::slurp(log);
  const size_t before = std::filesystem::exists(dir_ / "out" / "model.jsonl") ? jsonl(dir_ / "out" / "model.jsonl").size() : 0;
  EXPECT_LT(before, 4u) << "stopped before the model rows finished";
  EXPECT_EQ(jsonl(dir_ / "out" / "synthetic.jsonl").size(), 4u);  // whole lines only (parsed)
  const auto r = run_kvq("run " + p.string());
  ASSERT_EQ(r.status, 0) << r.err;
  const auto rows = jsonl(dir_ / "out" / "model.jsonl");
  ASSERT_EQ(rows.size(), 4u);
  std::set<std::string> keys;
  for (const auto& row : rows) keys.insert(row["key"].get<std::string>());
  EXPECT_EQ(keys.size(), 4u) << "no row doubled";
}

// [serve] (issue 47 items 3 and 4): serve-bench's schedule and run as config rows, one per
// mem x max_batch x scheme; a rerun resumes, 2 shards merge to the rows of one run, --check refuses
// bad keys, ranges, a cap that cannot hold a request and cuda without a device in one line each,
// and --smoke shrinks to 3 short requests. The model is the qwen2 fixture (2 layers, 1 KV head,
// head_dim 64, context 256), the text a file of this test. Expected numbers are worked by hand
// here from the definitions (evaluation/serve.h's policy, eval::serve_requests' lengths, bf16's 2
// bytes per element), not from the code under test.
TEST_F(RunCli, Serve_rowsPerCapAndBatch_heldAndBytesFromTheSchedule_resumesShardsAndChecks) {
  const auto text = dir_ / "text.txt";
  {
    std::ofstream t(text);
    for (int i = 0; i < 200; ++i) t << "In the beginning God created the heaven and the earth.\n";
  }
  const std::string model = std::string(KVQ_SOURCE_DIR) + "/tests/fixtures/hf/qwen2";
  const auto write = [&](const std::string& out, const std::string& schemes,
                         const std::string& serve) {
    const auto p = dir_ / "s.toml";
    std::ofstream(p) << "out = \"" << (dir_ / out).string() << "\"\nmodel_file = \"" << model
                     << "\"\nschemes = [" << schemes << "]\n[serve]\ntext = \"" << text.string()
                     << "\"\n" << serve;
    return p.string();
  };
  // 4 requests: prompt_tokens / 2 + (37 i mod 5) = 4, 6, 8, 5 prompt and gen / 2 + (13 i mod 3) =
  // 2, 3, 4, 2 output tokens (eval::serve_requests' definition). bf16 stores 2 layers x (K, V) x
  // 1 head x 64 x 2 bytes = 512 bytes per token, and each request reserves its prompt + outputs:
  // 6, 9, 12, 7 tokens. A cap of 15.5 tokens (7,936 bytes) holds requests 0 and 1, then 2 alone,
  // then 3 alone (first come first served: 2 blocks 3): steps 2 + 1 + 4 + 2 = 9 (hand-run below),
  // at most 2 held. 1 MB holds all 4 at once: 4 steps (the longest output).
  const std::string sizes = "requests = 4\nprompt_tokens = 8\ngen = 4\n";
  const std::string cfg = write("sv", "\"bf16\", \"kivi2\"",
                                sizes + "mem = [0.001, 0.000007936]\nmax_batch = [0, 1]\n");
  auto r = run_kvq("run --check " + cfg);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("serve rows (2): bf16, kivi2:g=32,r=128"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("x max_batch (0, 1): 8 rows of 4 requests"), std::string::npos) << r.out;
  r = run_kvq("run " + cfg);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("serve.csv; plot: .venv/bin/python experiments/plots/plot_serve.py " +
                       (dir_ / "sv").string() + ")"),
            std::string::npos)
      << r.out;
  const auto rows = jsonl(dir_ / "sv" / "serve.jsonl");
  ASSERT_EQ(rows.size(), 8u);
  struct Want {
    double mem;
    int max_batch, steps, held;
    double peak_tokens;  // the most tokens the held caches hold after a step
  };
  // Peak tokens, by hand: all 4 held, after step 2 they hold 4+1, 6+1, 8+1, 5+1 = 27 tokens; under
  // the cap, requests 0 and 1 after step 2: 5 + 7 = 12. With max_batch 1 one request at a time:
  // the longest, 8 + 3 = 11 before it leaves.
  const Want want[] = {{0.001, 0, 4, 4, 27},
                       {0.001, 1, 11, 1, 11},
                       {0.000007936, 0, 9, 2, 12},
                       {0.000007936, 1, 11, 1, 11}};
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto& row = rows[i];
    const Want& w = want[i / 2];
    SCOPED_TRACE(row.dump());
    EXPECT_EQ(row["scheme"], i % 2 == 0 ? "bf16" : "kivi2:g=32,r=128");
    EXPECT_DOUBLE_EQ(row["settings"]["mem"].get<double>(), w.mem);
    EXPECT_EQ(row["settings"]["max_batch"], w.max_batch);
    EXPECT_EQ(row["settings"]["requests"], 4);
    EXPECT_EQ(row["max_held"], w.held);
    EXPECT_EQ(row["steps"], w.steps);
    // every request's prompt once, and its outputs after the first (which its prefill yields)
    EXPECT_EQ(row["prefill_tokens"], 4 + 6 + 8 + 5);
    EXPECT_EQ(row["decode_tokens"], 1 + 2 + 3 + 1);
    EXPECT_GT(row["decode_tokens_per_s"].get<double>(), 0.0);
    EXPECT_GT(row["prefill_tokens_per_s"].get<double>(), 0.0);
    EXPECT_EQ(row["batched"], false) << "the host backends decode a step's requests in turn";
    EXPECT_FALSE(row.contains("bound_decode_tokens_per_s")) << "the bound needs a device's peak";
    EXPECT_FALSE(row.value("machine", "").empty());
    if (i % 2 == 0) {  // bf16: the bytes by hand; the cache measured equals the schedule's count
      EXPECT_DOUBLE_EQ(row["peak_cache_bytes"].get<double>(), w.peak_tokens * 512);
      EXPECT_DOUBLE_EQ(row["predicted_peak_cache_bytes"].get<double>(), w.peak_tokens * 512);
      EXPECT_LE(row["peak_reserved_bytes"].get<double>(), w.mem * 1e9);
    }
    // kivi2 under r = 128 keeps these few tokens exact, as fp16: bf16's bytes and schedule
    if (i % 2 == 1) {
      EXPECT_EQ(row["steps"], rows[i - 1]["steps"]);
      EXPECT_DOUBLE_EQ(row["peak_cache_bytes"].get<double>(),
                       row["predicted_peak_cache_bytes"].get<double>());
    }
  }
  r = run_kvq("run " + cfg);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(jsonl(dir_ / "sv" / "serve.jsonl").size(), 8u) << "a rerun adds nothing";
  for (int i = 1; i <= 2; ++i)
    ASSERT_EQ(
        run_kvq(fmt::format("run --shard {}/2 --out {} {}", i, (dir_ / "sh").string(), cfg)).status,
        0);
  r = run_kvq(fmt::format("run --merge --out {} {}", (dir_ / "sh").string(), cfg));
  ASSERT_EQ(r.status, 0) << r.err;
  const auto merged = jsonl(dir_ / "sh" / "serve.jsonl");
  ASSERT_EQ(merged.size(), rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    EXPECT_EQ(merged[i]["key"], rows[i]["key"]) << i;
    EXPECT_EQ(merged[i]["settings"], rows[i]["settings"]) << i;
    EXPECT_EQ(merged[i]["max_held"], rows[i]["max_held"]) << i;
  }
  // --smoke: 3 requests of at most 16 prompt and 4 output tokens, the largest cap and the first
  // batch limit: one row per scheme
  r = run_kvq("run --smoke --out " + (dir_ / "sm").string() + " " + cfg);
  ASSERT_EQ(r.status, 0) << r.err;
  const auto smoke = jsonl(dir_ / "sm" / "serve.jsonl");
  ASSERT_EQ(smoke.size(), 2u);
  EXPECT_EQ(smoke[0]["settings"]["smoke"], true);
  EXPECT_EQ(smoke[0]["settings"]["requests"], 3);
  EXPECT_DOUBLE_EQ(smoke[0]["settings"]["mem"].get<double>(), 0.001);
  EXPECT_EQ(smoke[0]["prefill_tokens"], 4 + 6 + 8);
  // --check refusals: one line each, before the model loads, nothing written
  const auto refused = [&](const std::string& serve, const std::string& want) {
    const auto c = write("bad", "\"bf16\"", serve);
    const auto b = run_kvq("run --check " + c);
    EXPECT_NE(b.status, 0) << serve;
    EXPECT_NE(b.err.find(want), std::string::npos) << serve << "\n" << b.err;
    EXPECT_FALSE(std::filesystem::exists(dir_ / "bad")) << serve;
  };
  refused(sizes + "memory = 1\n", "unknown key [serve].memory (allowed: mem, max_batch");
  refused(sizes + "mem = 0\n", "[serve].mem 0 GB is outside (0, 1000000]");
  refused(sizes + "mem = []\n", "[serve].mem is an empty array");
  refused(sizes + "mem = \"1\"\n", "[serve].mem must be a number or an array of numbers");
  refused(sizes + "max_batch = [-1]\n", "[serve].max_batch -1 is outside [0, 4096]");
  refused(sizes + "max_batch = [1.5]\n", "[serve].max_batch must be an integer or an array");
  refused("requests = 0\n", "[serve].requests must be between 1 and 100000, got 0");
  refused("gen = 1\n", "[serve].gen must be between 2 and 1048576, got 1");
  refused("prompt_tokens = 250\ngen = 10\n",
          "[serve].prompt_tokens 250 + [serve].gen 10 exceed the model's context 256");
  refused("backend = \"gpu\"\n", "[serve].backend: unknown backend 'gpu' (choices: ref,");
  // a cap under one request's bytes: request 2 reserves 12 tokens x 512 bytes
  refused(sizes + "mem = 0.000006\n",
          "takes 6144 bytes of bf16 cache, more than the 6000-byte cap alone");
  // backend cuda: checked statically, refused without a device in the one line
  const auto cuda = write("cu", "\"kivi2\"", sizes + "backend = \"cuda\"\n");
  EXPECT_EQ(run_kvq("run --check " + cuda).status, 0);
  if (const std::string why = cuda_unavailable(); !why.empty()) {
    r = run_kvq("run " + cuda);
    EXPECT_NE(r.status, 0);
    EXPECT_EQ(r.err_lines(), 1) << r.err;
    EXPECT_NE(r.err.find("[serve].backend \"cuda\": " + why), std::string::npos) << r.err;
    EXPECT_FALSE(std::filesystem::exists(dir_ / "cu" / "serve.jsonl"));
  }
}

// Every config shipped in experiments/configs passes `kvq run --check` (its keys, types, ranges and
// every row against the shapes it meets) without running anything. The [model] checks need the
// fetched model; without it the test says so and skips.
TEST(RunConfigs, EveryShippedConfigPassesCheck) {
  if (!std::filesystem::exists(cli::model_dir() + "/SmolLM2-135M-Instruct.Q4_1.gguf") ||
      !std::filesystem::exists(cli::model_dir() + "/kjv.txt"))
    GTEST_SKIP() << "model or text not fetched (scripts/fetch-model.sh, scripts/fetch-text.sh)";
  // Configs name files relative to the repo root (out = "results/...", scale=calib:experiments/...).
  const auto cwd = std::filesystem::current_path();
  std::filesystem::current_path(KVQ_SOURCE_DIR);
  int n = 0;
  for (const auto& e :
       std::filesystem::directory_iterator(std::string(KVQ_SOURCE_DIR) + "/experiments/configs")) {
    if (e.path().extension() != ".toml") continue;
    ++n;
    const auto r = run_kvq("run --check " + e.path().string());
    EXPECT_EQ(r.status, 0) << e.path() << ": " << r.err;
    EXPECT_NE(r.out.find("ok, nothing run (--check)"), std::string::npos) << r.out;
  }
  std::filesystem::current_path(cwd);
  EXPECT_GE(n, 6) << "default, kivi_ablation, granularity, kv_split, context and needle at least";
}

// The configs shipped in experiments/configs, sorted by name.
std::vector<std::filesystem::path> shipped_configs() {
  std::vector<std::filesystem::path> out;
  for (const auto& e :
       std::filesystem::directory_iterator(std::string(KVQ_SOURCE_DIR) + "/experiments/configs"))
    if (e.path().extension() == ".toml") out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

TEST(RunConfigs, ShipsTheConfigsTheSmokeRunsCover) {
  EXPECT_GE(shipped_configs().size(), 7u) << "experiments/configs/ ships 7 configs at least";
}

// Issue 11: every shipped config runs, at a tiny size (--smoke: the same code path, synthetic
// tokens <= 256, model windows <= 64 over 128 tokens), and its rows carry the binary's version and
// the machine. Expected row counts: what `--check` lists for the config. One test per config, so
// ctest runs them side by side.
class ShippedConfig : public ::testing::TestWithParam<std::filesystem::path> {};

TEST_P(ShippedConfig, RunsAtSmokeSize) {
  if (!std::filesystem::exists(cli::model_dir() + "/SmolLM2-135M-Instruct.Q4_1.gguf") ||
      !std::filesystem::exists(cli::model_dir() + "/kjv.txt"))
    GTEST_SKIP() << "model or text not fetched (scripts/fetch-model.sh, scripts/fetch-text.sh)";
  const std::filesystem::path config = GetParam();
  const auto cwd = std::filesystem::current_path();
  std::filesystem::current_path(KVQ_SOURCE_DIR);
  const auto dir = testing::temp_dir("smoke");
  const auto count = [](const std::string& listing, const std::string& task) {
    const size_t at = listing.find(task + " rows (");
    return at == std::string::npos ? 0 : std::stoul(listing.substr(at + task.size() + 7));
  };
  // runs once; `return` leaves through the cleanup below
  [&] {
    const auto out = dir / config.stem();
    const auto dry = run_kvq("run --dry-run " + config.string());
    EXPECT_EQ(dry.status, 0) << config << ": " << dry.err;
    const std::string& listing = dry.out;
    const auto r = run_kvq("run --smoke --out " + out.string() + " " + config.string());
    // a config for backend cuda (throughput_cuda.toml, model_cuda.toml) without a device: that one
    // line, nothing else
    if (const std::string why = cuda_unavailable();
        r.status != 0 && !why.empty() && r.err.find(why) != std::string::npos) {
      EXPECT_EQ(r.err_lines(), 1) << config << ": " << r.err;
      return;
    }
    EXPECT_EQ(r.status, 0) << config << ": " << r.err;
    if (r.status != 0) return;
    const size_t nsyn = count(listing, "synthetic"), nmod = count(listing, "model"),
                 nneedle = count(listing, "needle"), ntp = count(listing, "throughput"),
                 nruler = count(listing, "ruler"), nserve = count(listing, "serve");
    EXPECT_GT(nsyn + nmod + nneedle + ntp + nruler + nserve, 0u) << config << ": the listing names no rows: " << listing;
    if (ntp) {  // one context and batch, every scheme per op and backend: at least bf16 + one
      const auto rows = jsonl(out / "throughput.jsonl");
      EXPECT_GE(rows.size(), 2u) << config;
      EXPECT_EQ(rows.front()["scheme"], "bf16") << config;
      EXPECT_EQ(rows.front()["settings"]["smoke"], true) << config;
    }
    if (nsyn) {
      const auto rows = jsonl(out / "synthetic.jsonl");
      EXPECT_EQ(rows.size(), nsyn) << config;
      EXPECT_EQ(rows.front()["settings"]["tokens"], 256) << config;
      EXPECT_NE(rows.front().value("kvq", "").find("kvq "), std::string::npos) << rows.front().dump();
      EXPECT_FALSE(rows.front().value("machine", "").empty());
    }
    if (nmod) {
      const auto rows = jsonl(out / "model.jsonl");
      EXPECT_EQ(rows.size(), nmod) << config << " (windows of different lengths collapse to 64)";
      EXPECT_EQ(rows.front()["settings"]["ctx"], 64) << config;
      EXPECT_EQ(rows.front()["settings"]["smoke"], true) << config;
    }
    if (nneedle) {  // one 256-token trial per depth
      const auto rows = jsonl(out / "needle.jsonl");
      EXPECT_TRUE(!rows.empty() && rows.size() % nneedle == 0) << config << ": " << rows.size();
      EXPECT_EQ(rows.front()["settings"]["ctx"], 256) << config;
      EXPECT_TRUE(rows.front()["fp32_correct"].is_boolean()) << rows.front().dump();
    }
    if (nruler) {  // the first task once at 1,024 tokens: one row per scheme
      const auto rows = jsonl(out / "ruler.jsonl");
      EXPECT_EQ(rows.size(), nruler) << config;
      EXPECT_EQ(rows.front()["settings"]["length"], 1024) << config;
      EXPECT_TRUE(rows.front()["fp32_score"].is_number()) << rows.front().dump();
    }
    if (nserve) {  // the largest cap, 3 requests of <= 16 prompt and <= 4 output tokens
      const auto rows = jsonl(out / "serve.jsonl");
      EXPECT_EQ(rows.size(), nserve) << config;
      EXPECT_EQ(rows.front()["settings"]["smoke"], true) << config;
      EXPECT_EQ(rows.front()["settings"]["requests"], 3) << config;
      EXPECT_LE(rows.front()["prefill_tokens"].get<int>(), 3 * 16) << rows.front().dump();
      EXPECT_GT(rows.front()["decode_tokens_per_s"].get<double>(), 0.0) << rows.front().dump();
      EXPECT_GE(rows.front()["max_held"].get<int>(), 1) << rows.front().dump();
    }
  }();
  std::filesystem::current_path(cwd);
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(RunConfigs, ShippedConfig, ::testing::ValuesIn(shipped_configs()),
                         [](const ::testing::TestParamInfo<std::filesystem::path>& i) {
                           std::string n = i.param.stem().string();
                           for (char& c : n)
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           return n;
                         });

}  // namespace
}  // namespace kvq
