// FP8 kernels: ports of fp8/scale.cpp's compute_scales (dynamic), quantize and dequantize.
//
// Every per-element formula is the shared header's (fp8::scale_index, scale_from_amax,
// quantize_value, dequantize_value), so the device computes exactly what the CPU computes.
// amax is a max over |x| taken on the float bits (|x| as uint32 orders like the float, and a
// NaN's bits exceed +inf's, so a NaN wins and reaches the scale, as on the CPU).
#include <algorithm>
#include <cub/block/block_reduce.cuh>
#include <cuda/functional>
#include <string>
#include <type_traits>

#include "core/error.h"
#include "fp8/scale.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/fp8_kernels.cuh"
#include "kernels/cuda/fp8_token_split.h"
#include "kernels/cuda/quant_index.h"

namespace kvq::cuda {
namespace {

constexpr int kBlock = 256;              // threads per block
constexpr int kWarps = kBlock / 32;      // one warp per (token, head) row of D values
constexpr int64_t kMaxBlocks = 1 << 16;  // grid-stride loops cover the rest

__device__ __forceinline__ uint32_t abs_bits(float v) { return float_bits(v) & 0x7fffffffu; }

int grid_for(int64_t work, int64_t per_block) {
  return static_cast<int>(std::clamp<int64_t>((work + per_block - 1) / per_block, 1, kMaxBlocks));
}

// ---- amax -------------------------------------------------------------------------------------

// max |x| of one row of `dim` floats as ordered bits, reduced over the warp (every lane gets it):
// 16-byte loads when `vec` (row 16-byte aligned, dim % 4 == 0); kStream marks them evict-first.
template <bool kStream>
__device__ uint32_t warp_row_amax_bits(const float* r, int64_t dim, bool vec, int lane) {
  uint32_t m = 0;
  if (vec) {
    const float4* r4 = reinterpret_cast<const float4*>(r);
    for (int64_t q = lane; q < dim / 4; q += 32) {
      const float4 v = kStream ? __ldcs(r4 + q) : r4[q];
      m = max(max(m, abs_bits(v.x)), max(abs_bits(v.y), max(abs_bits(v.z), abs_bits(v.w))));
    }
  } else {
    for (int64_t d = lane; d < dim; d += 32) m = max(m, abs_bits(r[d]));
  }
  for (int off = 16; off > 0; off /= 2) m = max(m, __shfl_xor_sync(0xffffffffu, m, off));
  return m;
}

/// Token granularity: one warp reduces one (t, h) row and writes its scale directly: float4 loads
/// where `vec` (dim % 4 == 0 and x 16-byte aligned), an xor-shuffle max over the warp (max on
/// the |x| bits is order-independent, so the scale is the CPU's), no shared memory.
template <Fp8Format F>
__global__ void __launch_bounds__(kBlock)
    scales_token_kernel(const float* x, int64_t tokens, int64_t heads, int64_t dim, bool vec,
                        float* scales) {
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t rows = tokens * heads;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + warp; row < rows;
       row += static_cast<int64_t>(gridDim.x) * kWarps) {
    const uint32_t m = warp_row_amax_bits</*kStream=*/true>(x + row * dim, dim, vec, lane);
    const int64_t t = row / heads, h = row - t * heads;
    if (lane == 0)
      scales[fp8::scale_index(Granularity::Token, t, h, 0, heads, dim)] =
          fp8::scale_from_amax(bits_float(m), F);
  }
}

/// Tensor granularity: a block reduces its grid-stride share, then one atomicMax.
__global__ void __launch_bounds__(kBlock)
    amax_tensor_kernel(const float* x, int64_t n, uint32_t* amax) {
  using BlockReduce = cub::BlockReduce<uint32_t, kBlock>;
  __shared__ typename BlockReduce::TempStorage temp;
  uint32_t m = 0;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kBlock + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * kBlock)
    m = max(m, abs_bits(x[i]));
  m = BlockReduce(temp).Reduce(m, ::cuda::maximum<>{});
  if (threadIdx.x == 0) atomicMax(amax, m);
}

