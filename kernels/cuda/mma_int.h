// Fragment arithmetic of the Mma decode kernel's int path (KIVI 2- and 4-bit caches,
// kernels/cuda/attention_mma.cu): which code of which packed word lands in which bf16 B-fragment
// register of mma.m16n8k16 for which lane, as __host__ __device__ functions so that the CPU tests
// (tests/kernels/cuda/mma_layout_test.cpp) check them exhaustively. Fragment tables:
// mma_layout.h.
//
// Codes straight into fragments. A B register holds two k-rows of one column; the kernel pairs
// two words (per-channel keys: the words of channels d, d + 1 at one token run; per-token
// values: the words of tokens t, t + 1 at one channel run) and takes from each the same 4-code
// "slice" (4 B bits: half a 4-bit word, a byte of a 2-bit word), one PRMT putting word 0's slice
// in the low half and word 1's in the high half (pair_slices). Code k of the slice then becomes
// bf16 1 + c 2^(kPos - 7) by one shift and one LOP3 (code_pair): the code lands at the top of
// bf16's 7 mantissa bits (bits kPos .. kPos + B - 1) and ORs into 1.0's bits. No subtract: the
// kernel runs one more mma against B = 1.0 (kOne2) and takes
//   sum_k a_k c_k = (C - C_ones) / kUnit,
// where the offsets cancel exactly in value (C and C_ones sum the same a_k; the code part is a
// third (4-bit: c / 16 against 1) to half of C's magnitude, so the cancellation costs ~2 bits of
// fp32 accumulation, far below the A operand's 2^-16).
//
// Which lane takes which code (the column permutation). A fragment set is kE = 4 n-tiles; lane
// group g (= lane / 4, the B column) of n-tile j takes element set_index(g, j) = 4 g + j of a run
// of kSpan = 32 (tokens for keys, channels for values), so the 4 codes a lane takes from one word
// are its slice slice_of(g) of word slice_word(g) of the run: one word load and one PRMT feed 4
// n-tiles. The 8 columns of an n-tile then lie in one run of 32, which one scale group must hold:
// G a multiple of 32 (keys: 32 tokens of one token group; values: 32 channels of one channel
// group), so the scale folded into A (q_c s_c for keys, p_t s_t for values) is the same for every
// column of the mma.
#pragma once

#include <cstdint>

#include "core/hostdev.h"

namespace kvq::cuda::mma_int {

inline constexpr int kE = 4;          // codes a lane takes from one word: n-tiles per set
inline constexpr int kSpan = 8 * kE;  // tokens (keys) / channels (values) of one set

/// Lowest bit of a code inside a bf16 half: the top of the 7 mantissa bits.
template <int B>
inline constexpr int kPos = 7 - B;
/// bf16 1.0 in both halves of a register.
inline constexpr uint32_t kOne2 = 0x3f803f80u;
/// A code c in a fragment reads 1 + c * kUnit; kInvUnit = 1 / kUnit.
template <int B>
inline constexpr float kInvUnit = static_cast<float>(1 << (7 - kPos<B>));
template <int B>
inline constexpr float kUnit = 1.0f / kInvUnit<B>;

/// Element (token or channel) of a 32-run that n-tile j's column g holds.
KVQ_HD int set_index(int g, int j) { return kE * g + j; }
/// Word of a 32-run's B words holding elements 4 g .. 4 g + 3, and which 4 B-bit slice of it.
template <int B>
KVQ_HD int slice_word(int g) {
  static_assert(B == 2 || B == 4, "2- or 4-bit codes");
  return g * B / 8;
}
template <int B>
KVQ_HD int slice_of(int g) {
  return g % (8 / B);
}

/// PRMT (__byte_perm): byte i of the result is byte sel_i (nibble i of sel, 0..7) of b:a.
KVQ_HD uint32_t byte_perm(uint32_t a, uint32_t b, uint32_t sel) {
#if defined(__CUDA_ARCH__)
  return __byte_perm(a, b, sel);
#else
  const uint64_t x = a | (static_cast<uint64_t>(b) << 32);
  uint32_t r = 0;
  for (int i = 0; i < 4; ++i)
    r |= static_cast<uint32_t>((x >> (8 * ((sel >> (4 * i)) & 7u))) & 0xffu) << (8 * i);
  return r;
#endif
}

/// The PRMT selector of pair_slices: slice s of a to the low half, of b to the high half (B = 2:
/// the byte is repeated in the half's high byte, which code_pair masks off).
template <int B>
KVQ_HD uint32_t slice_selector(int s) {
  if constexpr (B == 4) {
    return s == 0 ? 0x5410u : 0x7632u;
  } else {
    const uint32_t lo = static_cast<uint32_t>(s), hi = 4u + lo;
    return lo | (lo << 4) | (hi << 8) | (hi << 12);
  }
}

/// Slice s of w0 (its codes from bit 0 up) in the low half, slice s of w1 in the high half.
template <int B>
KVQ_HD uint32_t pair_slices(uint32_t w0, uint32_t w1, int s) {
  return byte_perm(w0, w1, slice_selector<B>(s));
}

/// Code k (0..3) of each half of y as bf16 1 + c * kUnit (bits, low half first): one shift and
/// one LOP3 ((x & mask) | 1.0).
template <int B>
KVQ_HD uint32_t code_pair(uint32_t y, int k) {
  constexpr uint32_t kMask = (((1u << B) - 1u) << kPos<B>)*0x00010001u;
  const int sh = kPos<B> - B * k;
  const uint32_t x = sh >= 0 ? y << sh : y >> -sh;
#if defined(__CUDA_ARCH__)
  uint32_t r;  // one LOP3 (a & b) | c; written out: the compiler splits two immediates into two
  asm("lop3.b32 %0, %1, %2, %3, 0xea;" : "=r"(r) : "r"(x), "n"(kMask), "n"(kOne2));
  return r;
#else
  return (x & kMask) | kOne2;
#endif
}

// ---- where the kernel keeps the words in shared memory ---------------------------------------

/// Keys: a warp's 32-token run of one token group, [channel d][B words] (the words of channel d
/// covering the run's tokens, in global order). B register r of n-tile j at k-step ks reads, for
/// its half h, channel 16 ks + b_row(lane, r, h) (mma_layout.h) and token set_index(g, j): word
/// key_word(d, g), slice slice_of(g), code j of the slice.
template <int B>
KVQ_HD int key_word(int d, int g) {
  return d * B + slice_word<B>(g);
}

/// Values: a tile's rows of D B / 32 words, one row per token (the token's words in global
/// order). B register r of n-tile j at a k-step of set cs (channels [32 cs, 32 cs + 32)) reads,
/// for its half h, token row t = b_row(lane, r, h) (plus the k-step's first row) and channel
/// 32 cs + set_index(g, j): word value_word(t, cs, g), slice slice_of(g), code j.
template <int D, int B>
KVQ_HD int value_word(int t, int cs, int g) {
  return t * (D * B / 32) + cs * B + slice_word<B>(g);
}

}  // namespace kvq::cuda::mma_int
