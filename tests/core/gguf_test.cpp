// core/gguf: GGUF files built byte by byte (layout per ggml's docs/gguf.md), every metadata type,
// hand-made blocks of every decodable ggml type with values worked out by hand, every malformed
// header, and the real SmolLM2 model file when scripts/fetch-model.sh has fetched it.
#include "core/gguf.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <random>

#include "core/error.h"
#include "tests/support/expect_error.h"
#include "tests/support/gguf_writer.h"
#include "tests/support/model.h"

namespace kvq::gguf {
namespace {

using VT = ValueType;

using namespace kvq::testing::gguf_writer;

std::vector<float> dequant_one(GgmlType type, std::vector<uint64_t> dims, const std::string& data) {
  const auto f = GgufFile::parse(one_tensor("t", std::move(dims), type, data), "t.gguf");
  return f.dequantize("t");
}

std::string bytes_of(std::initializer_list<int> v) {
  std::string s;
  for (int x : v) s.push_back(static_cast<char>(x));
  return s;
}

// fp16 bit patterns used below: 0x3400 = 0.25, 0x3800 = 0.5, 0x3C00 = 1, 0x4000 = 2,
// 0xBC00 = -1.
std::string h16(uint16_t bits) { return le(bits); }

void expect_error(const std::string& bytes, const std::string& needle) {
  const std::string w =
      kvq::testing::expect_error([&] { GgufFile::parse(bytes, "t.gguf"); }, needle);
  if (!w.empty()) {
    EXPECT_EQ(w.rfind("t.gguf: ", 0), 0u) << "names the file: " << w;
  }
}

using kvq::testing::expect_error;

// ---- metadata ------------------------------------------------------------------------------

std::string all_types_file(uint32_t version) {
  Builder b;
  b.version = version;
  b.kv("u8", VT::kUint8, le<uint8_t>(200))
      .kv("i8", VT::kInt8, le<int8_t>(-5))
      .kv("u16", VT::kUint16, le<uint16_t>(60000))
      .kv("i16", VT::kInt16, le<int16_t>(-30000))
      .kv("u32", VT::kUint32, le<uint32_t>(4000000000u))
      .kv("i32", VT::kInt32, le<int32_t>(-2000000000))
      .kv("f32", VT::kFloat32, le<float>(1.5f))
      .kv("bool", VT::kBool, le<uint8_t>(1))
      .kv("str", VT::kString, gstr("h\xc3\xa9llo"))
      .kv("u64", VT::kUint64, le<uint64_t>((1ull << 40) + 1))
      .kv("i64", VT::kInt64, le<int64_t>(-(1ll << 40)))
      .kv("f64", VT::kFloat64, le<double>(0.1))
      .kv("arr.i32", VT::kArray,
          garray(VT::kInt32, 3, le<int32_t>(1) + le<int32_t>(-2) + le<int32_t>(3)))
      .kv("arr.u8", VT::kArray, garray(VT::kUint8, 2, bytes_of({7, 250})))
      .kv("arr.str", VT::kArray, garray(VT::kString, 3, gstr("a") + gstr("") + gstr("ccc")))
      .kv("arr.f32", VT::kArray, garray(VT::kFloat32, 2, le<float>(0.25f) + le<float>(-8.0f)))
      .kv("arr.f64", VT::kArray, garray(VT::kFloat64, 1, le<double>(2.5)))
      .kv("arr.bool", VT::kArray, garray(VT::kBool, 3, bytes_of({1, 0, 1})))
      .kv("arr.empty", VT::kArray, garray(VT::kUint64, 0, ""))
      // [[1, 2], ["x"]]: an array of arrays, the inner ones of different element types.
      .kv("arr.nested", VT::kArray,
          garray(VT::kArray, 2,
                 garray(VT::kUint16, 2, le<uint16_t>(1) + le<uint16_t>(2)) +
                     garray(VT::kString, 1, gstr("x"))));
  return b.build();
}

TEST(Gguf, ReadsEveryMetadataType) {
  const auto f = GgufFile::parse(all_types_file(3), "t.gguf");
  EXPECT_EQ(f.version(), 3u);
  ASSERT_EQ(f.metadata().size(), 20u);
  EXPECT_EQ(f.metadata()[0].first, "u8");  // file order kept
  EXPECT_EQ(f.get_u32("u8"), 200u);
  EXPECT_EQ(f.get_i32("i8"), -5);
  EXPECT_EQ(f.get_u32("u16"), 60000u);
  EXPECT_EQ(f.get_i32("i16"), -30000);
  EXPECT_EQ(f.get_u32("u32"), 4000000000u);
  EXPECT_EQ(f.get_i32("i32"), -2000000000);
  EXPECT_EQ(f.get_f32("f32"), 1.5f);
  EXPECT_TRUE(f.get_bool("bool"));
  EXPECT_EQ(f.get_string("str"), "h\xc3\xa9llo");
  EXPECT_EQ(f.get_u64("u64"), (1ull << 40) + 1);
  EXPECT_EQ(f.get_i64("i64"), -(1ll << 40));
  EXPECT_EQ(f.get_f64("f64"), 0.1);
  EXPECT_EQ(f.get_f32("f64"), 0.1f);
  EXPECT_EQ(f.get_i32_array("arr.i32"), (std::vector<int32_t>{1, -2, 3}));
  EXPECT_EQ(f.get_i32_array("arr.u8"), (std::vector<int32_t>{7, 250}));
  EXPECT_EQ(f.get_string_array("arr.str"), (std::vector<std::string>{"a", "", "ccc"}));
  EXPECT_EQ(f.get_f32_array("arr.f32"), (std::vector<float>{0.25f, -8.0f}));
  EXPECT_EQ(f.get_f32_array("arr.f64"), (std::vector<float>{2.5f}));
  EXPECT_EQ(f.array_size("arr.str"), 3u);
  EXPECT_EQ(f.array_size("arr.empty"), 0u);

  const Value& b = f.get("arr.bool");
  EXPECT_EQ(b.elem_type, VT::kBool);
  EXPECT_EQ(b.raw, std::string_view("\x01\x00\x01", 3));
  const Value& n = f.get("arr.nested");
  ASSERT_EQ(n.elem_type, VT::kArray);
  ASSERT_EQ(n.arrays.size(), 2u);
  EXPECT_EQ(n.arrays[0].elem_type, VT::kUint16);
  EXPECT_EQ(n.arrays[0].count, 2u);
  EXPECT_EQ(n.arrays[0].raw, std::string_view("\x01\x00\x02\x00", 4));
  ASSERT_EQ(n.arrays[1].strings.size(), 1u);
  EXPECT_EQ(n.arrays[1].strings[0], "x");
  EXPECT_TRUE(f.tensors().empty());
}

TEST(Gguf, AcceptsVersion2) {
  const auto f = GgufFile::parse(all_types_file(2), "t.gguf");
  EXPECT_EQ(f.version(), 2u);
  EXPECT_EQ(f.get_string("str"), "h\xc3\xa9llo");
}

TEST(Gguf, GetterErrorsNameKeyAndType) {
  const auto f = GgufFile::parse(all_types_file(3), "t.gguf");
  expect_error([&] { f.get_u32("nope"); }, "t.gguf: missing metadata key 'nope'");
  expect_error([&] { f.tensor("w"); }, "t.gguf: no tensor named 'w'");
  expect_error([&] { f.get_u32("str"); }, "metadata 'str' has type string, expected an integer");
  expect_error([&] { f.get_string("u8"); }, "metadata 'u8' has type uint8, expected string");
  expect_error([&] { f.get_f32("u32"); }, "has type uint32, expected a float");
  expect_error([&] { f.get_bool("u8"); }, "expected bool");
  expect_error([&] { f.get_string_array("arr.i32"); },
               "metadata 'arr.i32' has type array of int32, expected array of string");
  expect_error([&] { f.get_i32_array("arr.str"); }, "expected array of integers");
  expect_error([&] { f.array_size("u8"); }, "expected an array");
  // Integer getters convert only values that fit.
  expect_error([&] { f.get_u32("i8"); }, "metadata 'i8' = -5 does not fit");
  expect_error([&] { f.get_i32("u32"); }, "'u32' = 4000000000 does not fit");
  expect_error([&] { f.get_u32("u64"); }, "'u64' = 1099511627777 does not fit");
  EXPECT_EQ(f.get_i64("u32"), 4000000000ll);
  EXPECT_EQ(f.get_u64("u8"), 200u);
}

TEST(Gguf, AlignmentDefaultsTo32AndFollowsGeneralAlignment) {
  const std::string q = std::string(20, '\0');  // one Q4_1 block
  auto f = GgufFile::parse(one_tensor("t", {32}, GgmlType::kQ4_1, q), "t.gguf");
  EXPECT_EQ(f.alignment(), 32u);
  EXPECT_EQ(f.data_offset() % 32, 0u);

  Builder b;
  b.align = 64;
  b.kv("general.alignment", VT::kUint32, u32(64));
  b.tensor({"a", {32}, 3, q, {}}).tensor({"b", {32}, 3, q, {}});
  f = GgufFile::parse(b.build(), "t.gguf");
  EXPECT_EQ(f.alignment(), 64u);
  EXPECT_EQ(f.data_offset() % 64, 0u);
  EXPECT_EQ(f.tensor("b").offset, 64u);
  EXPECT_EQ(f.tensor_data(f.tensor("b")).size(), 20u);
}

// ---- dequantization, one hand-made block per type ------------------------------------------

TEST(Gguf, DequantF32KeepsMemoryOrder) {
  // dims {3, 2}: ne[0] = 3 values per row, 2 rows; element (i0, i1) sits at i0 + 3 * i1.
  std::string d;
  for (float v : {1.f, 2.f, 3.f, -4.f, 5.5f, -6.f}) d += le(v);
  const auto f = GgufFile::parse(one_tensor("t", {3, 2}, GgmlType::kF32, d), "t.gguf");
  const TensorInfo& t = f.tensor("t");
  EXPECT_EQ(t.dims, (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(t.nelements, 6);
  EXPECT_EQ(t.nbytes, 24u);
  EXPECT_EQ(f.dequantize("t"), (std::vector<float>{1, 2, 3, -4, 5.5f, -6}));
}

TEST(Gguf, DequantF16AndBF16) {
  // fp16: 0x3C00 = 1, 0xC000 = -2, 0x3555 = 0.333251953125, 0x7BFF = 65504, 0x0001 = 2^-24.
  const std::string h = h16(0x3C00) + h16(0xC000) + h16(0x3555) + h16(0x7BFF) + h16(0x0001);
  EXPECT_EQ(dequant_one(GgmlType::kF16, {5}, h),
            (std::vector<float>{1, -2, 0.333251953125f, 65504, std::ldexp(1.f, -24)}));
  // bf16 is the top half of a float: 0x3F80 = 1, 0xC040 = -3, 0x3E20 = 0.15625.
  const std::string b = h16(0x3F80) + h16(0xC040) + h16(0x3E20);
  EXPECT_EQ(dequant_one(GgmlType::kBF16, {3}, b), (std::vector<float>{1, -3, 0.15625f}));
}

TEST(Gguf, DequantQ8_0) {
  // d = 0.25, qs[j] = 8j - 128  ->  x_j = 0.25 * (8j - 128) = 2j - 32: -32, -30, ..., 30.
  std::string blk = h16(0x3400);
  for (int j = 0; j < 32; ++j) blk.push_back(static_cast<char>(8 * j - 128));
  const auto y = dequant_one(GgmlType::kQ8_0, {32}, blk);
  ASSERT_EQ(y.size(), 32u);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(y[j], 2.0f * j - 32) << j;
}

// Nibble bytes shared by the Q4_0 / Q4_1 cases: byte j = j | (15 - j) << 4, so element j
// (low nibble) is j and element j + 16 (high nibble) is 15 - j.
std::string nibbles_up_down() {
  std::string s;
  for (int j = 0; j < 16; ++j) s.push_back(static_cast<char>(j | ((15 - j) << 4)));
  return s;
}

TEST(Gguf, DequantQ4_0) {
  // d = 2: x_j = 2 (j - 8) = -16, -14, ..., 14; x_{j+16} = 2 (15 - j - 8) = 14, 12, ..., -16.
  const auto y = dequant_one(GgmlType::kQ4_0, {32}, h16(0x4000) + nibbles_up_down());
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], 2.0f * (j - 8)) << j;
    EXPECT_EQ(y[j + 16], 14.0f - 2 * j) << j;
  }
  EXPECT_EQ(y[0], -16.0f);
  EXPECT_EQ(y[31], -16.0f);
}

TEST(Gguf, DequantQ4_1) {
  // d = 0.5, m = -1: x_j = 0.5 j - 1 = -1, -0.5, ..., 6.5; x_{j+16} = 0.5 (15 - j) - 1 = 6.5 .. -1.
  const auto y = dequant_one(GgmlType::kQ4_1, {32}, h16(0x3800) + h16(0xBC00) + nibbles_up_down());
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], 0.5f * j - 1) << j;
    EXPECT_EQ(y[j + 16], 6.5f - 0.5f * j) << j;
  }
  EXPECT_EQ(y[15], 6.5f);
  EXPECT_EQ(y[16], 6.5f);
}

