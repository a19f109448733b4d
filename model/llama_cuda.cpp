// The model on backend cuda (issue 47 item 2): LlamaModel::forward on the GPU. The dense part runs
// in kernels/cuda/device_model.h (weights uploaded once, bf16 or float32); each layer's K and V go
// to the cache's backend cuda sides and its attention is backend cuda's (kernels/backend.h: rot=
// handled there, every scheme backend cuda stores). A pass of n > 1 tokens is a prefill in chunks
// of device_chunk() tokens (DeviceModel::prefill): a chunk's rows through each layer's dense part
// at once, its K and V appended and its attention one causal call (prefill_device: a decode
// launch over the chunk's positions, each reading what a decode at that position reads). A single
// token (and every token with device_chunk() 1) is a decode step (attend_decode_device). The two
// store the same codes for the same K and V, and their attention outputs differ by the float32
// summation order of the launch's split of the contexts.
//
// The step stays in device memory from the embedding to the logits: each layer's k and v are
// appended to the cache sides from the device model's q|k|v buffer and the decode attention reads
// q and writes its output there (kernels/backend.h's append_device / attend_decode_device), so a
// token's one copy is its logits back (and the token id's embedding row needs none). A rot= cache
// is the exception: its rotation runs on the host, so its rows, q and output still cross.
#include "model/llama_cuda.h"

#include <fmt/format.h>

#include <algorithm>
#include <string>
#include <utility>

#include "core/error.h"
#include "kernels/backend.h"
#include "kernels/cuda/device_model.h"
#include "model/llama.h"

