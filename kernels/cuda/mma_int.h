// Fragment arithmetic of the Mma decode kernel's int path (KIVI 2- and 4-bit caches,
// kernels/cuda/attention_mma.cu): which code of which packed word lands in which fp16 B-fragment
// register of mma.m16n8k16.f32.f16.f16.f32 for which lane, and how scales fold into the A
// operand, as __host__ __device__ functions so that the CPU tests
// (tests/kernels/cuda/mma_int_test.cpp) check them exhaustively. Fragment tables: mma_layout.h.
//
// Codes straight into fragments. A B register holds two k-rows of one column; the kernel pairs
// two words (per-channel keys: the words of channels d, d + 1 at one token run; per-token
// values: the words of tokens t, t + 1 at one channel run) and takes from each the same 4-code
// "slice" (4 B bits: half a 4-bit word, a byte of a 2-bit word), one PRMT putting word 0's slice
// in the low half and word 1's in the high half (pair_slices). Code k of the slice then becomes
// fp16 -(64 + c) by at most one shift and one LOP3 (code_half): the code lands at mantissa bits
// kPos .. kPos + B - 1 of -64 (code 2 of a 2-bit slice and code 1 of a 4-bit one are in place
// already: 3 shifts and 4 LOP3 per 8 codes). No subtract per code: the kernel runs one more mma
// of the same A against B = -64 (kMinus64x2, the same register as the LOP3's constant) into a
// per-run / per-group accumulator E, and since C = sum_k a_k (-64 - c_k),
//   sum_k a_k c_k = E_offset - C,  E_offset = -64 sum_k a_k,
// where the offsets cancel exactly in value (both sums hold the same exact products a_k * -64);
// the code part is 1/64 .. 15/64 of C's magnitude, so the cancellation costs ~2-6 bits of fp32
// accumulation (error ~2^-18 of sum |a_k c_k|).
//
// Scales fold into A in fp16, two channels (keys) or tokens (values) at once (fold_f16x2): with
// x = xh + xl (fp16 high + low parts of q or p, times a power of two) and s the stored fp16
// scale pair, hi = fl(xh s) (HMUL2), lo = fl(fl(xh s - hi) + xl s) (two HFMA2; the inner one is
// exact), so hi + lo = x s within ~2^-21 relative (plus 2^-24 absolute where hi or lo is
// subnormal). Three instructions a pair, no fp32 round trip. The minima go through one more mma
// with the unscaled x as A and the stored fp16 minima as B (every column the same), into the same
// E:
//   score / output = E - C,  E = -64 sum a + sum x m.
//
// Which lane takes which code (the column permutation). A fragment set is kE = 4 n-tiles; lane
// group g (= lane / 4, the B column) of n-tile j takes element set_index(g, j) = 4 g + j of a run
// of kSpan = 32 (tokens for keys, channels for values), so the 4 codes a lane takes from one word
// are its slice slice_of(g) of word slice_word(g) of the run: one word load and one PRMT feed 4
// n-tiles. The 8 columns of an n-tile then lie in one run of 32, which one scale group must hold:
// G a multiple of 32 (keys: 32 tokens of one token group; values: 32 channels of one channel
// group), so the scale folded into A (q_c s_c for keys, p_t s_t for values) is the same for every
// column of the mma.
//
// At GQA <= 4 the kernel runs the value product transposed (the section at the end): the codes
// become A (256 an mma) from the same paired words, p'_t s_t becomes B with the heads' high and
// low parts as columns, folded by the same three instructions a pair; the direct form above stays
// for GQA 5..8 and for the keys.
#pragma once

#include <cstdint>
#if !defined(__CUDA_ARCH__)
#include <algorithm>
#include <cmath>
#endif

#include "core/half.h"
#include "core/hostdev.h"
#include "kernels/cuda/mma_fp8.h"