TEST(Gguf, DequantQ4_1RowsFollowNe0) {
  // dims {64, 2}: four blocks, two per row; block k has d = 1, m = 10 k and all nibbles 0.
  // -> element e = 10 * (e / 32); row 1 starts at element 64.
  const uint16_t m[4] = {0x0000, 0x4900, 0x4D00, 0x4F80};  // 0, 10, 20, 30 in fp16
  std::string d;
  for (uint16_t mk : m) d += h16(0x3C00) + h16(mk) + std::string(16, '\0');
  const auto f = GgufFile::parse(one_tensor("t", {64, 2}, GgmlType::kQ4_1, d), "t.gguf");
  EXPECT_EQ(f.tensor("t").nbytes, 80u);
  const auto y = f.dequantize("t");
  ASSERT_EQ(y.size(), 128u);
  for (int e = 0; e < 128; ++e) EXPECT_EQ(y[e], 10.0f * (e / 32)) << e;
}

TEST(Gguf, DequantQ5_0) {
  // d = 1, qh = 0xFFFF0000 (fifth bit set for elements 16..31), byte j = j | j << 4:
  // x_j = j - 16 (-16..-1), x_{j+16} = (j + 16) - 16 = j: together -16, -15, ..., 15.
  std::string blk = h16(0x3C00) + bytes_of({0x00, 0x00, 0xFF, 0xFF});
  for (int j = 0; j < 16; ++j) blk.push_back(static_cast<char>(j | (j << 4)));
  const auto y = dequant_one(GgmlType::kQ5_0, {32}, blk);
  for (int e = 0; e < 32; ++e) EXPECT_EQ(y[e], e - 16.0f) << e;
}

