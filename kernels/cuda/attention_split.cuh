// What attention_kernels.cu (the plan, the baseline and tiled split kernels, the merge) and
// attention_mma.cu (the tensor-core split kernel, DecodeKernel::Mma) share: the split kernels'
// parameters and the Mma launchers. Internal to kernels/cuda (not installed API).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <span>

#include "kernels/cuda/attention_kernels.cuh"
#include "kernels/cuda/dispatch.h"

namespace kvq::cuda::detail {

/// Everything a split block reads; per-sequence views travel in the kernel's parameter space
/// (__grid_constant__: read in place, never copied to local memory).
template <class View>
struct SplitParams {
  View k[kMaxBatch];
  View v[kMaxBatch];
  const float* q;  // [batch, q_heads, D]
  float* part_o;   // [batch, q_heads, splits, D]
  float* part_ml;  // [batch, q_heads, splits, 2]: m, l
  int64_t split_tokens;
  int splits;
  int kv_heads;
  int nq;
  float inv_sqrt_d;
};

/// Whether the Mma kernel takes a launch of this head_dim and split (bf16 caches; otherwise
/// DecodeKernel::Mma runs the tiled kernel).
bool mma_bf16_supported(int head_dim, int nq, int64_t split_tokens);

/// Whether the Mma kernel takes an int launch; the one place that says which int caches it covers:
/// 2- and 4-bit KIVI layouts (keys per-channel with G 32, 64 or 128; values per-token, one group
/// a multiple of 32 for the whole batch with D / G even; asymmetric), head_dim 64 / 128, words
/// and parameters aligned for its copies (16 bytes; value scales and minima 4). Everything else
/// (3- and 8-bit codes, sym, per-token keys, per-channel values, other groups) runs the tiled
/// kernel.
bool mma_int_supported(int bits, int head_dim, int nq, int64_t split_tokens,
                       std::span<const IntSideView> k, std::span<const IntSideView> v);

/// Whether the Mma kernel takes an FP8 launch; the one place that says which FP8 caches it
/// covers: every format (e4m3, e5m2, e4m3fnuz) with tensor, head, token or channel scales on each
/// side, head_dim 64 / 128, codes 16-byte aligned. Unaligned codes run the tiled kernel.
bool mma_fp8_supported(int head_dim, int nq, int64_t split_tokens, std::span<const Fp8SideView> k,
                       std::span<const Fp8SideView> v);

/// Launches the Mma split kernel over FP8 caches that mma_fp8_supported accepts.
cudaError_t launch_mma_fp8(Fp8Format format, int head_dim, const SplitParams<Fp8SideView>& p,
                           dim3 grid, cudaStream_t stream);

/// Launches the Mma split kernel over int caches that mma_int_supported accepts.
cudaError_t launch_mma_int(int bits, int head_dim, const SplitParams<IntSideView>& p, dim3 grid,
                           cudaStream_t stream);

/// Launches the Mma split kernel over bf16 caches (grid: splits x kv heads x batch); the caller
/// launches the merge. Errors come back as the launch's cudaError_t.
cudaError_t launch_mma_bf16(int head_dim, const SplitParams<Bf16SideView>& p, dim3 grid,
                            cudaStream_t stream);

}  // namespace kvq::cuda::detail
