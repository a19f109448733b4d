// Tests for kernels/cuda/unpack.h on the host, against the reference decoders. Int codes: every
// pair of codes of every pair position, under four patterns of the word's other bits, against
// kivi/layout.h's definition (code j of a word in bits [B j, B j + B)),
// read back from the binary16 halves by core/half.h's exact conversion. FP8: fp8::decode on all
// 65,536 pairs of codes of each format (the halves times 2^(15 - kBias), a power of two, exact),
// bit-exact as floats; NaN codes apart (decode gives NaN; the integer form a finite number).
#include "kernels/cuda/unpack.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "core/half.h"
#include "fp8/format.h"

namespace kvq::cuda::unpack {
namespace {

float lo_half(uint32_t h2) { return half_bits_to_float(static_cast<uint16_t>(h2 & 0xffffu)); }
float hi_half(uint32_t h2) { return half_bits_to_float(static_cast<uint16_t>(h2 >> 16)); }

// The layout's code j of a word (kivi/layout.h: code j in bits [B j, B j + B)).
uint32_t code_of(uint32_t w, int b, int j) { return (w >> (b * j)) & ((1u << b) - 1); }

template <int B>
void check_every_word_pattern() {
  constexpr int kCodes = 32 / B, kPairs = 16 / B;
  // Every value of each pair's two fields, the other bits set to a changing pattern (they must
  // not leak into the halves).
  for (int k = 0; k < kPairs; ++k)
    for (uint32_t c0 = 0; c0 < (1u << B); ++c0)
      for (uint32_t c1 = 0; c1 < (1u << B); ++c1)
        for (uint32_t noise : {0u, 0xffffffffu, 0xa5a5a5a5u, 0x5a5a5a5au}) {
          const uint32_t field = (1u << B) - 1;
          uint32_t w = noise & ~((field << (B * k)) | (field << (B * (k + kPairs))));
          w |= (c0 << (B * k)) | (c1 << (B * (k + kPairs)));
          ASSERT_EQ(code_of(w, B, k), c0);
          ASSERT_EQ(code_of(w, B, k + kCodes / 2), c1);
          const uint32_t h = int_pair_magic<B>(w, k);
          ASSERT_EQ(lo_half(h), 1024.0f + static_cast<float>(c0)) << "k " << k << " w " << w;
          ASSERT_EQ(hi_half(h), 1024.0f + static_cast<float>(c1)) << "k " << k << " w " << w;
          // the half2 subtract of 1024 leaves the code exactly (binary16 arithmetic, emulated in
          // float: both operands and the result are binary16 values)
          ASSERT_EQ(lo_half(h) - 1024.0f, static_cast<float>(c0));
        }
}

TEST(cudaUnpack, intPairMagic_2bit_everyPairOfCodes) { check_every_word_pattern<2>(); }
TEST(cudaUnpack, intPairMagic_4bit_everyPairOfCodes) { check_every_word_pattern<4>(); }

template <Fp8Format F>
void check_every_fp8_pair() {
  const float pow2 = std::ldexp(1.0f, kHalfExpShift<F>);
  int64_t nan_pairs = 0;
  for (uint32_t two = 0; two < 65536; ++two) {
    const uint32_t h = fp8_pair_half2<F>(static_cast<uint16_t>(two));
    const uint8_t c[2] = {static_cast<uint8_t>(two & 0xff), static_cast<uint8_t>(two >> 8)};
    const float got[2] = {lo_half(h) * pow2, hi_half(h) * pow2};
    for (int i = 0; i < 2; ++i) {
      const float want = fp8::decode(F, c[i]);
      if (std::isnan(want)) {
        ++nan_pairs;
        if constexpr (F == Fp8Format::E5M2) {  // binary16 NaNs
          ASSERT_TRUE(std::isnan(got[i])) << int(c[i]);
        }
        continue;
      }
      uint32_t a, b;
      std::memcpy(&a, &got[i], 4);
      std::memcpy(&b, &want, 4);
      ASSERT_EQ(a, b) << "code " << int(c[i]) << " got " << got[i] << " want " << want;
    }
  }
  EXPECT_GT(nan_pairs, 0);  // the NaN codes were seen (and set apart)
}

TEST(cudaUnpack, fp8PairHalf2_e4m3_every65536Pairs) { check_every_fp8_pair<Fp8Format::E4M3>(); }
TEST(cudaUnpack, fp8PairHalf2_e4m3fnuz_every65536Pairs) {
  check_every_fp8_pair<Fp8Format::E4M3FNUZ>();
}
TEST(cudaUnpack, fp8PairHalf2_e5m2_every65536Pairs) { check_every_fp8_pair<Fp8Format::E5M2>(); }

}  // namespace
}  // namespace kvq::cuda::unpack