TEST(Gguf, DequantQ5_1) {
  // d = 0.25, m = 1, qh = 0x0000FFFF (fifth bit set for elements 0..15), byte j = j | j << 4:
  // x_j = 0.25 (16 + j) + 1 = 5 + j/4 (5 .. 8.75), x_{j+16} = 0.25 j + 1 (1 .. 4.75).
  std::string blk = h16(0x3400) + h16(0x3C00) + bytes_of({0xFF, 0xFF, 0x00, 0x00});
  for (int j = 0; j < 16; ++j) blk.push_back(static_cast<char>(j | (j << 4)));
  const auto y = dequant_one(GgmlType::kQ5_1, {32}, blk);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], 5 + 0.25f * j) << j;
    EXPECT_EQ(y[j + 16], 1 + 0.25f * j) << j;
  }
}

TEST(Gguf, DequantQ2_K) {
  // d = 1, dmin = 0.25; scale byte i (sub-block of 16 values) = (i % 8 + 1) | (i / 8) << 4.
  // qs bytes alternate 0xE4 (2-bit fields 0,1,2,3 from the bottom) and 0x1B (3,2,1,0).
  // Value e: sub-block e/16; field g = (e % 128) / 32 of byte 32 (e/128) + 16 ((e%32)/16) + e%16,
  // whose parity is that of e; code = g (even e) or 3 - g (odd e); x = sc * code - 0.25 * min.
  std::string blk;
  for (int i = 0; i < 16; ++i) blk.push_back(static_cast<char>((i % 8 + 1) | ((i / 8) << 4)));
  for (int i = 0; i < 64; ++i) blk.push_back(static_cast<char>(i % 2 ? 0x1B : 0xE4));
  blk += h16(0x3C00) + h16(0x3400);
  ASSERT_EQ(blk.size(), 84u);
  const auto y = dequant_one(GgmlType::kQ2_K, {256}, blk);
  for (int e = 0; e < 256; ++e) {
    const int is = e / 16, g = (e % 128) / 32, code = e % 2 ? 3 - g : g;
    EXPECT_EQ(y[e], static_cast<float>(is % 8 + 1) * code - 0.25f * (is / 8)) << e;
  }
  EXPECT_EQ(y[100], 21.0f);   // sub-block 6: sc 7, min 0; g = 3, even -> 7 * 3
  EXPECT_EQ(y[201], 4.75f);   // sub-block 12: sc 5, min 1; g = 2, odd -> 5 * 1 - 0.25
  EXPECT_EQ(y[255], -0.25f);  // sub-block 15: sc 8, min 1; g = 3, odd -> 0 - 0.25
}

