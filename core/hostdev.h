// Host/device portability macros shared by every header that kernels include.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define KVQ_HD __host__ __device__ __forceinline__
#else
#define KVQ_HD inline
#endif

namespace kvq {

/// \brief Bit pattern of a float (std::bit_cast, usable in device code too).
KVQ_HD uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}

/// \brief Float with the given bit pattern.
KVQ_HD float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

/// \brief 2^e as a float, for e in the normal range [-126, 127] (its exponent field, exact).
KVQ_HD float pow2(int e) { return bits_float(static_cast<uint32_t>(127 + e) << 23); }

/// \brief Round to nearest integer, ties to even (the default FP rounding mode; CUDA rintf).
KVQ_HD float round_half_even(float x) {
#if defined(__CUDA_ARCH__)
  return rintf(x);
#else
  return __builtin_rintf(x);
#endif
}

}  // namespace kvq
