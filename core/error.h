// Errors: every bad configuration or bad input throws kvq::Error with a one-line message that
// names the offending value; the CLI prints it and exits nonzero.
#pragma once

// fmt 9 does not compile under nvcc -std=c++20, so CUDA translation units (__CUDACC__) get
// kvq::Error only and build their messages with std::string.
#if !defined(__CUDACC__)
#include <fmt/format.h>
#endif

#include <stdexcept>
#include <string>

namespace kvq {

/// \brief The one exception type kvq throws for bad input or configuration.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

#if !defined(__CUDACC__)
/// \brief Throws kvq::Error with a fmt-formatted message.
template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(fmt::format(f, std::forward<Args>(args)...));
}
#endif

}  // namespace kvq

/// Checks a condition; on failure throws kvq::Error with the formatted message.
#define KVQ_CHECK(cond, ...)               \
  do {                                     \
    if (!(cond)) ::kvq::fail(__VA_ARGS__); \
  } while (0)
