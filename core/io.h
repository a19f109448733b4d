// File helpers: whole-file reads with clear errors, atomic writes (tmp file + rename); and the
// one reading of a whole number from text that the command lines and benches share.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace kvq {

/// \brief Reads a whole file; throws kvq::Error naming the path if it is missing or unreadable.
std::string read_file(const std::string& path);

/// \brief Writes a file atomically: a temporary beside it, then rename, so readers never see a
/// half-written result and an interrupted run leaves the previous file intact.
void write_file_atomic(const std::string& path, std::string_view bytes);

/// \brief s as a whole number (decimal, all of it, within long long), or nullopt: the reading of
/// the CLI's range checks (kvq::cli::at_least) and of the benches' flags (bench_attention's
/// --contexts, --l3-bytes).
std::optional<long long> whole_number(const std::string& s);

}  // namespace kvq