TEST(Gguf, DequantQ3_K) {
  // d = 0.5; sixteen 6-bit scales s_i = i + 24 (used as s_i - 32 = i - 8), packed: bytes 0..7
  // hold the low nibbles of s_i (low half) and s_{i+8} (high half); byte 8 + m holds the top two
  // bits of s_m, s_{m+4}, s_{m+8}, s_{m+12} at bit 0, 2, 4, 6.
  // qs as in Q2_K (0xE4 / 0x1B alternating). hmask bytes 0..15 = 0x55, 16..31 = 0xAA; value e
  // reads bit e/32 of hmask[e % 32]; when that bit is clear the code drops by 4.
  std::string blk = std::string(16, '\x55') + std::string(16, '\xAA');
  for (int i = 0; i < 64; ++i) blk.push_back(static_cast<char>(i % 2 ? 0x1B : 0xE4));
  int s[16];
  for (int i = 0; i < 16; ++i) s[i] = i + 24;
  for (int i = 0; i < 8; ++i)
    blk.push_back(static_cast<char>((s[i] & 15) | ((s[i + 8] & 15) << 4)));
  for (int m = 0; m < 4; ++m)
    blk.push_back(static_cast<char>((s[m] >> 4) | ((s[m + 4] >> 4) << 2) | ((s[m + 8] >> 4) << 4) |
                                    ((s[m + 12] >> 4) << 6)));
  blk += h16(0x3800);
  ASSERT_EQ(blk.size(), 110u);
  const auto y = dequant_one(GgmlType::kQ3_K, {256}, blk);
  for (int e = 0; e < 256; ++e) {
    const int b = e / 32, g = (e % 128) / 32, part = (e % 32) / 16;
    const int low = e % 2 ? 3 - g : g;
    const bool high = part == 0 ? (0x55 >> b) & 1 : (0xAA >> b) & 1;
    EXPECT_EQ(y[e],
              0.5f * static_cast<float>(e / 16 - 8) * static_cast<float>(low - (high ? 0 : 4)))
        << e;
  }
  EXPECT_EQ(y[40], 9.0f);   // scale -6; g = 1, even; bit 1 of 0x55 clear -> 1 - 4 = -3
  EXPECT_EQ(y[57], -5.0f);  // scale -5; g = 1, odd -> 2; bit 1 of 0xAA set -> 2
  EXPECT_EQ(y[180], 1.5f);  // scale 3; g = 1, even -> 1; bit 5 of 0xAA set -> 1
}

