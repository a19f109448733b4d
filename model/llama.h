// A Llama-family decoder (SmolLM2-135M-Instruct and kin; Mistral, Qwen2/2.5, Qwen3 through
// model/arch.h's table) from a GGUF file or a Hugging Face checkpoint folder: weights kept in their
// GGUF block format in panels, or the checkpoint's 16-bit or fp32 values multiplied where they lie
// in the mapped files (or copied into panels; model/packed_matrix.h, WeightStore), fp32
// activations, and a KV cache in any kvq scheme.
// Prefill in chunks and single-token decode are the same call: forward() appends the tokens to the
// cache and attends causally, so every position sees exactly the cache a token-by-token decode
// would hold (quantized outside the residual window).
#pragma once

#include <Eigen/Dense>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "cache/side.h"
#include "core/gguf.h"
#include "core/spec.h"
#include "kernels/backend.h"
#include "kernels/cpu/attention.h"
#include "model/arch.h"
#include "model/hf_checkpoint.h"
#include "model/packed_matrix.h"
#include "model/thread_team.h"

namespace kvq {

namespace cuda {
class DeviceModel;  // kernels/cuda/device_model.h: backend cuda's weights and decode step
}

/// \brief How the model's KV cache is stored.
struct CacheOptions {
  SchemeSpec spec;        ///< any scheme (roles decide KIVI's axes); SPEC@L=SPEC: per layer
  bool pre_rope = false;  ///< quantize keys before RoPE and rotate when reading (KVQuant)
  // The spec's rot= (core/rotation.h) rotates q, k and v per head and the output back; sink=S keeps
  // the first S tokens exact. Both work with every scheme, pre_rope included.
};

/// \brief Throws kvq::Error when `o` cannot run on a model of shape `c` (rot= needs a head_dim
/// divisible by 8; a per-layer spec names existing layers): the forward pass's own check,
/// callable before the weights load.
void check_cache_options(const CacheOptions& o, const LlamaConfig& c);

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

/// \brief How the weights are held in memory. kMapped and kPacked give bit-identical logits (the
/// same values in the same chain, model/packed_matrix.h), and both equal kFp32's.
enum class WeightStore {
  kMapped,  ///< a checkpoint folder's F32/F16/BF16 matrices multiplied where they lie in the
            ///< mapped shards, not copied (the default: the file's pages are the only copy, shared
            ///< with the page cache); GGUF blocks and FP8 weights as kPacked
  kPacked,  ///< the weights copied into column panels at load: the file's blocks decoded in
            ///< registers, 16-bit or fp32 panels (a folder's mapped pages released once copied)
  kFp32,    ///< dequantized fp32 [in][out] multiplied by reference_cpu/matmul.h: the plain
            ///< definition the packed path is tested against (about 4x the memory)
};

/// \brief "mapped", "packed" or "fp32" (the CLI's --weights, kvq run's weights key, Python's
/// weights=); throws naming the accepted values.
WeightStore parse_weight_store(const std::string& s);
/// \brief The name parse_weight_store reads.
const char* weight_store_name(WeightStore s);

/// \brief The model. The file's weight quantization stays fixed, so it does not mix with the
/// KV-cache comparison; both weight stores give bit-identical logits.
class LlamaModel {
 public:
  using Mat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  /// One weight matrix W [out][in].
  struct Linear {
    int64_t in = 0, out = 0;
    PackedMatrix packed;    ///< WeightStore::kPacked and kMapped
    std::vector<float> wt;  ///< WeightStore::kFp32: W transposed, [in][out]
  };

