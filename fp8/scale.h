// FP8 scales: store Q(x / s), read s * Q (vLLM / TensorRT-LLM convention).
//
// For one layer's cache tensor [T, H, D] a granularity sets how many scales there are and
// which elements share one; the layout of the scale vector is:
//   tensor  [1]      head  [H]      token  [T * H] (token-major)      channel  [H * D]
#pragma once

#include <string>
#include <vector>

#include "core/hostdev.h"
#include "core/spec.h"
#include "core/tensor.h"
#include "fp8/format.h"

namespace kvq::fp8 {

/// \brief Index into the scale vector of element (t, h, d) for a granularity.
KVQ_HD int64_t scale_index(Granularity g, int64_t t, int64_t h, int64_t d, int64_t heads,
                           int64_t dim) {
  switch (g) {
    case Granularity::Tensor:
      return 0;
    case Granularity::Head:
      return h;
    case Granularity::Token:
      return t * heads + h;
    case Granularity::Channel:
      return h * dim + d;
  }
  return 0;
}

/// \brief Number of scales a granularity needs for a shape.
int64_t scale_count(Granularity g, Shape3 s);

/// \brief A dynamic scale from the amax of its group: amax / max_finite, or 1 for an all-zero
/// group (so zeros stay zeros and nothing divides by zero). A NaN amax gives a NaN scale. A
/// subnormal amax whose quotient underflows to 0 gets the smallest float instead (0 / 0 would be
/// NaN; amax / 2^-149 < max_finite / 2 there, so nothing saturates).
KVQ_HD float scale_from_amax(float amax, Fp8Format f) {
  if (amax == 0.0f) return 1.0f;
  const float s = amax / max_finite(f);
  return s == 0.0f ? bits_float(1u) : s;
}

/// \brief Quantizes one value with its scale: the one formula both backends use.
template <Fp8Format F>
KVQ_HD uint8_t quantize_value(float x, float s) {
  return encode<F>(x / s);
}

/// \brief Reads one value back: s * decode(code).
template <Fp8Format F>
KVQ_HD float dequantize_value(uint8_t c, float s) {
  return s * decode<F>(c);
}

/// \brief Per-layer, per-head amax from calibration text (`kvq calibrate` writes it).
///
/// JSON file format (version 1):
///   { "kvq_calibration": 1, "model": "...", "source": "...",
///     "layers": [ { "k_amax": [h0, h1, ...], "v_amax": [h0, h1, ...] }, ... ] }
/// Every amax is a positive finite float32; every layer has the same head count.
struct Calibration {
  std::string model;
  std::string source;
  std::vector<std::vector<float>> k_amax;  ///< [layer][head]
  std::vector<std::vector<float>> v_amax;  ///< [layer][head]
};

/// \brief Reads and validates a calibration file; errors name the file and the bad entry.
Calibration read_calibration(const std::string& path);
/// \brief read_calibration on JSON text held in memory; `name` stands for the file in messages.
Calibration parse_calibration(const std::string& text, const std::string& name);
/// \brief Writes a calibration file atomically.
void write_calibration(const std::string& path, const Calibration& c);

/// \brief The scales `spec` uses for one layer's tensor `x` in role `role`.
/// Dynamic: amax over each scale's group; constant: one scale; calib: the file's amax for `layer`
/// (tensor: max over heads, head: per head; token/channel granularity is an error).
std::vector<float> compute_scales(const Fp8Spec& spec, Role role, const Tensor3& x, int layer = 0);

/// \brief The scales for quantizing all of `x` at once as a streaming cache would: dynamic
/// tensor / head / channel scales from the first min(spec.first, T) tokens (core/spec.h), every
/// other case as compute_scales. The reference round trip, one-shot caches and the CUDA tests use
/// it.
std::vector<float> prefill_scales(const Fp8Spec& spec, Role role, const Tensor3& x, int layer = 0);

/// \brief Quantizes x with the given scales into one code per element (same order as x).
void quantize(Fp8Spec const& spec, const std::vector<float>& scales, const Tensor3& x,
              std::vector<uint8_t>& codes);

/// \brief Dequantizes codes into y (shape already set).
void dequantize(Fp8Spec const& spec, const std::vector<float>& scales,
                const std::vector<uint8_t>& codes, Tensor3& y);

}  // namespace kvq::fp8