// Q4_K / Q5_K scales: sub-block j has scale sc[j] and min mn[j] (6 bits each). j < 4: low six
// bits of bytes j and j + 4; j >= 4: nibbles of byte j + 4, top two bits from the top of bytes
// j - 4 and j. Choose sc = {1..7, 24}, mn = {0..6, 39}: 24 = 8 | 1 << 4 and 39 = 7 | 2 << 4 put
// 1 in the top bits of byte 3 and 2 in those of byte 7.
constexpr int kSc[8] = {1, 2, 3, 4, 5, 6, 7, 24};
constexpr int kMn[8] = {0, 1, 2, 3, 4, 5, 6, 39};
std::string k4_scales() {
  std::string s = bytes_of({1, 2, 3, 4 | 0x40, 0, 1, 2, 3 | 0x80, 0x45, 0x56, 0x67, 0x78});
  return s;
}
// qs byte i = (i % 16) | (15 - i % 16) << 4; chunk c = e / 64 reads bytes 32c..32c+31, the first
// 32 values from low nibbles and the next 32 from high nibbles.
std::string k4_qs() {
  std::string s;
  for (int i = 0; i < 128; ++i) s.push_back(static_cast<char>((i % 16) | ((15 - i % 16) << 4)));
  return s;
}
int k4_code(int e) { return (e % 64) < 32 ? e % 16 : 15 - e % 16; }

TEST(Gguf, DequantQ4_K) {
  // d = 1, dmin = 0.5: x_e = sc[e/32] * code - 0.5 * mn[e/32].
  const std::string blk = h16(0x3C00) + h16(0x3800) + k4_scales() + k4_qs();
  ASSERT_EQ(blk.size(), 144u);
  const auto y = dequant_one(GgmlType::kQ4_K, {256}, blk);
  for (int e = 0; e < 256; ++e)
    EXPECT_EQ(y[e], static_cast<float>(kSc[e / 32] * k4_code(e)) - 0.5f * kMn[e / 32]) << e;
  EXPECT_EQ(y[33], 27.5f);    // sc 2, mn 1, high nibble of byte 1: 14 -> 28 - 0.5
  EXPECT_EQ(y[130], 8.0f);    // sc 5, mn 4, low nibble 2 -> 10 - 2
  EXPECT_EQ(y[250], 100.5f);  // sc 24, mn 39, high nibble of byte 122: 5 -> 120 - 19.5
}

TEST(Gguf, DequantQ5_K) {
  // As Q4_K, plus qh[l] = 0xAA: sub-block j takes its fifth bit from bit j of qh[e % 32], so the
  // odd sub-blocks add 16 to every code.
  const std::string blk =
      h16(0x3C00) + h16(0x3800) + k4_scales() + std::string(32, '\xAA') + k4_qs();
  ASSERT_EQ(blk.size(), 176u);
  const auto y = dequant_one(GgmlType::kQ5_K, {256}, blk);
  for (int e = 0; e < 256; ++e) {
    const int j = e / 32, code = k4_code(e) + (j % 2 ? 16 : 0);
    EXPECT_EQ(y[e], static_cast<float>(kSc[j] * code) - 0.5f * kMn[j]) << e;
  }
  EXPECT_EQ(y[33], 59.5f);    // 2 * (14 + 16) - 0.5
  EXPECT_EQ(y[255], 364.5f);  // 24 * (0 + 16) - 19.5
}

TEST(Gguf, DequantQ6_K) {
  // d = 0.5, int8 scales[i] = i - 8 for the 16-value sub-block i = e / 16.
  // ql byte i = (i & 15) | ((i + 1) & 15) << 4, qh bytes all 0xE4 (2-bit fields 0,1,2,3).
  // Value e: half h = e/128, quarter k = (e%128)/32, l = e%32. Low four bits: nibble k/2 of
  // ql[64h + l + 32 (k%2)], i.e. l % 16 (k < 2) or (l + 1) % 16 (k >= 2); top two bits: field k
  // of qh[32h + l] = k. x = d * scale * (code - 32).
  std::string blk;
  for (int i = 0; i < 128; ++i) blk.push_back(static_cast<char>((i & 15) | (((i + 1) & 15) << 4)));
  blk += std::string(64, '\xE4');
  for (int i = 0; i < 16; ++i) blk.push_back(static_cast<char>(i - 8));
  blk += h16(0x3800);
  ASSERT_EQ(blk.size(), 210u);
  const auto y = dequant_one(GgmlType::kQ6_K, {256}, blk);
  for (int e = 0; e < 256; ++e) {
    const int k = (e % 128) / 32, l = e % 32;
    const int code = (k < 2 ? l % 16 : (l + 1) % 16) | (k << 4);
    EXPECT_EQ(y[e], 0.5f * static_cast<float>(e / 16 - 8) * static_cast<float>(code - 32)) << e;
  }
  EXPECT_EQ(y[0], 128.0f);   // scale -8, code 0: 0.5 * -8 * -32
  EXPECT_EQ(y[40], 24.0f);   // scale -6, code 8 | 16 = 24: 0.5 * -6 * -8
  EXPECT_EQ(y[200], 18.0f);  // scale 4, code 9 | 32 = 41: 0.5 * 4 * 9
  EXPECT_EQ(y[255], 56.0f);  // scale 7, code 0 | 48: 0.5 * 7 * 16
}