/// Head granularity: block (bx, by) covers heads by, by + gridDim.y, ...; its warps walk the
/// tokens bx * kWarps + warp, ... of that head, lanes the channels; a block reduce, one atomicMax.
__global__ void __launch_bounds__(kBlock)
    amax_head_kernel(const float* x, int64_t tokens, int64_t heads, int64_t dim, uint32_t* amax) {
  using BlockReduce = cub::BlockReduce<uint32_t, kBlock>;
  __shared__ typename BlockReduce::TempStorage temp;
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  for (int64_t h = blockIdx.y; h < heads; h += gridDim.y) {
    uint32_t m = 0;
    for (int64_t t = static_cast<int64_t>(blockIdx.x) * kWarps + warp; t < tokens;
         t += static_cast<int64_t>(gridDim.x) * kWarps) {
      const float* r = x + (t * heads + h) * dim;
      for (int64_t d = lane; d < dim; d += 32) m = max(m, abs_bits(r[d]));
    }
    m = BlockReduce(temp).Reduce(m, ::cuda::maximum<>{});
    if (threadIdx.x == 0)
      atomicMax(&amax[fp8::scale_index(Granularity::Head, 0, h, 0, heads, dim)], m);
    __syncthreads();  // temp is reused for the next head
  }
}

/// Channel granularity: x is a [T, H*D] matrix and a group is one column; a thread walks its
/// column over the tokens blockIdx.y, blockIdx.y + gridDim.y, ... (neighbouring threads read
/// neighbouring columns: coalesced), then one atomicMax per column and block row.
__global__ void __launch_bounds__(kBlock)
    amax_channel_kernel(const float* x, int64_t tokens, int64_t heads, int64_t dim,
                        uint32_t* amax) {
  const int64_t cols = heads * dim;
  for (int64_t c = static_cast<int64_t>(blockIdx.x) * kBlock + threadIdx.x; c < cols;
       c += static_cast<int64_t>(gridDim.x) * kBlock) {
    uint32_t m = 0;
    for (int64_t t = blockIdx.y; t < tokens; t += gridDim.y) m = max(m, abs_bits(x[t * cols + c]));
    const int64_t h = c / dim, d = c - h * dim;
    atomicMax(&amax[fp8::scale_index(Granularity::Channel, 0, h, d, heads, dim)], m);
  }
}

/// amax bits (as left by the atomicMax kernels) -> scales, in place.
template <Fp8Format F>
__global__ void amax_to_scale_kernel(const uint32_t* amax, float* scales, int64_t count) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kBlock + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * kBlock) {
    const uint32_t a = amax[i];
    scales[i] = fp8::scale_from_amax(bits_float(a), F);
  }
}

// ---- quantize / dequantize --------------------------------------------------------------------

/// One warp per (t, h) row: lanes take channels d = lane, lane + 32, ... (coalesced).
template <Fp8Format F, Granularity G>
__global__ void __launch_bounds__(kBlock)
    quantize_kernel(const float* x, const float* scales, uint8_t* codes, int64_t tokens,
                    int64_t heads, int64_t dim) {
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t rows = tokens * heads;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + warp; row < rows;
       row += static_cast<int64_t>(gridDim.x) * kWarps) {
    const int64_t t = row / heads, h = row - t * heads;
    for (int64_t d = lane; d < dim; d += 32) {
      const int64_t i = row * dim + d;
      codes[i] = fp8::quantize_value<F>(x[i], scales[fp8::scale_index(G, t, h, d, heads, dim)]);
    }
  }
}

