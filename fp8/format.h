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
template <Fp8Format F>
KVQ_HD uint8_t encode(float x) {
  using T = Traits<F>;
  const uint32_t bits = float_bits(x);
  const uint32_t sign = bits >> 31;
  const uint32_t abits = bits & 0x7fffffffu;
  if (abits > 0x7f800000u) return T::kNaN;
  float a = bits_float(abits);
  if (a >= T::kMax) a = T::kMax;  // saturate (+inf included)
  constexpr int kMinExp = 1 - T::kBias;  // exponent of the smallest normal
  int e = static_cast<int>(float_bits(a) >> 23) - 127;
  if (e < kMinExp) e = kMinExp;  // subnormal range: fixed quantum
  // quantum = 2^(e - mant_bits); a / quantum is exact (power-of-two scaling, no underflow).
  const float inv_quantum = bits_float(static_cast<uint32_t>(127 - (e - T::kMantBits)) << 23);
  const float quantum = bits_float(static_cast<uint32_t>(127 + (e - T::kMantBits)) << 23);
  float r = round_half_even(a * inv_quantum) * quantum;
  if (r > T::kMax) r = T::kMax;
  uint32_t mag;
  if (r == 0.0f) {
    mag = 0;
  } else {
    const uint32_t rb = float_bits(r);
    const int re = static_cast<int>(rb >> 23) - 127;
    if (re < kMinExp) {  // subnormal code: mantissa = r / 2^(kMinExp - mant_bits)
      mag = static_cast<uint32_t>(r * bits_float(static_cast<uint32_t>(127 - (kMinExp - T::kMantBits)) << 23));
    } else {
      mag = (static_cast<uint32_t>(re + T::kBias) << T::kMantBits) |
            ((rb & 0x7fffffu) >> (23 - T::kMantBits));
    }
  }
  if (T::kFnuz && mag == 0) return 0;  // fnuz has no -0 (0x80 is NaN)
  return static_cast<uint8_t>((sign << 7) | mag);
}

/// \brief FP8 code -> float32, exact.
template <Fp8Format F>
KVQ_HD float decode(uint8_t c) {
  using T = Traits<F>;
  constexpr uint32_t kMantMask = (1u << T::kMantBits) - 1;
  constexpr uint32_t kExpMax = (1u << T::kExpBits) - 1;
  const uint32_t sign = static_cast<uint32_t>(c >> 7) << 31;
  const uint32_t e = (c >> T::kMantBits) & kExpMax;
  const uint32_t m = c & kMantMask;
  if (T::kFnuz && c == 0x80) return bits_float(0x7fc00000u);
  if (!T::kFnuz && !T::kHasInf && e == kExpMax && m == kMantMask) return bits_float(0x7fc00000u);
  if (T::kHasInf && e == kExpMax) return bits_float(m ? 0x7fc00000u : (sign | 0x7f800000u));
  if (e == 0) {  // subnormal: m * 2^(1 - bias - mant_bits)
    const float v = static_cast<float>(m) *
                    bits_float(static_cast<uint32_t>(127 + 1 - T::kBias - T::kMantBits) << 23);
    return bits_float(sign | float_bits(v));
  }
  return bits_float(sign | ((e - T::kBias + 127) << 23) | (m << (23 - T::kMantBits)));
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

/// \brief Runtime-dispatched decode (prefer the template in loops).
KVQ_HD float decode(Fp8Format f, uint8_t c) {
  return f == Fp8Format::E4M3       ? decode<Fp8Format::E4M3>(c)
         : f == Fp8Format::E4M3FNUZ ? decode<Fp8Format::E4M3FNUZ>(c)
                                    : decode<Fp8Format::E5M2>(c);
}

}  // namespace kvq::fp8
