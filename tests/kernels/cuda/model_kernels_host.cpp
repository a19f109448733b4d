// Host stand-ins for kernels/cuda/model_kernels.h's launchers (what each kernel computes, written
// as plain loops), so that device_model_host_test.cpp runs kernels/cuda/device_model.cpp's host
// code (weight placement, the step's order) on the CPU against the host runtime stand-in
// (host_runtime/). The launchers' argument checks are the same as model_kernels.cu's.
#include <cmath>
#include <cstdint>

#include "core/error.h"
#include "core/half.h"
#include "kernels/cuda/model_kernels.h"

namespace kvq::cuda::model {
namespace {
float weight(const void* w, bool bf16, int64_t i) {
  return bf16 ? bf16_bits_to_float(static_cast<const uint16_t*>(w)[i])
              : static_cast<const float*>(w)[i];
}
}  // namespace

void gemv(const void* w, bool bf16, int64_t rows, int64_t cols, const float* x, float* y,
          bool accumulate) {
  KVQ_CHECK(rows > 0 && cols > 0, "model kernels: gemv: bad shape [{}, {}]", rows, cols);
  if (gemv_vectorized(cols, bf16))
    KVQ_CHECK(reinterpret_cast<uintptr_t>(w) % 16 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0,
              "model kernels: gemv: W or x is not 16-byte aligned");
  for (int64_t r = 0; r < rows; ++r) {
    float acc = 0;
    for (int64_t c = 0; c < cols; ++c) acc += weight(w, bf16, r * cols + c) * x[c];
    y[r] = accumulate ? y[r] + acc : acc;
  }
}

void embed_row(const void* w, bool bf16, int64_t cols, int64_t row, float* out) {
  for (int64_t c = 0; c < cols; ++c) out[c] = weight(w, bf16, row * cols + c);
}

void rms_norm(const float* x, const float* w, int64_t rows, int64_t dim, float eps, float* y) {
  KVQ_CHECK(rows > 0 && rows <= 65535 && dim > 0, "model kernels: rms_norm: bad shape");
  for (int64_t r = 0; r < rows; ++r) {
    float s = 0;
    for (int64_t c = 0; c < dim; ++c) s += x[r * dim + c] * x[r * dim + c];
    const float k = 1.0f / std::sqrt(s / static_cast<float>(dim) + eps);
    for (int64_t c = 0; c < dim; ++c) y[r * dim + c] = x[r * dim + c] * w[c] * k;
  }
}

void add(float* x, const float* b, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] += b[i];
}

void rope(float* x, int64_t heads, int64_t dim, bool half, const RopeAngles& a) {
  KVQ_CHECK(dim % 2 == 0 && dim / 2 <= kMaxRopePairs, "model kernels: rope: bad shape");
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t i = 0; i < dim / 2; ++i) {
      int64_t ca, cb;
      rope_pair(i, dim, half, ca, cb);
      rope_rotate(x[h * dim + ca], x[h * dim + cb], a.cs[i], a.sn[i]);
    }
}

void silu_mul(float* g, const float* u, int64_t n) {
  for (int64_t i = 0; i < n; ++i) g[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
}

// Linked here so that the real launchers (model_kernels.cu, which the device side in kvq_kernels
// references) stay out of this test's link.
void to_bf16(const float* x, int64_t n, uint16_t* out) {
  KVQ_CHECK(n > 0, "model kernels: to_bf16: n = {}", n);
  for (int64_t i = 0; i < n; ++i) out[i] = float_to_bf16_bits(x[i]);
}

}  // namespace kvq::cuda::model
