// Range checks for the CLI with messages a person can read, and the record of the build and
// the machine (experiments/commands.h).
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>

#include "experiments/commands.h"

namespace kvq::cli {

std::optional<long long> whole_number(const std::string& s) {
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (s.empty() || *end != '\0' || errno == ERANGE) return std::nullopt;
  return v;
}

CLI::Validator at_least(long long min) {
  return CLI::Validator(
      [min](std::string& s) -> std::string {
        const std::optional<long long> v = whole_number(s);
        if (!v) return fmt::format("must be a whole number, got '{}'", s);
        if (*v < min) return fmt::format("must be at least {}, got {}", min, s);
        return {};
      },
      fmt::format("INT >= {}", min));
}

CLI::Validator above_zero() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        char* end = nullptr;
        const double v = std::strtod(s.c_str(), &end);
        if (s.empty() || *end != '\0' || !std::isfinite(v))
          return fmt::format("must be a number, got '{}'", s);
        if (!(v > 0)) return fmt::format("must be greater than 0, got {}", s);
        return {};
      },
      "NUMBER > 0");
}

namespace {
std::string& version_slot() {
  static std::string v;
  return v;
}
}  // namespace

void set_build_version(std::string v) { version_slot() = std::move(v); }
const std::string& build_version() { return version_slot(); }

std::string machine_name() {
  static const std::string name = [] {  // read once: every result row records it
    char host[256] = {};
    if (gethostname(host, sizeof host - 1) != 0) host[0] = 0;
    std::string cpu = "unknown CPU";
    std::ifstream in("/proc/cpuinfo");
    for (std::string line; std::getline(in, line);)
      if (line.rfind("model name", 0) == 0 && line.find(':') != std::string::npos) {
        cpu = line.substr(line.find(':') + 2);
        break;
      }
    return fmt::format("{}: {} x {}", host[0] ? host : "unknown host", cpu,
                       std::thread::hardware_concurrency());
  }();
  return name;
}

}  // namespace kvq::cli
