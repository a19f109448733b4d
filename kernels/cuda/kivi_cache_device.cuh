// The streaming KIVI cache of one side (K or V) of one layer, on the device: the port of
// kivi::SideCache (kivi/cache.h, the spec). Same residual rules (one plan, kivi/append_plan.h:
// per-channel, whole blocks of B tokens flush together; per-token, a sliding window of R), same
// layout (kivi/layout.h), the same bytes after the same appends, whatever their partition.
// Storage is device memory with a capacity, grown on the host side by reallocation (geometric,
// so appends cost amortized O(n * H * D)); the residual window stays float32 [n, H, D] on the
// device, oldest first, contiguous.
//
// Errors (STYLE 9): a bad configuration throws kvq::Error (the constructor checks exactly what
// kivi::SideCache checks, with its messages); CUDA failures are returned as cudaError_t. After a
// failed call the cache must not be used further. Work is asynchronous on the cache's stream:
// an appended buffer must stay valid until the stream has reached the append's work.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <span>
#include <vector>

#include "core/spec.h"
#include "kivi/append_plan.h"
#include "kivi/layout.h"

namespace kvq::cuda {

/// \brief A host copy of everything a KiviSideCache stores (what kivi::SideCache exposes).
struct KiviSideCacheHost {
  std::vector<uint32_t> words;   ///< packed codes (kivi/layout.h)
  std::vector<uint16_t> scales;  ///< fp16 bits of the group scales
  std::vector<uint16_t> mins;    ///< fp16 bits of the group minima; empty for sym
  std::vector<float> residual;   ///< float32 [residual_tokens, heads, head_dim], oldest first
};

/// \brief One side (K or V) of one layer's KIVI cache in device memory.
class KiviSideCache {
 public:
  /// \brief A cache for `role`'s side of `spec` (axis spec.axis(role)) with `heads` kv heads of
  /// `head_dim` channels, working on `stream`. Throws kvq::Error as kivi::SideCache's constructor
  /// does. Allocates nothing (usable without a device until the first append or reserve).
  KiviSideCache(const IntSpec& spec, Role role, int64_t heads, int64_t head_dim,
                cudaStream_t stream = nullptr);
  ~KiviSideCache();
  KiviSideCache(KiviSideCache&& other) noexcept;
  KiviSideCache& operator=(KiviSideCache&& other) noexcept;
  KiviSideCache(const KiviSideCache&) = delete;
  KiviSideCache& operator=(const KiviSideCache&) = delete;

  /// \brief Makes room for `tokens` tokens in total, so appends up to that count do not
  /// reallocate (device pointers stay put). Throws kvq::Error on negative `tokens`.
  [[nodiscard]] cudaError_t reserve(int64_t tokens);
  /// \brief Appends n >= 0 tokens x[n, heads, head_dim] (float32, C order, device memory) and
  /// quantizes those that leave the residual window. Throws kvq::Error on n < 0 or a null x.
  [[nodiscard]] cudaError_t append(const float* x, int64_t n);
  /// \brief Appends n[i] >= 0 tokens x[i][n[i], heads, head_dim] to *caches[i] for every i (a
  /// serving step: one token per request, or a prefill among decodes), with the same bytes as
  /// caches[i]->append(x[i], n[i]) in turn. The work is four lists of jobs, each one launch per
  /// kKiviJobsPerLaunch quantize jobs or kCopiesPerLaunch copies (a request makes at most two
  /// quantize jobs and one copy per list): residual top-ups, every quantize, window moves,
  /// residual pushes; so four launches for up to 32 requests of any size, or 64 decoding ones.
  /// A cache that must grow first reallocates (reserve: an allocation, a copy and a stream
  /// synchronization). The caches must be distinct and share the spec's bits, sym, group,
  /// residual and axis, heads, head_dim and stream. Throws kvq::Error, naming the request, on
  /// mismatched spans or caches, n < 0 or a null x, before anything is queued or changed. After
  /// a failed call (a CUDA error) no cache of the batch may be used further.
  [[nodiscard]] static cudaError_t append_batch(std::span<KiviSideCache* const> caches,
                                                std::span<const float* const> x,
                                                std::span<const int64_t> n);

