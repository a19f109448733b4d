// The device KIVI cache: kivi/cache.cpp's append, line for line, with kvq::cuda::kivi_quantize
// (kernels/cuda/kivi_kernels.cu) in place of the CPU quantizers and device copies for the residual.
#include "kernels/cuda/kivi_cache_device.cuh"

#include <algorithm>
#include <string>
#include <utility>

#include "core/error.h"
#include "core/footprint.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/kivi_kernels.cuh"
#include "kivi/cache.h"

namespace kvq::cuda {
namespace {

[[noreturn]] void bad_call(const std::string& what) {
  throw Error("kvq::cuda::KiviSideCache: " + what);
}

// Checks the configuration exactly as the CPU cache does (one set of rules, one set of messages)
// and returns G resolved.
int checked_group(const IntSpec& spec, Role role, int64_t heads, int64_t head_dim) {
  if (spec.arith != Arith::Exact)
    throw Error("backend cuda: arith=fp16 (KIVI's reference arithmetic) runs on backends ref and "
                "cpu only");
  return kivi::SideCache(spec, role, heads, head_dim).group();
}

}  // namespace

KiviSideCache::KiviSideCache(const IntSpec& spec, Role role, int64_t heads, int64_t head_dim,
                             cudaStream_t stream)
    : spec_(spec),
      role_(role),
      axis_(spec.axis(role)),
      heads_(heads),
      dim_(head_dim),
      row_(heads * head_dim),
      group_(checked_group(spec, role, heads, head_dim)),
      stream_(stream) {}

KiviSideCache::~KiviSideCache() {
  release(words_);
  release(scales_);
  release(mins_);
  release(resid_);
}

KiviSideCache::KiviSideCache(KiviSideCache&& other) noexcept
    : spec_(other.spec_),
      role_(other.role_),
      axis_(other.axis_),
      heads_(other.heads_),
      dim_(other.dim_),
      row_(other.row_),
      group_(other.group_),
      stream_(other.stream_),
      tokens_(other.tokens_),
      quantized_(other.quantized_),
      words_(std::exchange(other.words_, {})),
      scales_(std::exchange(other.scales_, {})),
      mins_(std::exchange(other.mins_, {})),
      resid_(std::exchange(other.resid_, {})),
      resid_start_(other.resid_start_),
      resid_count_(other.resid_count_) {
  other.tokens_ = other.quantized_ = other.resid_start_ = other.resid_count_ = 0;
}

KiviSideCache& KiviSideCache::operator=(KiviSideCache&& other) noexcept {
  if (this != &other) {
    std::swap(spec_, other.spec_);
    std::swap(role_, other.role_);
    std::swap(axis_, other.axis_);
    std::swap(heads_, other.heads_);
    std::swap(dim_, other.dim_);
    std::swap(row_, other.row_);
    std::swap(group_, other.group_);
    std::swap(stream_, other.stream_);
    std::swap(tokens_, other.tokens_);
    std::swap(quantized_, other.quantized_);
    std::swap(words_, other.words_);
    std::swap(scales_, other.scales_);
    std::swap(mins_, other.mins_);
    std::swap(resid_, other.resid_);
    std::swap(resid_start_, other.resid_start_);
    std::swap(resid_count_, other.resid_count_);
  }
  return *this;
}

int64_t KiviSideCache::word_count() const {
  return axis_ == Axis::Channel ? channel_layout().words_for_tokens(quantized_)
                                : token_layout().words_for_tokens(quantized_);
}

int64_t KiviSideCache::param_count() const {
  return axis_ == Axis::Channel ? channel_layout().params_for_tokens(quantized_)
                                : token_layout().params_for_tokens(quantized_);
}

template <typename T>
void KiviSideCache::release(Buffer<T>& b) {
  if (b.ptr != nullptr) cudaFree(b.ptr);  // a destructor cannot report; cudaFree waits for work
  b = {};
}

// Reallocates b to hold at least `need` elements (doubling), moving elements
// [keep_from, keep_from + keep) of the old buffer to the front of the new one.
template <typename T>
cudaError_t KiviSideCache::grow(Buffer<T>& b, int64_t need, int64_t keep_from, int64_t keep) {
  if (need <= b.capacity) return cudaSuccess;
  Buffer<T> n;
  n.capacity = std::max(need, 2 * b.capacity);
  void* p = nullptr;
  KVQ_CUDA_CALL(cudaMalloc(&p, static_cast<size_t>(n.capacity) * sizeof(T)));
  n.ptr = static_cast<T*>(p);
  if (keep > 0) {
    const cudaError_t e = cudaMemcpyAsync(n.ptr, b.ptr + keep_from,
                                          static_cast<size_t>(keep) * sizeof(T),
                                          cudaMemcpyDeviceToDevice, stream_);
    if (e != cudaSuccess) {
      cudaFree(n.ptr);
      return e;
    }
  }
  if (b.ptr != nullptr) {
    KVQ_CUDA_CALL(cudaStreamSynchronize(stream_));  // the old buffer may still be read
    KVQ_CUDA_CALL(cudaFree(b.ptr));
  }
  b = n;
  return cudaSuccess;
}

cudaError_t KiviSideCache::grow_quantized(int64_t quantized_tokens) {
  int64_t words = 0, params = 0;
  if (axis_ == Axis::Channel) {
    words = channel_layout().words_for_tokens(quantized_tokens);
    params = channel_layout().params_for_tokens(quantized_tokens);
  } else {
    words = token_layout().words_for_tokens(quantized_tokens);
    params = token_layout().params_for_tokens(quantized_tokens);
  }
  KVQ_CUDA_CALL(grow(words_, words, 0, word_count()));
  KVQ_CUDA_CALL(grow(scales_, params, 0, param_count()));
  if (!spec_.sym) KVQ_CUDA_CALL(grow(mins_, params, 0, param_count()));
  return cudaSuccess;
}

cudaError_t KiviSideCache::reserve(int64_t tokens) {
  if (tokens < 0) bad_call("reserve of tokens=" + std::to_string(tokens) + " (must be >= 0)");
  KVQ_CUDA_CALL(grow_quantized(kvq::quantized_tokens(spec_, axis_, tokens)));
  // Per-channel: at most one block of B tokens; per-token: the window of R plus its dead prefix
  // (reclaimed once it outgrows the live part), under 2R.
  const int64_t window = axis_ == Axis::Channel
                             ? (spec_.residual > 0 ? spec_.residual : group_)
                             : 2 * static_cast<int64_t>(spec_.residual);
  const int64_t rows = std::min(tokens, window);
  if (rows * row_ > resid_.capacity) {
    KVQ_CUDA_CALL(grow(resid_, rows * row_, resid_start_ * row_, resid_count_ * row_));
    resid_start_ = 0;
  }
  return cudaSuccess;
}

cudaError_t KiviSideCache::append(const float* x, int64_t n) {
  if (n < 0) bad_call("append of n=" + std::to_string(n) + " tokens (must be >= 0)");
  if (n == 0) return cudaSuccess;
  if (x == nullptr) bad_call("append of n=" + std::to_string(n) + " tokens from a null pointer");
  const int64_t total = tokens_ + n;
  const int64_t target = kvq::quantized_tokens(spec_, axis_, total);
  if (axis_ == Axis::Channel) {
    // Blocks of B tokens flush whole: first the one the residual has started (topped up from x),
    // then every complete block straight from x; what is left starts the next block.
    int64_t used = 0;
    if (target > quantized_) {
      if (resid_count_ > 0) {
        const int64_t block = spec_.residual > 0 ? spec_.residual : group_;
        used = block - resid_count_;
        KVQ_CUDA_CALL(push_residual(x, used));
        KVQ_CUDA_CALL(quantize(residual_row(0), resid_count_));
        drop_residual(resid_count_);
      }
      KVQ_CUDA_CALL(quantize(x + used * row_, target - quantized_));
      used = n - (total - target);
    }
    KVQ_CUDA_CALL(push_residual(x + used * row_, n - used));
  } else {
    // Token i (global index) is residual row i - quantized_ while i < tokens_, else x row
    // i - tokens_. Quantize [quantized_, target), then slide the window.
    const int64_t from_resid =
        std::min(std::max<int64_t>(target - quantized_, 0), resid_count_);
    KVQ_CUDA_CALL(quantize(residual_row(0), from_resid));
    drop_residual(from_resid);
    const int64_t from_x = target - quantized_;  // tokens of x quantized directly
    if (from_x > 0) KVQ_CUDA_CALL(quantize(x, from_x));
    const int64_t skip = std::max<int64_t>(from_x, 0);
    KVQ_CUDA_CALL(push_residual(x + skip * row_, n - skip));
  }
  tokens_ = total;
  if (quantized_ != target || resid_count_ != total - target)
    bad_call("internal error: " + std::to_string(quantized_) + " quantized + " +
             std::to_string(resid_count_) + " residual tokens after an append, expected " +
             std::to_string(target));
  return cudaSuccess;
}

// Quantizes `count` tokens src[count, H, D] (per-channel: a multiple of G) after those stored.
cudaError_t KiviSideCache::quantize(const float* src, int64_t count) {
  if (count <= 0) return cudaSuccess;
  KVQ_CUDA_CALL(grow_quantized(quantized_ + count));
  const int64_t w0 = word_count(), p0 = param_count();
  KVQ_CUDA_CALL(kivi_quantize(axis_, spec_.bits, spec_.sym, group_, Shape3{count, heads_, dim_},
                              src, words_.ptr + w0, scales_.ptr + p0,
                              spec_.sym ? nullptr : mins_.ptr + p0, stream_));
  quantized_ += count;
  return cudaSuccess;
}

cudaError_t KiviSideCache::push_residual(const float* src, int64_t count) {
  if (count <= 0) return cudaSuccess;
  if (resid_start_ > 0 && resid_start_ >= resid_count_) {  // reclaim the dead prefix
    if (resid_count_ > 0)  // source and destination do not overlap: start >= count
      KVQ_CUDA_CALL(cudaMemcpyAsync(resid_.ptr, residual_row(0),
                                    sizeof(float) * static_cast<size_t>(resid_count_ * row_),
                                    cudaMemcpyDeviceToDevice, stream_));
    resid_start_ = 0;
  }
  const int64_t need = (resid_start_ + resid_count_ + count) * row_;
  if (need > resid_.capacity) {  // reallocate, moving the live rows to the front
    KVQ_CUDA_CALL(grow(resid_, need, resid_start_ * row_, resid_count_ * row_));
    resid_start_ = 0;
  }
  KVQ_CUDA_CALL(cudaMemcpyAsync(resid_.ptr + (resid_start_ + resid_count_) * row_, src,
                                sizeof(float) * static_cast<size_t>(count * row_),
                                cudaMemcpyDeviceToDevice, stream_));
  resid_count_ += count;
  return cudaSuccess;
}

void KiviSideCache::drop_residual(int64_t count) {
  if (count <= 0) return;
  resid_start_ += count;
  resid_count_ -= count;
  if (resid_count_ == 0) resid_start_ = 0;
}

cudaError_t KiviSideCache::copy_to_host(KiviSideCacheHost& out) const {
  KVQ_CUDA_CALL(cudaStreamSynchronize(stream_));
  const auto copy = [](auto& v, const auto* src, int64_t count) -> cudaError_t {
    v.resize(static_cast<size_t>(count));
    if (count == 0) return cudaSuccess;
    return cudaMemcpy(v.data(), src, v.size() * sizeof(v[0]), cudaMemcpyDeviceToHost);
  };
  KVQ_CUDA_CALL(copy(out.words, words_.ptr, word_count()));
  KVQ_CUDA_CALL(copy(out.scales, scales_.ptr, param_count()));
  KVQ_CUDA_CALL(copy(out.mins, mins_.ptr, spec_.sym ? 0 : param_count()));
  KVQ_CUDA_CALL(copy(out.residual, residual(), resid_count_ * row_));
  return cudaSuccess;
}

}  // namespace kvq::cuda
