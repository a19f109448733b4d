// IEEE binary16 and bfloat16 conversions, round to nearest even; host and device.
#pragma once

#include "core/hostdev.h"

namespace kvq {

/// \brief float -> IEEE fp16 bits, round to nearest even; overflow -> inf, NaN -> quiet NaN.
KVQ_HD uint16_t float_to_half_bits(float f) {
  const uint32_t x = float_bits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) return static_cast<uint16_t>(sign | (ax > 0x7f800000u ? 0x7e00u : 0x7c00u));
  if (ax >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520 -> inf
  if (ax < 0x38800000u) {  // below 2^-14: fp16 subnormal, quantum 2^-24 (exact scaling)
    const uint32_t m = static_cast<uint32_t>(round_half_even(bits_float(ax) * 16777216.0f));
    return static_cast<uint16_t>(sign | m);  // m == 1024 is the smallest normal, as it should be
  }
  uint32_t h = (((ax >> 23) - 112u) << 10) | ((ax & 0x7fffffu) >> 13);
  const uint32_t rem = ax & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
  return static_cast<uint16_t>(sign | h);
}

/// \brief IEEE fp16 bits -> float (exact).
KVQ_HD float half_bits_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1fu;
  const uint32_t m = h & 0x3ffu;
  if (e == 0) {
    const float v = static_cast<float>(m) * (1.0f / 16777216.0f);
    return bits_float(sign | float_bits(v));
  }
  if (e == 31) return bits_float(sign | 0x7f800000u | (m << 13));
  return bits_float(sign | ((e + 112u) << 23) | (m << 13));
}

/// \brief float -> bfloat16 bits, round to nearest even; NaN stays NaN.
KVQ_HD uint16_t float_to_bf16_bits(float f) {
  uint32_t x = float_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}

/// \brief bfloat16 bits -> float (exact).
KVQ_HD float bf16_bits_to_float(uint16_t b) { return bits_float(static_cast<uint32_t>(b) << 16); }

/// \brief Rounds a float to the nearest fp16 value (as float).
KVQ_HD float round_to_half(float f) { return half_bits_to_float(float_to_half_bits(f)); }
/// \brief Rounds a float to the nearest bf16 value (as float).
KVQ_HD float round_to_bf16(float f) { return bf16_bits_to_float(float_to_bf16_bits(f)); }

}  // namespace kvq