/// The same codes, kFp8Chunk (16) consecutive elements a thread, when dim is a multiple of 16 and
/// x and codes are 16-byte aligned (quant_index::fp8_chunks_fit; every chunk then lies in one
/// (t, h) row): four float4 loads (streaming: read once), 16 fp8::quantize_value calls, one
/// 16-byte store. A warp moves 2 KB of floats and 512 bytes of codes per step, neighbouring
/// threads neighbouring chunks (coalesced), and 64 bytes a thread are in flight at once. The
/// scale is read once per chunk (tensor, head, token) or per element (channel: 16 neighbouring
/// scales, L1 hits).
template <Fp8Format F, Granularity G>
__global__ void __launch_bounds__(kBlock)
    quantize_chunk_kernel(const float* x, const float* scales, uint8_t* codes, int64_t chunks,
                          int64_t heads, int64_t dim) {
  constexpr int kC = quant_index::kFp8Chunk;
  for (int64_t k = static_cast<int64_t>(blockIdx.x) * kBlock + threadIdx.x; k < chunks;
       k += static_cast<int64_t>(gridDim.x) * kBlock) {
    const int64_t e0 = k * kC;
    const quant_index::RowPos p = quant_index::row_pos(e0, heads, dim);
    float v[kC];
#pragma unroll
    for (int q = 0; q < kC / 4; ++q) {
      const float4 f = __ldcs(reinterpret_cast<const float4*>(x + e0) + q);
      v[4 * q] = f.x;
      v[4 * q + 1] = f.y;
      v[4 * q + 2] = f.z;
      v[4 * q + 3] = f.w;
    }
    const float* s = scales + fp8::scale_index(G, p.t, p.h, p.d, heads, dim);
    const float s0 = *s;
    uint32_t w[4] = {0, 0, 0, 0};
#pragma unroll
    for (int j = 0; j < kC; ++j)
      quant_index::put_byte(w, j,
                            fp8::quantize_value<F>(v[j], G == Granularity::Channel ? s[j] : s0));
    *reinterpret_cast<uint4*>(codes + e0) = make_uint4(w[0], w[1], w[2], w[3]);
  }
}

// ---- fused per-token dynamic quantize ----------------------------------------------------------

/// Per-token dynamic scales and codes in one pass when dim fits fp8_token::fits_registers and x
/// and codes are 16-byte aligned: `span` lanes share a (t, h) row (fp8_token_split.h), each loads
/// its K chunks of 16 floats into registers (four streaming float4 loads a chunk, all issued
/// before the first is used), takes max |x| on the float bits, a segmented xor-shuffle max over
/// the span gives every lane of the row the amax (order-independent, so the CPU's), each lane
/// computes fp8::scale_from_amax itself and writes its codes from the registers as one 16-byte
/// store a chunk; lane part 0 writes the scale. x is read once from DRAM. The warp loop bound is
/// warp-uniform (all 32 lanes reach every shuffle); lanes past the last row or the row's end idle.
template <Fp8Format F, int K>
__global__ void __launch_bounds__(kBlock)
    quantize_token_fused_kernel(const float* x, float* scales, uint8_t* codes, int64_t rows,
                                int64_t dim, fp8_token::Split sp) {
  constexpr int kC = quant_index::kFp8Chunk;
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int per_warp = 32 / sp.span, part = lane % sp.span;
  const int64_t step = static_cast<int64_t>(gridDim.x) * kWarps * per_warp;
  for (int64_t base = (static_cast<int64_t>(blockIdx.x) * kWarps + warp) * per_warp; base < rows;
       base += step) {
    const int64_t row = base + lane / sp.span;
    const bool live = row < rows;
    const float* xr = x + row * dim;
    float v[K][kC];
    uint32_t m = 0;
#pragma unroll
    for (int c = 0; c < K; ++c) {
      const int64_t d0 = fp8_token::chunk_start(sp, part, c);
      if (live && d0 >= 0) {
#pragma unroll
        for (int q = 0; q < kC / 4; ++q) {
          const float4 f = __ldcs(reinterpret_cast<const float4*>(xr + d0) + q);
          v[c][4 * q] = f.x;
          v[c][4 * q + 1] = f.y;
          v[c][4 * q + 2] = f.z;
          v[c][4 * q + 3] = f.w;
        }
#pragma unroll
        for (int j = 0; j < kC; ++j) m = max(m, abs_bits(v[c][j]));
      }
    }
    for (int off = sp.span / 2; off > 0; off /= 2) m = max(m, __shfl_xor_sync(0xffffffffu, m, off));
    if (!live) continue;
    const float s = fp8::scale_from_amax(bits_float(m), F);
    if (part == 0) scales[row] = s;  // == fp8::scale_index(Token, t, h, 0, heads, dim)
#pragma unroll
    for (int c = 0; c < K; ++c) {
      const int64_t d0 = fp8_token::chunk_start(sp, part, c);
      if (d0 < 0) continue;
      uint32_t w[4] = {0, 0, 0, 0};
#pragma unroll
      for (int j = 0; j < kC; ++j) quant_index::put_byte(w, j, fp8::quantize_value<F>(v[c][j], s));
      *reinterpret_cast<uint4*>(codes + row * dim + d0) = make_uint4(w[0], w[1], w[2], w[3]);
    }
  }
}

