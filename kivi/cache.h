// The streaming KIVI cache of one side (K or V) of one layer: tokens arrive in appends of any
// size; the old ones are quantized in groups (kivi/minmax.h), packed (kivi/pack.h) and laid out
// as kivi/layout.h says; the recent ones stay exact in the residual window.
//
// Which tokens leave the residual window on an append is kivi/append_plan.h's one plan (the
// REFERENCE.md section 3 rules are stated there): per-channel, whole blocks of B tokens flush
// together; per-token, a sliding window of R tokens. Both depend on the token count only, so any
// partition of the same tokens into appends (a prefill, chunks, one token at a time, empty
// appends) stores bit-identical bytes. Nothing quantized is ever quantized again; an append costs
// O(n * H * D) plus amortized O(H * D) per token of window bookkeeping.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/footprint.h"
#include "core/spec.h"
#include "core/tensor.h"
#include "kivi/append_plan.h"
#include "kivi/layout.h"

namespace kvq::kivi {

/// \brief Group quantizers a backend may lend a SideCache in place of the portable loops of
/// kivi/cache.cpp. Each must write exactly the bytes those write (backend cpu's, in
/// kernels/cpu/kivi.h, are tested bit for bit against this cache). Null: the portable loop.
struct GroupQuantizers {
  /// One token group of the per-channel side, all `cols` columns: element i of column c is
  /// x[i * cols + c], i < n; writes words[c * words_for(n, bits) + w], scales[c], mins[c].
  void (*columns)(const float* x, int64_t cols, int n, int bits, bool sym, uint32_t* words,
                  uint16_t* scales, uint16_t* mins) = nullptr;
  /// ceil(dim / group) per-token groups of `group` contiguous channels (the last may be
  /// shorter), laid out as TokenLayout says for one (token, head).
  void (*row)(const float* x, int64_t dim, int group, int bits, bool sym, uint32_t* words,
              uint16_t* scales, uint16_t* mins) = nullptr;
};

/// \brief One side (K or V) of one layer's KIVI cache: packed codes, fp16 scales and minima,
/// and the exact float32 residual window.
class SideCache {
 public:
  /// \brief A cache for `role`'s side of `spec` (its axis is spec.axis(role)) with `heads` kv
  /// heads of `head_dim` channels. Throws kvq::Error naming the value on bits outside
  /// {2, 3, 4, 8}, a group larger than head_dim on the per-token side, g=dim or an R that is not
  /// a multiple of G on the per-channel side, negative R, or a non-positive shape.
  /// `quantizers` replaces the portable group loops (same bytes; see GroupQuantizers).
  SideCache(const IntSpec& spec, Role role, int64_t heads, int64_t head_dim,
            const GroupQuantizers& quantizers = {});

  /// \brief Appends n >= 0 tokens x[n, heads, head_dim] (float32, C order) and quantizes those
  /// that leave the residual window.
  void append(const float* x, int64_t n);

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
  /// \brief The side's residual rule (kivi/append_plan.h), which every append carries out.
  AppendRule append_rule() const { return AppendRule{axis_, group_, spec_.residual}; }

  /// \brief Packed codes of the quantized tokens (kivi/layout.h).
  std::span<const uint32_t> words() const { return words_; }
  /// \brief fp16 bits of the group scales (kivi/layout.h).
  std::span<const uint16_t> scales() const { return scales_; }
  /// \brief fp16 bits of the group minima, same indexing as scales(); empty for sym.
  std::span<const uint16_t> mins() const { return mins_; }
  /// \brief The exact residual tokens, float32 [residual_tokens(), heads, head_dim], oldest first.
  std::span<const float> residual() const {
    return {resid_.data() + resid_start_ * row_, static_cast<size_t>(resid_count_ * row_)};
  }
  /// \brief Index arithmetic of the per-channel side's storage (axis() == Axis::Channel).
  ChannelLayout channel_layout() const;
  /// \brief Index arithmetic of the per-token side's storage (axis() == Axis::Token).
  TokenLayout token_layout() const;

  /// \brief The values the cache reads back, [tokens(), heads, head_dim]: dequantized codes for
  /// the quantized tokens, the exact residual for the rest.
  Tensor3 dequantize() const;
  /// \brief Bytes held, by the one formula (kvq::footprint): words * 4, scales and minima * 2,
  /// residual elements * kResidualBytesPerElement.
  Footprint footprint() const;

 private:
  /// Quantizes `count` tokens src[count, H, D] after those stored, along the side's axis.
  void quantize(const float* src, int64_t count);
  void quantize_channel_blocks(const float* src, int64_t count);
  void quantize_token_rows(const float* src, int64_t count);
  void push_residual(const float* src, int64_t count);
  void drop_residual(int64_t count);
  const float* residual_row(int64_t i) const { return resid_.data() + (resid_start_ + i) * row_; }

  IntSpec spec_;
  Role role_;
  Axis axis_;
  int64_t heads_, dim_, row_;  // row_ = heads * head_dim floats per token
  int group_;
  GroupQuantizers quant_;
  int64_t tokens_ = 0, quantized_ = 0;
  std::vector<uint32_t> words_;
  std::vector<uint16_t> scales_, mins_;
  // Residual window: live tokens resid_[resid_start_ .. resid_start_ + resid_count_) (in rows);
  // the dead prefix left by the sliding window is reclaimed once it outgrows the live part.
  std::vector<float> resid_;
  int64_t resid_start_ = 0, resid_count_ = 0;
  // Scratch of the batched per-channel loops (a few floats / words per (head, channel)).
  std::vector<float> fscratch_;
  std::vector<uint32_t> uscratch_;
};

}  // namespace kvq::kivi