  /// \brief The shape of a llama-architecture GGUF from its metadata alone (no weights read): what
  /// commands check their settings against before the load.
  static LlamaConfig read_config(const gguf::GgufFile& f);
  /// \brief Loads a llama-architecture GGUF; errors name the missing key or tensor. The model
  /// keeps no reference to the file.
  static LlamaModel load(const gguf::GgufFile& f, WeightStore store = WeightStore::kMapped);
  /// \brief Loads a checkpoint folder (its config: c.config()); errors name the shard file and
  /// the tensor (missing, shape, dtype). F32/F16/BF16 matrices: kMapped multiplies them in the
  /// mapping (the model shares the mapping's ownership, so `c` may go), kPacked copies them into
  /// fp32 / 16-bit panels (each tensor's pages released once packed); F8_E4M3 ones with their
  /// weight_scale / weight_scale_inv are dequantized into fp32 panels either way.
  static LlamaModel load(const HfCheckpoint& c, WeightStore store = WeightStore::kMapped);
  /// \brief A model path's config without its weights: a folder's config.json, a GGUF's
  /// metadata (HfCheckpoint::is_folder decides).
  static LlamaConfig read_config(const std::string& path);
  /// \brief Loads a model path: a checkpoint folder or a GGUF file.
  static LlamaModel load(const std::string& path, WeightStore store = WeightStore::kMapped);
  const LlamaConfig& config() const { return cfg_; }
  /// \brief The attention backend of every later forward pass (default kCpu). Within one
  /// backend, chunked prefill and token-by-token decode give bit-identical logits; between the
  /// two, attention outputs differ by float rounding (tests/model/llama_test.cpp bounds the KLD).
  /// Backend cuda (model/llama_cuda.cpp) runs the whole pass on the GPU, a pass of n > 1 tokens
  /// in chunks of device_chunk() tokens (one causal attention call a layer a chunk), a single
  /// token as a decode step, over a cache whose sides it moves to device memory on its first
  /// pass (an empty cache; LlamaCache holds host sides until then); its chunked prefill and
  /// token-by-token decode differ by float rounding (the attention launch's split of the
  /// contexts; tests/cuda/model_cuda_test.cpp states the tolerance). Throws kvq::Error:
  /// require_host's for a backend the model does not run, cuda_unavailable()'s line for cuda
  /// without a device.
  void set_backend(AttentionBackend b);
  AttentionBackend backend() const { return backend_; }
  /// \brief How backend cuda holds the weights in device memory: bf16 (the default: half the
  /// bytes a decode step reads; each weight rounded to bf16) or float32 (the host's values
  /// exactly). Uploaded once, on the first backend cuda pass after a change.
  enum class DeviceWeights { kBf16, kFp32 };
  void set_device_weights(DeviceWeights w);
  /// \brief Backend cuda's prefill chunk: a forward pass of n > 1 tokens runs in chunks of at
  /// most `chunk` tokens (cuda::DeviceModel::prefill, kernels/backend.h prefill_device), each
  /// chunk's dense part over its rows at once and its attention one causal call a layer; 1 runs
  /// every token as a decode step (token by token, for comparison). Throws kvq::Error for
  /// chunk < 1. Default kDefaultDeviceChunk.
  static constexpr int64_t kDefaultDeviceChunk = 256;
  void set_device_chunk(int64_t chunk);
  int64_t device_chunk() const { return device_chunk_; }
  /// \brief Bytes of the weights in device memory (0 before the first backend cuda pass).
  int64_t device_weight_bytes() const;
  /// \brief Every weight into `dev` (a device model of this model's shape, device_model_shape):
  /// backend cuda's upload, rows as weight_row gives them for every WeightStore. Public for the
  /// tests, which run it against a host stand-in of the device.
  void upload_device_weights(cuda::DeviceModel& dev) const;
  /// \brief Bytes of the weights, held in memory or mapped from the file.
  size_t weight_bytes() const;
  /// \brief "Q4_1 (panels) x 210, Q8_0 (panels) x 1"-style summary of the weight formats.
  std::string weight_formats() const;

  /// \brief Runs `tokens` at positions cache.tokens() .. + n - 1, appending their K/V to the
  /// cache. Writes logits [n, vocab] for every position when `all_logits`, else only for the last
  /// ([1, vocab]). `threads` 0 = all cores; one persistent thread team runs the whole pass (the
  /// matrix products split output panels; attention splits positions, or a single position's
  /// context segments on backend cpu and its (position, kv head) pairs on backend ref).
  void forward(std::span<const int32_t> tokens, LlamaCache& cache, std::vector<float>& logits,
               bool all_logits, int threads = 0, const KvObserver& observe = {}) const;

