#include "evaluation/channel_stats.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"

namespace kvq {

double median(std::vector<double> v) {
  if (v.empty()) return std::numeric_limits<double>::quiet_NaN();
  std::sort(v.begin(), v.end());
  const size_t m = v.size();
  return m % 2 ? v[m / 2] : 0.5 * (v[m / 2 - 1] + v[m / 2]);
}

std::vector<HeadStats> channel_stats(const Tensor3& x, double threshold) {
  const Shape3 s = x.shape;
  KVQ_CHECK(s.tokens > 0 && s.heads > 0 && s.dim > 0, "stats: empty tensor [{}, {}, {}]", s.tokens,
            s.heads, s.dim);
  KVQ_CHECK(threshold > 0, "stats: threshold must be positive, got {}", threshold);
  std::vector<HeadStats> out(static_cast<size_t>(s.heads));
  const double n = static_cast<double>(s.tokens);
  for (int64_t h = 0; h < s.heads; ++h) {
    HeadStats& hs = out[static_cast<size_t>(h)];
    hs.head = h;
    hs.channels.resize(static_cast<size_t>(s.dim));
    for (int64_t d = 0; d < s.dim; ++d) {
      ChannelStats& c = hs.channels[static_cast<size_t>(d)];
      double sum = 0;
      for (int64_t t = 0; t < s.tokens; ++t) {
        const double v = x.at(t, h, d);
        sum += v;
        c.amax = std::max(c.amax, std::fabs(v));
      }
      c.mean = sum / n;
      double m2 = 0, m4 = 0;  // central moments, second pass
      for (int64_t t = 0; t < s.tokens; ++t) {
        const double e = x.at(t, h, d) - c.mean, e2 = e * e;
        m2 += e2;
        m4 += e2 * e2;
      }
      m2 /= n;
      m4 /= n;
      c.std = std::sqrt(m2);
      c.kurtosis = m2 > 0 ? m4 / (m2 * m2) : std::numeric_limits<double>::quiet_NaN();
    }
    std::vector<double> a;
    for (const auto& c : hs.channels) a.push_back(c.amax);
    hs.amax_median = median(std::move(a));
    for (int64_t d = 0; d < s.dim; ++d)
      if (hs.amax_median > 0 &&
          hs.channels[static_cast<size_t>(d)].amax > threshold * hs.amax_median)
        hs.outliers.push_back(d);
  }
  return out;
}

}  // namespace kvq
