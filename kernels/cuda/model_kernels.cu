// The model's small CUDA kernels (model_kernels.h).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "core/error.h"
#include "core/half.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/model_kernels.h"

namespace kvq::cuda::model {
namespace {

constexpr int kWarp = 32;

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = kWarp / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float bf16_to_float(uint16_t b) {
  return __uint_as_float(static_cast<uint32_t>(b) << 16);
}

// 8 bf16 weights (one uint4) times 8 x values, added to acc.
__device__ __forceinline__ float dot8(const uint4 w, const float4 x0, const float4 x1, float acc) {
  acc = fmaf(__uint_as_float(w.x << 16), x0.x, acc);
  acc = fmaf(__uint_as_float(w.x & 0xffff0000u), x0.y, acc);
  acc = fmaf(__uint_as_float(w.y << 16), x0.z, acc);
  acc = fmaf(__uint_as_float(w.y & 0xffff0000u), x0.w, acc);
  acc = fmaf(__uint_as_float(w.z << 16), x1.x, acc);
  acc = fmaf(__uint_as_float(w.z & 0xffff0000u), x1.y, acc);
  acc = fmaf(__uint_as_float(w.w << 16), x1.z, acc);
  acc = fmaf(__uint_as_float(w.w & 0xffff0000u), x1.w, acc);
  return acc;
}

// One warp per row of W [rows][cols]; lane l takes the row's 16-byte chunks l, l + 32, ... (VEC)
// or its weights l, l + 32, ... (scalar), then the warp sums the 32 partial sums.
template <bool kBf16, bool kVec>
__global__ void __launch_bounds__(kGemvWarps* kWarp)
    gemv_kernel(const void* __restrict__ wv, int64_t rows, int64_t cols,
                const float* __restrict__ x, float* __restrict__ y, bool accumulate) {
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kGemvWarps + threadIdx.x / kWarp;
  if (row >= rows) return;  // whole warps leave together (a warp is one row)
  float acc = 0.0f;
  if constexpr (kBf16) {
    const uint16_t* w = static_cast<const uint16_t*>(wv) + row * cols;
    if constexpr (kVec) {
      const int64_t chunks = cols / 8;
      const uint4* w4 = reinterpret_cast<const uint4*>(w);
      const float4* x4 = reinterpret_cast<const float4*>(x);
      for (int64_t j = lane; j < chunks; j += kWarp) {
        const uint4 q = __ldg(w4 + j);
        acc = dot8(q, __ldg(x4 + 2 * j), __ldg(x4 + 2 * j + 1), acc);
      }
    } else {
      for (int64_t c = lane; c < cols; c += kWarp)
        acc = fmaf(bf16_to_float(w[c]), __ldg(x + c), acc);
    }
  } else {
    const float* w = static_cast<const float*>(wv) + row * cols;
    if constexpr (kVec) {
      const int64_t chunks = cols / 4;
      const float4* w4 = reinterpret_cast<const float4*>(w);
      const float4* x4 = reinterpret_cast<const float4*>(x);
      for (int64_t j = lane; j < chunks; j += kWarp) {
        const float4 q = __ldg(w4 + j), v = __ldg(x4 + j);
        acc = fmaf(q.x, v.x, acc);
        acc = fmaf(q.y, v.y, acc);
        acc = fmaf(q.z, v.z, acc);
        acc = fmaf(q.w, v.w, acc);
      }
    } else {
      for (int64_t c = lane; c < cols; c += kWarp) acc = fmaf(__ldg(w + c), __ldg(x + c), acc);
    }
  }
  acc = warp_sum(acc);
  if (lane == 0) y[row] = accumulate ? y[row] + acc : acc;
}

template <bool kBf16>
__global__ void embed_kernel(const void* __restrict__ wv, int64_t cols, int64_t row,
                             float* __restrict__ out) {
  for (int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < cols;
       c += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if constexpr (kBf16)
      out[c] = bf16_to_float(static_cast<const uint16_t*>(wv)[row * cols + c]);
    else
      out[c] = static_cast<const float*>(wv)[row * cols + c];
  }
}

constexpr int kNormThreads = 256;

// One block per row: the sum of squares by a fixed tree (warp shuffles, then warp 0 over the
// warps' sums), then every thread scales its values. x and y may alias: each thread reads its own
// values before the barrier and writes only them after it.
__global__ void __launch_bounds__(kNormThreads)
    rms_norm_kernel(const float* x, const float* __restrict__ w, int64_t dim, float eps, float* y) {
  __shared__ float part[kNormThreads / kWarp];
  __shared__ float scale;
  const float* xr = x + static_cast<int64_t>(blockIdx.x) * dim;
  float* yr = y + static_cast<int64_t>(blockIdx.x) * dim;
  float s = 0.0f;
  for (int64_t c = threadIdx.x; c < dim; c += kNormThreads) s = fmaf(xr[c], xr[c], s);
  s = warp_sum(s);
  if (threadIdx.x % kWarp == 0) part[threadIdx.x / kWarp] = s;
  __syncthreads();
  if (threadIdx.x < kWarp) {
    float t = threadIdx.x < kNormThreads / kWarp ? part[threadIdx.x] : 0.0f;
    t = warp_sum(t);
    if (threadIdx.x == 0) scale = 1.0f / sqrtf(t / static_cast<float>(dim) + eps);
  }
  __syncthreads();
  const float r = scale;
  for (int64_t c = threadIdx.x; c < dim; c += kNormThreads) yr[c] = xr[c] * w[c] * r;
}

__global__ void add_kernel(float* __restrict__ x, const float* __restrict__ b, int64_t n) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    x[i] += b[i];
}

// One thread per (head, pair).
__global__ void rope_kernel(float* __restrict__ x, int64_t heads, int64_t dim, bool half,
                            const RopeAngles a) {
  const int64_t pairs = dim / 2;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= heads * pairs) return;
  const int64_t h = t / pairs, i = t % pairs;
  int64_t ca, cb;
  rope_pair(i, dim, half, ca, cb);
  float* p = x + h * dim;
  float x0 = p[ca], x1 = p[cb];
  rope_rotate(x0, x1, a.cs[i], a.sn[i]);
  p[ca] = x0;
  p[cb] = x1;
}

