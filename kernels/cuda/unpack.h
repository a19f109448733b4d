// Unpack math for the reworked CUDA decode kernels (issue 12): packed codes to binary16 pairs
// (half2 bits) two codes at a time with 32-bit integer ops and no per-code shift/convert, the way
// Marlin-style and FlashInfer kernels read quantized caches (int codes: a shift and one LOP3 per
// pair; fp8: a few ops per pair). Every function is __host__ __device__ (core/hostdev.h), so the
// CPU tests (tests/kernels/cuda/unpack_test.cpp) check them against the reference decoders: every
// pair of fp8 codes, every pair of int codes under four patterns of the word's other bits.
// Called by attention_kernels.cu's tiled kernel (DecodeKernel::Tiled): fp8 rows and 4-bit
// per-token value codes.
//
// Int codes (kivi/layout.h): a 32-bit word holds 32 / B codes, code j in bits [B j, B j + B). The
// magic-number trick ORs two codes 16 bits apart into the mantissas of two binary16 1024.0s:
// binary16 0x6400 is 1024 and its 10 mantissa bits count units, so 0x6400 | c is 1024 + c exactly
// (c < 1024); one half2 subtract of (1024, 1024) leaves the codes exactly, which a multiply by the
// scale and an add of the minimum then dequantize (folding the subtract into one fma with
// min - 1024 scale would round that constant in binary16). Pair k of a word holds codes
// (k, k + 16 / B): for B = 4, pairs (0, 4), (1, 5), (2, 6), (3, 7); for B = 2, (0, 8) .. (7, 15).
//
// FP8 codes: a code's sign bit placed at binary16's sign and its exponent and mantissa bits under
// binary16's (fp8_pair_half2) give its value times 2^(kBias - 15) for e4m3 / e4m3fnuz, subnormals
// included (binary16 has 5 exponent bits and 10 mantissa bits, e4m3 4 and 3), and the value itself
// for e5m2 (the top byte of a binary16). The power of two folds into the scale. sm_89+ has
// cvt.rn.f16x2.e4m3x2 / e5m2x2, which gives the value itself (no power of two), NaN for NaN codes
// and has no e4m3fnuz form; this integer form serves every format and gives a finite number for
// e4m3's NaN codes, which the saturating encoder never writes.
#pragma once

#include <cstdint>

#include "core/hostdev.h"
#include "core/spec.h"
#include "fp8/format.h"

namespace kvq::cuda::unpack {

/// binary16 1024.0 in both halves of a half2.
inline constexpr uint32_t kMagic1024x2 = 0x64006400u;

/// \brief Codes (k, k + 16 / B) of a word of B-bit codes (B = 2 or 4) as the half2 (1024 + c0,
/// 1024 + c1), as bits (low half first). k in [0, 16 / B).
template <int B>
KVQ_HD uint32_t int_pair_magic(uint32_t w, int k) {
  static_assert(B == 2 || B == 4, "16-bit-apart pairs of 2- or 4-bit codes");
  constexpr uint32_t kMask = ((1u << B) - 1) * 0x00010001u;  // one field in each half
  return ((w >> (B * k)) & kMask) | kMagic1024x2;
}

/// \brief The exponent 15 - kBias (0 for e5m2): fp8_pair_half2's halves times 2^kHalfExpShift are
/// the values.
template <Fp8Format F>
inline constexpr int kHalfExpShift = 15 - fp8::Traits<F>::kBias;

/// \brief Two FP8 codes (low byte first) as half2 bits, each half = value * 2^(kBias - 15) (e5m2:
/// the value), exact for every non-NaN code; e4m3's NaN codes give finite halves.
template <Fp8Format F>
KVQ_HD uint32_t fp8_pair_half2(uint16_t two) {
  // each code in the low byte of its half: 0x00bb00aa
  const uint32_t s = (static_cast<uint32_t>(two) | (static_cast<uint32_t>(two) << 8)) & 0x00ff00ffu;
  if constexpr (fp8::Traits<F>::kExpBits == 5) {
    return s << 8;  // e5m2 is the top byte of a binary16
  } else {
    // sign to bit 15, exponent and mantissa (7 bits) to bits 7 .. 13 (binary16's exponent field
    // is bits 10 .. 14, its mantissa 0 .. 9: e4m3's 4 exponent bits land in the low 4 of the 5)
    return ((s & 0x00800080u) << 8) | ((s & 0x007f007fu) << 7);
  }
}

}  // namespace kvq::cuda::unpack
