// evaluation/model_files.h: read_text checks a text file once per version of it. Expected values:
// the bytes written here, and the error the definition names (the offset of the first bad byte).
#include "evaluation/model_files.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>

#include "tests/support/expect_error.h"

namespace kvq::cli {
namespace {

void write(const std::filesystem::path& p, const std::string& bytes) {
  std::ofstream(p, std::ios::binary | std::ios::trunc) << bytes;
}

// A second read of an unchanged file gives the same text; a rewrite (another size, or the same
// size with a later modification time) is read and checked again, bad bytes included.
TEST(ReadText, RereadsAFileThatChanged_sizeOrTime) {
  const auto dir =
      std::filesystem::temp_directory_path() / ("kvq_test_read_text_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string p = (dir / "t.txt").string();
  write(p, "In the beginning");
  EXPECT_EQ(read_text(p), "In the beginning");
  EXPECT_EQ(read_text(p), "In the beginning");
  write(p, "In the beginning God");
  EXPECT_EQ(read_text(p), "In the beginning God");
  write(p, "In the beginning \xe9od");  // same size, not UTF-8 at offset 17
  std::filesystem::last_write_time(p,
                                   std::filesystem::last_write_time(p) + std::chrono::seconds(2));
  testing::expect_error([&] { read_text(p); }, "(byte 0xe9 at offset 17)");
  write(p, "In the beginning Gods");
  EXPECT_EQ(read_text(p), "In the beginning Gods");
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace kvq::cli
