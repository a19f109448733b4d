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

/// \brief The one exception type kvq throws for bad input or configuration. Its message is one
/// line whatever it quotes: control characters from the input (a newline in a spec, a shape or a
/// config value) are written as escapes (\n, \r, \xNN).
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(one_line(what)) {}

 private:
  static std::string one_line(const std::string& s) {
    std::string out;
    out.reserve(s.size());
    for (const char ch : s) {
      const auto c = static_cast<unsigned char>(ch);
      if (c == '\n') {
        out += "\\n";
      } else if (c == '\r') {
        out += "\\r";
      } else if (c < 0x20 || c == 0x7f) {
        const char hex[] = "0123456789abcdef";
        out += "\\x";
        out += hex[c >> 4];
        out += hex[c & 15];
      } else {
        out += ch;
      }
    }
    return out;
  }
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