/// The same scales and codes for any other shape or alignment: one warp a row, one launch; the
/// amax loop reads the row (float4 where `vec`), the code loop reads it again (from L1 / L2: a
/// row is at most a few KB), byte stores.
template <Fp8Format F>
__global__ void __launch_bounds__(kBlock)
    quantize_token_row_kernel(const float* x, float* scales, uint8_t* codes, int64_t rows,
                              int64_t dim, bool vec) {
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + warp; row < rows;
       row += static_cast<int64_t>(gridDim.x) * kWarps) {
    const float* r = x + row * dim;
    // plain loads: the codes pass below reads the row again, from cache
    const uint32_t m = warp_row_amax_bits</*kStream=*/false>(r, dim, vec, lane);
    const float s = fp8::scale_from_amax(bits_float(m), F);
    if (lane == 0) scales[row] = s;
    for (int64_t d = lane; d < dim; d += 32)
      codes[row * dim + d] = fp8::quantize_value<F>(__ldcs(r + d), s);
  }
}

template <Fp8Format F, Granularity G>
__global__ void __launch_bounds__(kBlock)
    dequantize_kernel(const uint8_t* codes, const float* scales, float* y, int64_t tokens,
                      int64_t heads, int64_t dim) {
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t rows = tokens * heads;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + warp; row < rows;
       row += static_cast<int64_t>(gridDim.x) * kWarps) {
    const int64_t t = row / heads, h = row - t * heads;
    for (int64_t d = lane; d < dim; d += 32) {
      const int64_t i = row * dim + d;
      y[i] = fp8::dequantize_value<F>(codes[i], scales[fp8::scale_index(G, t, h, d, heads, dim)]);
    }
  }
}

// ---- configuration checks and dispatch --------------------------------------------------------

template <Fp8Format F>
using FormatC = std::integral_constant<Fp8Format, F>;
template <Granularity G>
using GranC = std::integral_constant<Granularity, G>;

[[noreturn]] void bad_config(const char* fn, const std::string& what) {
  throw Error(std::string("kvq::cuda::") + fn + ": " + what);
}

/// Turns the runtime format into a template argument (STYLE 8); the default names the value.
template <typename Fn>
cudaError_t with_format(const char* fn, Fp8Format f, Fn&& body) {
  switch (f) {
    case Fp8Format::E4M3:
      return body(FormatC<Fp8Format::E4M3>{});
    case Fp8Format::E4M3FNUZ:
      return body(FormatC<Fp8Format::E4M3FNUZ>{});
    case Fp8Format::E5M2:
      return body(FormatC<Fp8Format::E5M2>{});
  }
  bad_config(fn, "unknown Fp8Format value " + std::to_string(static_cast<int>(f)));
}

template <typename Fn>
cudaError_t with_granularity(const char* fn, Granularity g, Fn&& body) {
  switch (g) {
    case Granularity::Tensor:
      return body(GranC<Granularity::Tensor>{});
    case Granularity::Head:
      return body(GranC<Granularity::Head>{});
    case Granularity::Token:
      return body(GranC<Granularity::Token>{});
    case Granularity::Channel:
      return body(GranC<Granularity::Channel>{});
  }
  bad_config(fn, "unknown Granularity value " + std::to_string(static_cast<int>(g)));
}

void check_format(const char* fn, Fp8Format f) {
  if (f != Fp8Format::E4M3 && f != Fp8Format::E4M3FNUZ && f != Fp8Format::E5M2)
    bad_config(fn, "unknown Fp8Format value " + std::to_string(static_cast<int>(f)));
}

