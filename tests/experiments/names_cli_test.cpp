// Issue 14, one name per concept: --text names any text source (a file or 'kjv') in every model
// command, --prompt-file stays as a hidden alias; the checks run before the model loads.
#include <gtest/gtest.h>

#include <sstream>

#include "tests/support/run_cli.h"

namespace kvq {
namespace {

using testing::run_kvq;

TEST(NamesCli, TextIsTheTextSourceInEveryModelCommand_promptFileAHiddenAlias) {
  for (const char* cmd :
       {"model dump --out /tmp/kvq_names_x.safetensors", "model logits --out /tmp/kvq_names_x.npy",
        "model generate", "model diverge"}) {
    const std::string c = cmd;
    for (const char* flag : {"--text", "--prompt-file"}) {
      const auto r = run_kvq(c + " " + flag + " /nonexistent/kvq_prompt.txt");
      EXPECT_NE(r.status, 0) << c << " " << flag;
      EXPECT_EQ(r.err_lines(), 1) << c << " " << flag << ": " << r.err;
      EXPECT_NE(r.err.find("text file /nonexistent/kvq_prompt.txt not found"), std::string::npos)
          << c << " " << flag << ": " << r.err;
    }
    const auto both = run_kvq(c + " --text a.txt --prompt hello");
    EXPECT_NE(both.err.find("give --prompt or --text, not both"), std::string::npos) << both.err;
    const auto h = run_kvq(c + " --help");
    EXPECT_NE(h.out.find("--text"), std::string::npos) << h.out;
    EXPECT_EQ(h.out.find("--prompt-file"), std::string::npos) << "hidden: " << h.out;
  }
}

// Issue 14, one default per setting (README, "Options"): --kv is kivi2 in every model command (it
// was fp32 in generate, logits and bench) and --max-tokens is 2,048 wherever a text is read (it
// was 4,096 in ppl and calibrate's --tokens, 256 in logits). --help states the defaults CLI11
// applies, so it is what each command runs with.
TEST(NamesCli, OneDefaultPerSetting_kvAndMaxTokens) {
  // The option's own line ("  --kv TEXT=kivi2   ...", CLI11's layout) shows the default.
  const auto has = [](const std::string& help, const std::string& flag, const std::string& value) {
    std::istringstream in(help);
    for (std::string line; std::getline(in, line);) {
      const size_t b = line.find_first_not_of(' ');
      if (b == std::string::npos || line.compare(b, flag.size() + 1, flag + " ") != 0) continue;
      const size_t eq = line.find("=" + value);
      return eq != std::string::npos &&
             (eq + 1 + value.size() == line.size() || line[eq + 1 + value.size()] == ' ');
    }
    return false;
  };
  for (const char* cmd : {"generate", "ppl", "diverge", "needle", "logits", "bench"}) {
    const auto h = run_kvq(std::string("model ") + cmd + " --help");
    EXPECT_TRUE(has(h.out, "--kv", "kivi2")) << cmd << ": " << h.out;
  }
  for (const char* cmd : {"model ppl", "model dump", "model logits", "model calibrate", "stats"}) {
    const auto h = run_kvq(std::string(cmd) + " --help");
    EXPECT_TRUE(has(h.out, "--max-tokens", "2048")) << cmd << ": " << h.out;
  }
  const auto q = run_kvq("quant --help");
  EXPECT_NE(q.out.find("--json"), std::string::npos) << q.out;
  EXPECT_EQ(q.out.find("--stats"), std::string::npos) << "hidden alias: " << q.out;
}

}  // namespace
}  // namespace kvq
