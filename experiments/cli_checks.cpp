// Range checks for the CLI with messages a person can read (experiments/commands.h).
#include <fmt/format.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <string>

#include "experiments/commands.h"

namespace kvq::cli {

CLI::Validator at_least(long long min) {
  return CLI::Validator(
      [min](std::string& s) -> std::string {
        errno = 0;
        char* end = nullptr;
        const long long v = std::strtoll(s.c_str(), &end, 10);
        if (s.empty() || *end != '\0' || errno == ERANGE)
          return fmt::format("must be a whole number, got '{}'", s);
        if (v < min) return fmt::format("must be at least {}, got {}", min, s);
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

}  // namespace kvq::cli