TEST(Gguf, TypeTraitsAndDequantizeRowErrors) {
  EXPECT_EQ(ggml_type_name(3), "Q4_1 (3)");
  EXPECT_EQ(ggml_type_name(5), "unknown (5)");  // retired Q4_3
  ASSERT_NE(type_traits(14), nullptr);
  EXPECT_EQ(type_traits(14)->block_elems, 256);
  EXPECT_EQ(type_traits(14)->block_bytes, 210);
  float out[32];
  const uint8_t zeros[20] = {};
  expect_error([&] { dequantize_row(GgmlType::kQ4_1, zeros, 16, out); },
               "16 values of Q4_1 are not whole blocks of 32");
  expect_error([&] { dequantize_row(GgmlType::kIQ4_NL, zeros, 32, out); },
               "IQ4_NL (20) has no decoder");
  // A tensor of a known type without a decoder opens fine; only dequantizing it fails.
  const auto f =
      GgufFile::parse(one_tensor("iq", {256}, GgmlType::kIQ2_XXS, std::string(66, '\0')), "t.gguf");
  EXPECT_EQ(f.tensor("iq").nbytes, 66u);
  expect_error([&] { f.dequantize("iq"); },
               "t.gguf: tensor 'iq' has ggml type IQ2_XXS (16), which this reader cannot");
}

// ---- malformed files -------------------------------------------------------------------------

// A valid file: three metadata entries and two Q4_1 tensors; the last tensor ends the file.
Builder base_builder() {
  Builder b;
  b.kv("general.architecture", VT::kString, gstr("llama"))
      .kv("llama.block_count", VT::kUint32, u32(2))
      .kv("tok", VT::kArray, garray(VT::kString, 2, gstr("a") + gstr("bc")));
  b.tensor({"w0", {32, 2}, 3, std::string(40, '\x11'), {}});
  b.tensor({"w1", {32}, 3, std::string(20, '\x22'), {}});
  return b;
}

TEST(GgufMalformed, BaseFileIsValid) {
  const auto f = GgufFile::parse(base_builder().build(), "t.gguf");
  EXPECT_EQ(f.tensors().size(), 2u);
  EXPECT_EQ(f.tensor("w1").offset, 64u);
}

TEST(GgufMalformed, BadMagic) {
  std::string b = base_builder().build();
  b[3] = 'X';
  expect_error(b, "not a GGUF file (magic bytes 47475558");
  expect_error("", "not a GGUF file (magic bytes missing");
  expect_error("GG", "not a GGUF file");
}

TEST(GgufMalformed, UnknownVersion) {
  Builder b = base_builder();
  b.version = 4;
  expect_error(b.build(), "unsupported GGUF version 4");
  b.version = 1;
  expect_error(b.build(), "GGUF version 1 is not supported");
  b.version = 0x03000000;  // version 3 written big-endian
  expect_error(b.build(), "big-endian GGUF");
}

TEST(GgufMalformed, TruncatedAnywhere) {
  const std::string full = base_builder().build();
  for (size_t n = 0; n < full.size(); ++n) {
    try {
      GgufFile::parse(full.substr(0, n), "t.gguf");
      ADD_FAILURE() << "prefix of " << n << " bytes parsed";
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
    }
  }
  expect_error(full.substr(0, 6), "truncated at byte 4 reading version (4 bytes needed, 2 left)");
  expect_error(full.substr(0, full.size() - 1), "tensor 'w1' data (offset 64, 20 bytes");
}

TEST(GgufMalformed, StringLongerThanTheFile) {
  Builder b;
  b.kvs.push_back(u64(1000000000000ull) + "key" + std::string(20, '\0'));
  expect_error(b.build(),
               "metadata key #0 has string length 1000000000000 but only 23 bytes remain");
  Builder v;
  v.kv("s", VT::kString, u64(1ull << 62));
  expect_error(v.build(), "metadata 's' has string length 4611686018427387904");
}

TEST(GgufMalformed, ArrayCountLargerThanTheFile) {
  expect_error(Builder{}.kv("a", VT::kArray, garray(VT::kUint32, 1ull << 61, "")).build(),
               "metadata 'a' has array count 2305843009213693952 larger than the 0 bytes");
  expect_error(
      Builder{}
          .kv("a", VT::kArray, garray(VT::kString, 3, gstr("xxxxxxxxxxxx") + gstr("yyyyyyyyyyyy")))
          .build(),
      "truncated at byte 89 reading metadata 'a'");
  // Every string needs at least its 8-byte length: 2 strings cannot fit in 15 bytes.
  expect_error(Builder{}.kv("a", VT::kArray, garray(VT::kString, 2, std::string(15, '\0'))).build(),
               "array count 2 larger than the 15 bytes");
}