void check_shape(const char* fn, Shape3 s) {
  if (s.tokens < 0 || s.heads < 0 || s.dim < 0)
    bad_config(fn, "shape [T=" + std::to_string(s.tokens) + ", H=" + std::to_string(s.heads) +
                       ", D=" + std::to_string(s.dim) + "] has a negative size");
}

void check_ptr(const char* fn, const void* p, const char* name, int64_t count) {
  if (count > 0 && p == nullptr)
    bad_config(fn,
               std::string(name) + " is null but must hold " + std::to_string(count) + " values");
}

int64_t checked_scale_count(const char* fn, Granularity g, Shape3 s) {
  switch (g) {
    case Granularity::Tensor:
    case Granularity::Head:
    case Granularity::Token:
    case Granularity::Channel:
      return fp8::scale_count(g, s);
  }
  bad_config(fn, "unknown Granularity value " + std::to_string(static_cast<int>(g)));
}

}  // namespace

cudaError_t fp8_dynamic_scales(Fp8Format format, Granularity gran, Shape3 shape, const float* x,
                               float* scales, cudaStream_t stream) {
  constexpr const char* kFn = "fp8_dynamic_scales";
  check_format(kFn, format);
  check_shape(kFn, shape);
  const int64_t n = shape.numel(), count = checked_scale_count(kFn, gran, shape);
  check_ptr(kFn, x, "x", n);
  check_ptr(kFn, scales, "scales", count);
  if (count == 0) return cudaSuccess;
  return with_format(kFn, format, [&](auto fc) -> cudaError_t {
    constexpr Fp8Format F = decltype(fc)::value;
    if (gran == Granularity::Token) {  // no atomics: each warp owns its scale
      const bool vec = shape.dim % 4 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0;
      scales_token_kernel<F><<<grid_for(count, kWarps), kBlock, 0, stream>>>(
          x, shape.tokens, shape.heads, shape.dim, vec, scales);
      return cudaGetLastError();
    }
    // amax bits accumulate in the scales buffer itself (0 bits == 0.0f), then become scales.
    uint32_t* amax = reinterpret_cast<uint32_t*>(scales);
    KVQ_CUDA_CALL(cudaMemsetAsync(amax, 0, static_cast<size_t>(count) * sizeof(uint32_t), stream));
    if (n > 0) {
      if (gran == Granularity::Tensor) {
        amax_tensor_kernel<<<grid_for(n, kBlock * 8), kBlock, 0, stream>>>(x, n, amax);
      } else if (gran == Granularity::Head) {
        const dim3 grid(static_cast<unsigned>(grid_for(shape.tokens, kWarps * 8)),
                        static_cast<unsigned>(std::min<int64_t>(shape.heads, 65535)));
        amax_head_kernel<<<grid, kBlock, 0, stream>>>(x, shape.tokens, shape.heads, shape.dim,
                                                      amax);
      } else {
        const dim3 grid(
            static_cast<unsigned>(grid_for(count, kBlock)),
            static_cast<unsigned>(std::clamp<int64_t>((shape.tokens + 15) / 16, 1, 1024)));
        amax_channel_kernel<<<grid, kBlock, 0, stream>>>(x, shape.tokens, shape.heads, shape.dim,
                                                         amax);
      }
      KVQ_CUDA_CALL(cudaGetLastError());
    }
    amax_to_scale_kernel<F><<<grid_for(count, kBlock), kBlock, 0, stream>>>(amax, scales, count);
    return cudaGetLastError();
  });
}

