// The FP8 formats (OCP 8-bit floating point), defined once for host and device.
//
//   format        exp/mant bias  max finite  min subnormal  inf          NaN codes
//   fp8_e4m3      4/3      7     448         2^-9           none         0x7F, 0xFF
//   fp8_e4m3fnuz  4/3      8     240         2^-10          none         0x80 only (no -0)
//   fp8_e5m2      5/2      15    57344       2^-16          0x7C, 0xFC   0x7D-0x7F, 0xFD-0xFF
//
// Encoding float32 -> FP8 follows cuda_fp8.h's __nv_cvt_float_to_fp8(x, __NV_SATFINITE, ...):
// round to nearest, ties to even; beyond the largest finite value (and +-inf) saturates to
// +-max finite; NaN -> NaN. Decoding is exact.
#pragma once

#include <cstring>

#include "core/hostdev.h"
#include "core/spec.h"

namespace kvq::fp8 {

/// \brief Compile-time description of one FP8 format.
template <Fp8Format F>
struct Traits;

template <>
struct Traits<Fp8Format::E4M3> {
  static constexpr int kExpBits = 4, kMantBits = 3, kBias = 7;
  static constexpr float kMax = 448.0f;
  static constexpr bool kFnuz = false, kHasInf = false;
  static constexpr uint8_t kNaN = 0x7F;
};
template <>
struct Traits<Fp8Format::E4M3FNUZ> {
  static constexpr int kExpBits = 4, kMantBits = 3, kBias = 8;
  static constexpr float kMax = 240.0f;
  static constexpr bool kFnuz = true, kHasInf = false;
  static constexpr uint8_t kNaN = 0x80;
};
template <>
struct Traits<Fp8Format::E5M2> {
  static constexpr int kExpBits = 5, kMantBits = 2, kBias = 15;
  static constexpr float kMax = 57344.0f;
  static constexpr bool kFnuz = false, kHasInf = true;
  static constexpr uint8_t kNaN = 0x7F;
};

/// \brief float32 -> FP8 code: nearest-even, saturating to +-max finite, NaN -> NaN.
/// Written with selects rather than branches so loops over it vectorize.
template <Fp8Format F>
KVQ_HD uint8_t encode(float x) {
  using T = Traits<F>;
  constexpr int kMinExp = 1 - T::kBias;  // exponent of the smallest normal
  const uint32_t bits = float_bits(x);
  const uint32_t sign = bits >> 31;
  const uint32_t abits = bits & 0x7fffffffu;
  const bool nan = abits > 0x7f800000u;
  // A NaN takes the path of 0 (its code is chosen at the end): float -> integer conversions of
  // NaN below would be undefined behaviour (UBSan, fuzz_roundtrip).
  float a = nan ? 0.0f : bits_float(abits);
  a = a >= T::kMax ? T::kMax : a;  // saturate (+inf included)
  int e = static_cast<int>(float_bits(a) >> 23) - 127;
  e = e < kMinExp ? kMinExp : e;  // subnormal range: fixed quantum
  // quantum = 2^(e - mant_bits); a / quantum is exact (power-of-two scaling, no underflow).
  const float inv_quantum = pow2(-(e - T::kMantBits));
  const float quantum = pow2(e - T::kMantBits);
  float r = round_half_even(a * inv_quantum) * quantum;
  r = r > T::kMax ? T::kMax : r;
  // r is on the format's grid: its code is the float's exponent and top mantissa bits, or for a
  // subnormal r, r / 2^(kMinExp - mant_bits).
  const uint32_t rb = float_bits(r);
  const int re = static_cast<int>(rb >> 23) - 127;
  const uint32_t normal = (static_cast<uint32_t>(re + T::kBias) << T::kMantBits) |
                          ((rb & 0x7fffffu) >> (23 - T::kMantBits));
  const uint32_t sub = static_cast<uint32_t>(
      r * pow2(-(kMinExp - T::kMantBits)));
  const uint32_t mag = re < kMinExp ? sub : normal;  // r == 0 lands here with sub == 0
  // fnuz has no -0 (0x80 is its NaN).
  const uint32_t code = (T::kFnuz && mag == 0) ? 0u : ((sign << 7) | mag);
  return static_cast<uint8_t>(nan ? T::kNaN : code);
}

/// \brief Whether c is one of format F's NaN codes (the table above).
template <Fp8Format F>
KVQ_HD bool is_nan_code(uint8_t c) {
  using T = Traits<F>;
  if constexpr (T::kFnuz) {
    return c == 0x80u;
  } else if constexpr (T::kHasInf) {
    return (c & 0x7fu) > 0x7cu;
  } else {
    return (c & 0x7fu) == 0x7fu;
  }
}

/// \brief FP8 code -> float32, exact. Selects, not branches, so loops over it vectorize.
template <Fp8Format F>
KVQ_HD float decode(uint8_t c) {
  using T = Traits<F>;
  constexpr uint32_t kMantMask = (1u << T::kMantBits) - 1;
  constexpr uint32_t kExpMax = (1u << T::kExpBits) - 1;
  const uint32_t cc = c;
  const uint32_t sign = (cc >> 7) << 31;
  const uint32_t e = (cc >> T::kMantBits) & kExpMax;
  const uint32_t m = cc & kMantMask;
  // Normal: rebias the exponent; subnormal: m * 2^(1 - bias - mant_bits), exact in float.
  const float normal = bits_float(sign | ((e + (127 - T::kBias)) << 23) | (m << (23 - T::kMantBits)));
  const float sub = bits_float(sign | float_bits(static_cast<float>(m) *
                                                 pow2(1 - T::kBias - T::kMantBits)));
  float v = e == 0 ? sub : normal;
  if constexpr (T::kHasInf) v = e == kExpMax ? bits_float(sign | 0x7f800000u) : v;
  return is_nan_code<F>(c) ? bits_float(0x7fc00000u) : v;
}

/// \brief Largest finite value of a format (runtime dispatch).
KVQ_HD float max_finite(Fp8Format f) {
  return f == Fp8Format::E4M3 ? Traits<Fp8Format::E4M3>::kMax
         : f == Fp8Format::E4M3FNUZ ? Traits<Fp8Format::E4M3FNUZ>::kMax
                                    : Traits<Fp8Format::E5M2>::kMax;
}

/// \brief Runtime-dispatched encode (prefer the template in loops).
KVQ_HD uint8_t encode(Fp8Format f, float x) {
  return f == Fp8Format::E4M3       ? encode<Fp8Format::E4M3>(x)
         : f == Fp8Format::E4M3FNUZ ? encode<Fp8Format::E4M3FNUZ>(x)
                                    : encode<Fp8Format::E5M2>(x);
}

/// \brief Whether any of the codes c[0 .. n) is a NaN code of format F. Host only. Eight codes a
/// step, each byte's test on a 64-bit word (no carry crosses a byte): 4-bit exponents, byte & 0x7f
/// is 0x7f exactly when adding 1 sets bit 7; e5m2, 0x7d-0x7f when adding 3 does; fnuz, byte ^ 0x80
/// is zero (the classic has-zero-byte test); then is_nan_code on the rest.
template <Fp8Format F>
inline bool any_nan_code(const uint8_t* c, int64_t n) {
  using T = Traits<F>;
  constexpr uint64_t kOnes = 0x0101010101010101ull, kHigh = 0x8080808080808080ull;
  uint64_t hit = 0;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t x;
    std::memcpy(&x, c + i, 8);
    if constexpr (T::kFnuz) {
      const uint64_t z = x ^ kHigh;
      hit |= (z - kOnes) & ~z & kHigh;
    } else {
      hit |= ((x & ~kHigh) + (T::kHasInf ? 3 : 1) * kOnes) & kHigh;
    }
  }
  bool r = hit != 0;
  for (; i < n; ++i) r |= is_nan_code<F>(c[i]);
  return r;
}
inline bool any_nan_code(Fp8Format f, const uint8_t* c, int64_t n) {
  return f == Fp8Format::E4M3       ? any_nan_code<Fp8Format::E4M3>(c, n)
         : f == Fp8Format::E4M3FNUZ ? any_nan_code<Fp8Format::E4M3FNUZ>(c, n)
                                    : any_nan_code<Fp8Format::E5M2>(c, n);
}

/// \brief Runtime-dispatched decode (prefer the template in loops).
KVQ_HD float decode(Fp8Format f, uint8_t c) {
  return f == Fp8Format::E4M3       ? decode<Fp8Format::E4M3>(c)
         : f == Fp8Format::E4M3FNUZ ? decode<Fp8Format::E4M3FNUZ>(c)
                                    : decode<Fp8Format::E5M2>(c);
}

}  // namespace kvq::fp8
