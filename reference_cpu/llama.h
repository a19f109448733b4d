// A Llama-family decoder (SmolLM2-135M-Instruct and kin) from a GGUF file, fp32 compute with
// Eigen, whose KV cache is any kvq scheme. Prefill in chunks and single-token decode are the same
// call: forward() appends the tokens to the cache and attends causally, so every position sees
// exactly the cache a token-by-token decode would hold (quantized outside the residual window).
#pragma once

#include <Eigen/Dense>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/gguf.h"
#include "core/spec.h"
#include "reference_cpu/kv_cache.h"

namespace kvq {

/// \brief Model hyperparameters, read from the GGUF's llama.* metadata.
struct LlamaConfig {
  int layers = 0, hidden = 0, heads = 0, kv_heads = 0, head_dim = 0, ffn = 0, vocab = 0;
  int context = 0;
  float rms_eps = 1e-5f, rope_theta = 10000.0f;
};

/// \brief How the model's KV cache is stored.
struct CacheOptions {
  SchemeSpec spec;        ///< any scheme; the same for K and V (roles decide KIVI's axes)
  bool pre_rope = false;  ///< quantize keys before RoPE and rotate when reading (KVQuant)
};

/// \brief One sequence's KV cache: a K and a V side per layer.
class LlamaCache {
 public:
  LlamaCache(const LlamaConfig& c, const CacheOptions& o);
  int64_t tokens() const { return layers_.empty() ? 0 : layers_[0].k->tokens(); }
  const CacheOptions& options() const { return opts_; }
  struct Layer {
    std::unique_ptr<SideStore> k, v;
  };
  std::vector<Layer>& layers() { return layers_; }
  const std::vector<Layer>& layers() const { return layers_; }
  /// \brief Bytes stored over all layers (codes, scales, zeros, residual window).
  double bytes() const;

 private:
  CacheOptions opts_;
  std::vector<Layer> layers_;
};

/// \brief Per-layer K (pre- and post-RoPE) and V of a chunk, [n, kv_heads, head_dim] each;
/// `kvq model dump` and `kvq model calibrate` observe the forward pass through it.
using KvObserver = std::function<void(int layer, int64_t pos0, int64_t n, const float* k_pre,
                                      const float* k_post, const float* v)>;

/// \brief The model: dequantized fp32 weights (the file's weight quantization stays fixed, so it
/// does not mix with the KV-cache comparison).
class LlamaModel {
 public:
  using Mat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  /// A weight stored transposed, [in][out] row-major, for kvq::matmul.
  struct Linear {
    int64_t in = 0, out = 0;
    std::vector<float> wt;
  };

  /// \brief Loads a llama-architecture GGUF; errors name the missing key or tensor.
  static LlamaModel load(const gguf::GgufFile& f);
  const LlamaConfig& config() const { return cfg_; }

  /// \brief Runs `tokens` at positions cache.tokens() .. + n - 1, appending their K/V to the
  /// cache. Writes logits [n, vocab] for every position when `all_logits`, else only for the last
  /// ([1, vocab]). `threads` 0 = all cores.
  void forward(std::span<const int32_t> tokens, LlamaCache& cache, std::vector<float>& logits,
               bool all_logits, int threads = 0, const KvObserver& observe = {}) const;

  /// \brief RoPE (adjacent channel pairs, as GGUF's llama layout) on x [n, heads, head_dim] for
  /// positions pos0.. ; `sign` -1 rotates back.
  void rope(float* x, int64_t n, int64_t heads, int64_t pos0, float sign = 1.0f) const;

 private:
  struct Block {
    Eigen::VectorXf attn_norm, ffn_norm;
    Linear wq, wk, wv, wo, w_gate, w_up, w_down;
  };
  LlamaConfig cfg_;
  Mat embed_;     ///< [vocab, hidden] token embeddings
  Linear head_;   ///< output head (the tied embeddings unless the file has output.weight)
  Eigen::VectorXf out_norm_;
  std::vector<Block> blocks_;
  std::vector<float> inv_freq_;
};

}  // namespace kvq
