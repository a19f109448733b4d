// kivi/pack.h: bit positions worked out by hand (code i of a word at bits [i*b, (i+1)*b), least
// significant first; b=3 packs 10 codes and leaves bits 30-31 zero), then random round trips.
#include "kivi/pack.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <random>
#include <vector>

namespace kvq::kivi {
namespace {

constexpr uint32_t kSentinel = 0xDEADBEEFu;

// Packs into a buffer with a sentinel word after the last one; checks the sentinel survives.
std::vector<uint32_t> pack_checked(const std::vector<uint32_t>& codes, int bits) {
  const int64_t n = static_cast<int64_t>(codes.size());
  std::vector<uint32_t> words(static_cast<size_t>(words_for(n, bits)) + 1, kSentinel);
  pack(codes.data(), n, bits, words.data());
  EXPECT_EQ(words.back(), kSentinel) << "pack wrote past words_for(" << n << ", " << bits << ")";
  words.pop_back();
  return words;
}

TEST(kiviPack, codesPerWord_wordsFor_byHand) {
  EXPECT_EQ(codes_per_word(2), 16);
  EXPECT_EQ(codes_per_word(3), 10);
  EXPECT_EQ(codes_per_word(4), 8);
  EXPECT_EQ(codes_per_word(8), 4);
  EXPECT_EQ(words_for(32, 2), 2);
  EXPECT_EQ(words_for(33, 2), 3);
  EXPECT_EQ(words_for(32, 3), 4);  // 10 + 10 + 10 + 2
  EXPECT_EQ(words_for(30, 3), 3);
  EXPECT_EQ(words_for(8, 3), 1);
  EXPECT_EQ(words_for(72, 4), 9);
  EXPECT_EQ(words_for(1, 8), 1);
  EXPECT_EQ(words_for(0, 4), 0);
}

TEST(kiviPack, b2_n16_byHand) {
  // codes i % 4: each byte holds 0 | 1<<2 | 2<<4 | 3<<6 = 0xE4
  std::vector<uint32_t> c;
  for (uint32_t i = 0; i < 16; ++i) c.push_back(i % 4);
  EXPECT_EQ(pack_checked(c, 2), (std::vector<uint32_t>{0xE4E4E4E4u}));
}

TEST(kiviPack, b2_n17_partialLastWord) {
  std::vector<uint32_t> c(17, 0);
  c[0] = 1;
  c[15] = 2;  // bits 30-31
  c[16] = 3;  // second word, bits 0-1, the rest zero
  EXPECT_EQ(pack_checked(c, 2), (std::vector<uint32_t>{0x80000001u, 0x00000003u}));
}

TEST(kiviPack, b3_n10_allSevens_bits30and31Zero) {
  EXPECT_EQ(pack_checked(std::vector<uint32_t>(10, 7), 3), (std::vector<uint32_t>{0x3FFFFFFFu}));
}

TEST(kiviPack, b3_n11_byHand) {
  std::vector<uint32_t> c(11, 0);
  c[0] = 1;   // bits 0-2
  c[1] = 6;   // bits 3-5: 0x30
  c[9] = 5;   // bits 27-29: 5 << 27 = 0x28000000
  c[10] = 4;  // next word, bits 0-2
  EXPECT_EQ(pack_checked(c, 3), (std::vector<uint32_t>{0x28000031u, 0x00000004u}));
}

TEST(kiviPack, b4_n8_byHand) {
  EXPECT_EQ(pack_checked({1, 2, 3, 4, 5, 6, 7, 8}, 4), (std::vector<uint32_t>{0x87654321u}));
}

TEST(kiviPack, b4_n3_partial) {
  EXPECT_EQ(pack_checked({0xF, 0x0, 0xA}, 4), (std::vector<uint32_t>{0x00000A0Fu}));
}

TEST(kiviPack, b8_n5_byHand) {
  EXPECT_EQ(pack_checked({0x11, 0x22, 0x33, 0x44, 0xFF}, 8),
            (std::vector<uint32_t>{0x44332211u, 0x000000FFu}));
}

TEST(kiviPack, unpackOne_byHand) {
  const uint32_t w[2] = {0x28000031u, 0x00000004u};  // b3_n11 above
  EXPECT_EQ(unpack_one(w, 0, 3), 1u);
  EXPECT_EQ(unpack_one(w, 1, 3), 6u);
  EXPECT_EQ(unpack_one(w, 2, 3), 0u);
  EXPECT_EQ(unpack_one(w, 9, 3), 5u);
  EXPECT_EQ(unpack_one(w, 10, 3), 4u);
}

class kiviPackRoundTrip : public ::testing::TestWithParam<int> {};

TEST_P(kiviPackRoundTrip, random_n1_to_101) {
  const int b = GetParam();
  std::mt19937 rng(1234 + b);
  int checked = 0;
  for (int64_t n : {1, 7, 9, 10, 11, 16, 31, 32, 33, 100, 101}) {
    std::vector<uint32_t> codes(static_cast<size_t>(n));
    for (auto& c : codes) c = rng() & ((1u << b) - 1u);
    const std::vector<uint32_t> words = pack_checked(codes, b);
    ASSERT_EQ(static_cast<int64_t>(words.size()), words_for(n, b));
    std::vector<uint32_t> back(codes.size(), 0xFFFFu);
    unpack(words.data(), n, b, back.data());
    EXPECT_EQ(back, codes) << "b=" << b << " n=" << n;
    // unused high bits of every word are zero: beyond 10 codes at b=3, beyond n in the last word
    const int cpw = codes_per_word(b);
    const int64_t last_codes = n - (static_cast<int64_t>(words.size()) - 1) * cpw;
    const int used_last = static_cast<int>(last_codes) * b;
    if (used_last < 32) {
      EXPECT_EQ(words.back() >> used_last, 0u) << "b=" << b << " n=" << n;
    }
    if (b == 3) {
      for (uint32_t w : words) EXPECT_EQ(w >> 30, 0u);
    }
    checked += static_cast<int>(n);
  }
  EXPECT_EQ(checked, 1 + 7 + 9 + 10 + 11 + 16 + 31 + 32 + 33 + 100 + 101);
}

INSTANTIATE_TEST_SUITE_P(Bits, kiviPackRoundTrip, ::testing::Values(2, 3, 4, 8),
                         [](const auto& info) { return fmt::format("b{}", info.param); });

}  // namespace
}  // namespace kvq::kivi
