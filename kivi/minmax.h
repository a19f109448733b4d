// Min-max integer quantization of one group (KIVI, REFERENCE.md section 3), defined once for
// host and device. Every backend computes codes, scales and minima through these functions.
//
// Asymmetric (default), b bits, n = 2^b - 1, for a group x of G floats:
//   mn = min x, mx = max x                                    (exact; a zero taken as +0)
//   min_h   = fp16(mn)                                           stored (fp16 bits, RNE)
//   scale_h = fp16(float32(float32(mx - mn) / n))                stored; float32 ops, then RNE
//   code    = clamp(rne((x - min_h) / scale_h), 0, n), with the quotient taken as the EXACT real
//             number: the code of the level min_h + k * scale_h nearest to x, ties to even k
//   x'      = float32(code * scale_h + min_h)                    (the product is exact)
// Codes are computed with the fp16-ROUNDED scale and min, the values the cache keeps, so
// dequantization reads back exactly the level each code was chosen for, and every backend that
// stores the same parameters derives the same codes. The float32 quotient is within one rounding
// of the exact one and lands on the right side of every tie (ties k + 1/2 are representable and
// IEEE rounding is monotone); only when it lands exactly on a tie is it resolved by an exact
// comparison in double (see resolve_tie). Needs IEEE float32 division and subnormals (no
// fast-math, no flush-to-zero).
//
// Symmetric (`sym`), no zero point, qmax = 2^(b-1) - 1:
//   scale_h = fp16(float32(max|x| / qmax)), q = clamp(rne(x / scale_h), -qmax, qmax) (exact
//   quotient as above), stored as the unsigned code q + 2^(b-1) in [1, 2^b - 1] so it fits in b
//   bits (code 0 unused); x' = (code - 2^(b-1)) * scale_h (exact). At b=2 the levels are -s, 0, s.
//
// Special groups:
// - Zero scale (asym: mx == mn, or a range so small that scale_h rounds to 0; sym: all zeros):
//   scale_h = 0, every code the zero code (0 asym, 2^(b-1) sym), x' = min_h (sym: 0). x' is mn
//   rounded to fp16: exact whenever mn is an fp16 value (0, and any bf16/fp16 model activation in
//   fp16's normal range); keeping arbitrary float32 minima exact would need a 32-bit min for such
//   groups, which KIVI's layout does not have. (KIVI itself divides by zero there; we do not.)
// - A NaN or +-inf in the group, or parameters that overflow fp16 (|values| beyond 65504):
//   scale_h = min_h = fp16 NaN, codes the zero code, and every x' is NaN: visible, never
//   silently finite.
#pragma once

#include "core/half.h"
#include "core/hostdev.h"

