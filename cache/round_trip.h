// Quantize-and-dequantize a whole tensor under any scheme, as the scheme stores it.
#pragma once

#include "core/footprint.h"
#include "core/spec.h"
#include "core/tensor.h"

namespace kvq {

/// \brief What a scheme makes of one layer's tensor: the values read back and the bytes stored.
struct RoundTrip {
  Tensor3 values;       ///< dequantized (residual-window tokens exact)
  Footprint footprint;  ///< storage, from the one accounting formula
};

/// \brief Quantizes and dequantizes `x` as one layer's cache in role `role` (int schemes apply
/// the residual rule as if the tensor's tokens were the cache). `layer` picks calib scales and the
/// scheme of a per-layer spec.
RoundTrip round_trip(const SchemeSpec& spec, Role role, const Tensor3& x, int layer = 0);

}  // namespace kvq