namespace kvq {

cuda::DeviceModelShape device_model_shape(const LlamaConfig& c) {
  cuda::DeviceModelShape s;
  s.layers = c.layers;
  s.hidden = c.hidden;
  s.heads = c.heads;
  s.kv_heads = c.kv_heads;
  s.head_dim = c.head_dim;
  s.ffn = c.ffn;
  s.vocab = c.vocab;
  s.eps = c.rms_eps;
  s.qkv_bias = c.qkv_bias;
  s.o_bias = c.o_bias;
  s.qk_norm = c.qk_norm;
  s.rope_half = c.rope_style == RopeStyle::kHalf;
  s.tied = c.tied;
  return s;
}

struct LlamaModel::CudaState {
#if KVQ_HAVE_CUDA
  std::unique_ptr<cuda::DeviceModel> dev;
#endif
};

void LlamaModel::set_backend(AttentionBackend b) {
  if (b == AttentionBackend::kCuda)
    require_available(b);
  else
    require_host(b);
  backend_ = b;
}

void LlamaModel::set_device_chunk(int64_t chunk) {
  KVQ_CHECK(chunk >= 1, "backend cuda's prefill chunk must be >= 1 token (got {})", chunk);
  const std::lock_guard<std::mutex> lock(team_->mutex);
  device_chunk_ = chunk;
}

void LlamaModel::set_device_weights(DeviceWeights w) {
  const std::lock_guard<std::mutex> lock(team_->mutex);
  if (w == device_weights_) return;
  device_weights_ = w;
  cuda_.reset();  // uploaded again, in the new format, by the next backend cuda pass
}

int64_t LlamaModel::device_weight_bytes() const {
  const std::lock_guard<std::mutex> lock(team_->mutex);
#if KVQ_HAVE_CUDA
  if (cuda_ && cuda_->dev) return cuda_->dev->weight_bytes();
#endif
  return 0;
}

#if KVQ_HAVE_CUDA
void LlamaModel::prepare_cuda_cache(LlamaCache& cache, int64_t n) const {
  const LlamaConfig& c = cfg_;
  KVQ_CHECK(cache.layers().size() == static_cast<size_t>(c.layers),
            "forward: the cache has {} layers, the model {}", cache.layers().size(), c.layers);
  check_cache_options(cache.options(), c);
  // the scheme and pre_rope before any side moves (kernels/backend.h's table)
  require_model(AttentionBackend::kCuda, cache.options().spec, cache.options().pre_rope);
  const int64_t pos0 = cache.tokens();
  for (int l = 0; l < c.layers; ++l)
    if (const int64_t w = c.window_of(l); w > 0 && pos0 + n > w)
      fail(
          "backend cuda has no sliding-window attention: layer {}'s window is {} tokens and the "
          "cache would hold {}; use backend ref or cpu (or at most {} tokens)",
          l, w, pos0 + n, w);
  // The cache's sides in device memory: made on the first pass over an empty cache.
  for (int l = 0; l < c.layers; ++l) {
    LlamaCache::Layer& side = cache.layers()[static_cast<size_t>(l)];
    if (on_device(*side.k) && on_device(*side.v)) continue;
    KVQ_CHECK(side.k->tokens() == 0 && side.v->tokens() == 0,
              "backend cuda: this cache already holds {} tokens in host memory (written on a host "
              "backend); a backend cuda pass starts from an empty cache",
              side.k->tokens());
    const SchemeSpec& spec = cache.options().spec;
    side.k = make_backend_side(AttentionBackend::kCuda, spec, Role::Key, c.kv_heads, c.head_dim, l);
    side.v =
        make_backend_side(AttentionBackend::kCuda, spec, Role::Value, c.kv_heads, c.head_dim, l);
  }
}

LlamaModel::CudaState& LlamaModel::cuda_state() const {
  if (!cuda_) cuda_ = std::make_shared<CudaState>();
  CudaState& st = *cuda_;
  if (!st.dev) {
    auto dev = std::make_unique<cuda::DeviceModel>(device_model_shape(cfg_),
                                                   device_weights_ == DeviceWeights::kBf16);
    upload_device_weights(*dev);
    const std::string gap = dev->missing();
    KVQ_CHECK(gap.empty(), "backend cuda: the model's {} was not uploaded", gap);
    st.dev = std::move(dev);
  }
  return st;
}

void LlamaModel::forward_cuda(std::span<const int32_t> tokens, LlamaCache& cache,
                              std::vector<float>& logits, bool all_logits,
                              const KvObserver& observe) const {
  const LlamaConfig& c = cfg_;
  const int64_t n = static_cast<int64_t>(tokens.size());
  KVQ_CHECK(n > 0, "forward: no tokens");
  for (const int32_t id : tokens)
    KVQ_CHECK(id >= 0 && id < c.vocab, "forward: token id {} outside the vocabulary [0, {})", id,
              c.vocab);
  KVQ_CHECK(!observe,
            "backend cuda does not observe the forward pass's K/V (kvq model dump / calibrate): "
            "use backend cpu");
  const std::lock_guard<std::mutex> lock(team_->mutex);
  prepare_cuda_cache(cache, n);
  CudaState& st = cuda_state();
  const int64_t pos0 = cache.tokens();
  const int64_t qd = c.q_dim(), kvd = static_cast<int64_t>(c.kv_heads) * c.head_dim;
  logits.resize(static_cast<size_t>((all_logits ? n : 1) * c.vocab));
  // q|k|v and the attention output are device pointers (the device model's buffers).
  if (n > 1 && device_chunk_ > 1) {
    const int64_t row = qd + 2 * kvd;
    st.dev->prefill(
        tokens, pos0, inv_freq_, device_chunk_,
        [&](int l, int64_t, int64_t m, const float* qkv, const float* q, float* attn) {
          LlamaCache::Layer& side = cache.layers()[static_cast<size_t>(l)];
          prefill_device(*side.k, *side.v, qkv + qd, qkv + qd + kvd, row, m, q, c.heads, attn);
        },
        logits.data(), all_logits);
    return;
  }
  st.dev->decode(
      tokens, pos0, inv_freq_,
      [&](int l, int64_t, const float* qkv, float* attn) {
        LlamaCache::Layer& side = cache.layers()[static_cast<size_t>(l)];
        append_device(*side.k, qkv + qd, 1);
        append_device(*side.v, qkv + qd + kvd, 1);
        attend_decode_device(qkv, c.heads, *side.k, *side.v, attn);
      },
      logits.data(), all_logits);
}

void LlamaModel::decode_batch(std::span<const int32_t> tokens, std::span<LlamaCache* const> caches,
                              std::vector<float>& logits) const {
  const LlamaConfig& c = cfg_;
  const size_t B = tokens.size();
  KVQ_CHECK(backend_ == AttentionBackend::kCuda,
            "decode_batch runs on backend cuda (this model's backend is {})", to_string(backend_));
  KVQ_CHECK(B >= 1 && caches.size() == B, "decode_batch: {} tokens for {} caches", B,
            caches.size());
  for (size_t b = 0; b < B; ++b) {
    KVQ_CHECK(caches[b] != nullptr, "decode_batch: sequence {}'s cache is null", b);
    KVQ_CHECK(tokens[b] >= 0 && tokens[b] < c.vocab,
              "decode_batch: sequence {}'s token id {} outside the vocabulary [0, {})", b,
              tokens[b], c.vocab);
    for (size_t j = 0; j < b; ++j)
      KVQ_CHECK(caches[j] != caches[b], "decode_batch: sequences {} and {} share one cache", j, b);
  }
  const std::string spec0 = caches[0]->options().spec.canonical();
  for (size_t b = 1; b < B; ++b)
    KVQ_CHECK(caches[b]->options().spec.canonical() == spec0 &&
                  caches[b]->options().pre_rope == caches[0]->options().pre_rope,
              "decode_batch: sequence {}'s cache is '{}', sequence 0's '{}' (one launch reads one "
              "scheme)",
              b, caches[b]->options().spec.canonical(), spec0);
  const std::lock_guard<std::mutex> lock(team_->mutex);
  std::vector<int64_t> positions(B);
  for (size_t b = 0; b < B; ++b) {
    prepare_cuda_cache(*caches[b], 1);
    positions[b] = caches[b]->tokens();
  }
  CudaState& st = cuda_state();
  const int64_t qd = c.q_dim(), kvd = static_cast<int64_t>(c.kv_heads) * c.head_dim,
                row = qd + 2 * kvd;
  std::vector<SideStore*> ks(B), vs(B);
  std::vector<const float*> xk(B), xv(B);
  logits.resize(B * static_cast<size_t>(c.vocab));
  st.dev->decode_batch(
      tokens, positions, inv_freq_,
      [&](int l, const float* qkv, const float* q, float* attn) {
        for (size_t b = 0; b < B; ++b) {
          LlamaCache::Layer& side = caches[b]->layers()[static_cast<size_t>(l)];
          ks[b] = side.k.get();
          vs[b] = side.v.get();
          xk[b] = qkv + static_cast<int64_t>(b) * row + qd;
          xv[b] = xk[b] + kvd;
        }
        append_device_batch(ks, xk, 1);
        append_device_batch(vs, xv, 1);
        attend_decode_device_batch(q, c.heads, std::span<const SideStore* const>(ks.data(), B),
                                   std::span<const SideStore* const>(vs.data(), B), attn);
      },
      logits.data());
}

void LlamaModel::reserve_device_batch(int64_t batch) const {
  KVQ_CHECK(backend_ == AttentionBackend::kCuda,
            "reserve_device_batch: backend cuda only (this model's backend is {})",
            to_string(backend_));
  const std::lock_guard<std::mutex> lock(team_->mutex);
  cuda_state().dev->reserve_batch(batch);
}
#else
void LlamaModel::forward_cuda(std::span<const int32_t>, LlamaCache&, std::vector<float>&, bool,
                              const KvObserver&) const {
  fail("{}", cuda_unavailable());
}

void LlamaModel::decode_batch(std::span<const int32_t>, std::span<LlamaCache* const>,
                              std::vector<float>&) const {
  fail("{}", cuda_unavailable());
}

void LlamaModel::reserve_device_batch(int64_t) const { fail("{}", cuda_unavailable()); }
#endif

}  // namespace kvq
