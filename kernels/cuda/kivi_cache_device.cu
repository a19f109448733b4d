// The device KIVI cache: kivi/cache.cpp's append (both carry out kivi/append_plan.h), with
// kvq::cuda::kivi_quantize (kernels/cuda/kivi_kernels.cu) in place of the CPU quantizers and device
// copies for the residual. Appends are planned on the host (the counts move as the CPU cache's do)
// into a few lists of jobs, launched together for every request of a batch
// (KiviSideCache::append_batch). Host code only (the kernels are kivi_kernels.cu's), so
// tests/kernels/cuda runs it on the CPU against a host stand-in of the runtime calls and launchers.
#include "kernels/cuda/kivi_cache_device.cuh"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/kivi_kernels.cuh"
#include "kivi/append_plan.h"
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

/// A batched append's work in launch order: copies[0] (residual top-ups of per-channel blocks),
/// then `quantize` (every block or token leaving a window, all caches), then copies[1] (a
/// per-token window's live rows moved to the front of its buffer), then copies[2] (new residual
/// rows). Each launch only reads what earlier launches wrote, and no two jobs of one launch
/// touch the same bytes.
struct KiviSideCache::Steps {
  std::vector<FloatCopy> copies[3];
  std::vector<KiviQuantizeJob> quantize;
};

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
  const kivi::AppendRule rule = append_rule();
  KVQ_CUDA_CALL(grow_quantized(rule.quantized_count(tokens)));
  // Per-channel: at most one block of B tokens; per-token: the window of R plus its dead prefix
  // (reclaimed once it outgrows the live part), under 2R.
  const int64_t window = axis_ == Axis::Channel ? rule.block() : 2 * rule.residual;
  const int64_t rows = std::min(tokens, window);
  if (rows * row_ > resid_.capacity) {
    KVQ_CUDA_CALL(grow(resid_, rows * row_, resid_start_ * row_, resid_count_ * row_));
    resid_start_ = 0;
  }
  return cudaSuccess;
}

cudaError_t KiviSideCache::append(const float* x, int64_t n) {
  KiviSideCache* self = this;
  return append_batch(std::span<KiviSideCache* const>(&self, 1),
                      std::span<const float* const>(&x, 1), std::span<const int64_t>(&n, 1));
}

cudaError_t KiviSideCache::append_batch(std::span<KiviSideCache* const> caches,
                                        std::span<const float* const> x,
                                        std::span<const int64_t> n) {
  if (x.size() != caches.size() || n.size() != caches.size())
    bad_call("append_batch of " + std::to_string(caches.size()) + " caches with " +
             std::to_string(x.size()) + " inputs and " + std::to_string(n.size()) +
             " token counts (one of each per cache)");
  const bool batch = caches.size() > 1;
  const KiviSideCache* c0 = caches.empty() ? nullptr : caches[0];
  for (size_t i = 0; i < caches.size(); ++i) {
    const std::string at = batch ? "request " + std::to_string(i) + ": " : "";
    const KiviSideCache* c = caches[i];
    if (c == nullptr) bad_call(at + "the cache is null");
    if (n[i] < 0) bad_call(at + "append of n=" + std::to_string(n[i]) + " tokens (must be >= 0)");
    if (n[i] > 0 && x[i] == nullptr)
      bad_call(at + "append of n=" + std::to_string(n[i]) + " tokens from a null pointer");
    if (c->spec_.bits != c0->spec_.bits || c->spec_.sym != c0->spec_.sym ||
        c->group_ != c0->group_ || c->spec_.residual != c0->spec_.residual ||
        c->axis_ != c0->axis_ || c->heads_ != c0->heads_ || c->dim_ != c0->dim_)
      bad_call(
          at + "its spec or shape differs from request 0's (" + std::to_string(c->heads_) +
          " heads x " + std::to_string(c->dim_) + ", " + std::to_string(c->spec_.bits) +
          " bits, g=" + std::to_string(c->group_) + ", r=" + std::to_string(c->spec_.residual) +
          " against " + std::to_string(c0->heads_) + " x " + std::to_string(c0->dim_) + ", " +
          std::to_string(c0->spec_.bits) + " bits, g=" + std::to_string(c0->group_) +
          ", r=" + std::to_string(c0->spec_.residual) + "); batch caches of one configuration");
    if (c->stream_ != c0->stream_) bad_call(at + "its stream differs from request 0's");
  }
  if (batch) {  // each cache once: sorted (pointer, request) pairs put repeats side by side
    std::vector<std::pair<const KiviSideCache*, size_t>> order;
    for (size_t i = 0; i < caches.size(); ++i) order.emplace_back(caches[i], i);
    std::sort(order.begin(), order.end());
    for (size_t i = 1; i < order.size(); ++i)
      if (order[i].first == order[i - 1].first)
        bad_call("request " + std::to_string(order[i].second) + ": the same cache as request " +
                 std::to_string(order[i - 1].second) + " (append its tokens in one request)");
  }
  if (caches.empty()) return cudaSuccess;
  // Grow first: every pointer a planned job holds stays valid until the launches have run.
  for (size_t i = 0; i < caches.size(); ++i)
    if (n[i] > 0) KVQ_CUDA_CALL(caches[i]->reserve(caches[i]->tokens_ + n[i]));
  Steps steps;
  for (size_t i = 0; i < caches.size(); ++i)
    if (n[i] > 0) caches[i]->plan_append(x[i], n[i], steps);
  const cudaStream_t stream = c0->stream_;
  KVQ_CUDA_CALL(copy_floats_batch(steps.copies[0], stream));
  KVQ_CUDA_CALL(kivi_quantize_batch(c0->axis_, c0->spec_.bits, c0->spec_.sym, c0->group_,
                                    c0->heads_, c0->dim_, steps.quantize, stream));
  KVQ_CUDA_CALL(copy_floats_batch(steps.copies[1], stream));
  return copy_floats_batch(steps.copies[2], stream);
}

