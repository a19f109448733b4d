// Shared by the libFuzzer targets (fuzz/README.md): the one acceptable failure of a parser is a
// kvq::Error (a one-line message); anything else - another exception type, a crash, a sanitizer
// report, a leak, a timeout, an allocation beyond libFuzzer's -malloc_limit_mb - is a finding.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/error.h"

namespace kvq::fuzz {

/// \brief Runs f(); a kvq::Error is an accepted rejection (its message must be one line).
template <typename F>
void accept_errors(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    const std::string m = e.what();
    if (m.empty() || m.find('\n') != std::string::npos) __builtin_trap();  // not one line
  }
}

/// \brief Fails the run (a finding) when `ok` is false: a property the target checks.
inline void require(bool ok) {
  if (!ok) __builtin_trap();
}

inline std::string bytes(const uint8_t* data, size_t size) {
  return std::string(reinterpret_cast<const char*>(data), size);
}

}  // namespace kvq::fuzz
