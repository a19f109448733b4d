// Bad inputs of docs/bad-inputs.md that have no home in a parser's own tests: the output side (a
// directory nothing can be created in, a file-size limit standing in for a full disk) and the
// model side (no model where kvq looks, a GGUF of another architecture, a file that is no GGUF).
// Each must give one line on stderr and a nonzero exit, and lose nothing already written.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>

#include "evaluation/model_files.h"
#include "tests/support/gguf_writer.h"
#include "tests/support/run_cli.h"

namespace kvq {
namespace {

using testing::run_kvq;

class BadInputs : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = testing::temp_dir("bad_inputs"); }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string synthetic_config(const std::string& out, int rows) const {
    const auto p = dir_ / "c.toml";
    std::string schemes;
    const char* all[] = {"bf16", "fp8_e4m3:gran=token", "fp8_e4m3:gran=head", "kivi4:g=32,r=0",
                         "kivi2:g=32,r=0", "int3:k=channel,v=token", "int8:k=channel,v=token",
                         "fp8_e5m2:gran=token"};
    for (int i = 0; i < rows; ++i) schemes += fmt::format("{}\"{}\"", i ? ", " : "", all[i]);
    std::ofstream(p) << "out = \"" << out << "\"\nschemes = [" << schemes
                     << "]\n[synthetic]\ntokens = 64\nheads = 2\nhead_dim = 64\nqueries = 1\n";
    return p.string();
  }
  std::filesystem::path dir_;
};

// A results directory that cannot be created (/proc takes no new entries; as root a chmod would
// not stop a write, so /proc stands in for a read-only file system).
TEST_F(BadInputs, OutputDirectoryNotCreatable_oneLineNamingIt) {
  const auto r = run_kvq("run " + synthetic_config("/proc/kvq-results", 1));
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.err_lines(), 1) << r.err;
  EXPECT_NE(r.err.find("/proc/kvq-results: cannot create the results directory"), std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("give --out DIR somewhere writable"), std::string::npos) << r.err;
}

// A full disk, simulated by a file-size limit (ulimit -f): the write that does not fit fails with
// a line naming the file; the rows written before it are whole and a rerun without the limit
// finishes the rest, none doubled.
TEST_F(BadInputs, FileSizeLimit_writeFailsWithALine_rowsKept_rerunResumes) {
  const std::string out = (dir_ / "out").string();
  const std::string cfg = synthetic_config(out, 8);
  // sh's ulimit -f counts 512-byte blocks: 1.5 KiB, a few rows fit and then the CSV outgrows it
  auto r = run_kvq("run " + cfg, "ulimit -f 3;");
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_NE(r.err.find("kvq: error: " + out + "/synthetic."), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("write failed (File too large)"), std::string::npos) << r.err;
  const auto before = testing::jsonl(std::filesystem::path(out) / "synthetic.jsonl");
  EXPECT_GE(before.size(), 1u);
  EXPECT_LT(before.size(), 8u);
  for (const auto& e : std::filesystem::directory_iterator(out))
    EXPECT_EQ(e.path().string().find(".tmp."), std::string::npos) << "left behind: " << e.path();
  r = run_kvq("run " + cfg);
  ASSERT_EQ(r.status, 0) << r.err;
  const auto after = testing::jsonl(std::filesystem::path(out) / "synthetic.jsonl");
  ASSERT_EQ(after.size(), 8u);
  for (size_t i = 0; i < before.size(); ++i) EXPECT_EQ(after[i], before[i]) << i;
  std::set<std::string> keys;
  for (const auto& row : after) EXPECT_TRUE(keys.insert(row["key"]).second) << row["key"];
}

// A results file whose rows kvq did not write: a line that is not JSON, a row that is not an
// object, and one whose "key" is a number. One line naming the file and the line, and the file
// untouched (expected from the contract in docs/bad-inputs.md; before session 28 the last two
// gave nlohmann's type_error text without the file).
TEST_F(BadInputs, ResultsRowOfAnotherShape_oneLineNamingFileAndLine_fileKept) {
  const std::string out = (dir_ / "out").string();
  const std::string cfg = synthetic_config(out, 1);
  std::filesystem::create_directories(out);
  const auto rows = std::filesystem::path(out) / "synthetic.jsonl";
  const std::pair<std::string, std::string> cases[] = {
      {"{not json", ":1: not a JSON line; delete the file or the line to rerun"},
      {"7", ":1: not a kvq run row"},
      {R"({"key": 5, "settings": {}})", ":1: not a kvq run row"}};
  for (const auto& [bad, want] : cases) {
    std::ofstream(rows) << bad << "\n";
    const auto r = run_kvq("run " + cfg);
    EXPECT_EQ(r.status, 1) << bad;
    // the plan's line ("kvq run: 1 synthetic ... rows -> DIR") and one error line
    EXPECT_LE(r.err_lines(), 2) << r.err;
    EXPECT_NE(r.err.find("kvq: error: " + rows.string() + want), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("kvq: error:"), r.err.rfind("kvq: error:")) << r.err;
    EXPECT_EQ(r.err.find("json.exception"), std::string::npos) << r.err;
    EXPECT_EQ(testing::slurp(rows), bad + "\n");
  }
}

