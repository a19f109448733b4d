// The model's small CUDA kernels (model_kernels.h).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <mutex>
#include <string>
#include <type_traits>

#include "core/error.h"
#include "core/half.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/gemm_bf16.h"
#include "kernels/cuda/model_kernels.h"
#include "kernels/cuda/ptx.cuh"

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
// or its weights l, l + 32, ... (scalar) and multiplies each by the same chunk of up to kGemvCols
// activation rows at once (one weight load for all of them), then the warp sums each row's 32
// partial sums. Row b's sums take the same fmaf chain and shuffle tree whatever n and kCols are.
// kCols: activation rows a pass holds sums for: 1 for a single row (n is 1 then, and the loop over
// passes folds away: the batch-1 kernel's registers and occupancy), kGemvCols for a batch.
template <bool kBf16, bool kVec, int kCols>
__global__ void __launch_bounds__(kGemvWarps* kWarp)
    gemv_kernel(const void* __restrict__ wv, int64_t rows, int64_t cols,
                const float* __restrict__ x, int64_t ldx, int64_t n, float* __restrict__ y,
                bool accumulate) {
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kGemvWarps + threadIdx.x / kWarp;
  if (row >= rows) return;  // whole warps leave together (a warp is one row)
  if (kCols == 1) n = 1;    // the launcher's promise, made visible to the compiler
  for (int64_t b0 = 0; b0 < n; b0 += kCols) {
    const int nb = static_cast<int>(n - b0 < kCols ? n - b0 : kCols);  // warp-uniform
    const float* xb = x + b0 * ldx;
    float acc[kCols];
#pragma unroll
    for (int b = 0; b < kCols; ++b) acc[b] = 0.0f;
    if constexpr (kBf16) {
      const uint16_t* w = static_cast<const uint16_t*>(wv) + row * cols;
      if constexpr (kVec) {
        const int64_t chunks = cols / 8;
        const uint4* w4 = reinterpret_cast<const uint4*>(w);
        for (int64_t j = lane; j < chunks; j += kWarp) {
          const uint4 q = __ldg(w4 + j);
#pragma unroll
          for (int b = 0; b < kCols; ++b)
            if (b < nb) {
              const float4* x4 = reinterpret_cast<const float4*>(xb + b * ldx);
              acc[b] = dot8(q, __ldg(x4 + 2 * j), __ldg(x4 + 2 * j + 1), acc[b]);
            }
        }
      } else {
        for (int64_t c = lane; c < cols; c += kWarp) {
          const float wc = bf16_to_float(w[c]);
#pragma unroll
          for (int b = 0; b < kCols; ++b)
            if (b < nb) acc[b] = fmaf(wc, __ldg(xb + b * ldx + c), acc[b]);
        }
      }
    } else {
      const float* w = static_cast<const float*>(wv) + row * cols;
      if constexpr (kVec) {
        const int64_t chunks = cols / 4;
        const float4* w4 = reinterpret_cast<const float4*>(w);
        for (int64_t j = lane; j < chunks; j += kWarp) {
          const float4 q = __ldg(w4 + j);
#pragma unroll
          for (int b = 0; b < kCols; ++b)
            if (b < nb) {
              const float4 v = __ldg(reinterpret_cast<const float4*>(xb + b * ldx) + j);
              float a = acc[b];
              a = fmaf(q.x, v.x, a);
              a = fmaf(q.y, v.y, a);
              a = fmaf(q.z, v.z, a);
              a = fmaf(q.w, v.w, a);
              acc[b] = a;
            }
        }
      } else {
        for (int64_t c = lane; c < cols; c += kWarp) {
          const float wc = __ldg(w + c);
#pragma unroll
          for (int b = 0; b < kCols; ++b)
            if (b < nb) acc[b] = fmaf(wc, __ldg(xb + b * ldx + c), acc[b]);
        }
      }
    }
#pragma unroll
    for (int b = 0; b < kCols; ++b)
      if (b < nb) {
        const float s = warp_sum(acc[b]);
        float* yr = y + (b0 + b) * rows + row;
        if (lane == 0) *yr = accumulate ? *yr + s : s;
      }
  }
}

