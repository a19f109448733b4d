// Integer group quantization of a whole tensor (KIVI axes), the CPU reference of what the
// streaming cache stores: it is the cache (kivi/cache.h) after one append of every token, read
// back. The group routine itself is kivi/group.h (formula: kivi/minmax.h, bits: kivi/pack.h).
#pragma once

#include "core/spec.h"
#include "core/tensor.h"

namespace kvq::kivi {

/// \brief Quantizes and dequantizes one layer's tensor in `role` as the streaming cache would
/// hold it after appending all of x's tokens: quantized outside the residual window, exact inside.
Tensor3 round_trip(const IntSpec& spec, Role role, const Tensor3& x);

}  // namespace kvq::kivi