  /// \brief Backend cuda's serving step: one token tokens[b] for each sequence b, at its cache's
  /// next position (caches[b]->tokens()), appended to caches[b]; logits [B, vocab]. Every layer's
  /// dense part runs over the B rows at once and its attention is one batched call over the B
  /// caches (kernels/cuda/device_model.h decode_batch; kernels/backend.h append_device_batch /
  /// attend_decode_device_batch). Each sequence's logits are decode's for it alone up to the
  /// attention launch's split of the contexts (float32 summation order; tests/cuda/
  /// model_cuda_test.cpp states the tolerance). The caches: distinct, one CacheOptions spec, each
  /// empty or written by backend cuda. Throws kvq::Error as forward does, naming the sequence,
  /// and on any other backend than cuda.
  void decode_batch(std::span<const int32_t> tokens, std::span<LlamaCache* const> caches,
                    std::vector<float>& logits) const;
  /// \brief Backend cuda: uploads the weights if not yet and holds activations for batches of up
  /// to `batch` sequences (cuda::DeviceModel::reserve_batch), so that decode_batch allocates
  /// nothing up to it. Throws on any other backend.
  void reserve_device_batch(int64_t batch) const;

  /// \brief RoPE on x [n, heads, head_dim] for positions pos0.. in the config's channel pairing
  /// (GGUF: adjacent pairs; checkpoint folders: rotate_half's, so K equals transformers'
  /// past_key_values); `sign` -1 rotates back.
  void rope(float* x, int64_t n, int64_t heads, int64_t pos0, float sign = 1.0f) const;

 private:
  struct Block {
    Eigen::VectorXf attn_norm, ffn_norm;
    Linear wq, wk, wv, wo, w_gate, w_up, w_down;
    Eigen::VectorXf bq, bk, bv, bo;  ///< biases (LlamaConfig::qkv_bias, o_bias), else empty
    Eigen::VectorXf q_norm, k_norm;  ///< per-head RMSNorm weights [head_dim] (qk_norm), else empty
  };
  template <class Source>
  static LlamaModel load_from(const Source& src, const LlamaConfig& c, WeightStore store);
  void apply(const Linear& l, const float* x, int64_t n, float* y, bool accumulate, int me,
             int members) const;
  void embed(int32_t id, float* out) const;
  struct CudaState;  // model/llama_cuda.cpp: the weights in device memory
  void forward_cuda(std::span<const int32_t> tokens, LlamaCache& cache, std::vector<float>& logits,
                    bool all_logits, const KvObserver& observe) const;
  // backend cuda, under team_'s mutex: the device model (weights uploaded on first use), and the
  // checks and device sides of a cache about to take n tokens (model/llama_cuda.cpp)
  CudaState& cuda_state() const;
  void prepare_cuda_cache(LlamaCache& cache, int64_t n) const;
  void weight_row(const Linear& l, int64_t r, float* out) const;  // row r of W [out][in]

  LlamaConfig cfg_;
  WeightStore store_ = WeightStore::kMapped;
  AttentionBackend backend_ = AttentionBackend::kCpu;
  Linear head_;        ///< output head [vocab][hidden]: output.weight, or the token embeddings
  Linear embed_;       ///< token embeddings when the file has its own output.weight (else head_)
  struct TeamSlot {    // the forward pass's thread teams, kept between calls
    std::mutex mutex;  // one forward pass at a time per model
    std::unique_ptr<ThreadTeam> team;      // `threads` members (all cores when kvq chooses)
    std::unique_ptr<ThreadTeam> solo;      // one member: AutoThreads' other choice
    std::unique_ptr<AutoThreads> chooser;  // threads = 0: the count per pass
  };
  std::shared_ptr<TeamSlot> team_ = std::make_shared<TeamSlot>();
  Eigen::VectorXf out_norm_;
  std::vector<Block> blocks_;
  std::vector<float> inv_freq_;
  DeviceWeights device_weights_ = DeviceWeights::kBf16;
  int64_t device_chunk_ = kDefaultDeviceChunk;
  mutable std::shared_ptr<CudaState> cuda_;  // made by the first backend cuda pass, under team_'s
                                             // mutex
};

}  // namespace kvq