__global__ void silu_mul_kernel(float* __restrict__ g, const float* __restrict__ u, int64_t n) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float v = g[i];
    g[i] = v / (1.0f + expf(-v)) * u[i];
  }
}

// core/half.h's float_to_bf16_bits itself (__host__ __device__): round to nearest even, NaN kept.
__global__ void to_bf16_kernel(const float* __restrict__ x, int64_t n, uint16_t* __restrict__ out) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = float_to_bf16_bits(x[i]);
}

constexpr int kThreads = 256;
unsigned grid_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 1 ? 1 : (b > 65535 ? 65535 : b));
}

// Bad arguments throw kvq::Error (std::string messages: no fmt in CUDA translation units); the
// message is built only on failure.
#define KVQ_MODEL_NEED(cond, what)                               \
  do {                                                           \
    if (!(cond)) throw ::kvq::Error("model kernels: " + (what)); \
  } while (0)
std::string shape(int64_t a, int64_t b) {
  std::string s(1, '[');  // appended piece by piece (g++ 12's -Wrestrict misfires on "[" + ...)
  s.append(std::to_string(a)).append(", ").append(std::to_string(b)).push_back(']');
  return s;
}

void check_aligned(const void* p, const char* what) {
  KVQ_MODEL_NEED(reinterpret_cast<uintptr_t>(p) % 16 == 0,
                 std::string("gemv: ") + what + " is not 16-byte aligned");
}

}  // namespace

void gemv(const void* w, bool bf16, int64_t rows, int64_t cols, const float* x, float* y,
          bool accumulate) {
  KVQ_MODEL_NEED(rows > 0 && cols > 0 && gemv_blocks(rows) <= 0x7fffffff,
                 "gemv: bad shape " + shape(rows, cols));
  const bool vec = gemv_vectorized(cols, bf16);
  if (vec) {
    check_aligned(w, "W");
    check_aligned(x, "x");
  }
  const dim3 grid(static_cast<unsigned>(gemv_blocks(rows))), block(kGemvWarps * kWarp);
  if (bf16) {
    if (vec)
      gemv_kernel<true, true><<<grid, block>>>(w, rows, cols, x, y, accumulate);
    else
      gemv_kernel<true, false><<<grid, block>>>(w, rows, cols, x, y, accumulate);
  } else {
    if (vec)
      gemv_kernel<false, true><<<grid, block>>>(w, rows, cols, x, y, accumulate);
    else
      gemv_kernel<false, false><<<grid, block>>>(w, rows, cols, x, y, accumulate);
  }
  KVQ_CUDA_CHECK(cudaGetLastError());
}

void embed_row(const void* w, bool bf16, int64_t cols, int64_t row, float* out) {
  KVQ_MODEL_NEED(cols > 0 && row >= 0, "embed_row: bad row/columns " + shape(row, cols));
  if (bf16)
    embed_kernel<true><<<grid_for(cols), kThreads>>>(w, cols, row, out);
  else
    embed_kernel<false><<<grid_for(cols), kThreads>>>(w, cols, row, out);
  KVQ_CUDA_CHECK(cudaGetLastError());
}

void rms_norm(const float* x, const float* w, int64_t rows, int64_t dim, float eps, float* y) {
  KVQ_MODEL_NEED(rows > 0 && rows <= 65535 && dim > 0, "rms_norm: bad shape " + shape(rows, dim));
  rms_norm_kernel<<<static_cast<unsigned>(rows), kNormThreads>>>(x, w, dim, eps, y);
  KVQ_CUDA_CHECK(cudaGetLastError());
}

void add(float* x, const float* b, int64_t n) {
  KVQ_MODEL_NEED(n > 0, "add: n = " + std::to_string(n));
  add_kernel<<<grid_for(n), kThreads>>>(x, b, n);
  KVQ_CUDA_CHECK(cudaGetLastError());
}

void rope(float* x, int64_t heads, int64_t dim, bool half, const RopeAngles& a) {
  KVQ_MODEL_NEED(heads > 0 && dim > 0 && dim % 2 == 0 && dim / 2 <= kMaxRopePairs,
                 "rope: bad shape (heads, dim) " + shape(heads, dim));
  const int64_t n = heads * (dim / 2);
  rope_kernel<<<static_cast<unsigned>((n + kThreads - 1) / kThreads), kThreads>>>(x, heads, dim,
                                                                                  half, a);
  KVQ_CUDA_CHECK(cudaGetLastError());
}

void silu_mul(float* g, const float* u, int64_t n) {
  KVQ_MODEL_NEED(n > 0, "silu_mul: n = " + std::to_string(n));
  silu_mul_kernel<<<grid_for(n), kThreads>>>(g, u, n);
  KVQ_CUDA_CHECK(cudaGetLastError());
}

void to_bf16(const float* x, int64_t n, uint16_t* out) {
  KVQ_MODEL_NEED(n > 0, "to_bf16: n = " + std::to_string(n));
  to_bf16_kernel<<<grid_for(n), kThreads>>>(x, n, out);
  KVQ_CUDA_CHECK(cudaGetLastError());
}

}  // namespace kvq::cuda::model
