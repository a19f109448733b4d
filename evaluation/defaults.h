// The defaults every command shares, and the Python package with them (README, "Options").
#pragma once

#include <cstdint>

namespace kvq::cli {

/// The KV scheme a command studies when --kv is not given.
inline constexpr const char* kDefaultKv = "kivi2";
/// How many tokens of a text a command reads when --max-tokens is not given.
inline constexpr int64_t kDefaultMaxTokens = 2048;

}  // namespace kvq::cli
