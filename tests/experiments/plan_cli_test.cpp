// `kvq plan` end to end: the design note's numbers in the table and the JSON, --help, and one
// stderr line with a nonzero exit for each bad input.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

namespace {

struct Result {
  int rc = -1;
  std::string out, err;
};

// Runs `kvq plan ARGS` (ARGS go through sh), capturing stdout and stderr.
Result run_plan(const std::string& args) {
  static int counter = 0;
  const auto err_path =
      std::filesystem::temp_directory_path() /
      ("kvq_plan_cli_" + std::to_string(getpid()) + "_" + std::to_string(counter++) + ".err");
  const std::string cmd =
      std::string("'") + KVQ_BINARY + "' plan " + args + " 2>'" + err_path.string() + "'";
  Result r;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  const int status = pclose(p);
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::ifstream f(err_path);
  std::stringstream ss;
  ss << f.rdbuf();
  r.err = ss.str();
  std::filesystem::remove(err_path);
  return r;
}

// The whitespace-separated cells of the first table line starting with `label` + a space.
std::vector<std::string> row(const std::string& table, const std::string& label) {
  std::istringstream lines(table);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind(label + " ", 0) != 0) continue;
    std::istringstream cells(line);
    std::vector<std::string> v;
    for (std::string c; cells >> c;) v.push_back(c);
    return v;
  }
  return {};
}

TEST(plan_cli, DefaultIsTheDesignNote) {
  const Result r = run_plan("");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.err, "");
  // KV format, KiB/token, bits/elem, tokens in 55 GB, 4,096-token reqs, decode batch, KV read GB,
  // min step ms, tokens/s (64 / 9.802 ms = 6,529; 64 / 7.298 ms = 8,769), speedup.
  const std::vector<std::string> bf16 = {"bf16", "128.00", "16.00", "419,617", "102",
                                         "64",   "16.8",   "9.8",   "6,529",   "1.00x"};
  const std::vector<std::string> fp8 = {"fp8", "64.00", "8.00", "839,233", "204",
                                        "64",  "8.4",   "7.3",  "8,769",   "1.34x"};
  EXPECT_EQ(row(r.out, "bf16"), bf16) << r.out;
  EXPECT_EQ(row(r.out, "fp8"), fp8) << r.out;
  for (const char* s : {"llama-3.1-8b", "32 layers", "8 kv heads", "head dim 128", "55 GB",
                        "4,096 tokens", "batch 64 x 2,000", "h100-sxm", "3.35 TB/s", "16.06 GB"})
    EXPECT_NE(r.out.find(s), std::string::npos) << "missing '" << s << "' in\n" << r.out;
  // The design note's two rows come first; any extra rows are named by their full spec.
  EXPECT_LT(r.out.find("\nbf16 "), r.out.find("\nfp8 "));
  EXPECT_NE(r.out.find("fp8          = fp8_e4m3:gran=tensor,scale=dynamic"), std::string::npos);
}

TEST(plan_cli, Json) {
  const Result r = run_plan("--json --kv bf16 fp8 kivi2:g=32,r=128");
  ASSERT_EQ(r.rc, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["rows"].size(), 3u);
  const auto& bf16 = j["rows"][0];
  const auto& fp8 = j["rows"][1];
  const auto& kivi2 = j["rows"][2];
  EXPECT_EQ(bf16["kv"], "bf16");
  EXPECT_EQ(bf16["bytes_per_token"], 131072.0);
  EXPECT_EQ(bf16["tokens_in_mem_rounded"], 419617);
  EXPECT_EQ(bf16["requests"], 102);
  EXPECT_EQ(bf16["decode_kv_bytes"], 16777216000.0);
  EXPECT_NEAR(bf16["step_ms"].get<double>(), 9.802, 5e-4);
  EXPECT_EQ(fp8["tokens_in_mem_rounded"], 839233);
  EXPECT_EQ(fp8["requests"], 204);
  EXPECT_NEAR(fp8["decode_kv_bytes"].get<double>(), 8.4e9, 0.05e9);
  EXPECT_NEAR(fp8["step_ms"].get<double>(), 7.298, 5e-4);
  EXPECT_EQ(kivi2["bytes_per_token"], 26240.0);  // worked out in planner_test.cpp
  EXPECT_EQ(kivi2["requests"], 511);
  EXPECT_EQ(j["model"]["name"], "llama-3.1-8b");
  EXPECT_EQ(j["weight_bytes"], 16.06e9);
}