// ---- the tensor-core GEMM (gemm_bf16.h: tile plan, fragment offsets, dispatch) ---------------
using namespace ptx;  // cp.async, mma.m16n8k16 (ptx.cuh, shared with attention_mma.cu)

// A thread's cp.async sources, fixed for the block: its W chunk's and X chunks' addresses at
// column 0 (clamped to the matrix start where the row lies outside) and whether the row lies
// inside; a stage adds its first column and zero-fills chunks past `cols` (gemm_bf16.h's plan).
struct GemmSources {
  const uint16_t* w;
  const float* x[gemm::kGemmXChunksPerThread];
  bool w_in, x_in[gemm::kGemmXChunksPerThread];
};

__device__ __forceinline__ GemmSources gemm_sources(const uint16_t* w, const float* x, int64_t rows,
                                                    int64_t cols, int64_t n, int64_t ldx,
                                                    int64_t m0, int64_t n0) {
  using namespace gemm;
  const int t = static_cast<int>(threadIdx.x);
  GemmSources s;
  const int64_t r = m0 + w_chunk_row(t);
  s.w_in = r < rows;
  s.w = s.w_in ? w + r * cols + w_chunk_col(t) : w;
#pragma unroll
  for (int i = 0; i < kGemmXChunksPerThread; ++i) {
    const int64_t b = n0 + x_chunk_row(t, i);
    s.x_in[i] = b < n;
    s.x[i] = s.x_in[i] ? x + b * ldx + x_chunk_col(t, i) : x;
  }
  return s;
}

// Stage (ws, xs) <- columns [k0, k0 + kGemmBK) of the block's W rows and x rows.
__device__ __forceinline__ void gemm_load(uint16_t* ws, float* xs, const GemmSources& s,
                                          int64_t cols, int64_t k0) {
  using namespace gemm;
  const int t = static_cast<int>(threadIdx.x);
  {
    const bool in = s.w_in && k0 + w_chunk_col(t) < cols;
    cp_async16(ws + w_chunk_smem(t), in ? s.w + k0 : s.w, in ? 16 : 0);
  }
#pragma unroll
  for (int i = 0; i < kGemmXChunksPerThread; ++i) {
    const bool in = s.x_in[i] && k0 + x_chunk_col(t, i) < cols;
    cp_async16(xs + x_chunk_smem(t, i), in ? s.x[i] + k0 : s.x[i], in ? 16 : 0);
  }
}

