// Memory accounting for every scheme: the one formula behind `kvq quant`'s effective bits, the
// streaming KIVI cache's byte counts and `kvq plan`'s capacity table.
#pragma once

#include <cstdint>

#include "core/spec.h"
#include "core/tensor.h"

namespace kvq {

/// \brief Bytes a scheme stores for one layer's K or V of a given shape.
struct Footprint {
  double code_bytes = 0;      ///< element codes (packed words for int schemes)
  double scale_bytes = 0;     ///< scales (fp32 for FP8, fp16 for int groups)
  double zero_bytes = 0;      ///< zero points / minima (fp16, int asymmetric only)
  double residual_bytes = 0;  ///< full-precision tokens: the recent window and sink=S tokens
  int64_t quantized_elements = 0;
  int64_t residual_elements = 0;
  double total_bytes() const { return code_bytes + scale_bytes + zero_bytes + residual_bytes; }
  /// \brief Bits per quantized element: codes + scales + zeros (residual counted separately).
  double effective_bits() const {
    return quantized_elements ? 8.0 * (code_bytes + scale_bytes + zero_bytes) / quantized_elements : 0.0;
  }
  Footprint& operator+=(const Footprint& o) {
    code_bytes += o.code_bytes;
    scale_bytes += o.scale_bytes;
    zero_bytes += o.zero_bytes;
    residual_bytes += o.residual_bytes;
    quantized_elements += o.quantized_elements;
    residual_elements += o.residual_elements;
    return *this;
  }
  /// \brief Bits per element over the whole tensor, residual included.
  double overall_bits() const {
    const int64_t n = quantized_elements + residual_elements;
    return n ? 8.0 * total_bytes() / n : 0.0;
  }
};

/// Residual-window tokens are kept in the model's dtype; kvq counts 16 bits (bf16/fp16), as
/// KIVI keeps them in fp16. (The CPU reference holds them in fp32 so they are exact.)
inline constexpr double kResidualBytesPerElement = 2.0;

/// \brief `elements` more exact elements (sink=S tokens), at kResidualBytesPerElement each.
inline void add_exact(Footprint& f, int64_t elements) {
  f.residual_elements += elements;
  f.residual_bytes += kResidualBytesPerElement * static_cast<double>(elements);
}

struct StoredSide;  // core/stored_side.h

/// \brief What a stored view holds (core/stored_side.h), by the rules footprint(spec, ...) applies
/// to the scheme that wrote it: its quantized tokens' codes, scales and minima, and its exact tokens
/// (window and sinks) at kResidualBytesPerElement (the view's own exact rows are float32). The bytes
/// the cpu kernels weigh against the L3 (kernels/cpu/causal.cpp, beyond_l3).
Footprint footprint(const StoredSide& side);

/// \brief Storage of `spec` for a tensor `shape` in role `role`. sink=S tokens count as exact
/// tokens (kResidualBytesPerElement each element); rot= stores nothing (the signs follow the seed).
/// A per-layer spec (SPEC@L=SPEC) is an error: ask for one layer's (SchemeSpec::for_layer).
Footprint footprint(const SchemeSpec& spec, Role role, Shape3 shape);

}  // namespace kvq
