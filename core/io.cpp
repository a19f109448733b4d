#include "core/io.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace kvq {

std::optional<long long> whole_number(const std::string& s) {
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (s.empty() || *end != '\0' || errno == ERANGE) return std::nullopt;
  return v;
}

std::string read_file(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) fail("{}: no such file", path);
  if (std::filesystem::is_directory(path, ec)) fail("{}: is a directory, expected a file", path);
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("{}: cannot open for reading ({})", path, std::strerror(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) fail("{}: read error", path);
  return std::move(ss).str();
}

void write_file_atomic(const std::string& path, std::string_view bytes) {
  const std::string tmp = fmt::format("{}.tmp.{}", path, static_cast<long>(::getpid()));
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) fail("{}: cannot open for writing ({})", path, std::strerror(errno));
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    out.flush();
    if (!out) {
      std::remove(tmp.c_str());
      fail("{}: write failed ({})", path, std::strerror(errno));
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::remove(tmp.c_str());
    fail("{}: cannot rename temporary into place ({})", path, ec.message());
  }
}

}  // namespace kvq
