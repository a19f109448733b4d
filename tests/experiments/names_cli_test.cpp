// Issue 14, one name per concept: --text names any text source (a file or 'kjv') in every model
// command, --prompt-file stays as a hidden alias; the checks run before the model loads.
#include <gtest/gtest.h>

#include "tests/support/run_cli.h"

namespace kvq {
namespace {

using testing::run_kvq;

TEST(NamesCli, TextIsTheTextSourceInEveryModelCommand_promptFileAHiddenAlias) {
  for (const char* cmd : {"model dump --out /tmp/kvq_names_x.safetensors",
                          "model logits --out /tmp/kvq_names_x.npy", "model generate",
                          "model diverge"}) {
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

}  // namespace
}  // namespace kvq