TEST(GgufMalformed, AbsurdCounts) {
  Builder b = base_builder();
  b.tensor_count = 1ull << 60;
  expect_error(b.build(), "absurd tensor_count 1152921504606846976");
  b = base_builder();
  b.kv_count = ~0ull;
  expect_error(b.build(), "absurd metadata_kv_count 18446744073709551615");
}

TEST(GgufMalformed, BadTensorInfos) {
  const auto with = [](TensorSpec t) { return Builder{}.tensor(std::move(t)).build(); };
  const std::string blk(20, '\0');
  expect_error(with({"w", {32, 1, 1, 1, 1}, 3, blk, {}}), "tensor 'w' has n_dims 5 (at most 4)");
  expect_error(with({"w", {32}, 99, blk, {}}), "tensor 'w' has unknown ggml type 99");
  expect_error(with({"w", {32}, 4, blk, {}}), "unknown ggml type 4");  // retired Q4_2
  expect_error(with({"w", {1ull << 32, 1ull << 32}, 0, blk, {}}),
               "tensor 'w' dims [4294967296, 4294967296] overflow the element count");
  expect_error(with({"w", {~0ull}, 0, blk, {}}),
               "dimension 0 = 18446744073709551615 is out of range");
  expect_error(with({"w", {48}, 3, blk, {}}),
               "row length ne[0] = 48 is not a multiple of the Q4_1 block size 32");
  // 2^62 elements fit int64, their 2^65 bytes of F64 do not.
  expect_error(with({"w", {1ull << 62}, 28, blk, {}}), "byte size overflows");
  expect_error(with({"w", {32}, 3, blk, 16}),
               "data offset 16 is not a multiple of the alignment 32");
  expect_error(with({"w", {32}, 3, blk, 1ull << 40}), "tensor 'w' data (offset 1099511627776");
  expect_error(with({"w", {32}, 3, blk, ~0ull & ~31ull}), "lies outside the file");
  expect_error(with({"w", {64}, 3, blk, {}}), "tensor 'w' data (offset 0, 40 bytes");
  Builder dup = base_builder();
  dup.tensor({"w0", {32}, 3, blk, {}});
  expect_error(dup.build(), "duplicate tensor name 'w0'");
}

TEST(GgufMalformed, BadMetadataValues) {
  expect_error(Builder{}.kv("x", static_cast<VT>(13), u32(0)).build(),
               "metadata 'x' has unknown value type 13");
  expect_error(Builder{}.kv("x", VT::kArray, garray(static_cast<VT>(77), 0, "")).build(),
               "metadata 'x' is an array of unknown value type 77");
  expect_error(Builder{}.kv("x", VT::kBool, le<uint8_t>(2)).build(), "metadata 'x' is bool 2");
  expect_error(Builder{}.kv("x", VT::kArray, garray(VT::kBool, 2, bytes_of({1, 7}))).build(),
               "element 1 is bool 7");
  expect_error(Builder{}.kv("", VT::kUint8, le<uint8_t>(1)).build(), "metadata key #0 is empty");
  expect_error(Builder{}.kv("k", VT::kUint8, "\x01").kv("k", VT::kUint8, "\x02").build(),
               "duplicate metadata key 'k'");
  std::string nested = garray(VT::kUint8, 0, "");
  for (int i = 0; i < 10; ++i) nested = garray(VT::kArray, 1, nested);
  expect_error(Builder{}.kv("deep", VT::kArray, nested).build(), "nests arrays deeper than 8");
}

TEST(GgufMalformed, BadAlignment) {
  Builder b = base_builder();
  b.kv("general.alignment", VT::kUint32, u32(48));
  expect_error(b.build(), "metadata 'general.alignment' = 48 is not a power of two");
  b = base_builder();
  b.kv("general.alignment", VT::kUint32, u32(0));
  expect_error(b.build(), "'general.alignment' = 0 is not a power of two");
  b = base_builder();
  b.kv("general.alignment", VT::kUint64, u64(32));
  expect_error(b.build(), "'general.alignment' has type uint64, expected uint32");
}

TEST(GgufMalformed, OpenMissingFile) {
  expect_error([] { GgufFile::open("/nonexistent/dir/m.gguf"); },
               "/nonexistent/dir/m.gguf: cannot open GGUF file");
  expect_error([] { GgufFile::open("/"); }, "/: not a regular file");
}

// Random byte corruption of the header (fixed seed): every outcome is a clean parse or a
// kvq::Error, never a crash, another exception type or a runaway allocation.
TEST(GgufMalformed, RandomHeaderCorruptionNeverCrashes) {
  const std::string full = base_builder().build();
  const size_t header = GgufFile::parse(full, "t.gguf").data_offset();
  std::mt19937 rng(20240607);
  int parsed = 0, rejected = 0;
  for (int it = 0; it < 4000; ++it) {
    std::string b = full;
    const int flips = 1 + static_cast<int>(rng() % 3);
    for (int k = 0; k < flips; ++k) b[rng() % header] = static_cast<char>(rng());
    try {
      const auto f = GgufFile::parse(b, "t.gguf");
      for (const auto& t : f.tensors())
        if (type_traits(static_cast<uint32_t>(t.type))->dequantizable) f.dequantize(t);
      ++parsed;
    } catch (const Error&) {
      ++rejected;
    }
  }
  EXPECT_GT(rejected, 0);
  EXPECT_GT(parsed, 0);
}

