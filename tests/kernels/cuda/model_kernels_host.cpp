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
          bool accumulate, int64_t n, int64_t ldx, bool) {
  if (ldx == 0) ldx = cols;
  KVQ_CHECK(rows > 0 && cols > 0 && n > 0 && ldx >= cols, "model kernels: gemv: bad shape [{}, {}]",
            rows, cols);
  if (gemv_vectorized(cols, bf16, ldx))
    KVQ_CHECK(reinterpret_cast<uintptr_t>(w) % 16 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0,
              "model kernels: gemv: W or x is not 16-byte aligned");
  for (int64_t b = 0; b < n; ++b)
    for (int64_t r = 0; r < rows; ++r) {
      float acc = 0;
      for (int64_t c = 0; c < cols; ++c) acc += weight(w, bf16, r * cols + c) * x[b * ldx + c];
      float& out = y[b * rows + r];
      out = accumulate ? out + acc : acc;
    }
}

void embed_row(const void* w, bool bf16, int64_t cols, int64_t row, float* out) {
  for (int64_t c = 0; c < cols; ++c) out[c] = weight(w, bf16, row * cols + c);
}

// ids are "device" memory: host memory under the runtime stand-in.
void embed_rows(const void* w, bool bf16, int64_t cols, const int32_t* ids, int64_t n, float* out) {
  KVQ_CHECK(cols > 0 && n > 0 && n <= 65535 && ids, "model kernels: embed_rows: bad shape");
  for (int64_t b = 0; b < n; ++b) embed_row(w, bf16, cols, ids[b], out + b * cols);
}

void rms_norm(const float* x, const float* w, int64_t rows, int64_t dim, float eps, float* y,
              int64_t groups, int64_t group_stride) {
  KVQ_CHECK(rows > 0 && rows <= 0x7fffffff && dim > 0 && groups > 0 && groups <= 65535 &&
                (groups == 1 || group_stride >= rows * dim),
            "model kernels: rms_norm: bad shape");
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t r = 0; r < rows; ++r) {
      const float* xr = x + g * group_stride + r * dim;
      float* yr = y + g * group_stride + r * dim;
      float s = 0;
      for (int64_t c = 0; c < dim; ++c) s += xr[c] * xr[c];
      const float k = 1.0f / std::sqrt(s / static_cast<float>(dim) + eps);
      for (int64_t c = 0; c < dim; ++c) yr[c] = xr[c] * w[c] * k;
    }
}

void add(float* x, const float* b, int64_t n, int64_t rows) {
  KVQ_CHECK(n > 0 && rows > 0, "model kernels: add: bad shape");
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < n; ++i) x[r * n + i] += b[i];
}

void rope(float* x, int64_t heads, int64_t dim, bool half, const RopeAngles& a, int64_t rows,
          int64_t ld, const RopeAngles* rows_a) {
  KVQ_CHECK(
      dim % 2 == 0 && dim / 2 <= kMaxRopePairs && rows > 0 && (rows == 1 || ld >= heads * dim),
      "model kernels: rope: bad shape");
  for (int64_t r = 0; r < rows; ++r) {
    const RopeAngles& ar = rows_a ? rows_a[r] : a;
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < dim / 2; ++i) {
        int64_t ca, cb;
        rope_pair(i, dim, half, ca, cb);
        float* p = x + r * ld + h * dim;
        rope_rotate(p[ca], p[cb], ar.cs[i], ar.sn[i]);
      }
  }
}

void silu_mul(float* g, const float* u, int64_t n, int64_t rows, int64_t ld) {
  if (ld == 0) ld = n;
  KVQ_CHECK(n > 0 && rows > 0 && ld >= n, "model kernels: silu_mul: bad shape");
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < n; ++i) {
      float& v = g[r * ld + i];
      v = v / (1.0f + std::exp(-v)) * u[r * ld + i];
    }
}

// Linked here so that the real launchers (model_kernels.cu, which the device side in kvq_kernels
// references) stay out of this test's link.
void to_bf16_jobs(std::span<const float* const> x, std::span<uint16_t* const> out, int64_t n) {
  KVQ_CHECK(n > 0 && !x.empty() && x.size() == out.size() && x.size() <= kBf16Jobs,
            "model kernels: to_bf16: bad jobs");
  for (size_t j = 0; j < x.size(); ++j)
    for (int64_t i = 0; i < n; ++i) out[j][i] = float_to_bf16_bits(x[j][i]);
}

void to_bf16(const float* x, int64_t n, uint16_t* out) {
  KVQ_CHECK(n > 0, "model kernels: to_bf16: n = {}", n);
  to_bf16_jobs(std::span<const float* const>(&x, 1), std::span<uint16_t* const>(&out, 1), n);
}

}  // namespace kvq::cuda::model
