// A host stand-in for the few CUDA runtime calls kernels/cuda/kivi_cache_device.cu and
// kernels/cuda/device_model.cpp make, so that kivi_cache_plan_test.cpp and
// device_model_host_test.cpp can run their host code on a machine without CUDA:
// "device" memory is host memory (filled with 0xA5 on allocation, so bytes never written show),
// copies are memmove (counted by kind: host_runtime_copies), streams and synchronization are
// no-ops. Only those tests put this directory on their include path.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <cstring>

using cudaError_t = int;
using cudaStream_t = void*;
inline constexpr cudaError_t cudaSuccess = 0;
inline constexpr cudaError_t cudaErrorMemoryAllocation = 2;
enum cudaMemcpyKind { cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost, cudaMemcpyDeviceToDevice };

inline cudaError_t cudaMalloc(void** p, size_t bytes) {
  *p = std::malloc(bytes > 0 ? bytes : 1);
  if (*p == nullptr) return cudaErrorMemoryAllocation;
  std::memset(*p, 0xA5, bytes);
  return cudaSuccess;
}
inline cudaError_t cudaFree(void* p) {
  std::free(p);
  return cudaSuccess;
}
// Pinned host memory: plain host memory here.
inline cudaError_t cudaMallocHost(void** p, size_t bytes) { return cudaMalloc(p, bytes); }
inline cudaError_t cudaFreeHost(void* p) { return cudaFree(p); }
// Copies of one or more bytes made so far of kind `k` (device_model_host_test counts a decode
// step's copies to and from the host).
inline long long& host_runtime_copies(cudaMemcpyKind k) {
  static long long n[3] = {};
  return n[static_cast<int>(k)];
}
inline cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  if (bytes > 0) {
    std::memmove(dst, src, bytes);
    ++host_runtime_copies(kind);
  }
  return cudaSuccess;
}
// A strided copy of `height` rows of `width` bytes (one copy, counted as one).
inline cudaError_t cudaMemcpy2D(void* dst, size_t dpitch, const void* src, size_t spitch,
                                size_t width, size_t height, cudaMemcpyKind kind) {
  if (width == 0 || height == 0) return cudaSuccess;
  for (size_t r = 0; r < height; ++r)
    std::memmove(static_cast<char*>(dst) + r * dpitch, static_cast<const char*>(src) + r * spitch,
                 width);
  ++host_runtime_copies(kind);
  return cudaSuccess;
}
inline cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                                   cudaStream_t) {
  return cudaMemcpy(dst, src, bytes, kind);
}
inline cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
inline cudaError_t cudaGetLastError() { return cudaSuccess; }
inline const char* cudaGetErrorName(cudaError_t) { return "cudaErrorHostStandIn"; }
inline const char* cudaGetErrorString(cudaError_t) { return "host stand-in"; }
