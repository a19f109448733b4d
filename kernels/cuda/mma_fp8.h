// Fragment arithmetic of the Mma decode kernel's FP8 path (kernels/cuda/attention_mma.cu,
// mma_fp8_split_kernel): e4m3 / e5m2 / e4m3fnuz codes converted two at a time straight into the
// fp16 B registers of mma.m16n8k16.f32.f16.f16.f32, as __host__ __device__ functions so that the
// CPU tests (tests/kernels/cuda/mma_layout_test.cpp) check them exhaustively. Fragment tables:
// mma_layout.h (the same for f16 as for bf16).
//
// Conversion (unpack.h's integer form, one op shorter): a 32-bit word whose bytes 1 and 3 hold two
// codes (bytes 0 and 2 anything) becomes the half2 (code1, code3) * 2^(kBias - 15) by
//   (t & 0x80008000) | ((t >> 1) & 0x3f803f80)      (e4m3, e4m3fnuz: sign; exponent + mantissa)
//   t & 0xff00ff00                                   (e5m2: a code is the top byte of a binary16)
// (fp8_hi_pair_half2), exact for every non-NaN code, subnormals included; the power of two
// (unpack::kHalfExpShift) and the per-tensor / per-head scale multiply the scores and the outputs
// once; per-token key scales multiply each score, per-token value scales fold into p
// (token_pshift), per-channel key scales fold into q (q_c s_c before q_shift and the split),
// per-channel value scales multiply each output channel once. This integer form serves every
// format (sm_89's cvt.rn.f16x2.e4m3x2 has no e4m3fnuz form).
//
// Keys (scores, B = K^T: k = channel, n = token). Lane (g, tig) takes token g of the n-tile and
// the D / 4 channels [tig D / 4, (tig + 1) D / 4) of it: one 16-byte shared load (two for D 128),
// word ks of it for k-step ks. The channel order inside a k-step is the kernel's choice (A, q, is
// built in the same order): B register r's half h is byte 2 h + r of the word, so register 0 is
// fp8_hi_pair_half2(w << 8) (bytes 0, 2) and register 1 fp8_hi_pair_half2(w) (bytes 1, 3); k row
// 2 tig + 8 r + h is channel key_channel(D, tig, ks, r, h). No byte permute.
//
// Values (P V, k = token, n = channel). Lane (g, tig) takes the D / 8 channels
// [g D / 8, (g + 1) D / 8) of tokens 2 tig, 2 tig + 1 (register 0) and 2 tig + 8, 2 tig + 9
// (register 1) of the k-step: four 16-byte (D 64: 8-byte) shared loads; n-tile j's column g is
// channel value_channel(D, g, j) = g D / 8 + j, and one PRMT (value_pair_word) puts byte j % 4 of
// the two tokens' words at bytes 1 and 3.
//
// A operands in fp16, high + low parts (as mma_layout.h's bf16 rows g and g + 8): q of head g
// times 2^q_shift (a power of two per head bringing max |q| into [2^14, 2^15): both parts stay
// normal fp16 down to 2^-28 of the head's largest element, and no product can overflow), p times
// 2^kPShift (p <= 1). The scores are C 2^(kHalfExpShift - q_shift) s_k / sqrt(D), the outputs
// C 2^(kHalfExpShift - kPShift) s_v.
//
// Shared tiles: rows of D bytes in 16-byte chunks, seen as 128-byte lines (D 128: a row; D 64: two
// rows); chunk x of a line sits at x ^ line_swizzle(line), so the quarter-warp phases of both
// read patterns above touch 8 different 16-byte bank groups (tested).
#pragma once

#include <cstdint>

#include "core/half.h"
#include "core/hostdev.h"
#include "fp8/format.h"

