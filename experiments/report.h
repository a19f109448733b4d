// Result rows shared by the commands: one JSON object per (scheme, role, tensor).
#pragma once

#include <nlohmann/json.hpp>

#include "core/spec.h"
#include "core/tensor.h"
#include "reference_cpu/quantize.h"

namespace kvq::cli {

/// \brief scheme, role, shape, effective_bits (codes + scales + zeros per quantized element),
/// overall_bits (residual included), mse, nmse, snr_db (null when exact), max_abs_err, cosine.
nlohmann::json error_report(const SchemeSpec& spec, Role role, const Tensor3& x, const RoundTrip& r);

}  // namespace kvq::cli
