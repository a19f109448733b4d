#include "core/rotation.h"

#include <cmath>

#include "core/error.h"
#include "core/splitmix.h"

namespace kvq {

void hadamard_transform(float* x, int64_t n) {
  for (int64_t h = 1; h < n; h *= 2)
    for (int64_t i = 0; i < n; i += 2 * h)
      for (int64_t j = i; j < i + h; ++j) {
        const float a = x[j], b = x[j + h];
        x[j] = a + b;
        x[j + h] = a - b;
      }
  // 1/sqrt(n): exact for n = 4^k (64: 1/8); otherwise the float nearest.
  const float s = static_cast<float>(1.0 / std::sqrt(static_cast<double>(n)));
  for (int64_t i = 0; i < n; ++i) x[i] *= s;
}

int64_t rotation_block(int64_t dim) {
  if (dim <= 0) return 0;
  const int64_t b = dim & -dim;  // the lowest set bit: the largest power of two dividing dim
  return b >= 8 ? b : 0;
}

Rotation::Rotation(const RotSpec& spec, int64_t dim) : dim_(dim), block_(rotation_block(dim)) {
  KVQ_CHECK(spec.on, "Rotation: the spec has no rot=");
  KVQ_CHECK(block_ > 0,
            "rot=hadamard needs a head_dim divisible by 8 (it rotates blocks of the largest power "
            "of two dividing head_dim), not {}",
            dim);
  if (!spec.seeded) return;
  sign_.resize(static_cast<size_t>(dim));
  uint64_t state = spec.seed;
  for (float& s : sign_) s = (splitmix64(state) & 1) ? -1.0f : 1.0f;
}

void Rotation::rotate(float* x, int64_t rows) const {
  for (int64_t r = 0; r < rows; ++r) {
    float* row = x + r * dim_;
    if (!sign_.empty())
      for (int64_t d = 0; d < dim_; ++d) row[d] *= sign_[static_cast<size_t>(d)];
    for (int64_t b = 0; b < dim_; b += block_) hadamard_transform(row + b, block_);
  }
}

void Rotation::unrotate(float* x, int64_t rows) const {
  for (int64_t r = 0; r < rows; ++r) {
    float* row = x + r * dim_;
    for (int64_t b = 0; b < dim_; b += block_) hadamard_transform(row + b, block_);
    if (!sign_.empty())
      for (int64_t d = 0; d < dim_; ++d) row[d] *= sign_[static_cast<size_t>(d)];
  }
}

}  // namespace kvq
