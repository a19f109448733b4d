// `kvq --version`: the project's version and the commit the binary was built from, then backend
// cpu's CPU paths. Expected values come from outside the code under test: the version from the
// top-level CMakeLists.txt's project() line, the commit from `git rev-parse HEAD` run here on the
// same checkout, the path from KVQ_CPU_PATH set here.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>

namespace {

// Runs a shell command, returning its exit status and stdout.
std::pair<int, std::string> run(const std::string& cmd) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return {-1, out};
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

TEST(KvqCli, version_printsProjectVersionAndBuildCommit) {
  std::ifstream cm(std::string(KVQ_SOURCE_DIR) + "/CMakeLists.txt");
  std::stringstream ss;
  ss << cm.rdbuf();
  std::smatch m;
  const std::string text = ss.str();
  ASSERT_TRUE(std::regex_search(text, m, std::regex(R"(project\(kvq VERSION ([0-9.]+))")));
  const std::string version = m[1];

  const auto [rc, out] = run(std::string("'") + KVQ_BINARY + "' --version");
  EXPECT_EQ(rc, 0);
  std::smatch v;
  ASSERT_TRUE(std::regex_match(
      out, v,
      std::regex(
          R"(kvq (\S+) \(commit (\S+)\)\nbackend cpu: paths ([a-z0-9, ]+); this machine runs )"
          R"(([a-z0-9]+) \(([a-z0-9+]+)\)\n)")))
      << out;
  EXPECT_EQ(v[1].str(), version);
  // backend cpu's paths (kernels/cpu/isa.h): portable is always compiled in, the one running is
  // one of them, and KVQ_CPU_PATH=portable makes it portable (whose instruction set is "portable")
  const std::string paths = ", " + v[3].str() + ",";
  EXPECT_NE(paths.find(", portable,"), std::string::npos) << out;
  EXPECT_NE(paths.find(", " + v[4].str() + ","), std::string::npos) << out;
  const auto [prc, pout] = run(std::string("KVQ_CPU_PATH=portable '") + KVQ_BINARY + "' --version");
  EXPECT_EQ(prc, 0);
  EXPECT_NE(pout.find("; this machine runs portable (portable)\n"), std::string::npos) << pout;

  const auto [git_rc, head] =
      run(std::string("git -C '") + KVQ_SOURCE_DIR + "' rev-parse HEAD 2>/dev/null");
  if (git_rc != 0 || head.size() < 12) {
    EXPECT_EQ(v[2].str(), "unknown") << "not a git checkout, so no commit to name";
  } else {
    const std::string commit = v[2].str();
    EXPECT_EQ(commit.substr(0, 12), head.substr(0, 12)) << "binary built from another commit";
    EXPECT_TRUE(commit.size() == 12 || commit == head.substr(0, 12) + "-dirty") << commit;
  }
}

}  // namespace
