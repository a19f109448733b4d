// The tests' double-precision reference of the dense layers' product (kernels/cuda/gemm_bf16.h),
// shared by the host emulation (tests/kernels/cuda/gemm_bf16_test.cpp) and the device test
// (tests/cuda/model_kernel_test.cu): one output of y = x W^T, with the sum of magnitudes the
// error bounds scale by.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "core/half.h"

namespace kvq::cuda::gemm_ref {

struct Dot {
  double sum = 0, mag = 0;  ///< sum_c W[r][c] x[b][c], and sum_c |W[r][c] x[b][c]|
};

/// \brief Output (b, r) of x [n][ldx] times bf16 W [rows][cols]^T, in double.
inline Dot dot(const std::vector<uint16_t>& w, const std::vector<float>& x, int64_t cols,
               int64_t ldx, int64_t b, int64_t r) {
  Dot d;
  for (int64_t c = 0; c < cols; ++c) {
    const double p = static_cast<double>(bf16_bits_to_float(w[static_cast<size_t>(r * cols + c)])) *
                     x[static_cast<size_t>(b * ldx + c)];
    d.sum += p;
    d.mag += std::fabs(p);
  }
  return d;
}

}  // namespace kvq::cuda::gemm_ref