// y [n][rows] (+)= x [n][cols] W^T on tensor cores: block (blockIdx.x, blockIdx.y) the weight rows
// [kGemmBM bx, +kGemmBM) and activation rows [kGemmBN by, +kGemmBN); kGemmStages-stage cp.async
// pipeline over the column stages [slice_tiles z, +slice_tiles) of slice z = blockIdx.z; x split
// into high and low bf16 (two mmas a tile, gemm_bf16.h). With `partial` (split-K) the sums go to
// partial [z][n][rows] and gemm_reduce_kernel adds the slices; else to y.
__global__ void __launch_bounds__(gemm::kGemmThreads)
    gemm_bf16_kernel(const uint16_t* __restrict__ w, int64_t rows, int64_t cols,
                     const float* __restrict__ x, int64_t ldx, int64_t n, float* __restrict__ y,
                     bool accumulate, int slice_tiles, float* __restrict__ partial) {
  using namespace gemm;
  __shared__ __align__(16) uint16_t ws[kGemmStages][kGemmWStage];
  __shared__ __align__(16) float xs[kGemmStages][kGemmXStage];
  const int lane = static_cast<int>(threadIdx.x) % 32, warp = static_cast<int>(threadIdx.x) / 32;
  const int64_t m0 = static_cast<int64_t>(blockIdx.x) * kGemmBM;
  const int64_t n0 = static_cast<int64_t>(blockIdx.y) * kGemmBN;
  const bool active = n0 + 16 * warp < n;  // warp-uniform: a warp past n only loads
  const int first = static_cast<int>(blockIdx.z) * slice_tiles;
  const int all = static_cast<int>(gemm_k_tiles(cols));
  const int tiles = all - first < slice_tiles ? all - first : slice_tiles;  // this slice's stages
  GemmSources src = gemm_sources(w, x, rows, cols, n, ldx, m0, n0);
  src.w += static_cast<int64_t>(first) * kGemmBK;  // the slice's first column (kept in bounds:
  cols -= static_cast<int64_t>(first) * kGemmBK;   // a chunk is read only while k0 < the rest)
#pragma unroll
  for (int i = 0; i < kGemmXChunksPerThread; ++i) src.x[i] += static_cast<int64_t>(first) * kGemmBK;
  float acc[2][2][4];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[mt][nt][i] = 0.0f;
#pragma unroll
  for (int s = 0; s < kGemmStages - 1; ++s) {
    if (s < tiles) gemm_load(ws[s], xs[s], src, cols, int64_t{s} * kGemmBK);
    cp_async_commit();
  }
  for (int kt = 0; kt < tiles; ++kt) {
    cp_async_wait<kGemmStages - 2>();  // tile kt has landed (this thread's copies)
    __syncthreads();                   // everyone's; and the slot refilled below is free
    const int next = kt + kGemmStages - 1;
    if (next < tiles) {
      const int slot = next % kGemmStages;
      gemm_load(ws[slot], xs[slot], src, cols, int64_t{next} * kGemmBK);
    }
    cp_async_commit();  // an empty group past the last tile keeps the count
    if (active) {
      const int slot = kt % kGemmStages;
      const uint16_t* wsl = ws[slot];
      const float* xsl = xs[slot];
#pragma unroll
      for (int s = 0; s < kGemmBK / mma::kK; ++s) {
        uint32_t a[2][4], hi[2][2], lo[2][2];
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
          for (int r = 0; r < 4; ++r)
            a[mt][r] = *reinterpret_cast<const uint32_t*>(wsl + a_smem(lane, mt, s, r));
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            const float2 v = *reinterpret_cast<const float2*>(xsl + b_smem(lane, warp, nt, s, r));
            const mma::HiLo h = mma::split_bf16x2(v.x, v.y);
            hi[nt][r] = h.hi;
            lo[nt][r] = h.lo;
          }
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
          for (int nt = 0; nt < 2; ++nt) {
            mma_bf16(acc[mt][nt], a[mt], hi[nt][0], hi[nt][1]);
            mma_bf16(acc[mt][nt], a[mt], lo[nt][0], lo[nt][1]);
          }
      }
    }
  }
  cp_async_wait<0>();  // no copy outlives the block (the trailing groups are empty)
  if (!active) return;
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int64_t r = m0 + c_wrow(lane, mt, i), b = n0 + c_xrow(lane, warp, nt, i);
        if (r < rows && b < n) {
          if (partial) {
            partial[(static_cast<int64_t>(blockIdx.z) * n + b) * rows + r] = acc[mt][nt][i];
          } else {
            float* out = y + b * rows + r;
            *out = accumulate ? *out + acc[mt][nt][i] : acc[mt][nt][i];
          }
        }
      }
}

// y [total] (+)= the sum of partial [z][total] over z = 0 .. splits - 1, in that order.
__global__ void gemm_reduce_kernel(const float* __restrict__ partial, int64_t splits, int64_t total,
                                   float* __restrict__ y, bool accumulate) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float v = partial[i];
    for (int64_t z = 1; z < splits; ++z) v += partial[z * total + i];
    y[i] = accumulate ? y[i] + v : v;
  }
}

// Row blockIdx.y of the output: W's row ids[blockIdx.y] (a batch), or `row` (ids null).
template <bool kBf16>
__global__ void embed_kernel(const void* __restrict__ wv, int64_t cols, int64_t row,
                             const int32_t* __restrict__ ids, float* __restrict__ out) {
  const int64_t r = ids ? static_cast<int64_t>(ids[blockIdx.y]) : row;
  float* o = out + static_cast<int64_t>(blockIdx.y) * cols;
  for (int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < cols;
       c += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if constexpr (kBf16)
      o[c] = bf16_to_float(static_cast<const uint16_t*>(wv)[r * cols + c]);
    else
      o[c] = static_cast<const float*>(wv)[r * cols + c];
  }
}

constexpr int kNormThreads = 256;