// ---- the real model (REFERENCE.md section 7; scripts/fetch-model.sh fetches it) -------------

// The fetched model, found where the commands look (tests/support/model.h).
std::string find_model() { return kvq::testing::model_file(); }

double rms(const std::vector<float>& v) {
  double s = 0;
  for (float x : v) s += static_cast<double>(x) * x;
  return std::sqrt(s / static_cast<double>(v.size()));
}

TEST(GgufRealModel, SmolLM2MetadataAndWeights) {
  const std::string path = find_model();
  if (path.empty())
    GTEST_SKIP() << "SmolLM2-135M-Instruct.Q4_1.gguf not in $KVQ_MODEL_DIR or ~/.cache/kvq; run "
                    "scripts/fetch-model.sh";
  const auto f = GgufFile::open(path);
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.get_string("general.architecture"), "llama");
  EXPECT_EQ(f.get_u32("llama.block_count"), 30u);
  EXPECT_EQ(f.get_u32("llama.embedding_length"), 576u);
  EXPECT_EQ(f.get_u32("llama.feed_forward_length"), 1536u);
  EXPECT_EQ(f.get_u32("llama.attention.head_count"), 9u);
  EXPECT_EQ(f.get_u32("llama.attention.head_count_kv"), 3u);
  EXPECT_EQ(f.get_u32("llama.context_length"), 8192u);
  EXPECT_EQ(f.get_f32("llama.rope.freq_base"), 100000.0f);
  EXPECT_EQ(f.get_f32("llama.attention.layer_norm_rms_epsilon"), 1e-5f);
  const auto tokens = f.get_string_array("tokenizer.ggml.tokens");
  ASSERT_EQ(tokens.size(), 49152u);
  EXPECT_EQ(tokens[0], "<|endoftext|>");
  EXPECT_EQ(tokens[1], "<|im_start|>");
  EXPECT_EQ(f.get_i32_array("tokenizer.ggml.token_type").size(), 49152u);
  EXPECT_EQ(f.array_size("tokenizer.ggml.merges"), 48900u);

  // 272 tensors: 61 F32 norms, 210 Q4_1 matrices, the Q8_0 token embedding (tied with output).
  int n_f32 = 0, n_q4_1 = 0, n_q8_0 = 0;
  for (const auto& t : f.tensors()) {
    n_f32 += t.type == GgmlType::kF32;
    n_q4_1 += t.type == GgmlType::kQ4_1;
    n_q8_0 += t.type == GgmlType::kQ8_0;
  }
  EXPECT_EQ(f.tensors().size(), 272u);
  EXPECT_EQ(n_f32, 61);
  EXPECT_EQ(n_q4_1, 210);
  EXPECT_EQ(n_q8_0, 1);

  const TensorInfo& emb = f.tensor("token_embd.weight");
  EXPECT_EQ(emb.dims, (std::vector<int64_t>{576, 49152}));
  EXPECT_EQ(emb.type, GgmlType::kQ8_0);
  EXPECT_EQ(f.tensor("blk.0.attn_k.weight").dims, (std::vector<int64_t>{576, 192}));
  EXPECT_EQ(f.tensor("blk.29.ffn_down.weight").dims, (std::vector<int64_t>{1536, 576}));

  // Pinned values from an independent decoder (gguf-py 0.19.0, gguf.quants.dequantize), which
  // agreed bit for bit with this reader on all 272 tensors.
  const auto e = f.dequantize(emb);
  ASSERT_EQ(e.size(), 576u * 49152u);
  double sum = 0;
  for (float x : e) {
    ASSERT_TRUE(std::isfinite(x));
    sum += x;
  }
  const double r = rms(e);
  EXPECT_GT(r, 0.05);
  EXPECT_LT(r, 0.5);
  EXPECT_NEAR(r, 0.13557929232202331, 1e-9);
  EXPECT_NEAR(sum, -15353.04449415207, 1e-4);
  EXPECT_EQ(e[0], -0.10654449462890625f);
  EXPECT_EQ(e[1], 0.032978057861328125f);
  EXPECT_EQ(e.back(), -0.0417022705078125f);

  const auto q = f.dequantize("blk.0.attn_q.weight");
  EXPECT_EQ(q[0], -0.0963134765625f);
  EXPECT_EQ(q[1], 0.1573486328125f);
  EXPECT_EQ(q.back(), -0.255859375f);
  EXPECT_NEAR(rms(q), 0.2839461246469261, 1e-9);
  const auto norm = f.dequantize("output_norm.weight");
  EXPECT_EQ(norm[0], 1.7578125f);
  EXPECT_NEAR(rms(norm), 1.8265668454357387, 1e-9);
}

}  // namespace
}  // namespace kvq::gguf
