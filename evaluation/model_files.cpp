#include "evaluation/model_files.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <mutex>

#include "core/error.h"
#include "core/io.h"
#include "model/tokenizer.h"

namespace kvq::cli {

std::string model_dir() {
  if (const char* d = std::getenv("KVQ_MODEL_DIR"); d && *d) return d;
  const char* home = std::getenv("HOME");
  return std::string(home && *home ? home : ".") + "/.cache/kvq";
}

std::string model_path(const std::string& flag) {
  const std::string p = flag.empty() ? model_dir() + "/SmolLM2-135M-Instruct.Q4_1.gguf" : flag;
  if (!std::filesystem::exists(p))
    fail("model file {} not found; run scripts/fetch-model.sh (or pass --model-file)", p);
  return p;
}

std::string text_path(const std::string& arg) {
  const std::string p = arg == "kjv" ? model_dir() + "/kjv.txt" : arg;
  if (!std::filesystem::exists(p))
    fail("text file {} not found{}", p, arg == "kjv" ? "; run scripts/fetch-text.sh" : "");
  return p;
}

std::string read_text(const std::string& arg) {
  const std::string p = text_path(arg);
  // The last file checked, by path, size and modification time: `kvq run` checks each task's text
  // before any work and reads it again to run, and the config fuzzer checks it on every input
  // (the 4 MB KJV's UTF-8 scan was most of fuzz_config's time).
  struct Checked {
    std::string path;
    uintmax_t size = 0;
    std::filesystem::file_time_type mtime;
    std::string text;
  };
  static std::mutex mu;
  static Checked last;
  std::error_code ec;
  const uintmax_t size = std::filesystem::file_size(p, ec);
  const auto mtime = std::filesystem::last_write_time(p, ec);
  {
    const std::lock_guard<std::mutex> lock(mu);
    if (!ec && last.path == p && last.size == size && last.mtime == mtime) return last.text;
  }
  std::string text = read_file(p);
  const size_t nul = text.find('\0'), bad = invalid_utf8_at(text);
  if (nul != std::string::npos || bad != std::string::npos) {
    const size_t at = std::min(nul, bad);
    fail(
        "{}: not UTF-8 text (byte 0x{:02x} at offset {}); --text takes a text file, such as "
        "--text kjv",
        p, static_cast<unsigned>(static_cast<unsigned char>(text[at])), at);
  }
  if (!ec && text.size() == size) {
    const std::lock_guard<std::mutex> lock(mu);
    last = {p, size, mtime, text};
  }
  return text;
}

}  // namespace kvq::cli
