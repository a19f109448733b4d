// A Llama-family decoder's weights in device memory and the dense part of one decode step on the
// GPU (batch 1, one token), as plain C++ (no CUDA types: model/llama_cuda.cpp includes it). The
// attention between attention_in and attention_out is the caller's: the model appends K and V to
// its backend cuda cache sides and runs backend cuda's decode attention (kernels/backend.h) over
// them, so every cache scheme backend cuda stores runs here.
//
// One step, all on the legacy default stream (model_kernels.h's kernels):
//   embed(id)            x = E[id]
//   attention_in(l, a)   h = RMSNorm(x) * attn_norm; q, k, v = Wq h, Wk h, Wv h (+ biases);
//                        qwen3's per-head q/k RMSNorm; RoPE at the angles `a` (q|k|v stay in
//                        device memory: device_qkv())
//   attention_out(l)     x += Wo o (+ o bias), o the attention output the caller wrote into
//                        device_attn(); h = RMSNorm(x) * ffn_norm;
//                        x += Wdown (SiLU(Wgate h) * Wup h)
//   logits(out)          out = Whead RMSNorm(x) * out_norm, to the host (a step's one copy back)
// Weights are uploaded once (set_matrix / set_vector), as bf16 (half the bytes a token reads; the
// rounding is the only change from the CPU's values) or float32 (the CPU's values exactly).
//
// decode_batch runs the same step for B sequences at once, one new token each at its own position
// (a serving step): every kernel above over B rows (the products load each weight once for up to
// kGemvCols rows; bf16 weights at gemm::kGemmMinRows rows or more go to the tensor-core GEMM,
// kernels/cuda/gemm_bf16.h), the attention one call a layer over all B (AttendBatch), the logits
// [B, vocab] back in one copy. With float32 weights, or bf16 below the GEMM's rows, each row
// computes exactly what decode computes for that sequence alone (the same float operations in the
// same order; model_kernels.h), so a batched step differs from B single steps only through the
// attention call; the GEMM's rows differ from the gemv's by its summation order and x's 2^-16
// split (gemm_rel_bound). Chunked prefill's chunks take the same dispatch. Activations are held for
// the largest batch asked (reserve_batch; activation_bytes says how much).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cuda/model_kernels.h"

namespace kvq::cuda {

/// \brief The shape DeviceModel needs (model/arch.h's LlamaConfig, restated below the model layer).
struct DeviceModelShape {
  int64_t layers = 0, hidden = 0, heads = 0, kv_heads = 0, head_dim = 0, ffn = 0, vocab = 0;
  float eps = 1e-5f;
  bool qkv_bias = false, o_bias = false, qk_norm = false;
  bool rope_half = true;  ///< rotate_half's channel pairs (checkpoint folders), else adjacent
  bool tied = true;       ///< the token embeddings are the output head
  int64_t q_dim() const { return heads * head_dim; }
  int64_t kv_dim() const { return kv_heads * head_dim; }
};

class DeviceModel {
 public:
  /// Matrix and Vector are model/arch.h's TensorRole split by shape (kHead is its kOutput). They
  /// are not TensorRole itself because kernels/cuda/ sits below model/ and may not include it
  /// (scripts/check-layers.py); model/llama_cuda_upload.cpp holds the one translation and
  /// static_asserts that the three agree (every role exactly once, these in declaration order).
  enum class Matrix { kQ, kK, kV, kO, kGate, kUp, kDown, kHead, kEmbed };
  enum class Vector {
    kAttnNorm,
    kFfnNorm,
    kQBias,
    kKBias,
    kVBias,
    kOBias,
    kQNorm,
    kKNorm,
    kOutNorm
  };

  /// \brief Checks the shape (throws kvq::Error naming what is wrong) and allocates the
  /// activations; `bf16`: weights held as bf16, else float32. Without a device the first
  /// allocation throws (the model checks cuda_unavailable() before it gets here).
  DeviceModel(const DeviceModelShape& s, bool bf16);
  ~DeviceModel();
  DeviceModel(const DeviceModel&) = delete;
  DeviceModel& operator=(const DeviceModel&) = delete;

  /// \brief [rows, cols] of matrix `m` (kHead / kEmbed: `layer` ignored).
  std::pair<int64_t, int64_t> matrix_shape(Matrix m) const;
  /// \brief Length of vector `v` (0 when the shape has none: biases / q-k norms off).
  int64_t vector_size(Vector v) const;
  /// \brief Uploads matrix `m` of `layer`: row(r, out) writes row r of W [rows][cols] as float
  /// (converted to bf16 here when held as bf16), in chunks through a bounded host buffer.
  void set_matrix(Matrix m, int layer, const std::function<void(int64_t, float*)>& row);
  /// \brief Uploads vector `v` of `layer` (vector_size(v) floats).
  void set_vector(Vector v, int layer, const float* x);
  /// \brief Empty when every weight the shape needs was set, else the first missing one's name.
  std::string missing() const;
  /// \brief Bytes of weights in device memory (what one decode step reads from them).
  int64_t weight_bytes() const;
  bool bf16() const;
  const DeviceModelShape& shape() const;

