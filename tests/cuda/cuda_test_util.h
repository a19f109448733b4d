// Shared helpers of the CUDA tests: skip visibly without a device, and device buffers with
// sentinel guard bytes around them (STYLE 4: catch out-of-bounds writes).
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_check.h"

namespace kvq::cuda::testing {

/// Empty when a device is usable, else why not.
inline std::string no_device_reason() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) return std::string("cudaGetDeviceCount failed: ") + cudaGetErrorString(e);
  if (n == 0) return "cudaGetDeviceCount returned 0";
  return "";
}

/// A device buffer of `count` T with kGuard sentinel bytes before and after it.
template <typename T>
class GuardedBuffer {
 public:
  static constexpr size_t kGuard = 256;
  static constexpr uint8_t kSentinel = 0xA5;

  explicit GuardedBuffer(size_t count) : count_(count) {
    KVQ_CUDA_CHECK(cudaMalloc(&base_, bytes()));
    KVQ_CUDA_CHECK(cudaMemset(base_, kSentinel, bytes()));  // the payload too: unwritten shows
  }
  ~GuardedBuffer() { cudaFree(base_); }
  GuardedBuffer(const GuardedBuffer&) = delete;
  GuardedBuffer& operator=(const GuardedBuffer&) = delete;

  T* get() { return reinterpret_cast<T*>(base_ + kGuard); }
  void upload(const std::vector<T>& v) {
    KVQ_CUDA_CHECK(cudaMemcpy(get(), v.data(), count_ * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<T> download() {
    std::vector<T> v(count_);
    KVQ_CUDA_CHECK(cudaMemcpy(v.data(), get(), count_ * sizeof(T), cudaMemcpyDeviceToHost));
    return v;
  }
  /// Number of guard bytes that no longer hold the sentinel.
  size_t damaged_guard_bytes() {
    std::vector<uint8_t> all(bytes());
    KVQ_CUDA_CHECK(cudaMemcpy(all.data(), base_, bytes(), cudaMemcpyDeviceToHost));
    size_t bad = 0;
    for (size_t i = 0; i < kGuard; ++i) bad += all[i] != kSentinel;
    for (size_t i = kGuard + count_ * sizeof(T); i < all.size(); ++i) bad += all[i] != kSentinel;
    return bad;
  }

 private:
  size_t bytes() const { return count_ * sizeof(T) + 2 * kGuard; }
  size_t count_;
  uint8_t* base_ = nullptr;
};

}  // namespace kvq::cuda::testing

/// Skips the current test with the reason when no CUDA device is usable.
#define KVQ_SKIP_WITHOUT_DEVICE()                                                    \
  do {                                                                               \
    const std::string why_ = ::kvq::cuda::testing::no_device_reason();               \
    if (!why_.empty()) GTEST_SKIP() << "no CUDA device: " << why_;                   \
  } while (0)
