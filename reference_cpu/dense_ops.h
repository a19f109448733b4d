// Attention reads over plain float32 [T, H, D] storage: the fp32 cache and the exact window.
#pragma once

#include <cstdint>

namespace kvq {

/// \brief scores[i*ld + (t - t0)] = <q_i, x[t, h, :]> for t in [t0, t1).
inline void dense_dot(const float* x, int64_t H, int64_t D, int64_t h, const float* q, int nq,
                      int64_t t0, int64_t t1, float* scores, int64_t ld) {
  for (int64_t t = t0; t < t1; ++t) {
    const float* row = x + (t * H + h) * D;
    for (int i = 0; i < nq; ++i) {
      const float* qi = q + i * D;
      float acc = 0;
#pragma omp simd reduction(+ : acc)
      for (int64_t d = 0; d < D; ++d) acc += qi[d] * row[d];
      scores[i * ld + (t - t0)] = acc;
    }
  }
}

/// \brief out[i*D + d] += sum_t p[i*ld + (t - t0)] * x[t, h, d] for t in [t0, t1).
inline void dense_accumulate(const float* x, int64_t H, int64_t D, int64_t h, const float* p,
                             int nq, int64_t t0, int64_t t1, int64_t ld, float* out) {
  for (int64_t t = t0; t < t1; ++t) {
    const float* row = x + (t * H + h) * D;
    for (int i = 0; i < nq; ++i) {
      const float w = p[i * ld + (t - t0)];
      float* o = out + i * D;
#pragma omp simd
      for (int64_t d = 0; d < D; ++d) o[d] += w * row[d];
    }
  }
}

}  // namespace kvq