namespace kvq::cuda::mma_int {

inline constexpr int kE = 4;          // codes a lane takes from one word: n-tiles per set
inline constexpr int kSpan = 8 * kE;  // tokens (keys) / channels (values) of one set

/// Lowest bit of a code inside an fp16 half (bits 4 .. 4 + B - 1 of the 10 mantissa bits).
inline constexpr int kPos = 4;
/// fp16 -64 in both halves: the bits a code is ORed into (then the half reads -(64 + c): the
/// code at mantissa bit kPos of -64 is worth c 2^(6 + kPos - 10) = c), and B of the offset mma.
inline constexpr uint32_t kMinus64x2 = 0xd400d400u;
inline constexpr float kOffset = 64.0f;
/// fp16 -16 and -1 in both halves (key_code_half2; B of the 2-bit keys' offset mma).
inline constexpr uint32_t kMinus16x2 = 0xcc00cc00u;
inline constexpr uint32_t kMinus1x2 = 0xbc00bc00u;

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
/// the byte is repeated in the half's high byte, which code_half masks off).
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

/// Code k (0..3) of each half of y as fp16 -(64 + c) (bits, low half first): at most one shift,
/// then one LOP3 ((x & mask) | -64).
template <int B>
KVQ_HD uint32_t code_half(uint32_t y, int k) {
  constexpr uint32_t kMask = (((1u << B) - 1u) << kPos) * 0x00010001u;
  const int sh = kPos - B * k;
  const uint32_t x = sh >= 0 ? y << sh : y >> -sh;
#if defined(__CUDA_ARCH__)
  uint32_t r;  // one LOP3 (a & b) | c; written out: the compiler splits two immediates into two
  asm("lop3.b32 %0, %1, %2, %3, 0xea;" : "=r"(r) : "r"(x), "n"(kMask), "n"(kMinus64x2));
  return r;
#else
  return (x & kMask) | kMinus64x2;
#endif
}

/// 2-bit key codes with one shift per two codes: code k of each half of y as fp16 -(kKeyBase2(k)
/// + c), codes 0, 2 at mantissa bit 4 of -64 (from y << 4 and y), codes 1, 3 at bit 6 of -16
/// (the unit is 1 at both places). The offsets differ per k, so the kernel keeps sum a apart.
KVQ_HD float key_base2(int k) { return k % 2 == 0 ? 64.0f : 16.0f; }
KVQ_HD uint32_t key_code_half2(uint32_t y, int k) {
  const uint32_t x = k < 2 ? y << 4 : y;
#if defined(__CUDA_ARCH__)
  uint32_t r;
  if (k % 2 == 0)
    asm("lop3.b32 %0, %1, %2, %3, 0xea;" : "=r"(r) : "r"(x), "n"(0x00300030u), "n"(kMinus64x2));
  else
    asm("lop3.b32 %0, %1, %2, %3, 0xea;" : "=r"(r) : "r"(x), "n"(0x00c000c0u), "n"(kMinus16x2));
  return r;
#else
  return k % 2 == 0 ? (x & 0x00300030u) | kMinus64x2 : (x & 0x00c000c0u) | kMinus16x2;
#endif
}

/// fp16 high and low parts (bits, two lanes of a half2 each).
struct HiLo16 {
  uint32_t hi, lo;
};

#if !defined(__CUDA_ARCH__)
/// fp16 bits of x rounded to nearest even (host; finite x, overflow to inf).
inline uint16_t round_half_bits(double x) {
  const double a = std::fabs(x);
  if (a == 0.0) return std::signbit(x) ? 0x8000u : 0u;
  int e = 0;
  std::frexp(a, &e);                                            // a in [2^(e-1), 2^e)
  const double q = std::ldexp(1.0, std::max(e - 1, -14) - 10);  // the fp16 quantum there
  const double r = std::nearbyint(a / q) * q;                   // exact, ties to even
  return float_to_half_bits(static_cast<float>(std::signbit(x) ? -r : r));  // r exact in float
}
/// fp16 value of bits h (host).
inline double half_value(uint32_t h) { return half_bits_to_float(static_cast<uint16_t>(h)); }
#endif

/// (xh + xl) * s per half as fp16 high + low parts: hi = fl(xh s), lo = fl(fl(xh s - hi) + xl s);
/// one HMUL2 and two HFMA2 on the device, the same roundings on the host.
KVQ_HD HiLo16 fold_f16x2(uint32_t xh, uint32_t xl, uint32_t s) {
#if defined(__CUDA_ARCH__)
  uint32_t hi, n, r, lo;  // ptxas folds the negation into the HFMA2's operand
  asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(hi) : "r"(xh), "r"(s));
  asm("neg.f16x2 %0, %1;" : "=r"(n) : "r"(hi));
  asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(xh), "r"(s), "r"(n));
  asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(lo) : "r"(xl), "r"(s), "r"(r));
  return {hi, lo};