namespace kvq::kivi {

/// \brief fp16 quiet NaN: the scale (and min) of a group holding NaN/inf.
inline constexpr uint16_t kHalfNaN = 0x7e00;

/// \brief Largest asymmetric code: 2^bits - 1.
KVQ_HD constexpr int max_code(int bits) { return (1 << bits) - 1; }
/// \brief Largest symmetric magnitude: 2^(bits-1) - 1.
KVQ_HD constexpr int sym_qmax(int bits) { return (1 << (bits - 1)) - 1; }
/// \brief Offset added to a symmetric code so it is stored unsigned: 2^(bits-1).
KVQ_HD constexpr int sym_offset(int bits) { return 1 << (bits - 1); }
/// \brief The code that dequantizes to the group's zero point (min_h, or 0 for sym).
KVQ_HD constexpr uint32_t zero_code(int bits, bool sym) {
  return sym ? static_cast<uint32_t>(sym_offset(bits)) : 0u;
}

/// \brief Whether a float is finite (host and device, by its bits).
KVQ_HD bool is_finite_bits(float x) { return (float_bits(x) & 0x7f800000u) != 0x7f800000u; }

/// \brief One step of a running min / max (the exact compare-select every backend uses, so a
/// NaN never enters; non-finite values are tracked apart).
KVQ_HD float min_step(float x, float m) { return x < m ? x : m; }
KVQ_HD float max_step(float x, float m) { return x > m ? x : m; }

/// \brief Running min and max of a group, and whether every value seen was finite.
struct GroupRange {
  float mn = 0.0f, mx = 0.0f;
  bool finite = true;
  /// \brief The range of one value.
  KVQ_HD static GroupRange of(float x) {
    GroupRange r;
    r.mn = r.mx = x;
    r.finite = is_finite_bits(x);
    return r;
  }
  KVQ_HD void add(float x) {
    mn = min_step(x, mn);
    mx = max_step(x, mx);
    finite = finite && is_finite_bits(x);
  }
};

/// \brief One group's parameters: stored fp16 bits and the float values codes are computed with.
struct GroupParams {
  uint16_t scale_h = 0;  ///< stored scale (fp16 bits)
  uint16_t min_h = 0;    ///< stored min (fp16 bits); 0 and unused for sym
  float scale = 0.0f;    ///< half_bits_to_float(scale_h)
  float min = 0.0f;      ///< half_bits_to_float(min_h)
};

/// \brief Parameters of a group with NaN/inf or fp16 overflow: NaN scale and min.
KVQ_HD GroupParams nan_params() {
  GroupParams p;
  p.scale_h = p.min_h = kHalfNaN;
  p.scale = p.min = half_bits_to_float(kHalfNaN);
  return p;
}

/// \brief The stored parameters of a group with range r (the definition at the top).
KVQ_HD GroupParams minmax_params(const GroupRange& r, int bits, bool sym) {
  if (!r.finite) return nan_params();
  // Zeros taken as +0, so the result does not depend on the order the values were seen in.
  const float mn = r.mn == 0.0f ? 0.0f : r.mn, mx = r.mx == 0.0f ? 0.0f : r.mx;
  GroupParams p;
  if (sym) {
    const float amax = -mn > mx ? -mn : mx;
    p.scale_h = float_to_half_bits(amax / static_cast<float>(sym_qmax(bits)));
  } else {
    p.min_h = float_to_half_bits(mn);
    p.scale_h = float_to_half_bits((mx - mn) / static_cast<float>(max_code(bits)));
  }
  p.scale = half_bits_to_float(p.scale_h);
  p.min = half_bits_to_float(p.min_h);
  if (!is_finite_bits(p.scale) || !is_finite_bits(p.min)) return nan_params();
  return p;
}

/// \brief Lower clamp of the quotient: 0 (asym) or -qmax (sym).
KVQ_HD constexpr float quotient_lo(int bits, bool sym) {
  return sym ? -static_cast<float>(sym_qmax(bits)) : 0.0f;
}
/// \brief Upper clamp of the quotient: 2^b - 1 (asym) or qmax (sym).
KVQ_HD constexpr float quotient_hi(int bits, bool sym) {
  return static_cast<float>(sym ? sym_qmax(bits) : max_code(bits));
}

/// \brief The float32 quotient float32(float32(x - z) / s) clamped to [lo, hi] (a NaN goes to lo).
/// z = min (asym) or 0 (sym), s > 0.
KVQ_HD float clamped_quotient(float x, float z, float s, float lo, float hi) {
  float q = (x - z) / s;
  q = q > lo ? q : lo;
  return q < hi ? q : hi;
}

/// \brief Whether a quotient sits exactly on a tie k + 1/2. rne(q) - q is exact (|q| < 2^22 and
/// the two are within 1/2 of each other), and is +-1/2 exactly at a tie. Branch-free, so that
/// loops over it vectorize.
KVQ_HD bool on_tie(float q) {
  const float d = round_half_even(q) - q;
  return (d == 0.5f) | (d == -0.5f);
}

/// \brief The nearest level for a quotient q = clamped_quotient(x, z, s, ...) that sits on a tie
/// (on_tie(q)), decided on the exact real (x - z) / s: the float32 quotient is on the correct
/// side of every tie k + 1/2 (IEEE rounding is monotone and the tie times s is a float), so only
/// q == k + 1/2 is in doubt. z + q*s is exact in double (fp16 z and s have no bits below 2^-25
/// and are below 2^24, so the sum spans at most 50 bits), and so is the comparison with x.
KVQ_HD float resolve_tie(float x, float z, float s, float q) {
  const double t = static_cast<double>(z) + static_cast<double>(q) * static_cast<double>(s);
  const double xd = static_cast<double>(x);
  if (xd > t) return q + 0.5f;
  if (xd < t) return q - 0.5f;
  return round_half_even(q);  // an exact tie: to even
}

/// \brief The b-bit code of x in a group with parameters p.
KVQ_HD uint32_t encode(float x, const GroupParams& p, int bits, bool sym) {
  if (!(p.scale > 0.0f)) return zero_code(bits, sym);  // zero scale, or NaN (a bad group)
  const float z = sym ? 0.0f : p.min;
  const float q = clamped_quotient(x, z, p.scale, quotient_lo(bits, sym), quotient_hi(bits, sym));
  const float k = on_tie(q) ? resolve_tie(x, z, p.scale, q) : round_half_even(q);
  return static_cast<uint32_t>(static_cast<int>(k) + (sym ? sym_offset(bits) : 0));
}

/// \brief KIVI's own arithmetic (spec option arith=fp16; REFERENCE.md section 3): the group is
/// first rounded to fp16 (KIVI's caches hold fp16), and every torch operation of KIVI's
/// quant_and_pack_kcache / quant_and_pack_vcache rounds its result to fp16:
///   mn_h = fp16(min x), mx_h = fp16(max x)     (rounding is monotone: the min of the rounded
///                                               values is the rounded min)
///   scale_h = fp16(fp16(mx_h - mn_h) / n)      (KIVI rounds the range before dividing)
///   code    = rne(clamp(fp16(fp16(x_h - mn_h) / scale_h), 0, n)), a NaN quotient (0 / 0) -> 0
/// Each operation is done in float32 and rounded once to fp16; for +, - and / of fp16 operands
/// that equals the correctly rounded fp16 result (float32 has 24 >= 2 * 11 + 2 bits, so the
/// double rounding is innocuous), which is what torch's fp16 kernels compute on CPU and GPU.
/// A zero scale_h (a constant group, or a range whose n-th rounds to 0) makes x_h == mn_h give
/// 0 / 0 = NaN (code 0, as CUDA casts it) and x_h > mn_h give +inf (clamped to n): KIVI's codes,
/// which all read back as mn_h. A group with NaN/inf (or past fp16's range) gets nan_params, as
/// in the exact arithmetic; KIVI would propagate inf there. Asymmetric only (KIVI has no sym).
KVQ_HD GroupParams minmax_params_fp16(const GroupRange& r, int bits) {
  if (!r.finite) return nan_params();
  GroupRange h;
  h.mn = round_to_half(r.mn == 0.0f ? 0.0f : r.mn);
  h.mx = round_to_half(r.mx == 0.0f ? 0.0f : r.mx);
  GroupParams p;
  p.min_h = float_to_half_bits(h.mn);
  const float range = round_to_half(h.mx - h.mn);
  p.scale_h = float_to_half_bits(range / static_cast<float>(max_code(bits)));
  p.scale = half_bits_to_float(p.scale_h);
  p.min = half_bits_to_float(p.min_h);
  if (!is_finite_bits(h.mx) || !is_finite_bits(p.min) || !is_finite_bits(range) ||
      !is_finite_bits(p.scale))
    return nan_params();
  return p;
}

/// \brief The code of x under KIVI's arithmetic (minmax_params_fp16's definition).
KVQ_HD uint32_t encode_fp16(float x, const GroupParams& p, int bits) {
  if (p.scale != p.scale) return 0u;  // a bad group (NaN parameters)
  const float t = round_to_half(round_to_half(x) - p.min);
  if (!(p.scale > 0.0f)) return t > 0.0f ? static_cast<uint32_t>(max_code(bits)) : 0u;
  float q = round_to_half(t / p.scale);
  const float hi = static_cast<float>(max_code(bits));
  q = q > 0.0f ? q : 0.0f;
  q = q < hi ? q : hi;
  return static_cast<uint32_t>(round_half_even(q));
}

/// \brief The value a code reads back as, given its group's scale and min as floats.
KVQ_HD float decode(uint32_t code, float scale, float min, int bits, bool sym) {
  if (sym) return static_cast<float>(static_cast<int>(code) - sym_offset(bits)) * scale;
  return static_cast<float>(code) * scale + min;
}

}  // namespace kvq::kivi
