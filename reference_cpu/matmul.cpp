#include "reference_cpu/matmul.h"

#include <algorithm>
#include <cmath>

namespace kvq {
namespace {

constexpr int64_t kRows = 4;     // rows per register tile
constexpr int64_t kCols = 16;    // columns per register tile (two 8-float vectors)
constexpr int64_t kPanel = 128;  // columns per panel: k x 128 floats of Wt stay in L2

// One tile of up to kRows x kCols outputs; each element is fma(x[r][kk], w[kk][c], acc) for
// kk = 0 .. k-1 in order, starting from 0 (or from y when accumulating).
template <int64_t R, int64_t C>
inline void tile(const float* x, int64_t k, const float* wt, int64_t n, float* y, bool accumulate) {
  float acc[R][C];
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < C; ++c) acc[r][c] = accumulate ? y[r * n + c] : 0.0f;
  for (int64_t kk = 0; kk < k; ++kk) {
    const float* w = wt + kk * n;
    for (int64_t r = 0; r < R; ++r) {
      const float xr = x[r * k + kk];
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) acc[r][c] = std::fma(xr, w[c], acc[r][c]);
    }
  }
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < C; ++c) y[r * n + c] = acc[r][c];
}

// Edge tiles: same chain per element, runtime sizes.
void tile_edge(const float* x, int64_t rows, int64_t k, const float* wt, int64_t n, int64_t cols,
               float* y, bool accumulate) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      float acc = accumulate ? y[r * n + c] : 0.0f;
      for (int64_t kk = 0; kk < k; ++kk) acc = std::fma(x[r * k + kk], wt[kk * n + c], acc);
      y[r * n + c] = acc;
    }
}

}  // namespace

// Compiled three times and chosen by the CPU when the program loads (GCC / clang target_clones):
// every element is one fma chain, so each clone gives the same bits and only the speed depends on
// the ISA - no CPU path (cmake/cpu_paths.cmake) is needed. Without it a baseline x86-64 build
// (KVQ_NATIVE=OFF) calls libm's fmaf per element: 40x slower (the model's --weights fp32, the
// packed products' tests).
#if defined(__x86_64__)
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#endif
void matmul(const float* x, int64_t m, int64_t k, const float* wt, int64_t n, float* y, bool accumulate) {
  const int64_t panels = (n + kPanel - 1) / kPanel;
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t p = 0; p < panels; ++p) {
    const int64_t j0 = p * kPanel, j1 = std::min(n, j0 + kPanel);
    for (int64_t i = 0; i < m; i += kRows) {
      const int64_t rows = std::min(kRows, m - i);
      int64_t j = j0;
      for (; j + kCols <= j1; j += kCols) {
        if (rows == kRows)
          tile<kRows, kCols>(x + i * k, k, wt + j, n, y + i * n + j, accumulate);
        else if (rows == 1)
          tile<1, kCols>(x + i * k, k, wt + j, n, y + i * n + j, accumulate);
        else if (rows == 2)
          tile<2, kCols>(x + i * k, k, wt + j, n, y + i * n + j, accumulate);
        else
          tile<3, kCols>(x + i * k, k, wt + j, n, y + i * n + j, accumulate);
      }
      if (j < j1) tile_edge(x + i * k, rows, k, wt + j, n, j1 - j, y + i * n + j, accumulate);
    }
  }
}

}  // namespace kvq
