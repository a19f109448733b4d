// Errors: every bad configuration or bad input throws kvq::Error with a one-line message that
// names the offending value; the CLI prints it and exits nonzero.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace kvq {

/// \brief The one exception type kvq throws for bad input or configuration.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

/// \brief Throws kvq::Error with a fmt-formatted message.
template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace kvq

/// Checks a condition; on failure throws kvq::Error with the formatted message.
#define KVQ_CHECK(cond, ...)               \
  do {                                     \
    if (!(cond)) ::kvq::fail(__VA_ARGS__); \
  } while (0)
