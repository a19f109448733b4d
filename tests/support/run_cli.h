// Runs the kvq binary (KVQ_BINARY) in a shell and captures its exit status, stdout and stderr.
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

namespace kvq::testing {

struct CliResult {
  int status = -1;  ///< exit status (128 + signal when killed)
  std::string out, err;
  /// \brief Number of lines on stderr.
  int err_lines() const {
    int n = 0;
    for (char c : err) n += c == '\n';
    return n;
  }
};

/// \brief A fresh temporary directory for one test.
inline std::filesystem::path temp_dir(const std::string& name) {
  const auto d = std::filesystem::temp_directory_path() / ("kvq_test_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}

inline std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

/// \brief The rows of a `kvq run` jsonl file, one JSON value per line.
inline std::vector<nlohmann::json> jsonl(const std::filesystem::path& p) {
  std::vector<nlohmann::json> rows;
  std::istringstream in(slurp(p));
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) rows.push_back(nlohmann::json::parse(line));
  return rows;
}

/// \brief Runs `KVQ_BINARY args` (args already shell-quoted as needed); `shell_prefix` runs in the
/// same shell first (for example "ulimit -f 6;" (sh: 512-byte blocks) or "KVQ_MODEL_DIR=/x").
inline CliResult run_kvq(const std::string& args, const std::string& shell_prefix = "") {
  const auto dir = temp_dir("cli");
  const auto out = dir / "stdout", err = dir / "stderr";
  const std::string cmd = shell_prefix + " '" + KVQ_BINARY + "' " + args + " >'" + out.string() + "' 2>'" + err.string() + "'";
  const int raw = std::system(cmd.c_str());
  CliResult r;
  r.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : 128 + (WIFSIGNALED(raw) ? WTERMSIG(raw) : 0);
  r.out = slurp(out);
  r.err = slurp(err);
  std::filesystem::remove_all(dir);
  return r;
}

/// \brief Starts `KVQ_BINARY args` in the background (stdout dropped; stderr to `err`, dropped
/// when `err` is empty), waits until the file `rows` holds at least `n` lines (polled every 0.02
/// s, at most `timeout_s`), sends it signal `sig` (a kill(1) name: "INT", "KILL") and returns its
/// exit status: 128 + the signal when the signal ended it, its own status when it exited. Waiting
/// for rows rather than for a time keeps the signal inside the run on a slow or a fast host.
inline int signal_after_rows(const std::string& args, const std::filesystem::path& rows, int n,
                             const std::string& sig, const std::filesystem::path& err = {},
                             int timeout_s = 120) {
  const std::string r = "'" + rows.string() + "'";
  const std::string cmd = "('" + std::string(KVQ_BINARY) + "' " + args + " >/dev/null 2>" +
                          (err.empty() ? std::string("/dev/null") : "'" + err.string() + "'") +
                          " & pid=$!; for i in $(seq " + std::to_string(50 * timeout_s) +
                          "); do [ -f " + r + " ] && [ $(wc -l < " + r + ") -ge " +
                          std::to_string(n) + " ] && break; sleep 0.02; done; kill -" + sig +
                          " $pid; wait $pid; exit $?)";
  const int raw = std::system(cmd.c_str());
  return WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
}

}  // namespace kvq::testing
