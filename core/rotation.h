// The rotation of rot=hadamard[:SEED] (core/spec.h): R = blockdiag(H_b) * diag(s) / sqrt(b), H_b
// the Sylvester Walsh-Hadamard matrix of order b, b the largest power of two dividing head_dim
// (128 -> one block of 128; 96 -> three of 32; 72 -> nine of 8; below 8 is an error), s the signs:
// all +1 without a seed (llama.cpp's rotated caches), else s_i = +1 or -1 by the low bit of the
// i-th splitmix64 output from SEED (QuaRot's randomized Hadamard). R is orthonormal, so
// <R q, R k> = <q, k> and R^T (sum p R v) = sum p v in exact arithmetic; O(d log d) per vector.
#pragma once

#include <cstdint>
#include <vector>

#include "core/spec.h"

namespace kvq {

/// \brief x[0..n) <- H_n x / sqrt(n) in place (Sylvester order), n a power of two: the
/// orthonormal Walsh-Hadamard transform, its own inverse.
void hadamard_transform(float* x, int64_t n);

/// \brief The block size b for head_dim `dim`: the largest power of two dividing it (0 if below 8).
int64_t rotation_block(int64_t dim);

class Rotation {
 public:
  /// Throws kvq::Error when `dim` has no power-of-two block of at least 8.
  Rotation(const RotSpec& spec, int64_t dim);
  int64_t dim() const { return dim_; }
  int64_t block() const { return block_; }
  /// \brief x [rows, dim] <- rows multiplied by R.
  void rotate(float* x, int64_t rows) const;
  /// \brief x [rows, dim] <- rows multiplied by R^T (undoes rotate up to float rounding).
  void unrotate(float* x, int64_t rows) const;

 private:
  int64_t dim_, block_;
  std::vector<float> sign_;  // empty: all +1
};

}  // namespace kvq