// One block per row (blockIdx.x: the row in its group, blockIdx.y: the group): the sum of squares
// by a fixed tree (warp shuffles, then warp 0 over the warps' sums), then every thread scales its
// values. x and y may alias: each thread reads its own values before the barrier and writes only
// them after it.
__global__ void __launch_bounds__(kNormThreads)
    rms_norm_kernel(const float* x, const float* __restrict__ w, int64_t dim, float eps, float* y,
                    int64_t group_stride) {
  __shared__ float part[kNormThreads / kWarp];
  __shared__ float scale;
  const int64_t off =
      static_cast<int64_t>(blockIdx.y) * group_stride + static_cast<int64_t>(blockIdx.x) * dim;
  const float* xr = x + off;
  float* yr = y + off;
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

// x [rows][n] += b [n], one thread an element.
__global__ void add_kernel(float* __restrict__ x, const float* __restrict__ b, int64_t n,
                           int64_t total) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    x[i] += b[i % n];
}

// One thread per (row, head, pair); row r's angles are rows_a[r] when given, else `a`.
__global__ void rope_kernel(float* __restrict__ x, int64_t rows, int64_t ld, int64_t heads,
                            int64_t dim, bool half, const RopeAngles a,
                            const RopeAngles* __restrict__ rows_a) {
  const int64_t pairs = dim / 2;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= rows * heads * pairs) return;
  const int64_t r = t / (heads * pairs), h = (t / pairs) % heads, i = t % pairs;
  int64_t ca, cb;
  rope_pair(i, dim, half, ca, cb);
  float* p = x + r * ld + h * dim;
  float x0 = p[ca], x1 = p[cb];
  const float cs = rows_a ? rows_a[r].cs[i] : a.cs[i];
  const float sn = rows_a ? rows_a[r].sn[i] : a.sn[i];
  rope_rotate(x0, x1, cs, sn);
  p[ca] = x0;
  p[cb] = x1;
}

// g [rows][n] at stride ld (u likewise): one thread an element.
__global__ void silu_mul_kernel(float* __restrict__ g, const float* __restrict__ u, int64_t n,
                                int64_t ld, int64_t total) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t at = (i / n) * ld + i % n;
    const float v = g[at];
    g[at] = v / (1.0f + expf(-v)) * u[at];
  }
}

// Up to kBf16Jobs conversions, passed by value (kernel parameters).
struct Bf16Jobs {
  const float* x[kBf16Jobs];
  uint16_t* out[kBf16Jobs];
};

// core/half.h's float_to_bf16_bits itself (__host__ __device__): round to nearest even, NaN kept.
// Job blockIdx.y.
__global__ void to_bf16_kernel(const Bf16Jobs jobs, int64_t n) {
  const float* __restrict__ x = jobs.x[blockIdx.y];
  uint16_t* __restrict__ out = jobs.out[blockIdx.y];
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
                 std::string(what) + " is not 16-byte aligned");
}

// The current device's SM count and split-K workspace (grown, never shrunk, kept for the process;
// a mutex guards the growth, and the launches that use it queue on the legacy default stream, so
// one finishes its reduce before the next product's slices write).
struct GemmDevice {
  int64_t sms = 0;
  float* ws = nullptr;
  int64_t ws_floats = 0;
  std::mutex m;
  float* workspace(int64_t floats) {
    std::lock_guard<std::mutex> lock(m);
    if (floats > ws_floats) {
      if (ws) KVQ_CUDA_CHECK(cudaFree(ws));  // waits for the device: no launch still reads it
      ws = nullptr;
      ws_floats = 0;
      KVQ_CUDA_CHECK(cudaMalloc(&ws, static_cast<size_t>(floats) * sizeof(float)));
      ws_floats = floats;
    }
    return ws;
  }
};
constexpr int kGemmMaxDevices = 64;
GemmDevice& gemm_device() {
  static GemmDevice devices[kGemmMaxDevices];
  int dev = 0;
  KVQ_CUDA_CHECK(cudaGetDevice(&dev));
  KVQ_MODEL_NEED(dev >= 0 && dev < kGemmMaxDevices, "gemm_bf16: device " + std::to_string(dev));
  GemmDevice& d = devices[dev];
  if (d.sms == 0) {
    int sms = 0;
    KVQ_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    d.sms = sms > 0 ? sms : 1;
  }
  return d;
}

}  // namespace

