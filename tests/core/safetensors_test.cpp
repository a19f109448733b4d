// Tests for core/safetensors.h: the writer's files read back bit-exact, and every malformed file
// (hand-built headers, per the safetensors format: 8-byte little-endian header length, a JSON
// header, then the data) is a one-line kvq::Error naming the file, allocating nothing for
// sizes the file cannot hold.
#include "core/safetensors.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <ostream>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/io.h"
#include "tests/support/expect_error.h"

namespace kvq {
namespace {

std::string file(const std::string& header, const std::string& data) {
  const uint64_t n = header.size();
  std::string b(8, '\0');
  std::memcpy(b.data(), &n, 8);
  return b + header + data;
}

void expect_error(const std::string& bytes, const std::string& needle) {
  const std::string m =
      kvq::testing::expect_error([&] { parse_safetensors(bytes, "x.safetensors"); }, needle);
  if (!m.empty()) {
    EXPECT_NE(m.find("x.safetensors"), std::string::npos) << "names the file: " << m;
  }
}

TEST(Safetensors, ParsesF32AndF16_handBuilt) {
  float f[2] = {1.5f, -2.0f};
  const std::string data(reinterpret_cast<const char*>(f), 8);
  // 0x3c00 is 1.0 in fp16, 0xc000 is -2.0
  const std::string h16("\x00\x3c\x00\xc0", 4);
  const auto ts = parse_safetensors(
      file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
           R"("b":{"dtype":"F16","shape":[1,2],"data_offsets":[8,12]},"__metadata__":{"x":"y"}})",
           data + h16),
      "x.safetensors");
  ASSERT_EQ(ts.size(), 2u);
  EXPECT_EQ(ts[0].data, (std::vector<float>{1.5f, -2.0f}));
  EXPECT_EQ(ts[1].shape, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(ts[1].data, (std::vector<float>{1.0f, -2.0f}));
}

TEST(Safetensors, RejectsMalformedFiles_oneLineNamingTheFile) {
  expect_error("abc", "shorter than 8 bytes");
  expect_error(file("{}", "").substr(0, 9), "exceeds the file size");
  expect_error(file("{not json", ""), "not valid JSON");
  expect_error(file("[1,2]", ""), "not a JSON object");
  expect_error(file(R"({"a":{"dtype":"F32","shape":[1]}})", ""), "lacks dtype, shape or data_offsets");
  expect_error(file(R"({"a":{"dtype":"I8","shape":[1],"data_offsets":[0,1]}})", "x"),
               "dtype I8 (supported: F32, F16, BF16)");
  expect_error(file(R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", "xxxx"),
               "bad shape");
  expect_error(file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,16]}})", "xxxxxxxx"),
               "lies outside the 8 data bytes");
  expect_error(file(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", "xxxxxxxx"),
               "has 8 bytes for 3 values of F32");
}

// Issue 16 (found reading the parser): a dtype that is not a string and data_offsets that are not
// two numbers escaped as JSON library errors without the file's name; 2^32 x 2^32 wrapped the
// element count to 0 and was accepted; a header claiming 2^60 elements allocates nothing.
TEST(Safetensors, RejectsWrongTypesAndWrappingShapes_2pow60Elements) {
  expect_error(file(R"({"a":{"dtype":4,"shape":[1],"data_offsets":[0,4]}})", "xxxx"),
               "dtype that is not a string");
  expect_error(file(R"({"a":{"dtype":"F32","shape":1,"data_offsets":[0,4]}})", "xxxx"),
               "shape that is not an array");
  expect_error(file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":"0-4"}})", "xxxx"),
               "data_offsets that are not two byte offsets");
  expect_error(file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0]}})", "xxxx"),
               "data_offsets that are not two byte offsets");
  expect_error(file(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}})",
                    ""),
               "too large");
  expect_error(file(R"({"a":{"dtype":"F32","shape":[1152921504606846976],"data_offsets":[0,4]}})",
                    "xxxx"),
               "bad shape");
  expect_error(file(R"({"a":{"dtype":"F32","shape":[1073741824,1073741824],"data_offsets":[0,4]}})",
                    "xxxx"),
               "too large");
}

}  // namespace
// The streamed writer (what writes checkpoints larger than memory) gives the bytes the
// in-memory one gives, and rejects a callback that writes the wrong byte count, naming the tensor.
TEST(Safetensors, StreamedWriterEqualsInMemory_andChecksByteCounts) {
  const std::string dir = ::testing::TempDir(), a = dir + "kvq_st_a", b = dir + "kvq_st_b";
  const std::vector<RawTensor> raw = {{"h", "BF16", {2, 3}, std::string(12, '\x3f')},
                                      {"u", "U8", {5}, "abcde"}};
  write_safetensors(a, raw, {{"k", "v"}});
  std::vector<SafetensorsEntry> entries;
  for (const RawTensor& t : raw) entries.push_back({t.name, t.dtype, t.shape, 0, 0});
  write_safetensors(b, entries, [&](size_t i, std::ostream& out) { out << raw[i].bytes; },
                    {{"k", "v"}});
  EXPECT_EQ(read_file(a), read_file(b));
  kvq::testing::expect_error(
      [&] { write_safetensors(b, entries, [&](size_t, std::ostream& out) { out << "xyz"; }); },
      "kvq_st_b: tensor h got 3 bytes, its shape and dtype need 12");
  std::remove(a.c_str());
  std::remove(b.c_str());
}

}  // namespace kvq