cudaError_t fp8_quantize(Fp8Format format, Granularity gran, Shape3 shape, const float* x,
                         const float* scales, uint8_t* codes, cudaStream_t stream) {
  constexpr const char* kFn = "fp8_quantize";
  check_format(kFn, format);
  check_shape(kFn, shape);
  const int64_t n = shape.numel(), count = checked_scale_count(kFn, gran, shape);
  check_ptr(kFn, x, "x", n);
  check_ptr(kFn, scales, "scales", count);
  check_ptr(kFn, codes, "codes", n);
  if (n == 0) return cudaSuccess;
  return with_format(kFn, format, [&](auto fc) {
    return with_granularity(kFn, gran, [&](auto gc) -> cudaError_t {
      constexpr Fp8Format F = decltype(fc)::value;
      constexpr Granularity G = decltype(gc)::value;
      if (quant_index::fp8_chunks_fit(shape.dim) && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
          reinterpret_cast<uintptr_t>(codes) % 16 == 0) {
        const int64_t chunks = n / quant_index::kFp8Chunk;
        quantize_chunk_kernel<F, G><<<grid_for(chunks, kBlock), kBlock, 0, stream>>>(
            x, scales, codes, chunks, shape.heads, shape.dim);
        return cudaGetLastError();
      }
      quantize_kernel<F, G><<<grid_for(shape.tokens * shape.heads, kWarps), kBlock, 0, stream>>>(
          x, scales, codes, shape.tokens, shape.heads, shape.dim);
      return cudaGetLastError();
    });
  });
}

cudaError_t fp8_quantize_dynamic_token(Fp8Format format, Shape3 shape, const float* x,
                                       float* scales, uint8_t* codes, cudaStream_t stream) {
  constexpr const char* kFn = "fp8_quantize_dynamic_token";
  check_format(kFn, format);
  check_shape(kFn, shape);
  const int64_t n = shape.numel(), rows = shape.tokens * shape.heads;
  check_ptr(kFn, x, "x", n);
  check_ptr(kFn, scales, "scales", rows);
  check_ptr(kFn, codes, "codes", n);
  if (rows == 0) return cudaSuccess;
  if (shape.dim == 0) {  // every row is empty: amax 0, scale 1 (fp8::scale_from_amax)
    return fp8_dynamic_scales(format, Granularity::Token, shape, x, scales, stream);
  }
  return with_format(kFn, format, [&](auto fc) -> cudaError_t {
    constexpr Fp8Format F = decltype(fc)::value;
    if (fp8_token::fits_registers(shape.dim) && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
        reinterpret_cast<uintptr_t>(codes) % 16 == 0) {
      const fp8_token::Split sp = fp8_token::split_for(shape.dim);
      const int grid = grid_for(rows, static_cast<int64_t>(kWarps) * (32 / sp.span));
      if (sp.chunks_per_lane == 1)
        quantize_token_fused_kernel<F, 1>
            <<<grid, kBlock, 0, stream>>>(x, scales, codes, rows, shape.dim, sp);
      else if (sp.chunks_per_lane == 2)
        quantize_token_fused_kernel<F, 2>
            <<<grid, kBlock, 0, stream>>>(x, scales, codes, rows, shape.dim, sp);
      else
        quantize_token_fused_kernel<F, 4>
            <<<grid, kBlock, 0, stream>>>(x, scales, codes, rows, shape.dim, sp);
      return cudaGetLastError();
    }
    const bool vec = shape.dim % 4 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0;
    quantize_token_row_kernel<F>
        <<<grid_for(rows, kWarps), kBlock, 0, stream>>>(x, scales, codes, rows, shape.dim, vec);
    return cudaGetLastError();
  });
}

cudaError_t fp8_dequantize(Fp8Format format, Granularity gran, Shape3 shape, const uint8_t* codes,
                           const float* scales, float* y, cudaStream_t stream) {
  constexpr const char* kFn = "fp8_dequantize";
  check_format(kFn, format);
  check_shape(kFn, shape);
  const int64_t n = shape.numel(), count = checked_scale_count(kFn, gran, shape);
  check_ptr(kFn, codes, "codes", n);
  check_ptr(kFn, scales, "scales", count);
  check_ptr(kFn, y, "y", n);
  if (n == 0) return cudaSuccess;
  return with_format(kFn, format, [&](auto fc) {
    return with_granularity(kFn, gran, [&](auto gc) -> cudaError_t {
      constexpr Fp8Format F = decltype(fc)::value;
      constexpr Granularity G = decltype(gc)::value;
      dequantize_kernel<F, G><<<grid_for(shape.tokens * shape.heads, kWarps), kBlock, 0, stream>>>(
          codes, scales, y, shape.tokens, shape.heads, shape.dim);
      return cudaGetLastError();
    });
  });
}

}  // namespace kvq::cuda
