// CUDA status handling, the two levels (STYLE 9): launchers return a cudaError_t that
// KVQ_CUDA_CALL propagates to the caller; host code that cannot return a status turns it into a
// kvq::Error with KVQ_CUDA_CHECK. Bad configuration never becomes a status: it throws kvq::Error.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "core/error.h"

namespace kvq::cuda {

/// \brief Throws kvq::Error "what: cudaErrorName (message)" if e is not cudaSuccess.
inline void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw Error(std::string(what) + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) +
                ")");
}

}  // namespace kvq::cuda

/// Evaluates a cudaError_t expression and returns it from the enclosing function on failure.
#define KVQ_CUDA_CALL(expr)                       \
  do {                                            \
    const cudaError_t kvq_err_ = (expr);          \
    if (kvq_err_ != cudaSuccess) return kvq_err_; \
  } while (0)

/// Evaluates a cudaError_t expression and throws kvq::Error (naming the expression) on failure.
#define KVQ_CUDA_CHECK(expr) ::kvq::cuda::check((expr), #expr)