void gemm_bf16(const uint16_t* w, int64_t rows, int64_t cols, const float* x, float* y,
               bool accumulate, int64_t n, int64_t ldx) {
  if (ldx == 0) ldx = cols;
  KVQ_MODEL_NEED(rows > 0 && cols > 0 && cols % 8 == 0 && n > 0 && ldx >= cols && ldx % 4 == 0 &&
                     gemm::gemm_blocks_m(rows) <= 0x7fffffff && gemm::gemm_blocks_n(n) <= 65535 &&
                     gemm::gemm_k_tiles(cols) <= 0x7fffffff,
                 "gemm_bf16: bad shape " + shape(rows, cols) + " x " + shape(n, ldx) +
                     " (cols a multiple of 8, ldx of 4)");
  check_aligned(w, "gemm_bf16: W");
  check_aligned(x, "gemm_bf16: x");
  GemmDevice& d = gemm_device();
  const int64_t slice = gemm::gemm_slice_tiles(rows, n, cols, 2 * d.sms);
  const int64_t splits = gemm::gemm_splits(cols, slice);
  float* partial = splits > 1 ? d.workspace(splits * n * rows) : nullptr;
  const dim3 grid(static_cast<unsigned>(gemm::gemm_blocks_m(rows)),
                  static_cast<unsigned>(gemm::gemm_blocks_n(n)), static_cast<unsigned>(splits));
  gemm_bf16_kernel<<<grid, gemm::kGemmThreads>>>(w, rows, cols, x, ldx, n, y, accumulate,
                                                 static_cast<int>(slice), partial);
  KVQ_CUDA_CHECK(cudaGetLastError());
  if (partial) {
    gemm_reduce_kernel<<<grid_for(n * rows), kThreads>>>(partial, splits, n * rows, y, accumulate);
    KVQ_CUDA_CHECK(cudaGetLastError());
  }
}

void gemv(const void* w, bool bf16, int64_t rows, int64_t cols, const float* x, float* y,
          bool accumulate, int64_t n, int64_t ldx, bool tensor_cores) {
  if (ldx == 0) ldx = cols;
  KVQ_MODEL_NEED(rows > 0 && cols > 0 && n > 0 && ldx >= cols && gemv_blocks(rows) <= 0x7fffffff,
                 "gemv: bad shape " + shape(rows, cols) + " x " + shape(n, ldx));
  if (tensor_cores && gemm::use_gemm(bf16, n, cols, ldx)) {
    gemm_bf16(static_cast<const uint16_t*>(w), rows, cols, x, y, accumulate, n, ldx);
    return;
  }
  const bool vec = gemv_vectorized(cols, bf16, ldx);
  if (vec) {
    check_aligned(w, "gemv: W");
    check_aligned(x, "gemv: x");
  }
  const dim3 grid(static_cast<unsigned>(gemv_blocks(rows))), block(kGemvWarps * kWarp);
  auto go = [&](auto cols_c) {
    constexpr int C = decltype(cols_c)::value;
    if (bf16) {
      if (vec)
        gemv_kernel<true, true, C><<<grid, block>>>(w, rows, cols, x, ldx, n, y, accumulate);
      else
        gemv_kernel<true, false, C><<<grid, block>>>(w, rows, cols, x, ldx, n, y, accumulate);
    } else {
      if (vec)
        gemv_kernel<false, true, C><<<grid, block>>>(w, rows, cols, x, ldx, n, y, accumulate);
      else
        gemv_kernel<false, false, C><<<grid, block>>>(w, rows, cols, x, ldx, n, y, accumulate);
    }
  };
  if (n == 1)
    go(std::integral_constant<int, 1>{});
  else
    go(std::integral_constant<int, kGemvCols>{});
  KVQ_CUDA_CHECK(cudaGetLastError());
}

namespace {
void launch_embed(const void* w, bool bf16, int64_t cols, int64_t row, const int32_t* ids,
                  int64_t n, float* out) {
  const dim3 grid(grid_for(cols), static_cast<unsigned>(n));
  if (bf16)
    embed_kernel<true><<<grid, kThreads>>>(w, cols, row, ids, out);
  else
    embed_kernel<false><<<grid, kThreads>>>(w, cols, row, ids, out);
  KVQ_CUDA_CHECK(cudaGetLastError());
}
}  // namespace

