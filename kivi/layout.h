// Where the streaming KIVI cache (kivi/cache.h) keeps each group's packed words and fp16
// parameters, defined once for host and device. One layer, one side (K or V), H heads, D channels,
// G the group, b the bits, cpw = codes_per_word(b) (kivi/pack.h).
//
// Per-channel side (KIVI keys: statistics per (head, channel) over G consecutive tokens, packed
// along tokens). Quantized token groups g = 0 .. quantized_tokens/G - 1:
//   words   [((g*H + h)*D + d) * words_for(G, b) + w]; word w holds tokens g*G + w*cpw + i at
//           bits [i*b, (i+1)*b)
//   scale, min (fp16 bits) [(g*H + h)*D + d]
//
// Per-token side (KIVI values: statistics per (token, head) over G consecutive channels, packed
// along channels). n_cg = ceil(D / G) channel groups, group c covering channels
// [c*G, c*G + len_c), len_c = min(G, D - c*G) (only the last one may be shorter):
//   words   [(t*H + h) * words_per_token_head + c * words_for(G, b) + w],
//           words_per_token_head = sum over c of words_for(len_c, b); word w of group c holds
//           channels c*G + w*cpw + i at bits [i*b, (i+1)*b)
//   scale, min (fp16 bits) [(t*H + h)*n_cg + c]
//
// Symmetric schemes store no min. Tokens not yet quantized (the residual window) are kept
// exactly, float32 [n_resid, H, D], oldest first.
#pragma once

#include "core/hostdev.h"
#include "kivi/pack.h"

namespace kvq::kivi {

/// \brief Layout of the per-channel side (groups of G tokens per (head, channel)).
struct ChannelLayout {
  int64_t heads = 0;
  int64_t dim = 0;
  int group = 0;  ///< G tokens
  int bits = 0;

  KVQ_HD int64_t words_per_group() const { return words_for(group, bits); }
  /// \brief Index of the scale / min of token group g, head h, channel d.
  KVQ_HD int64_t param_index(int64_t g, int64_t h, int64_t d) const {
    return (g * heads + h) * dim + d;
  }
  /// \brief Index of the first word of token group g, head h, channel d.
  KVQ_HD int64_t word_index(int64_t g, int64_t h, int64_t d) const {
    return param_index(g, h, d) * words_per_group();
  }
  /// \brief Words / parameters stored for the first tq (a multiple of G) tokens.
  KVQ_HD int64_t words_for_tokens(int64_t tq) const {
    return tq / group * heads * dim * words_per_group();
  }
  KVQ_HD int64_t params_for_tokens(int64_t tq) const { return tq / group * heads * dim; }
  /// \brief The code of quantized token t, head h, channel d.
  KVQ_HD uint32_t code(const uint32_t* words, int64_t t, int64_t h, int64_t d) const {
    return unpack_one(words + word_index(t / group, h, d), t % group, bits);
  }
};

/// \brief Layout of the per-token side (groups of G channels per (token, head)).
struct TokenLayout {
  int64_t heads = 0;
  int64_t dim = 0;
  int group = 0;  ///< G channels (<= dim)
  int bits = 0;

  /// \brief n_cg = ceil(D / G).
  KVQ_HD int64_t channel_groups() const { return (dim + group - 1) / group; }
  /// \brief Channels in group c: G, or what is left for the last one.
  KVQ_HD int group_len(int64_t c) const {
    return static_cast<int>(dim - c * group < group ? dim - c * group : group);
  }
  /// \brief Offset of group c's words within one (token, head): c * words_for(G, b).
  KVQ_HD int64_t word_offset(int64_t c) const { return c * words_for(group, bits); }
  KVQ_HD int64_t words_per_token_head() const {
    const int64_t last = channel_groups() - 1;
    return word_offset(last) + words_for(group_len(last), bits);
  }
  /// \brief Index of the first word of token t, head h, channel group c.
  KVQ_HD int64_t word_index(int64_t t, int64_t h, int64_t c) const {
    return (t * heads + h) * words_per_token_head() + word_offset(c);
  }
  /// \brief Index of the scale / min of token t, head h, channel group c.
  KVQ_HD int64_t param_index(int64_t t, int64_t h, int64_t c) const {
    return (t * heads + h) * channel_groups() + c;
  }
  KVQ_HD int64_t words_for_tokens(int64_t tq) const { return tq * heads * words_per_token_head(); }
  KVQ_HD int64_t params_for_tokens(int64_t tq) const { return tq * heads * channel_groups(); }
  /// \brief The code of quantized token t, head h, channel d.
  KVQ_HD uint32_t code(const uint32_t* words, int64_t t, int64_t h, int64_t d) const {
    return unpack_one(words + word_index(t, h, d / group), d % group, bits);
  }
};

}  // namespace kvq::kivi
