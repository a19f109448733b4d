// Row-deterministic matrix product for the model: Y = X * Wt with every element computed as the
// same fused multiply-add chain over k in increasing order, whatever the number of rows, the tile
// or the thread. So a token's activations are bit-identical whether it runs in a chunk of 512, a
// chunk of 7 or alone - which lets chunked prefill and token-by-token decode store the very same
// quantized codes (BLAS GEMM and GEMV sum in different orders, and a one-ulp difference can flip
// a code and ripple through 30 layers).
#pragma once

#include <cstdint>

namespace kvq {

/// \brief Y[m][n] (=, or += when `accumulate`) X[m][k] * Wt[k][n], all row-major.
void matmul(const float* x, int64_t m, int64_t k, const float* wt, int64_t n, float* y,
            bool accumulate = false);

}  // namespace kvq