TEST(plan_cli, OptionsChangeTheAssumptions) {
  const Result r = run_plan(
      "--model llama-3.1-70b --gpu h200 --weights-bytes 70.6 --mem 60GB --ctx 32768 --batch 8 "
      "--decode-ctx 32768 --kv bf16 int4");
  ASSERT_EQ(r.rc, 0) << r.err;
  // bf16: 80 x 8 x 128 x 2 x 2 = 327,680 B = 320 KiB per token; 60e9 / 327,680 = 183,105.5;
  // one 32,768-token request: 10.74 GB -> 5 requests, so the decode batch of 8 is capped at 5:
  // KV read 5 x 10.737 = 53.7 GB; step (70.6 + 53.7) GB / 4.8 TB/s = 25.9 ms; 5 / 25.89 ms = 193
  // tokens/s.
  const std::vector<std::string> bf16 = {"bf16", "320.00", "16.00", "183,105", "5",
                                         "5",    "53.7",   "25.9",  "193",     "1.00x"};
  EXPECT_EQ(row(r.out, "bf16"), bf16) << r.out;
  EXPECT_NE(r.out.find("note: bf16: only 5 requests of 32,768 tokens fit in 60 GB of KV memory: "
                       "its decode batch is 5, not --batch 8"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("tokens in 60 GB"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("h200: 141 GB, 4.8 TB/s"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("70.6 GB (--weights-bytes)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("int4         = int4:k=channel,v=token,g=32,r=0"), std::string::npos);
}

TEST(plan_cli, CustomModel) {
  const Result r = run_plan(
      "--layers 30 --kv-heads 3 --head-dim 64 --params 0.135 --bandwidth 0.3 --mem 8 --kv bf16");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(row(r.out, "bf16").at(1), "22.50") << r.out;  // 30 x 3 x 64 x 2 x 2 = 23,040 B
  EXPECT_NE(r.out.find("custom: 30 layers, 3 kv heads, head dim 64"), std::string::npos);
  EXPECT_NE(r.out.find("0.3 TB/s (--bandwidth)"), std::string::npos) << r.out;
}

TEST(plan_cli, HelpTeaches) {
  const Result r = run_plan("--help");
  ASSERT_EQ(r.rc, 0);
  for (const char* s : {"--model",
                        "--layers",
                        "--kv-heads",
                        "--head-dim",
                        "--params",
                        "--kv",
                        "--mem",
                        "--ctx",
                        "--batch",
                        "--decode-ctx",
                        "--gpu",
                        "--bandwidth",
                        "--weights-bytes",
                        "--json",
                        "Example",
                        "55 GB",
                        "=4096",
                        "=64",
                        "=2000",
                        "llama-3.1-70b",
                        "smollm2-135m",
                        "a100-80gb",
                        "kivi2:g=32,r=128",
                        "--weights-dtype",
                        "gpu_memory_utilization"})
    EXPECT_NE(r.out.find(s), std::string::npos) << "missing '" << s << "' in --help";
}

struct BadCase {
  const char* args;
  const char* names;  // the bad value the one stderr line must name
};

void PrintTo(const BadCase& c, std::ostream* os) { *os << "kvq plan " << c.args; }

class plan_cli_bad : public ::testing::TestWithParam<BadCase> {};

TEST_P(plan_cli_bad, OneLineAndNonzeroExit) {
  const Result r = run_plan(GetParam().args);
  EXPECT_NE(r.rc, 0) << GetParam().args;
  EXPECT_NE(r.rc, -1) << "killed by a signal: " << GetParam().args;
  EXPECT_EQ(r.out, "") << GetParam().args;
  ASSERT_FALSE(r.err.empty()) << GetParam().args;
  EXPECT_EQ(r.err.back(), '\n') << r.err;
  EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << "more than one line:\n" << r.err;
  EXPECT_NE(r.err.find(GetParam().names), std::string::npos) << r.err;
}

INSTANTIATE_TEST_SUITE_P(
    Inputs, plan_cli_bad,
    ::testing::Values(BadCase{"--model llama-9b", "llama-9b' (allowed: llama-3.1-8b"},
                      BadCase{"--gpu b200", "b200' (allowed: h100-sxm, h200, a100-80gb, l4)"},
                      BadCase{"--ctx 0", "--ctx 0"}, BadCase{"--ctx -4096", "--ctx -4096"},
                      BadCase{"--batch 0", "--batch 0"},
                      BadCase{"--decode-ctx -1", "--decode-ctx -1"},
                      BadCase{"--mem 0", "--mem '0'"}, BadCase{"--mem -55", "--mem '-55'"},
                      BadCase{"--mem lots", "--mem 'lots'"},
                      BadCase{"--weights-bytes -16", "--weights-bytes '-16'"},
                      BadCase{"--bandwidth 0", "--bandwidth 0"},
                      BadCase{"--gpu h200 --bandwidth 4.8", "not both"},
                      BadCase{"--layers 32 --kv-heads 8", "missing --head-dim, --params"},
                      BadCase{"--layers 0 --kv-heads 8 --head-dim 128 --params 8", "--layers 0"},
                      BadCase{"--model mistral-7b --head-dim 64", "cannot be combined"},
                      BadCase{"--kv bf16 fp7", "'fp7'"}, BadCase{"--kv kivi2:g=48", "g=48"},
                      BadCase{"--kv int4:g=64", "int4:g=64"}, BadCase{"--ctx ten", "ten"},
                      BadCase{"--frobnicate", "--frobnicate"}),
    [](const ::testing::TestParamInfo<BadCase>& info) {
      std::string name;  // "--kv bf16 fp7" -> "kv_bf16_fp7", "--ctx -1" -> "ctx_minus1"
      for (const char* c = info.param.args; *c; ++c) {
        const bool negative = *c == '-' && std::isdigit(static_cast<unsigned char>(c[1])) &&
                              (c == info.param.args || c[-1] == ' ');
        if (negative) name += "minus";
        const bool alnum = std::isalnum(static_cast<unsigned char>(*c));
        if (alnum)
          name += *c;
        else if (!name.empty() && name.back() != '_')
          name += '_';
      }
      return name;
    });

// Issue 14's planner findings: the speed-up is against bf16 whatever --kv lists, the weights'
// dtype sets their bytes, the KV memory defaults to what the GPU has left, and --json takes a file.
TEST(plan_cli, SpeedupAgainstBf16_evenWhenNotListed) {
  const Result r = run_plan("--kv kivi2 fp8");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(row(r.out, "kivi2").back(), "1.65x") << r.out;  // the default table's kivi2 row
  EXPECT_EQ(row(r.out, "fp8").back(), "1.34x") << r.out;
}

TEST(plan_cli, WeightsDtypeAndKvMemoryFromTheGpu) {
  // 70.6 B params x 1 byte (fp8) = 70.6 GB; 90% of 141 GB - 70.6 GB = 56.3 GB of KV memory.
  Result r = run_plan("--model llama-3.1-70b --gpu h200 --weights-dtype fp8 --kv bf16");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("weights    70.6 GB (70.6 B params x 1 bytes, fp8)"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("KV memory  56.3 GB (90% of the h200's 141 GB - 70.6 GB of weights"),
            std::string::npos)
      << r.out;
  // bf16 weights (141.2 GB) leave nothing: one line saying what to change.
  r = run_plan("--model llama-3.1-70b --gpu h200");
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find("141.2 GB of weights do not fit in 90% of the h200's 141 GB"),
            std::string::npos)
      << r.err;
  // --bandwidth has no memory to derive it from.
  r = run_plan("--layers 30 --kv-heads 3 --head-dim 64 --params 0.135 --bandwidth 0.3");
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find("give --mem"), std::string::npos) << r.err;
}

TEST(plan_cli, JsonToAFile_tableStillPrinted) {
  const auto path = std::filesystem::temp_directory_path() /
                    ("kvq_plan_json_" + std::to_string(getpid()) + ".json");
  const Result r = run_plan("--json '" + path.string() + "'");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("KV format"), std::string::npos) << r.out;
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  std::filesystem::remove(path);
  const auto j = nlohmann::json::parse(ss.str());
  EXPECT_EQ(j["rows"][0]["tokens_in_mem_rounded"], 419617);
  // fp8 against bf16, by hand (tests/evaluation/planner_test.cpp's design-note figures): the same
  // batch of 64, so the speed-up is the ratio of the step bounds,
  // (16.06e9 + 64 x 2,000 x 131,072) / (16.06e9 + 64 x (2,000 x 65,536 + 256)) = 1.343111.
  EXPECT_EQ(j["rows"][1]["kv"], "fp8");
  EXPECT_NEAR(j["rows"][1]["speedup_vs_bf16"].get<double>(), 1.343111, 1e-6);
}

// Issue 14: a batch x context sweep the plots can read. Each CSV row is the plan of that batch and
// context (checked against the default table: batch 64 at 2,000 tokens gives bf16 6,529 tokens/s),
// and a batch beyond what fits is capped (55 GB / (32,000 x 128 KiB) = 13 bf16 requests).
TEST(plan_cli, SweepCsv_oneRowPerBatchContextAndFormat) {
  const auto path = std::filesystem::temp_directory_path() /
                    ("kvq_plan_sweep_" + std::to_string(getpid()) + ".csv");
  const Result r =
      run_plan("--kv bf16 kivi2 --sweep-batch 64 256 --sweep-ctx 2000 32000 --sweep-csv '" +
               path.string() + "'");
  ASSERT_EQ(r.rc, 0) << r.err;
  std::ifstream f(path);
  std::vector<std::vector<std::string>> rows;
  for (std::string line; std::getline(f, line);) {
    std::vector<std::string> cells;
    std::stringstream ss(line);
    for (std::string c; std::getline(ss, c, ',');) cells.push_back(c);
    rows.push_back(cells);
  }
  std::filesystem::remove(path);
  ASSERT_EQ(rows.size(), 1u + 2 * 2 * 2) << "header + batches x contexts x formats";
  EXPECT_EQ(rows[0][0], "kv");
  bool seen_default = false, seen_capped = false;
  for (size_t i = 1; i < rows.size(); ++i) {
    const auto& c = rows[i];
    if (c[0] == "\"bf16\"" && c[2] == "64" && c[3] == "2000") {
      EXPECT_EQ(std::llround(std::stod(c[7])), 6529);
      seen_default = true;
    }
    if (c[0] == "\"bf16\"" && c[2] == "256" && c[3] == "32000") {
      EXPECT_EQ(c[4], "13");  // floor(55e9 / (32,000 x 131,072 B)) requests fit
      seen_capped = true;
    }
  }
  EXPECT_TRUE(seen_default && seen_capped);
  const Result bad = run_plan("--sweep-batch 8");
  EXPECT_NE(bad.rc, 0);
  EXPECT_NE(bad.err.find("need --sweep-csv FILE"), std::string::npos) << bad.err;
}

}  // namespace