#else
  HiLo16 out{0, 0};
  for (int k = 0; k < 2; ++k) {
    const int sh = 16 * k;
    const double a = half_value(xh >> sh & 0xffffu), b = half_value(xl >> sh & 0xffffu),
                 c = half_value(s >> sh & 0xffffu);
    const uint32_t h = round_half_bits(a * c);                  // exact product, rounded
    const uint32_t r = round_half_bits(a * c - half_value(h));  // fma: one rounding
    const uint32_t l = round_half_bits(b * c + half_value(r));  // fma: one rounding
    out.hi |= h << sh;
    out.lo |= l << sh;
  }
  return out;
#endif
}

/// The power of two 2^e that brings p (<= 1) times every value scale of a split below 2^14, so
/// that a = p s never overflows fp16 and stays normal down to 2^-28 of the largest; smax_bits
/// the largest scale's fp16 bits (non-negative). e in [-3, 15] (15 for zero or subnormal scales).
KVQ_HD int value_shift(unsigned smax_bits) {
  const int e = 28 - static_cast<int>((smax_bits >> 10) & 31u);  // scale < 2^(biased exp - 14)
  return e > 15 ? 15 : e;
}

/// The PRMT selector that pairs half `which` (0 low, 1 high) of two words: half `which` of a in
/// the low half, of b in the high half (the value scales and minima of tokens t, t + 1).
KVQ_HD uint32_t half_pair_selector(int which) { return which ? 0x7632u : 0x5410u; }

// ---- where the kernel keeps the words in shared memory ---------------------------------------

/// Keys: a warp's 32-token run of one token group, [channel d][B words] (the words of channel d
/// covering the run's tokens, in global order). B register r of n-tile j at k-step ks reads, for
/// its half h, channel 16 ks + b_row(lane, r, h) (mma_layout.h) and token set_index(g, j): word
/// key_word(d, g), slice slice_of(g), code j of the slice.
template <int B>
KVQ_HD int key_word(int d, int g) {
  return d * B + slice_word<B>(g);
}