// No model where kvq looks for it: the message names the path and the command that fetches it.
TEST_F(BadInputs, ModelDirectoryWithoutTheModel_namesPathAndFetchScript) {
  const auto r = run_kvq("model generate --prompt hi", "KVQ_MODEL_DIR='" + dir_.string() + "'");
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.err_lines(), 1) << r.err;
  EXPECT_NE(r.err.find(dir_.string() + "/SmolLM2-135M-Instruct.Q4_1.gguf not found"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("run scripts/fetch-model.sh"), std::string::npos) << r.err;
}

// A GGUF whose architecture is not llama, a llama GGUF with 0 layers, and a file that is not a
// GGUF at all.
TEST_F(BadInputs, GgufOfAnotherArchitecture_zeroLayers_andNotAGguf) {
  namespace gw = testing::gguf_writer;
  const auto gpt2 = dir_ / "gpt2.gguf";
  std::ofstream(gpt2, std::ios::binary)
      << gw::Builder{}
             .kv("general.architecture", gw::VT::kString, gw::gstr("gpt2"))
             .tensor({"token_embd.weight", {4, 2}, 0, std::string(32, '\0'), {}})
             .build();
  auto r = run_kvq("model ppl --model-file '" + gpt2.string() + "'");
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.err_lines(), 1) << r.err;
  EXPECT_NE(r.err.find("gpt2.gguf: architecture 'gpt2' is not supported (only llama)"),
            std::string::npos)
      << r.err;
  // A llama GGUF whose layer count is 0 (the counts were never checked; 0 heads divided).
  const auto zero = dir_ / "zero_layers.gguf";
  std::ofstream(zero, std::ios::binary)
      << gw::Builder{}
             .kv("general.architecture", gw::VT::kString, gw::gstr("llama"))
             .kv("llama.block_count", gw::VT::kUint32, gw::u32(0))
             .kv("llama.embedding_length", gw::VT::kUint32, gw::u32(64))
             .kv("llama.attention.head_count", gw::VT::kUint32, gw::u32(4))
             .kv("llama.attention.head_count_kv", gw::VT::kUint32, gw::u32(2))
             .kv("llama.feed_forward_length", gw::VT::kUint32, gw::u32(128))
             .kv("llama.context_length", gw::VT::kUint32, gw::u32(256))
             .kv("llama.attention.layer_norm_rms_epsilon", gw::VT::kFloat32, gw::le(1e-5f))
             .build();
  r = run_kvq("model generate --prompt hi --model-file '" + zero.string() + "'");
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.err_lines(), 1) << r.err;
  EXPECT_NE(r.err.find("zero_layers.gguf: llama.block_count = 0 is outside [1, 16777216]"),
            std::string::npos)
      << r.err;
  const auto text = dir_ / "notes.gguf";
  std::ofstream(text) << "these are notes, not a model\n";
  r = run_kvq("model ppl --model-file '" + text.string() + "'");
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.err_lines(), 1) << r.err;
  EXPECT_NE(r.err.find("notes.gguf"), std::string::npos) << r.err;
}

// Flags that only the model's shape can judge are checked against the GGUF's metadata before the
// weights load: one line, no "loaded ..." banner first, and quickly.
TEST_F(BadInputs, ModelFlagsCheckedBeforeTheModelLoads_noBanner) {
  if (!std::filesystem::exists(cli::model_dir() + "/SmolLM2-135M-Instruct.Q4_1.gguf") ||
      !std::filesystem::exists(cli::model_dir() + "/kjv.txt"))
    GTEST_SKIP() << "model or text not fetched (scripts/fetch-model.sh, scripts/fetch-text.sh)";
  const std::string out = (dir_ / "x.out").string();
  const std::pair<std::string, std::string> cases[] = {
      {"model ppl --ctx 100000", "ppl: --ctx 100000 exceeds the model's context 8192"},
      {"model ppl --ctx 512 --stride 1024", "ppl: --stride 1024 must not exceed --ctx 512"},
      {"model ppl --ctx 512 --score-from 511", "--score-from 511 leaves nothing to score"},
      {"model ppl --kv kivi2@30=kivi4", "names layer 30, but the model has 30 layers (0-29)"},
      {"model needle --ctx 100000", "--ctx 100000 outside [256, 8192]"},
      {"model calibrate --ctx 100000 --out " + out, "--ctx 100000 exceeds the model's context 8192"},
      {"model bench --depth 9000", "bench: --depth 9000 + 512 tokens exceed the model's context 8192"},
      {"model generate --prompt hi -n 9000", "-n 9000 leaves no room for a prompt"},
      {"model diverge --prompt hi -n 9000", "-n 9000 leaves no room for a prompt"},
      {"model dump --prompt hi --max-tokens 9000 --out " + out, "--max-tokens 9000 exceeds the model's context"},
      {"model logits --prompt hi --max-tokens 9000 --out " + out, "--max-tokens 9000 exceeds the model's context"},
  };
  for (const auto& [args, needle] : cases) {
    const auto r = run_kvq(args);
    EXPECT_EQ(r.status, 1) << args;
    EXPECT_EQ(r.err_lines(), 1) << args << ": " << r.err;
    EXPECT_NE(r.err.find(needle), std::string::npos) << args << ": " << r.err;
    EXPECT_EQ(r.err.find("loaded"), std::string::npos) << args << ": the model loaded first";
  }
}

}  // namespace
}  // namespace kvq
