// Backend `cpu`: FP8 quantize, bit-identical to the reference (fp8/scale.h, fp8/format.h).
//
// The encode is fp8::encode<F> step for step on 8 lanes, 16 with AVX-512 (same selects, the same
// IEEE division x / s per element: x * (1/s) would flip codes), so every code equals the
// reference's; the amax pass is a lane-wise max (order-free: max of |x| is unique) with groups
// holding NaN redone by the reference so the NaN that reaches the scale is the same one.
#pragma once

#include <cstdint>
#include <vector>

#include "core/spec.h"
#include "core/tensor.h"

namespace kvq::cpu {

/// \brief codes[i] = fp8::quantize_value<f>(x[i], s) for i < n (one scale).
void fp8_quantize_row(Fp8Format f, const float* x, int64_t n, float s, uint8_t* codes);

/// \brief codes[i] = fp8::quantize_value<f>(x[i], s[i]) for i < n (a scale per element).
void fp8_quantize_row(Fp8Format f, const float* x, int64_t n, const float* s, uint8_t* codes);

/// \brief fp8::compute_scales, with the dynamic amax pass vectorized (same floats, bit for bit).
std::vector<float> fp8_compute_scales(const Fp8Spec& spec, Role role, const Tensor3& x,
                                      int layer = 0);

/// \brief fp8::quantize: the same codes, bit for bit.
void fp8_quantize(const Fp8Spec& spec, const std::vector<float>& scales, const Tensor3& x,
                  std::vector<uint8_t>& codes);

/// \brief fp8_compute_scales then fp8_quantize (the same scales and codes, bit for bit); with
/// dynamic per-token scales each row's amax and codes are computed in one pass while the row is in
/// L1 (one read of x instead of two).
void fp8_quantize_dynamic(const Fp8Spec& spec, Role role, const Tensor3& x,
                          std::vector<float>& scales, std::vector<uint8_t>& codes, int layer = 0);

}  // namespace kvq::cpu
