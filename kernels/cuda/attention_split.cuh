// What attention_kernels.cu (the plan, the baseline and tiled split kernels, the merge) and
// attention_mma.cu (the tensor-core split kernel, DecodeKernel::Mma) share: the split kernels'
// parameters and the Mma launchers. Internal to kernels/cuda (not installed API).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

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

/// Launches the Mma split kernel over bf16 caches (grid: splits x kv heads x batch); the caller
/// launches the merge. Errors come back as the launch's cudaError_t.
cudaError_t launch_mma_bf16(int head_dim, const SplitParams<Bf16SideView>& p, dim3 grid,
                            cudaStream_t stream);

}  // namespace kvq::cuda::detail
