// core/npy: hand-built .npy byte strings (format per numpy's NEP 1 / format.py docs).
#include "core/npy.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "core/error.h"
#include "tests/support/expect_error.h"

namespace kvq {
namespace {

// Builds a version-1 .npy with the given header dict text and raw data bytes.
std::string npy_v1(const std::string& dict, const std::string& data) {
  std::string h = dict;
  while ((10 + h.size() + 1) % 64) h.push_back(' ');
  h.push_back('\n');
  std::string out = "\x93NUMPY";
  out += '\x01';
  out += '\x00';
  out += static_cast<char>(h.size() & 0xff);
  out += static_cast<char>(h.size() >> 8);
  return out + h + data;
}

std::string floats(std::initializer_list<float> v) {
  std::string s(v.size() * 4, '\0');
  std::memcpy(s.data(), std::data(v), s.size());
  return s;
}

void expect_error(const std::string& bytes, const std::string& needle) {
  kvq::testing::expect_error([&] { parse_npy(bytes, "x.npy"); }, needle);
}

TEST(Npy, ParsesFloat32V1) {
  const auto a = parse_npy(npy_v1("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }",
                                  floats({1, 2, 3, 4, 5, -6.5f})),
                           "x.npy");
  ASSERT_EQ(a.shape, (std::vector<int64_t>{2, 3}));
  ASSERT_EQ(a.data.size(), 6u);
  EXPECT_EQ(a.data[0], 1.0f);
  EXPECT_EQ(a.data[5], -6.5f);
}

TEST(Npy, ParsesFloat16ExactlyWidened) {
  // fp16 bit patterns by hand: 0x3C00 = 1.0, 0xC000 = -2.0, 0x0001 = 2^-24, 0x7BFF = 65504.
  const uint16_t h[4] = {0x3C00, 0xC000, 0x0001, 0x7BFF};
  std::string data(8, '\0');
  std::memcpy(data.data(), h, 8);
  const auto a =
      parse_npy(npy_v1("{'descr': '<f2', 'fortran_order': False, 'shape': (4,), }", data), "x.npy");
  ASSERT_EQ(a.data.size(), 4u);
  EXPECT_EQ(a.data[0], 1.0f);
  EXPECT_EQ(a.data[1], -2.0f);
  EXPECT_EQ(a.data[2], std::ldexp(1.0f, -24));
  EXPECT_EQ(a.data[3], 65504.0f);
}

TEST(Npy, ParsesVersion2Header) {
  std::string v1 = npy_v1("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", floats({7}));
  // Re-wrap as version 2: 4-byte little-endian header length.
  const std::string header = v1.substr(10, v1.size() - 10 - 4);
  std::string v2 = "\x93NUMPY";
  v2 += '\x02';
  v2 += '\x00';
  const uint32_t len = static_cast<uint32_t>(header.size());
  v2.append(reinterpret_cast<const char*>(&len), 4);
  v2 += header + floats({7});
  const auto a = parse_npy(v2, "x.npy");
  ASSERT_EQ(a.data.size(), 1u);
  EXPECT_EQ(a.data[0], 7.0f);
}

TEST(Npy, EncodeThenParseRoundTripsBitExact) {
  const std::vector<float> x = {0.0f, -0.0f, 1e-40f, 3.5f, -1e30f, 0.1f};
  const auto a = parse_npy(encode_npy({3, 1, 2}, x.data()), "rt.npy");
  EXPECT_EQ(a.shape, (std::vector<int64_t>{3, 1, 2}));
  ASSERT_EQ(a.data.size(), x.size());
  EXPECT_EQ(std::memcmp(a.data.data(), x.data(), x.size() * 4), 0);
  EXPECT_EQ(encode_npy({3, 1, 2}, x.data()).size() % 64, 24u) << "header padded to 64 bytes";
}

TEST(Npy, RejectsBadMagic) { expect_error("PK\x03\x04 this is a zip", "not an .npy"); }
TEST(Npy, RejectsUnknownVersion) {
  std::string b = npy_v1("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", floats({1}));
  b[6] = 4;
  expect_error(b, "version 4");
}
TEST(Npy, RejectsFortranOrder) {
  expect_error(npy_v1("{'descr': '<f4', 'fortran_order': True, 'shape': (1,), }", floats({1})),
               "Fortran");
}
TEST(Npy, RejectsUnsupportedDtype) {
  expect_error(npy_v1("{'descr': '<i4', 'fortran_order': False, 'shape': (1,), }", floats({1})),
               "unsupported dtype '<i4'");
  expect_error(
      npy_v1("{'descr': '<f16', 'fortran_order': False, 'shape': (1,), }", std::string(16, '\0')),
      "unsupported dtype '<f16'");
  expect_error(
      npy_v1("{'descr': '<c8', 'fortran_order': False, 'shape': (1,), }", std::string(8, '\0')),
      "unsupported dtype '<c8'");
}

// numpy's default float64 and big-endian files are read as float32. Expected values: the float64
// literals cast to float by the compiler (nearest), and the bytes written here in reverse order.
TEST(Npy, ReadsFloat64AndBigEndian_asNearestFloat32) {
  const double d[4] = {1.5, -2.25, 1.0e-3, 1.0e39};
  std::string le(reinterpret_cast<const char*>(d), sizeof d), be;
  for (int i = 0; i < 4; ++i)
    be += std::string(le.rbegin() + 8 * (3 - i), le.rbegin() + 8 * (4 - i));
  for (const auto& [descr, bytes] : {std::pair<std::string, std::string>{"<f8", le}, {">f8", be}}) {
    const NpyArray a = parse_npy(
        npy_v1("{'descr': '" + descr + "', 'fortran_order': False, 'shape': (2, 2), }", bytes),
        "t.npy");
    ASSERT_EQ(a.shape, (std::vector<int64_t>{2, 2})) << descr;
    EXPECT_EQ(a.descr, descr);
    EXPECT_EQ(a.data[0], 1.5f) << descr;
    EXPECT_EQ(a.data[1], -2.25f) << descr;
    EXPECT_EQ(a.data[2], static_cast<float>(1.0e-3)) << descr;
    EXPECT_TRUE(std::isinf(a.data[3])) << descr << ": beyond float32's range";
  }
  const std::string f = floats({3.0f, -0.5f});
  std::string fbe;
  for (int i = 0; i < 2; ++i)
    fbe += std::string(f.rbegin() + 4 * (1 - i), f.rbegin() + 4 * (2 - i));
  const NpyArray b =
      parse_npy(npy_v1("{'descr': '>f4', 'fortran_order': False, 'shape': (2,), }", fbe), "b.npy");
  EXPECT_EQ(b.data, (std::vector<float>{3.0f, -0.5f}));
  const uint16_t h[2] = {0x3c00, 0xc000};  // 1.0, -2.0 in binary16
  std::string hbe;
  for (uint16_t x : h) hbe += {static_cast<char>(x >> 8), static_cast<char>(x & 0xff)};
  const NpyArray c =
      parse_npy(npy_v1("{'descr': '>f2', 'fortran_order': False, 'shape': (2,), }", hbe), "c.npy");
  EXPECT_EQ(c.data, (std::vector<float>{1.0f, -2.0f}));
}
TEST(Npy, RejectsHeaderThatLiesAboutSize) {
  expect_error(npy_v1("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }", floats({1, 2})),
               "needs 12 data bytes but the file has 8");
  expect_error(npy_v1("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", floats({1, 2})),
               "needs 4 data bytes but the file has 8");
}
TEST(Npy, RejectsTruncatedHeader) {
  std::string b = npy_v1("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", "");
  expect_error(b.substr(0, 40), "truncated");
}
TEST(Npy, RejectsAbsurdShape) {
  expect_error(
      npy_v1("{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999, 99999999999), }", ""),
      "too large");
}
// Issue 16 (found reading the parser): "-3" was read as 3 (a regex took the digits), so a
// negative dimension passed; a header claiming 2^60 elements is refused before any allocation.
TEST(Npy, RejectsNegativeAndMalformedShapes_and2pow60Elements) {
  const auto h = [](const std::string& shape) {
    return npy_v1("{'descr': '<f4', 'fortran_order': False, 'shape': " + shape + ", }",
                  floats({1, 2, 3}));
  };
  expect_error(h("(-3,)"), "malformed npy shape '(-3,)'");
  expect_error(h("(3"), "malformed npy shape");
  expect_error(h("(1,,3)"), "malformed npy shape");
  expect_error(h("(3.0,)"), "malformed npy shape");
  expect_error(h("(1152921504606846976,)"), "absurd dimension 1152921504606846976");
  expect_error(h("(1073741824, 1073741824)"), "too large");
  // the spellings numpy writes, and one with a space before the closing parenthesis
  for (const char* ok : {"(3,)", "(1, 3)", "(3, )", "(1,3,1)"})
    EXPECT_EQ(parse_npy(h(ok), "ok.npy").data.size(), 3u) << ok;
}
// fuzz_npy's first finding: a header cut inside the dict, padded with spaces and a newline,
// echoed that newline into the message (fuzz/README.md; now escaped by kvq::Error).
TEST(Npy, TruncatedDictWithNewline_oneLine_fuzzFinding) {
  std::string h = "{'descr': '<f4', 'fortran_order':                   \n";
  std::string b = std::string("\x93NUMPY\x01\x00", 8);
  b += static_cast<char>(h.size());
  b += '\0';
  expect_error(b + h + std::string(8, '\0'), "x.npy");
}
// fuzz_npy (UBSan): an empty float32 array copied its 0 bytes from a null pointer.
TEST(Npy, EmptyArray_zeroElements_fuzzFinding) {
  for (const char* shape : {"(0,)", "(3, 0)", "(0, 0, 5)"}) {
    const NpyArray a =
        parse_npy(npy_v1(std::string("{'descr': '<f4', 'fortran_order': False, 'shape': ") + shape +
                             ", }",
                         ""),
                  "e.npy");
    EXPECT_TRUE(a.data.empty()) << shape;
  }
}
TEST(Npy, MissingFileNamesThePath) {
  try {
    read_npy("/nonexistent/dir/k.npy");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/dir/k.npy: no such file"),
              std::string::npos);
  }
}

}  // namespace
}  // namespace kvq