// A staged key run (the kernel's shared memory): the copies place the run's words so that a lane
// reads the four words of a k-step (channels 16 ks + 2 tg + 8 r2 + e, r2, e = 0, 1, its word
// slice_word(g) each: key_word's words) by one 16-byte load, and its scale and minimum pairs of
// two k-steps by one 16-byte load each. Words: 4 B lane classes (tg, slice word), kKeyClassWords
// apart (D / 4 words and 4 of padding, so that the classes' loads of a k-step fall on distinct
// bank quads); inside a class, k-step ks at 4 ks, then 2 r2 + e.
template <int D>
inline constexpr int kKeyClassWords = D / 4 + 4;
template <int D, int B>
inline constexpr int kKeyRunWords = kKeyClassWords<D> * 4 * B;
/// Slot (word) of word w (0 .. B - 1) of channel d in a staged key run.
template <int D, int B>
KVQ_HD int key_slot(int d, int w) {
  return (d % 8 / 2 * B + w) * kKeyClassWords<D> + d / 16 * 4 + d / 8 % 2 * 2 + d % 2;
}
/// The first slot lane (g, tg) reads: k-step ks's words are slots key_lane_slot + 4 ks + 2 r2 + e.
template <int D, int B>
KVQ_HD int key_lane_slot(int g, int tg) {
  return key_slot<D, B>(2 * tg, slice_word<B>(g));
}
/// The copies: lane L copies word w of channel L + 32 x (x < D / 32; a channel's B words of a run
/// are contiguous at every G) to slot key_slot(L, 0) + key_copy_offset(x, w) (= key_slot(L + 32 x,
/// w): a compile-time offset from the lane's first slot).
template <int D>
KVQ_HD int key_copy_offset(int x, int w) {
  return w * kKeyClassWords<D> + 8 * x;
}
/// A staged run's scale (minimum) pairs: pair p (channels 2 p, 2 p + 1) at word key_param_slot(p)
/// = (p % 4) (D / 8 + 4) + p / 4 (4 words of padding a row: distinct bank quads), so lane tg's
/// pairs tg + 4 m (m = 2 ks + r2: channels 16 ks + 2 tg + 8 r2, + 1) are words tg (D / 8 + 4) + m,
/// one 16-byte load per two k-steps. kKeyParamWords words an array. The copies: lanes L < 16 the
/// scales, L >= 16 the minima; pair L % 16 + 16 x (x < D / 32) to key_param_slot(L % 16) +
/// key_param_copy_offset(x) (= key_param_slot(L % 16 + 16 x)).
template <int D>
inline constexpr int kKeyParamWords = 4 * (D / 8 + 4);
template <int D>
KVQ_HD int key_param_slot(int p) {
  return p % 4 * (D / 8 + 4) + p / 4;
}
KVQ_HD int key_param_copy_offset(int x) { return 4 * x; }

/// Values: a tile's rows of D B / 32 words, one row per token (the token's words in global
/// order). B register r of n-tile j at a k-step of set cs (channels [32 cs, 32 cs + 32)) reads,
/// for its half h, token row t = b_row(lane, r, h) (plus the k-step's first row) and channel
/// 32 cs + set_index(g, j): word value_word(t, cs, g), slice slice_of(g), code j.
template <int D, int B>
KVQ_HD int value_word(int t, int cs, int g) {
  return t * (D * B / 32) + cs * B + slice_word<B>(g);
}

// ---- the transposed value product (GQA <= 4; kTHeads) -----------------------------------------
//
// For nq <= 4 the value product runs transposed, out^T[c][h] = sum_t V^T[c][t] P^T[t][h]:
// A = the codes (M = 16 channels of an m-tile, K = 16 tokens), B = p'_t s_t (N = 8 columns:
// column h < 4 is head h's high part, column 4 + h its low part), so one mma consumes 256 codes
// (128 in the direct form, where half the M rows were low parts and rows of absent heads).
// A lane's A registers of m-tile mt come from the same two pair_slices words as the direct form's
// B registers (y[r]: tokens 2 tg + 8 r, + 1): register r reads slice code t_code(mt, r) of
// y[r / 2], so slice code k of lane group g sits at m-tile k / 2, row g + 8 (k % 2): channel
// t_channel(mt, row) of the 32-channel set (a permutation inside the set, undone at write-out).
// Codes become fp16 -(t_base(k) + c) by t_code_half (2-bit: key_code_half2, one shift per two
// codes, bases 64 and 16 by row half; 4-bit: code_half, base 64).
// B: the softmax stores p' of every quantized token as one word, fp16 high part in the low half
// and low part in the high half (pack_p); a lane's column is head g % 4's high part (g < 4) or low
// part (g >= 4), and p_select turns the words of tokens t, t + 1 into xh' = (g < 4 ? 0 : high),
// xl' = (g < 4 ? high : low), so that fold_b = fold_f16x2(xh', xl', s).lo is fold_f16x2's hi
// (g < 4: fl(fl(0 s - 0) + ph s) = fl(ph s)) or lo (g >= 4) of the direct form, bit for bit for
// s >= 0, with the same three instructions a pair. A column's B only reaches that column of C
// (heads are columns), so lanes of absent heads may hold any finite B; rows (tokens) past the
// quantized ones must be zero (their codes are zero-filled words, read as -base). Offsets: per
// group cg one mma of A = -1 (every row: kMinus1x2 in every register, one constant for all
// groups) against that group's folded B into its own accumulator, EO[cg][any row][n] =
// -sum_t b_t. Minima: one mma per k-step of A row g = m_{t, g % NCG}, row g + 8 the other half of
// the same minima word (t_min_group: every register a useful PRMT) against xl' into EM, whose
// row cg (< NCG) is sum_t p'_t m_{t,cg}. Per channel c of group cg and head h (columns h and
// h + 4 summed),
//   out'[c][h] = t_base(k(c)) EO[cg][h] + EM[cg][h] - C[c][h].

