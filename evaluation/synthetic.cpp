#include "evaluation/synthetic.h"

#include <cmath>
#include <vector>

#include "core/splitmix.h"

namespace kvq {
namespace {

double uniform01(uint64_t& st) { return (static_cast<double>(splitmix64(st) >> 11) + 0.5) * 0x1.0p-53; }

}  // namespace

Tensor3 synthetic_kv(const SyntheticSpec& s) {
  Tensor3 x(s.shape);
  uint64_t st = s.seed * 0x2545f4914f6cdd1dULL + 1;
  std::vector<float> mult(static_cast<size_t>(s.shape.dim), 1.0f), mean(mult.size(), 0.0f);
  for (int i = 0; i < s.outlier_channels && s.shape.dim > 0; ++i)
    mult[static_cast<size_t>((7 + i * (s.shape.dim / 2 + 1)) % s.shape.dim)] = s.outlier_scale;
  for (auto& m : mean) m = static_cast<float>(uniform01(st) - 0.5);
  for (size_t i = 0; i < x.data.size(); i += 2) {
    const double u1 = uniform01(st), u2 = uniform01(st);
    const double r = std::sqrt(-2.0 * std::log(u1));
    const double z[2] = {r * std::cos(2 * M_PI * u2), r * std::sin(2 * M_PI * u2)};
    for (size_t k = 0; k < 2 && i + k < x.data.size(); ++k) {
      const size_t d = (i + k) % static_cast<size_t>(s.shape.dim);
      x.data[i + k] = static_cast<float>((z[k] + mean[d]) * mult[d]);
    }
  }
  return x;
}

}  // namespace kvq
