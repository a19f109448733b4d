// File helpers: whole-file reads with clear errors, atomic writes (tmp file + rename).
#pragma once

#include <string>
#include <string_view>

namespace kvq {

/// \brief Reads a whole file; throws kvq::Error naming the path if it is missing or unreadable.
std::string read_file(const std::string& path);

/// \brief Writes a file atomically: a temporary beside it, then rename, so readers never see a
/// half-written result and an interrupted run leaves the previous file intact.
void write_file_atomic(const std::string& path, std::string_view bytes);

}  // namespace kvq
