// Backend `cpu`, x86 attention blocks: KIVI codes in the exact mode (codes widened to float):
// per-channel key groups with tokens in the lanes (dot_channel_group, 512-bit) or transposed for
// the float kernels (transpose_words), and per-token values by channel span (acc_span).
#pragma once

#include "kernels/cpu/attention/x86/loaders.h"
#include "kernels/cpu/attention/x86/simd_math.h"

namespace kvq::cpu::KVQ_CPU_PATH_NS::attn {
// Internal to this path's attention sources: each file that includes it has its own copy (internal
// linkage), as when they were one translation unit, so the compiler inlines them as it did.
namespace {

/// o_i[d] += sum_j w[i * ldw + j - j0] * code_j[d] for rows [j0, j1) and d in [d0, d1), CW vectors
/// of W channels at a time (ld(j, d): W floats). Per element the same fma chain in row order
/// whatever W and CW. VPG < CW: the CW vectors span CW / VPG channel groups of VPG vectors each,
/// group g weighted by w + g * gstride, and [d0, d1) is a whole number of such spans (more
/// independent accumulators per row than one group's vectors give). Inter (W = 16): ld gives its
/// channels in kInter4 lane order, and the accumulators are held in that order.
template <int NQ, int CW, int W = 8, int VPG = CW, bool Inter = false, class L>
void acc_span(const float* w, int64_t ldw, int64_t j0, int64_t j1, const L& ld, float* o, int64_t D,
              int64_t d0, int64_t d1, int64_t gstride = 0) {
  using V = FVec<W>;
  static_assert(CW % VPG == 0);
  static_assert(!Inter || W == 16);
  constexpr int NG = CW / VPG;
  for (; d0 + W * CW <= d1; d0 += W * CW, w += NG * gstride) {
    typename V::T a[NQ * CW];
    for (int i = 0; i < NQ; ++i)
      for (int c = 0; c < CW; ++c) {
        a[i * CW + c] = V::load(o + i * D + d0 + W * c);
#if KVQ_CPU_AVX512
        if constexpr (Inter) a[i * CW + c] = to_inter4(a[i * CW + c]);
#endif
      }
    for (int64_t j = j0; j < j1; ++j) {
      typename V::T vv[CW];
      for (int c = 0; c < CW; ++c) vv[c] = ld(j, d0 + W * c);
      for (int i = 0; i < NQ; ++i)
        for (int g = 0; g < NG; ++g) {
          const auto pw = V::bcast(w + g * gstride + i * ldw + (j - j0));
          for (int c = g * VPG; c < (g + 1) * VPG; ++c)
            a[i * CW + c] = V::fma(pw, vv[c], a[i * CW + c]);
        }
    }
    for (int i = 0; i < NQ; ++i)
      for (int c = 0; c < CW; ++c) {
#if KVQ_CPU_AVX512
        if constexpr (Inter) a[i * CW + c] = from_inter4(a[i * CW + c]);
#endif
        V::store(o + i * D + d0 + W * c, a[i * CW + c]);
      }
  }
  if constexpr (CW > 1 && NG == 1) {
    if (d0 < d1) acc_span<NQ, 1, W, 1, Inter>(w, ldw, j0, j1, ld, o, D, d0, d1);
  }
}

#if KVQ_CPU_AVX512
/// Exact scores of a per-channel key group (bits 2, 4 or 8, G a multiple of 16; words
/// channel-major, word x of channel d at words[d * wpg + x]) for its tokens [j0, j0 + n), tokens in
/// the lanes: s_i[t] = base_i + sum_d qs_i[d] * code_t[d], the sum taken in channel order by one
/// fma per channel, 16 tokens a vector, two vectors (32 tokens) at a time where the group has them.
/// No horizontal sums and no transposed copy of the words.
template <int NQ, int B>
void dot_channel_group(const uint32_t* words, int64_t D, int64_t wpg, const float* qs,
                       const float* base, int64_t j0, int64_t n, float* s, int64_t lds) {
  constexpr bool kInter = kInterCodes<B>;
  auto slices = [&]<int S>(int64_t k) {  // tokens 16k .. 16k + 16 S - 1 of the group
    __m512 acc[NQ * S];
    for (auto& a : acc) a = _mm512_setzero_ps();
    for (int64_t d = 0; d < D; ++d) {
      const uint32_t* wd = words + d * wpg;
      __m512 f[S];
      for (int u = 0; u < S; ++u) f[u] = codes16<B, kInter>(wd, 16 * (k + u));  // 16 (k + u) on
      for (int i = 0; i < NQ; ++i) {
        const __m512 qv = _mm512_set1_ps(qs[i * D + d]);
        for (int u = 0; u < S; ++u) acc[i * S + u] = _mm512_fmadd_ps(qv, f[u], acc[i * S + u]);
      }
    }
    const int64_t a = std::max(j0, 16 * k), b = std::min(j0 + n, 16 * (k + S));
    for (int i = 0; i < NQ; ++i) {
      alignas(64) float tmp[16 * S];
      for (int u = 0; u < S; ++u) {
        __m512 x = _mm512_add_ps(acc[i * S + u], _mm512_set1_ps(base[i]));
        if constexpr (kInter) x = from_inter4(x);  // tokens back in order
        _mm512_store_ps(tmp + 16 * u, x);
      }
      for (int64_t t = a; t < b; ++t) s[i * lds + (t - j0)] = tmp[t - 16 * k];
    }
  };
  int64_t k = j0 / 16;
  const int64_t k1 = (j0 + n + 15) / 16;
  for (; k + 2 <= k1; k += 2) slices.template operator()<2>(k);
  if (k < k1) slices.template operator()<1>(k);
}
#endif

/// A key group's words, channel-major (words[d * wpg + x]), as wt[x * D + d]: word x of 8
/// consecutive channels in one vector.
inline void transpose_words(const uint32_t* words, int64_t D, int64_t wpg, uint32_t* wt) {
  if (wpg == 2) {  // kivi2 at G=32: split even / odd words of 8 channels
    const __m256i idx = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
    for (int64_t d = 0; d < D; d += 8) {
      const __m256i a = _mm256_permutevar8x32_epi32(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(words + 2 * d)), idx);
      const __m256i b = _mm256_permutevar8x32_epi32(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(words + 2 * d + 8)), idx);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(wt + d),
                          _mm256_permute2x128_si256(a, b, 0x20));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(wt + D + d),
                          _mm256_permute2x128_si256(a, b, 0x31));
    }
    return;
  }
  if (wpg == 4 && D % 8 == 0) {  // kivi4 at G=32: a 4 x 8 transpose per 8 channels
    const __m256i idx = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    auto pairs = [&](int64_t d) {  // channels d, d+1: [w(d,0) w(d+1,0) w(d,1) w(d+1,1) ...]
      return _mm256_permutevar8x32_epi32(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(words + 4 * d)), idx);
    };
    for (int64_t d = 0; d < D; d += 8) {
      const __m256i v0 = pairs(d), v1 = pairs(d + 2), v2 = pairs(d + 4), v3 = pairs(d + 6);
      const __m256i t0 = _mm256_unpacklo_epi64(v0, v1), t1 = _mm256_unpackhi_epi64(v0, v1);
      const __m256i t2 = _mm256_unpacklo_epi64(v2, v3), t3 = _mm256_unpackhi_epi64(v2, v3);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(wt + d),
                          _mm256_permute2x128_si256(t0, t2, 0x20));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(wt + D + d),
                          _mm256_permute2x128_si256(t1, t3, 0x20));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(wt + 2 * D + d),
                          _mm256_permute2x128_si256(t0, t2, 0x31));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(wt + 3 * D + d),
                          _mm256_permute2x128_si256(t1, t3, 0x31));
    }
    return;
  }
  for (int64_t d = 0; d < D; ++d)
    for (int64_t x = 0; x < wpg; ++x) wt[x * D + d] = words[d * wpg + x];
}

}  // namespace
}  // namespace kvq::cpu::KVQ_CPU_PATH_NS::attn
