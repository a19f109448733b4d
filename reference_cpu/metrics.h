// Error metrics (REFERENCE.md section 4), accumulated in double.
#pragma once

#include <cstddef>
#include <span>

namespace kvq {

/// \brief Reconstruction error of x' against x.
struct ReconMetrics {
  double mse = 0;          ///< mean (x - x')^2
  double nmse = 0;         ///< mse / mean(x^2)
  double snr_db = 0;       ///< -10 log10(nmse); +inf when exact
  double max_abs_err = 0;  ///< max |x - x'|
  double cosine = 0;       ///< <x, x'> / (|x| |x'|); 1 when both are zero
};

/// \brief Computes every reconstruction metric; the spans must have equal length.
ReconMetrics recon_metrics(std::span<const float> x, std::span<const float> y);

}  // namespace kvq
