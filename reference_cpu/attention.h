// Attention over a quantized cache (CPU reference): decode for one query position, and causal
// prefill in which every position sees exactly the cache a token-by-token decode would hold.
#pragma once

#include <cstdint>
#include <vector>

#include "cache/side.h"
#include "core/tensor.h"

namespace kvq {

/// \brief o = softmax(q K^T / sqrt(d)) V for every query head over the whole cache.
/// q and out are [q_heads, dim] with q_heads a multiple of the kv heads (GQA: query head j reads
/// kv head j / (q_heads / kv_heads)). Parallel over kv heads with `threads` (0: all cores).
/// `t_end` >= 0 attends to the first t_end tokens only (a prefix of the cache).
void decode_attention(const float* q, int64_t q_heads, const SideStore& k, const SideStore& v,
                      float* out, int threads = 1, int64_t t_end = -1);

/// \brief Causal attention for n new positions t_begin .. t_begin + n - 1 over a cache that now
/// holds t_begin + n tokens. Position i attends to tokens 0..i exactly as a cache holding i + 1
/// tokens stores them: tokens below quantized_tokens_at(i + 1) from the codes, the rest exact from
/// k_exact / v_exact (which must start at or below quantized_tokens_at(t_begin + 1)). q and out are
/// [n, q_heads, dim]. With t_begin = 0 and the raw tensors as exact tails this is causal prefill;
/// a chunk after earlier ones passes the cache's exact tail from before the append (see
/// SideStore::exact_tail) followed by the chunk's raw values.
/// `window` > 0: position i attends to tokens i - window + 1 .. i only (a sliding window, as
/// transformers' sliding_window mask); the older ones get probability 0.
void causal_attention(const float* q, int64_t n, int64_t q_heads, int64_t t_begin,
                      const SideStore& k, const SideStore& v, ExactTail k_exact, ExactTail v_exact,
                      float* out, int threads = 1, int64_t window = 0);

/// \brief The checks causal_attention makes (throws kvq::Error naming what is wrong).
void causal_attention_check(int64_t n, int64_t q_heads, int64_t t_begin, const SideStore& k,
                            const SideStore& v, ExactTail k_exact, ExactTail v_exact);

/// \brief One work item of causal_attention, unchecked: position item / kv_heads, kv head
/// item % kv_heads (its nq query heads). Items are independent and each is computed the same way
/// on any thread, so a caller with its own thread team may hand them out in any order.
/// `scratch` is resized as needed.
void causal_attention_item(const float* q, int64_t q_heads, int64_t t_begin, const SideStore& k,
                           const SideStore& v, ExactTail k_exact, ExactTail v_exact, float* out,
                           int64_t item, std::vector<float>& scratch, int64_t window = 0);

/// \brief Causal prefill of a cache holding exactly the T tokens of k_raw / v_raw ([T, H, D]):
/// causal_attention with t_begin = 0 and the raw tensors as exact tails.
void prefill_attention(const float* q, int64_t q_heads, const SideStore& k, const SideStore& v,
                       const Tensor3& k_raw, const Tensor3& v_raw, float* out, int threads = 1);

/// \brief Softmax probabilities of one query over the whole cache (for attention metrics):
/// [q_heads, tokens].
std::vector<double> attention_probs(const float* q, int64_t q_heads, const SideStore& k);

/// \brief Attention-level comparison of a cache against a reference cache for the same query.
struct AttentionMetrics {
  double kl = 0;            ///< mean over query heads of KL(p_ref || p)
  double output_nmse = 0;   ///< ||o - o_ref||^2 / ||o_ref||^2 over all heads
  double topk_overlap = 0;  ///< mean |topk(p) & topk(p_ref)| / k
};

/// \brief Compares attention of `q` over (k, v) against (k_ref, v_ref), with top-k overlap at k.
AttentionMetrics attention_metrics(const float* q, int64_t q_heads, const SideStore& k_ref,
                                   const SideStore& v_ref, const SideStore& k, const SideStore& v,
                                   int topk = 32);

}  // namespace kvq
