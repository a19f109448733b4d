#include "reference_cpu/metrics.h"

#include <cmath>
#include <limits>

#include "core/error.h"

namespace kvq {

ReconMetrics recon_metrics(std::span<const float> x, std::span<const float> y) {
  KVQ_CHECK(x.size() == y.size(), "recon_metrics: sizes differ ({} vs {})", x.size(), y.size());
  KVQ_CHECK(!x.empty(), "recon_metrics: empty input");
  double se = 0, sx = 0, sy = 0, sxy = 0, mx = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double a = x[i], b = y[i], e = a - b;
    se += e * e;
    sx += a * a;
    sy += b * b;
    sxy += a * b;
    const double ae = std::fabs(e);
    if (!(ae <= mx)) mx = ae;  // NaN propagates
  }
  ReconMetrics m;
  const double n = static_cast<double>(x.size());
  m.mse = se / n;
  m.nmse = sx > 0 ? se / sx : (se > 0 ? std::numeric_limits<double>::infinity() : 0.0);
  m.snr_db = m.nmse > 0 ? -10.0 * std::log10(m.nmse) : std::numeric_limits<double>::infinity();
  m.max_abs_err = mx;
  m.cosine = (sx > 0 && sy > 0) ? sxy / std::sqrt(sx * sy) : (sx == 0 && sy == 0 ? 1.0 : 0.0);
  return m;
}

}  // namespace kvq