void KiviSideCache::plan_append(const float* x, int64_t n, Steps& steps) {
  // The one append policy (kivi/append_plan.h), as kivi::SideCache::append carries it out: the
  // top-up is copied before the quantize launch, the kept rows after it.
  const kivi::AppendPlan p = append_rule().plan(tokens_, n);
  plan_push(x, p.topup, steps, 0);
  plan_quantize(residual_row(0), p.from_window, steps);
  drop_residual(p.from_window);
  plan_quantize(x + p.topup * row_, p.from_x, steps);
  plan_push(x + p.kept_from() * row_, n - p.kept_from(), steps, 2);
  tokens_ = p.tokens;
  if (quantized_ != p.quantized || resid_count_ != p.tokens - p.quantized)
    bad_call("internal error: " + std::to_string(quantized_) + " quantized + " +
             std::to_string(resid_count_) + " residual tokens after an append, expected " +
             std::to_string(p.quantized));
}

// Queues the quantization of `count` tokens src[count, H, D] (per-channel: a multiple of G)
// after those stored; the storage was reserved.
void KiviSideCache::plan_quantize(const float* src, int64_t count, Steps& steps) {
  if (count <= 0) return;
  const int64_t w0 = word_count(), p0 = param_count();
  quantized_ += count;
  if (word_count() > words_.capacity || param_count() > scales_.capacity ||
      (!spec_.sym && param_count() > mins_.capacity))
    bad_call("internal error: a batched append outgrew the reserved codes");
  steps.quantize.push_back(KiviQuantizeJob{src, count, words_.ptr + w0, scales_.ptr + p0,
                                           spec_.sym ? nullptr : mins_.ptr + p0});
}

// Queues a copy of `count` rows from src to the end of the residual window, into copies[into]
// (0: before the quantize launch, 2: after it). A dead prefix of the window that has outgrown the
// live rows is reclaimed first, by a move queued in copies[1] (so only after the quantize launch
// has read those rows).
void KiviSideCache::plan_push(const float* src, int64_t count, Steps& steps, int into) {
  if (count <= 0) return;
  if (resid_start_ > 0 && resid_start_ >= resid_count_) {  // reclaim the dead prefix
    if (into != 2) bad_call("internal error: a residual move before the quantize launch");
    if (resid_count_ > 0)  // source and destination do not overlap: start >= count
      steps.copies[1].push_back(FloatCopy{residual_row(0), resid_.ptr, resid_count_ * row_});
    resid_start_ = 0;
  }
  if ((resid_start_ + resid_count_ + count) * row_ > resid_.capacity)
    bad_call("internal error: a batched append outgrew the reserved residual window");
  steps.copies[into].push_back(
      FloatCopy{src, resid_.ptr + (resid_start_ + resid_count_) * row_, count * row_});
  resid_count_ += count;
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
