// Attention over a quantized cache (CPU reference): decode for one query position, and causal
// prefill in which every position sees exactly the cache a token-by-token decode would hold.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "reference_cpu/kv_cache.h"

namespace kvq {

/// \brief o = softmax(q K^T / sqrt(d)) V for every query head over the whole cache.
/// q and out are [q_heads, dim] with q_heads a multiple of the kv heads (GQA: query head j reads
/// kv head j / (q_heads / kv_heads)). Parallel over kv heads with `threads` (0: all cores).
void decode_attention(const float* q, int64_t q_heads, const SideStore& k, const SideStore& v,
                      float* out, int threads = 1);

/// \brief Causal prefill: q is [T, q_heads, dim] for the cache's T tokens; position i attends
/// to tokens 0..i as a cache holding i + 1 tokens stores them: tokens below
/// quantized_tokens_at(i + 1) from codes, the rest exact from the raw k_raw / v_raw
/// ([T, heads, dim], the tokens that were appended). out is [T, q_heads, dim].
void prefill_attention(const float* q, int64_t q_heads, const SideStore& k, const SideStore& v,
                       const Tensor3& k_raw, const Tensor3& v_raw, float* out, int threads = 1);

/// \brief Softmax probabilities of one query over the whole cache (for attention metrics):
/// [q_heads, tokens].
std::vector<double> attention_probs(const float* q, int64_t q_heads, const SideStore& k);

/// \brief Attention-level comparison of a cache against a reference cache for the same query.
struct AttentionMetrics {
  double kl = 0;           ///< mean over query heads of KL(p_ref || p)
  double output_nmse = 0;  ///< ||o - o_ref||^2 / ||o_ref||^2 over all heads
  double topk_overlap = 0; ///< mean |topk(p) & topk(p_ref)| / k
};

/// \brief Compares attention of `q` over (k, v) against (k_ref, v_ref), with top-k overlap at k.
AttentionMetrics attention_metrics(const float* q, int64_t q_heads, const SideStore& k_ref,
                                   const SideStore& v_ref, const SideStore& k, const SideStore& v,
                                   int topk = 32);

}  // namespace kvq