void embed_row(const void* w, bool bf16, int64_t cols, int64_t row, float* out) {
  KVQ_MODEL_NEED(cols > 0 && row >= 0, "embed_row: bad row/columns " + shape(row, cols));
  launch_embed(w, bf16, cols, row, nullptr, 1, out);
}

void embed_rows(const void* w, bool bf16, int64_t cols, const int32_t* ids, int64_t n, float* out) {
  KVQ_MODEL_NEED(cols > 0 && n > 0 && n <= 65535 && ids != nullptr,
                 "embed_rows: bad rows/columns " + shape(n, cols));
  launch_embed(w, bf16, cols, 0, ids, n, out);
}

void rms_norm(const float* x, const float* w, int64_t rows, int64_t dim, float eps, float* y,
              int64_t groups, int64_t group_stride) {
  KVQ_MODEL_NEED(rows > 0 && rows <= 0x7fffffff && dim > 0 && groups > 0 && groups <= 65535 &&
                     (groups == 1 || group_stride >= rows * dim),
                 "rms_norm: bad shape " + shape(rows, dim) + " x " + shape(groups, group_stride));
  const dim3 grid(static_cast<unsigned>(rows), static_cast<unsigned>(groups));
  rms_norm_kernel<<<grid, kNormThreads>>>(x, w, dim, eps, y, group_stride);
  KVQ_CUDA_CHECK(cudaGetLastError());
}

void add(float* x, const float* b, int64_t n, int64_t rows) {
  KVQ_MODEL_NEED(n > 0 && rows > 0, "add: bad shape " + shape(rows, n));
  add_kernel<<<grid_for(rows * n), kThreads>>>(x, b, n, rows * n);
  KVQ_CUDA_CHECK(cudaGetLastError());
}

void rope(float* x, int64_t heads, int64_t dim, bool half, const RopeAngles& a, int64_t rows,
          int64_t ld, const RopeAngles* rows_a) {
  KVQ_MODEL_NEED(
      heads > 0 && dim > 0 && dim % 2 == 0 && dim / 2 <= kMaxRopePairs && rows > 0 &&
          (rows == 1 || ld >= heads * dim),
      "rope: bad shape (heads, dim) " + shape(heads, dim) + " x rows " + shape(rows, ld));
  const int64_t n = rows * heads * (dim / 2), blocks = (n + kThreads - 1) / kThreads;
  KVQ_MODEL_NEED(blocks <= 0x7fffffff, "rope: too many rows " + shape(rows, heads));
  rope_kernel<<<static_cast<unsigned>(blocks), kThreads>>>(x, rows, ld, heads, dim, half, a,
                                                           rows_a);
  KVQ_CUDA_CHECK(cudaGetLastError());
}

void silu_mul(float* g, const float* u, int64_t n, int64_t rows, int64_t ld) {
  if (ld == 0) ld = n;
  KVQ_MODEL_NEED(n > 0 && rows > 0 && ld >= n, "silu_mul: bad shape " + shape(rows, n));
  silu_mul_kernel<<<grid_for(rows * n), kThreads>>>(g, u, n, ld, rows * n);
  KVQ_CUDA_CHECK(cudaGetLastError());
}

void to_bf16_jobs(std::span<const float* const> x, std::span<uint16_t* const> out, int64_t n) {
  KVQ_MODEL_NEED(n > 0 && !x.empty() && x.size() == out.size() && x.size() <= kBf16Jobs,
                 "to_bf16: bad jobs " + shape(static_cast<int64_t>(x.size()), n));
  Bf16Jobs jobs{};
  for (size_t j = 0; j < x.size(); ++j) {
    jobs.x[j] = x[j];
    jobs.out[j] = out[j];
  }
  const dim3 grid(grid_for(n), static_cast<unsigned>(x.size()));
  to_bf16_kernel<<<grid, kThreads>>>(jobs, n);
  KVQ_CUDA_CHECK(cudaGetLastError());
}

void to_bf16(const float* x, int64_t n, uint16_t* out) {
  KVQ_MODEL_NEED(n > 0, "to_bf16: n = " + std::to_string(n));
  to_bf16_jobs(std::span<const float* const>(&x, 1), std::span<uint16_t* const>(&out, 1), n);
}

}  // namespace kvq::cuda::model