  int64_t tokens() const { return tokens_; }
  /// \brief Tokens held quantized (kvq::quantized_tokens of tokens()).
  int64_t quantized_tokens() const { return quantized_; }
  int64_t residual_tokens() const { return resid_count_; }
  int64_t heads() const { return heads_; }
  int64_t head_dim() const { return dim_; }
  int bits() const { return spec_.bits; }
  /// \brief G, resolved (g=dim is head_dim).
  int group() const { return group_; }
  /// \brief R, the residual window of the spec.
  int residual_window() const { return spec_.residual; }
  Axis axis() const { return axis_; }
  Role role() const { return role_; }
  bool sym() const { return spec_.sym; }
  const IntSpec& spec() const { return spec_; }
  cudaStream_t stream() const { return stream_; }
  /// \brief The side's residual rule (kivi/append_plan.h), which every append carries out.
  kivi::AppendRule append_rule() const { return kivi::AppendRule{axis_, group_, spec_.residual}; }
  /// \brief Index arithmetic of the per-channel side's storage (axis() == Axis::Channel).
  kivi::ChannelLayout channel_layout() const {
    return kivi::ChannelLayout{heads_, dim_, group_, spec_.bits};
  }
  /// \brief Index arithmetic of the per-token side's storage (axis() == Axis::Token).
  kivi::TokenLayout token_layout() const {
    return kivi::TokenLayout{heads_, dim_, group_, spec_.bits};
  }

  // Device pointers, valid until the next append / reserve (which may reallocate); null while
  // nothing is stored. Their contents are complete once the stream has reached the last append.
  /// \brief Packed codes of the quantized tokens, word_count() words (kivi/layout.h).
  const uint32_t* words() const { return words_.ptr; }
  int64_t word_count() const;
  /// \brief fp16 bits of the group scales, param_count() of them (kivi/layout.h).
  const uint16_t* scales() const { return scales_.ptr; }
  /// \brief fp16 bits of the group minima, same indexing as scales(); null for sym.
  const uint16_t* mins() const { return spec_.sym ? nullptr : mins_.ptr; }
  int64_t param_count() const;
  /// \brief The exact residual tokens, float32 [residual_tokens(), heads, head_dim], oldest first.
  const float* residual() const { return resid_.ptr ? resid_.ptr + resid_start_ * row_ : nullptr; }
  /// \brief Global index of the token residual() starts with (== quantized_tokens()).
  int64_t residual_start() const { return quantized_; }

  /// \brief Waits for the stream and copies everything stored into `out` (for tests and tools).
  [[nodiscard]] cudaError_t copy_to_host(KiviSideCacheHost& out) const;

 private:
  /// A device array with a capacity; grow() reallocates, keeping the first `keep` elements.
  template <typename T>
  struct Buffer {
    T* ptr = nullptr;
    int64_t capacity = 0;
  };
  template <typename T>
  cudaError_t grow(Buffer<T>& b, int64_t need, int64_t keep_from, int64_t keep);
  template <typename T>
  static void release(Buffer<T>& b);
  struct Steps;  // the batched append's queued work (kivi_cache_device.cu)
  cudaError_t grow_quantized(int64_t quantized_tokens);
  /// Plans this cache's part of a batched append (storage already reserved) into `steps`,
  /// updating the host-side counts as append() does.
  void plan_append(const float* x, int64_t n, Steps& steps);
  void plan_quantize(const float* src, int64_t count, Steps& steps);
  void plan_push(const float* src, int64_t count, Steps& steps, int into);
  void drop_residual(int64_t count);
  const float* residual_row(int64_t i) const { return resid_.ptr + (resid_start_ + i) * row_; }

  IntSpec spec_;
  Role role_;
  Axis axis_;
  int64_t heads_, dim_, row_;  // row_ = heads * head_dim floats per token
  int group_;
  cudaStream_t stream_;
  int64_t tokens_ = 0, quantized_ = 0;
  Buffer<uint32_t> words_;
  Buffer<uint16_t> scales_, mins_;
  // Residual window: live rows resid_[resid_start_ .. resid_start_ + resid_count_); the dead
  // prefix left by the sliding window is reclaimed once it outgrows the live part (as the CPU).
  Buffer<float> resid_;  // capacity in floats
  int64_t resid_start_ = 0, resid_count_ = 0;
};

}  // namespace kvq::cuda