  /// \brief DEVICE memory: q|k|v after attention_in (q_dim() + 2 kv_dim() floats: q, then k, then
  /// v), and the attention output [q_dim()] attention_out reads. The caller's cache sides append
  /// k and v from there and its decode call reads q and writes the output there
  /// (kernels/backend.h's append_device / attend_decode_device): no host copy between them.
  const float* device_qkv() const;
  float* device_attn();

  /// \brief x = the embedding of token `id` (0 <= id < vocab, checked).
  void embed(int32_t id);
  /// \brief Layer `layer`'s q, k, v of x at the rotation `a` (one gemv over the stacked Wq|Wk|Wv)
  /// into device_qkv() (queued; nothing copied).
  void attention_in(int layer, const model::RopeAngles& a);
  /// \brief The rest of layer `layer` with the attention output in device_attn() (gate and up as
  /// one gemv over the stacked Wgate|Wup).
  void attention_out(int layer);
  /// \brief The logits [vocab] of x, copied to the host.
  void logits(float* out);

  /// \brief The attention between attention_in and attention_out, the caller's: q|k|v of layer
  /// `layer` in device_qkv() (the token at position `pos`) in, its output [q_dim()] into
  /// device_attn(), both DEVICE pointers.
  using Attend = std::function<void(int layer, int64_t pos, const float* qkv, float* attn)>;
  /// \brief The attention of a batched step, the caller's: layer `layer`'s q|k|v of the B rows in
  /// `qkv` [B][q_dim() + 2 kv_dim()] (row b: sequence b's q, then k, then v), its q alone in `q`
  /// [B][q_dim()] (contiguous: what the decode launch reads), the output [B][q_dim()] into
  /// `attn`; all DEVICE pointers.
  using AttendBatch = std::function<void(int layer, const float* qkv, const float* q, float* attn)>;
  /// \brief Device bytes of the activations for batches of up to `batch` rows: x, h, q|k|v, q,
  /// the attention output, gate|up and the logits (float32 a row each), and the step's upload
  /// (batch RopeAngles and token ids). Host arithmetic (tests/kernels/cuda/).
  static int64_t activation_bytes(const DeviceModelShape& s, int64_t batch);
  /// \brief Holds activations for batches of up to `batch` rows (grows only; the constructor holds
  /// batch 1). Throws kvq::Error for batch < 1.
  void reserve_batch(int64_t batch);
  /// \brief The largest batch the activations hold now.
  int64_t batch_capacity() const;
  /// \brief One decode step of B = tokens.size() sequences: sequence b's token tokens[b] at
  /// position positions[b] (RoPE's angles; the caller's caches hold that many tokens before it).
  /// Grows the activations to B if needed (reserve_batch), uploads the step's token ids and
  /// angles in one copy, runs embed, every layer's dense part over the B rows with `attend`
  /// between its halves, and copies logits [B, vocab] to `logits` (the step's one copy back).
  void decode_batch(std::span<const int32_t> tokens, std::span<const int64_t> positions,
                    std::span<const float> inv_freq, const AttendBatch& attend, float* logits);

  /// \brief The attention of a prefill chunk, the caller's: layer `layer`'s q|k|v of the chunk's
  /// n tokens at positions pos0 .. pos0 + n - 1 in `qkv` [n][q_dim() + 2 kv_dim()], q alone in `q`
  /// [n][q_dim()], the output [n][q_dim()] into `attn`; all DEVICE pointers (kernels/backend.h's
  /// prefill_device appends the chunk's k and v and runs the causal call over them).
  using AttendChunk = std::function<void(int layer, int64_t pos0, int64_t n, const float* qkv,
                                         const float* q, float* attn)>;
  /// \brief The chunks prefill cuts n tokens into: (first token, tokens) pairs of at most `chunk`
  /// tokens each, in order, covering [0, n) (host arithmetic; throws kvq::Error for chunk < 1).
  static std::vector<std::pair<int64_t, int64_t>> prefill_chunks(int64_t n, int64_t chunk);
  /// \brief Tokens at positions pos0, pos0 + 1, ... in chunks (prefill_chunks): each chunk one
  /// batched step of its rows at their positions (decode_batch's dense part: row i computes what
  /// decode computes for that token), one `attend` a layer over the whole chunk; the logits of
  /// every token into logits [n, vocab] (all_logits) or of the last into logits [vocab] (the head
  /// runs over those rows only). Activations grow to `chunk` rows (reserve_batch).
  void prefill(std::span<const int32_t> tokens, int64_t pos0, std::span<const float> inv_freq,
               int64_t chunk, const AttendChunk& attend, float* logits, bool all_logits);

  /// \brief Decode steps for tokens at positions pos0, pos0 + 1, ... (inv_freq: RoPE's per-pair
  /// frequencies, rope_angles): embed, every layer's attention_in / attend / attention_out, and the
  /// logits [vocab] of every token into logits [n, vocab] (all_logits) or of the last into
  /// logits [vocab].
  void decode(std::span<const int32_t> tokens, int64_t pos0, std::span<const float> inv_freq,
              const Attend& attend, float* logits, bool all_logits);

 private:
  struct Impl;
  std::unique_ptr<Impl> p_;
};

}  // namespace kvq::cuda
