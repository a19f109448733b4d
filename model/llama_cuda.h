// The model's shape as backend cuda's device model takes it (kernels/cuda/device_model.h): the one
// translation from LlamaConfig, for model/llama_cuda.cpp and the tests. Callers include
// kernels/cuda/device_model.h for the struct itself (installed only with CUDA).
#pragma once

#include "model/arch.h"

namespace kvq {

namespace cuda {
struct DeviceModelShape;
}

/// \brief `c` as cuda::DeviceModelShape (layers, widths, eps, biases, q/k norm, RoPE pairing, tied
/// embeddings).
cuda::DeviceModelShape device_model_shape(const LlamaConfig& c);

}  // namespace kvq
