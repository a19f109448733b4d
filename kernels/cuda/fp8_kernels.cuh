// FP8 KV-cache kernels: dynamic scales, quantize, dequantize for one layer's tensor [T, H, D]
// (float32, C order, device memory), every format x granularity.
//
// Each kernel is a port of the CPU reference in fp8/scale.cpp and calls the same header
// functions (fp8/format.h encode/decode, fp8/scale.h scale_index / scale_from_amax /
// quantize_value / dequantize_value), so codes and scales are bit-equal to the CPU's.
// Scale layouts are fp8/scale.h's: tensor [1], head [H], token [T * H], channel [H * D].
//
// Errors (STYLE 9): a bad configuration (negative sizes, a null pointer, an unknown enum)
// throws kvq::Error naming the value; CUDA failures are returned as cudaError_t (propagate them
// with KVQ_CUDA_CALL, or turn them into kvq::Error with KVQ_CUDA_CHECK; kernels/cuda/cuda_check.h).
// Launches are asynchronous on `stream`.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/spec.h"
#include "core/tensor.h"

namespace kvq::cuda {

/// \brief Dynamic scales of x: amax / max_finite per group of `gran`, 1 for an all-zero group,
/// NaN for a group holding a NaN (fp8::scale_from_amax). `scales` holds
/// fp8::scale_count(gran, shape) floats. Per token one warp a row (float4 loads, a shuffle max);
/// otherwise CUB block reductions and atomicMax on the float bits of |x| (order-independent, so
/// the result is deterministic).
cudaError_t fp8_dynamic_scales(Fp8Format format, Granularity gran, Shape3 shape, const float* x,
                               float* scales, cudaStream_t stream = nullptr);

/// \brief codes[i] = fp8::quantize_value(x[i], scales[scale_index(gran, t, h, d)]). One pass;
/// 16 codes a thread (16-byte loads and stores) when dim % 16 == 0 and x and codes are 16-byte
/// aligned, else a warp a row.
/// A constant scale is gran = Tensor with a one-element `scales` (as fp8::quantize does).
cudaError_t fp8_quantize(Fp8Format format, Granularity gran, Shape3 shape, const float* x,
                         const float* scales, uint8_t* codes, cudaStream_t stream = nullptr);

/// \brief fp8_dynamic_scales then fp8_quantize at Granularity::Token (the same scales [T * H]
/// and codes, bit for bit) in one pass over x: when dim % 16 == 0, dim <= 2048 and x and codes
/// are 16-byte aligned, lanes of a warp share a row (kernels/cuda/fp8_token_split.h), hold its
/// values in registers from 16-byte loads, reduce max |x| with warp shuffles and store 16 codes
/// at a time; otherwise one warp a row in one launch (the row read a second time from cache).
cudaError_t fp8_quantize_dynamic_token(Fp8Format format, Shape3 shape, const float* x,
                                       float* scales, uint8_t* codes,
                                       cudaStream_t stream = nullptr);

/// \brief y[i] = fp8::dequantize_value(codes[i], scales[scale_index(gran, t, h, d)]).
cudaError_t fp8_dequantize(Fp8Format format, Granularity gran, Shape3 shape, const uint8_t* codes,
                           const float* scales, float* y, cudaStream_t stream = nullptr);

}  // namespace kvq::cuda