namespace kvq::cuda::mma_fp8 {

inline constexpr int kChunkBytes = 16;
inline constexpr int kPShift = 14;  // p (<= 1) times 2^14 as the fp16 A operand

/// \brief Half2 bits of the codes in bytes 1 (low half) and 3 (high half) of t, each half =
/// value * 2^(kBias - 15) (e5m2: the value); bytes 0 and 2 are ignored.
template <Fp8Format F>
KVQ_HD uint32_t fp8_hi_pair_half2(uint32_t t) {
  if constexpr (fp8::Traits<F>::kExpBits == 5) {
    return t & 0xff00ff00u;
  } else {
    return (t & 0x80008000u) | ((t >> 1) & 0x3f803f80u);
  }
}

/// Bytes 1 and 3 of the result: byte k (0..3) of a and of b (PRMT).
KVQ_HD uint32_t value_pair_word(uint32_t a, uint32_t b, int k) {
#if defined(__CUDA_ARCH__)
  return __byte_perm(a, b, (static_cast<unsigned>(4 + k) << 12) | (static_cast<unsigned>(k) << 4));
#else
  const uint32_t x = (a >> (8 * k)) & 0xffu, y = (b >> (8 * k)) & 0xffu;
  return (x << 8) | (y << 24);
#endif
}

/// Key B register r (0, 1) of a lane's k-step word w (4 codes of its token).
KVQ_HD uint32_t key_pair_word(uint32_t w, int r) { return r == 0 ? w << 8 : w; }

/// Channel of k row 2 tig + 8 r + h of key k-step ks.
KVQ_HD int key_channel(int D, int tig, int ks, int r, int h) {
  return tig * (D / 4) + 4 * ks + 2 * h + r;
}
/// Channel of column n of value n-tile j.
KVQ_HD int value_channel(int D, int n, int j) { return n * (D / 8) + j; }

/// XOR applied to the chunk index within 128-byte line `line` of a tile of D-byte rows.
template <int D>
KVQ_HD int line_swizzle(int line) {
  static_assert(D == 64 || D == 128, "head_dim 64 or 128");
  return D == 128 ? line % 8 : (2 * line) % 8;
}
/// Byte offset of chunk c (16 bytes) of row r in the swizzled tile.
template <int D>
KVQ_HD int chunk_offset(int r, int c) {
  const int x = r * (D / kChunkBytes) + c;  // chunk index, unswizzled
  const int line = x / 8;
  return (line * 8 + ((x % 8) ^ line_swizzle<D>(line))) * kChunkBytes;
}

/// The power of two e with amax * 2^e in [2^14, 2^15) (0 for 0, inf or NaN), within [-126, 126].
KVQ_HD int q_shift(float amax) {
  const int x = static_cast<int>((float_bits(amax) >> 23) & 0xffu);  // amax in [2^(x-127), ..)
  if (amax == 0.0f || x == 255) return 0;
  const int e = 141 - x;
  return e > 126 ? 126 : e;
}

/// The power of two 2^e for p' = p s_t 2^e with token value scales (p <= 1, s_t <= smax): smax
/// 2^e in [2^13, 2^14) (p' fp16 with room for the high + low split) for every smax >= 2^-112;
/// e in [-114, 125] (q_shift's cap), so that 2^e and the output factor 2^(kHalfExpShift - e)
/// stay normal floats: below 2^-112 (subnormal scales included) e = 125 and p' < 2^13 keeps fp16
/// precision down to 2^-14, each token's p' within 2^-25 absolute (2^-150 |V| after the output
/// factor); kPShift for smax 0, inf or NaN.
KVQ_HD int token_pshift(float smax) {
  if (!(smax > 0.0f) || ((float_bits(smax) >> 23) & 0xffu) == 0xffu) return kPShift;
  return q_shift(smax) - 1;
}

/// Two floats as f16x2 bits (x low), round to nearest even.
KVQ_HD uint32_t pack_half2(float x, float y) {
#if defined(__CUDA_ARCH__)
  uint32_t r;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(y), "f"(x));
  return r;
#else
  return static_cast<uint32_t>(float_to_half_bits(x)) |
         (static_cast<uint32_t>(float_to_half_bits(y)) << 16);
#endif
}

/// The high and low f16x2 parts of (x, y): hi = half(x, y), lo = half(x - hi, y - hi).
struct HiLo {
  uint32_t hi, lo;
};
KVQ_HD HiLo split_half2(float x, float y) {
  const uint32_t hi = pack_half2(x, y);
#if defined(__CUDA_ARCH__)
  float hx, hy;  // two cvt (exact)
  asm("{ .reg .b16 a, b;\n mov.b32 {a, b}, %2;\n cvt.f32.f16 %0, a;\n cvt.f32.f16 %1, b;\n}"
      : "=f"(hx), "=f"(hy)
      : "r"(hi));
#else
  const float hx = half_bits_to_float(static_cast<uint16_t>(hi));
  const float hy = half_bits_to_float(static_cast<uint16_t>(hi >> 16));
#endif
  return {hi, pack_half2(x - hx, y - hy)};
}

}  // namespace kvq::cuda::mma_fp8
