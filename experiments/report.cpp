#include "experiments/report.h"

#include <cmath>

#include "reference_cpu/metrics.h"

namespace kvq::cli {

nlohmann::json error_report(const SchemeSpec& spec, Role role, const Tensor3& x, const RoundTrip& r) {
  const ReconMetrics m = recon_metrics(x.data, r.values.data);
  nlohmann::json j;
  j["scheme"] = spec.canonical();
  j["role"] = std::string(to_string(role));
  j["shape"] = {x.shape.tokens, x.shape.heads, x.shape.dim};
  j["effective_bits"] = r.footprint.effective_bits();
  j["overall_bits"] = r.footprint.overall_bits();
  j["residual_tokens"] = r.footprint.residual_elements / (x.shape.heads * x.shape.dim);
  j["mse"] = m.mse;
  j["nmse"] = m.nmse;
  j["snr_db"] = std::isfinite(m.snr_db) ? nlohmann::json(m.snr_db) : nlohmann::json(nullptr);
  j["max_abs_err"] = m.max_abs_err;
  j["cosine"] = m.cosine;
  return j;
}

}  // namespace kvq::cli
