// Integer group quantization of a whole tensor (KIVI axes), the CPU reference of what the
// streaming cache stores. Implemented with issue 3.
#pragma once

#include "core/spec.h"
#include "core/tensor.h"

namespace kvq::kivi {

/// \brief Quantizes and dequantizes one layer's tensor in `role` as the streaming cache would
/// hold it after appending all of x's tokens: quantized outside the residual window, exact inside.
Tensor3 round_trip(const IntSpec& spec, Role role, const Tensor3& x);

}  // namespace kvq::kivi
