// KIVI's bit packing, defined once for host and device: 32/b codes of b bits in one 32-bit word,
// code i of a word at bits [i*b, (i+1)*b), least significant first.
//
//   bits  codes/word  unused bits   storage per element with G-element groups (fp16 scale + min)
//   2     16          0             2 + 32/G bits   (3 bits at G=32)
//   3     10          30-31 (zero)  3.2 + 32/G bits (10 codes per word, not 32/3: no code spans
//                                                    two words, so every code is one shift+mask)
//   4     8           0             4 + 32/G bits
//   8     4           0             8 + 32/G bits
//
// A run of n codes takes words_for(n, b) = ceil(n / codes_per_word(b)) words; the unused high
// codes of the last word are zero. Keys are packed along tokens, values along channels
// (kivi/layout.h says where each group's words live).
#pragma once

#include "core/hostdev.h"

namespace kvq::kivi {

/// \brief Codes of `bits` bits held by one 32-bit word: 16, 10, 8, 4 for b = 2, 3, 4, 8.
KVQ_HD constexpr int codes_per_word(int bits) { return 32 / bits; }

/// \brief 32-bit words holding n codes of `bits` bits.
KVQ_HD constexpr int64_t words_for(int64_t n, int bits) {
  return (n + codes_per_word(bits) - 1) / codes_per_word(bits);
}

/// \brief Mask of one code: 2^bits - 1.
KVQ_HD constexpr uint32_t code_mask(int bits) { return (1u << bits) - 1u; }

/// \brief Word of a packed run holding code i.
KVQ_HD constexpr int64_t word_of(int64_t i, int bits) { return i / codes_per_word(bits); }
/// \brief Bit position of code i inside its word: (i mod codes_per_word) * bits.
KVQ_HD constexpr int shift_of(int64_t i, int bits) {
  return static_cast<int>(i % codes_per_word(bits)) * bits;
}

static_assert(codes_per_word(2) == 16 && codes_per_word(3) == 10 && codes_per_word(4) == 8 &&
              codes_per_word(8) == 4);
static_assert(words_for(32, 2) == 2 && words_for(32, 3) == 4 && words_for(32, 4) == 4 &&
              words_for(32, 8) == 8 && words_for(0, 2) == 0 && words_for(11, 3) == 2);
static_assert(codes_per_word(3) * 3 == 30, "3-bit words leave bits 30-31 zero");
static_assert(word_of(10, 3) == 1 && shift_of(10, 3) == 0 && shift_of(9, 3) == 27 &&
              shift_of(15, 2) == 30 && shift_of(3, 8) == 24);

/// \brief Packs n codes (each < 2^bits) into words_for(n, bits) words; every bit of those words
/// is written (unused ones zero), so the destination needs no clearing.
KVQ_HD void pack(const uint32_t* codes, int64_t n, int bits, uint32_t* words) {
  const int cpw = codes_per_word(bits);
  for (int64_t w = 0; w * cpw < n; ++w) {
    uint32_t word = 0;
    const int64_t base = w * cpw;
    for (int i = 0; i < cpw && base + i < n; ++i) word |= codes[base + i] << shift_of(i, bits);
    words[w] = word;
  }
}

/// \brief Code i of a packed run.
KVQ_HD uint32_t unpack_one(const uint32_t* words, int64_t i, int bits) {
  return (words[word_of(i, bits)] >> shift_of(i, bits)) & code_mask(bits);
}

/// \brief Unpacks n codes from words_for(n, bits) words.
KVQ_HD void unpack(const uint32_t* words, int64_t n, int bits, uint32_t* codes) {
  for (int64_t i = 0; i < n; ++i) codes[i] = unpack_one(words, i, bits);
}

}  // namespace kvq::kivi