/// Heads the transposed product takes (B columns h and kTHeads + h).
inline constexpr int kTHeads = 4;

/// Slice code (0..3) that A register r of m-tile mt (0, 1) reads from its y (y[r / 2]).
KVQ_HD int t_code(int mt, int r) { return 2 * mt + r % 2; }
/// Channel (within the 32-channel set) of row `row` (0..15) of m-tile mt: lane group row % 8,
/// slice code 2 mt + row / 8.
KVQ_HD int t_channel(int mt, int row) { return set_index(row % 8, t_code(mt, row / 8)); }

/// Slice code k of each half of y as fp16 -(t_base<B>(k) + c).
template <int B>
KVQ_HD uint32_t t_code_half(uint32_t y, int k) {
  if constexpr (B == 2) return key_code_half2(y, k);
  return code_half<B>(y, k);
}
template <int B>
KVQ_HD float t_base(int k) {
  return B == 2 ? key_base2(k) : kOffset;
}

/// p' of one token as the softmax stores it for the transposed product: fp16 high part (low
/// half), fp16 low part of the remainder (high half), the values split_half2 gives.
KVQ_HD uint32_t pack_p(float x) {
  const mma_fp8::HiLo s = mma_fp8::split_half2(x, 0.0f);
  return (s.hi & 0xffffu) | (s.lo << 16);
}

/// The lane's B inputs for tokens t, t + 1 (their pack_p words w0, w1): lo = xl' (the pair of
/// high parts for a high column, of low parts for a low column), hi = xh' (0 for a high column,
/// the high parts for a low column). sel = p_selector(low), mask = p_mask(low): lane constants.
KVQ_HD uint32_t p_selector(bool low) { return low ? 0x7632u : 0x5410u; }
KVQ_HD uint32_t p_mask(bool low) { return low ? 0xffffffffu : 0u; }
KVQ_HD HiLo16 p_select(uint32_t w0, uint32_t w1, uint32_t sel, uint32_t mask) {
  return {byte_perm(w0, w1, 0x5410u) & mask, byte_perm(w0, w1, sel)};
}

/// B of channel group cg for tokens t, t + 1 (x = p_select's pair, s = their scales' fp16 pair).
KVQ_HD uint32_t fold_b(HiLo16 x, uint32_t s) { return fold_f16x2(x.hi, x.lo, s).lo; }

/// The channel group whose minima A register r of lane group g holds: row g (r even) group
/// g % ncg, row g + 8 (r odd) the other group of the same 32-bit word of minima (ncg even; ncg 1:
/// group 0), so a lane's two registers of a token pair come from the same two words.
KVQ_HD int t_min_group(int g, int ncg, int r) { return ((g % ncg) ^ (r % 2)) % ncg; }

}  // namespace kvq::cuda::mma_int
