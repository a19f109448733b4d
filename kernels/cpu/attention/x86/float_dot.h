// Backend `cpu`, x86 attention blocks: the float dot products and accumulations over any row
// loader (loaders.h): scores (dot) and outputs (accumulate) of one kv head, and of every kv head
// in address order (dot_heads / acc_heads, their stream forms with a prefetch ahead). The exact
// mode of every side kind, and the exact window of every side, goes through these.
#pragma once

#include "kernels/cpu/attention/x86/loaders.h"
#include "kernels/cpu/attention/x86/simd_math.h"

namespace kvq::cpu::KVQ_CPU_PATH_NS::attn {
// Internal to this path's attention sources: each file that includes it has its own copy (internal
// linkage), as when they were one translation unit, so the compiler inlines them as it did.
namespace {

/// The score arithmetic every float dot kernel shares, and so the definition of a score on this
/// backend: for U loader rows and NQ queries each (row u's queries at q[u] + i * D),
/// res[i * U + u] = the lane-wise fma chain over d in steps of 8, then hsum4's fixed tree; where
/// the loader has a 16-float form (Wide<L>) and D is a multiple of 16, the chain runs in steps of
/// 16 and its two halves are added before the tree. Which rows go together, and in which order
/// blocks are taken, never changes a score.
template <int NQ, int U, bool kOneQ = false, class L>
inline void dot_core(const float* const* q, const int64_t* rows, int64_t D, const L& ld,
                     float* res) {
  // kOneQ: every row's queries are q[0]'s, loaded once per channel vector for all U rows
  auto qv = [&](int u) { return q[kOneQ ? 0 : u]; };
  __m256 acc[NQ * U];
  bool wide = false;  // 16 channels a step
#if KVQ_CPU_AVX512
  if constexpr (Wide<L>) {
    wide = D % 16 == 0;
    if (wide) {
      __m512 az[NQ * U];
      for (auto& a : az) a = _mm512_setzero_ps();
      for (int64_t d = 0; d < D; d += 16) {
        __m512 kv[U];
        for (int u = 0; u < U; ++u) kv[u] = ld.z(rows[u], d);
        for (int i = 0; i < NQ; ++i) {
          const __m512 q0 = _mm512_loadu_ps(qv(0) + i * D + d);
          for (int u = 0; u < U; ++u)
            az[i * U + u] = _mm512_fmadd_ps(kOneQ ? q0 : _mm512_loadu_ps(qv(u) + i * D + d), kv[u],
                                            az[i * U + u]);
        }
      }
      for (int a = 0; a < NQ * U; ++a) acc[a] = fold16(az[a]);
    }
  }
#endif
  if (!wide) {
    for (auto& a : acc) a = _mm256_setzero_ps();
    for (int64_t d = 0; d < D; d += 8) {
      __m256 kv[U];
      for (int u = 0; u < U; ++u) kv[u] = ld(rows[u], d);
      for (int i = 0; i < NQ; ++i) {
        const __m256 q0 = _mm256_loadu_ps(qv(0) + i * D + d);
        for (int u = 0; u < U; ++u)
          acc[i * U + u] = _mm256_fmadd_ps(kOneQ ? q0 : _mm256_loadu_ps(qv(u) + i * D + d), kv[u],
                                           acc[i * U + u]);
      }
    }
  }
  constexpr int kN = NQ * U;
  for (int a = 0; a < kN; a += 4) {
    const __m256 z = _mm256_setzero_ps();
    alignas(16) float r[4];
    _mm_store_ps(r, hsum4(acc[a], a + 1 < kN ? acc[a + 1] : z, a + 2 < kN ? acc[a + 2] : z,
                          a + 3 < kN ? acc[a + 3] : z));
    for (int b = 0; b < 4 && a + b < kN; ++b) res[a + b] = r[b];
  }
}

// The row kernels' step lambdas are always_inline: GCC 12 once left acc_heads_w's out of line
// after an unrelated change to simd_tile_block (bf16 at 32k 1.10-1.15x the time, session 26).

/// s[i * lds + j] = <q_i, row j> for j < n, i < NQ; q is [NQ, D]. TT tokens at a time, so NQ * TT
/// independent accumulators hide the FMA latency.
template <int NQ, int TT, class L>
void dot_rows(const float* q, int64_t D, int64_t n, const L& ld, float* s, int64_t lds) {
  int64_t j = 0;
  auto step = [&]<int U>() __attribute__((always_inline)) {
    if constexpr (Prefetchable<L>) {
      if (j % kSubRows < U) prefetch_rows(ld, j / kSubRows * kSubRows + kSubRows, n, D);
    }
    const float* qs[U];
    int64_t rows[U];
    for (int u = 0; u < U; ++u) qs[u] = q, rows[u] = j + u;
    float res[NQ * U];
    dot_core<NQ, U, true>(qs, rows, D, ld, res);
    for (int i = 0; i < NQ; ++i)
      for (int u = 0; u < U; ++u) s[i * lds + j + u] = res[i * U + u];
    j += U;
  };
  while (j + TT <= n) step.template operator()<TT>();
  while (j < n) step.template operator()<1>();
}

/// o_i[d] += sum_j p[i * ldp + j] * row_j[d] for rows [j0, j1), d in [d0, D), CW vectors of
/// channels at a time (NQ * CW accumulators in registers).
template <int NQ, int CW, class L>
void acc_chunks(const float* p, int64_t ldp, int64_t j0, int64_t j1, const L& ld, float* o,
                int64_t D, int64_t d0) {
  for (; d0 + 8 * CW <= D; d0 += 8 * CW) {
    __m256 a[NQ * CW];
    for (int i = 0; i < NQ; ++i)
      for (int c = 0; c < CW; ++c) a[i * CW + c] = _mm256_loadu_ps(o + i * D + d0 + 8 * c);
    for (int64_t j = j0; j < j1; ++j) {
      __m256 vv[CW];
      for (int c = 0; c < CW; ++c) vv[c] = ld(j, d0 + 8 * c);
      for (int i = 0; i < NQ; ++i) {
        const __m256 pw = _mm256_broadcast_ss(p + i * ldp + j);
        for (int c = 0; c < CW; ++c) a[i * CW + c] = _mm256_fmadd_ps(pw, vv[c], a[i * CW + c]);
      }
    }
    for (int i = 0; i < NQ; ++i)
      for (int c = 0; c < CW; ++c) _mm256_storeu_ps(o + i * D + d0 + 8 * c, a[i * CW + c]);
  }
  if constexpr (CW > 1) {
    if (d0 < D) acc_chunks<NQ, 1>(p, ldp, j0, j1, ld, o, D, d0);
  }
}

/// o_i += sum_j p[i * ldp + j] * row_j for j < n, in sub-blocks of kSubRows rows that stay in L1
/// while every channel chunk passes over them; the next sub-block is prefetched meanwhile.
template <int NQ, int CW, class L>
void acc_rows(const float* p, int64_t ldp, int64_t n, const L& ld, float* o, int64_t D) {
  if constexpr (Prefetchable<L>) prefetch_rows(ld, 0, n, D);
  for (int64_t j0 = 0; j0 < n; j0 += kSubRows) {
    if constexpr (Prefetchable<L>) prefetch_rows(ld, j0 + kSubRows, n, D);
    acc_chunks<NQ, CW>(p, ldp, j0, std::min(n, j0 + kSubRows), ld, o, D, 0);
  }
}

/// Scores of every kv head, tokens in address order: for TT tokens at a time, each head's rows
/// (a token's heads are contiguous, so a step reads TT whole tokens) dotted with that head's NQ
/// queries (q is [H, NQ, D]) into s[h * hs + i * lds + t]. Row (t, h) is ld(t * H + h, .). Each
/// score is the arithmetic of dot_rows (the same lane-wise fma chain over d and the same
/// horizontal sum); only the order in which scores are produced differs.
template <int NQ, int TT, class L>
void dot_heads(const float* q, int64_t H, int64_t D, int64_t n, const L& ld, float* s, int64_t hs,
               int64_t lds) {
  int64_t t = 0;
  auto step = [&]<int U>() __attribute__((always_inline)) {
    for (int64_t h = 0; h < H; ++h) {
      const float* qs[U];
      int64_t rows[U];
      for (int u = 0; u < U; ++u) qs[u] = q + h * NQ * D, rows[u] = (t + u) * H + h;
      float res[NQ * U];
      dot_core<NQ, U, true>(qs, rows, D, ld, res);
      for (int i = 0; i < NQ; ++i)
        for (int u = 0; u < U; ++u) s[h * hs + i * lds + t + u] = res[i * U + u];
    }
    t += U;
  };
  while (t + TT <= n) step.template operator()<TT>();
  while (t < n) step.template operator()<1>();
}

/// Tokens a step of acc_heads_w takes per load and store of o: NQ * U broadcast weights fit 16
/// vector registers (bf16 at 32k, GQA 4, one thread: 4 tokens ran 10-15% faster than 2, whose
/// stores of o bound the loop; session 16, docs/benchmarks.md).
template <int NQ>
constexpr int kValueTokens = NQ <= 2   ? 8
                             : NQ <= 4 ? 4
                                       : 2;

/// Values of every kv head, tokens in address order: o_h,i += p[h * hs + i * ldp + t] * row (t, h),
/// kValueTokens<NQ> tokens of a head per load and store of o (the stores of o, not the rows, bound
/// a one-token step), their fmas applied in token order, W channels a vector (16 where the loader
/// has its 16-float form and D is a multiple of 16). Per element the same fma chain in token order
/// as acc_rows, so the same bits at either width and step. kPrefetch (a stream read once): the
/// next step's rows, up to `valid` rows from the base, are prefetched, each head's before its
/// own work (one burst per step held the loop on its row loads: 0.88-0.91x at 32k spread).
template <int NQ, int W, bool kPrefetch, class L, int kLoc = kL2>
void acc_heads_w(const float* p, int64_t hs, int64_t ldp, int64_t H, int64_t D, int64_t n,
                 const L& ld, float* o, int64_t valid) {
  using V = FVec<W>;
  int64_t t = 0;
  auto step = [&]<int U>() __attribute__((always_inline)) {
    for (int64_t h = 0; h < H; ++h) {
      if constexpr (kPrefetch && Prefetchable<L>)
        for (int u = 0; u < U; ++u)
          if (const int64_t r = (t + U + u) * H + h; r < valid) ld.template prefetch<kLoc>(r, D);
      float* oh = o + h * NQ * D;
      typename V::T pw[NQ * U];
      for (int i = 0; i < NQ; ++i)
        for (int u = 0; u < U; ++u) pw[i * U + u] = V::bcast(p + h * hs + i * ldp + t + u);
      for (int64_t d = 0; d < D; d += W) {
        typename V::T v[U];
        for (int u = 0; u < U; ++u) v[u] = V::row(ld, (t + u) * H + h, d);
        for (int i = 0; i < NQ; ++i) {
          typename V::T x = V::load(oh + i * D + d);
          for (int u = 0; u < U; ++u) x = V::fma(pw[i * U + u], v[u], x);
          V::store(oh + i * D + d, x);
        }
      }
    }
    t += U;
  };
  constexpr int U = kValueTokens<NQ>;
  while (t + U <= n) step.template operator()<U>();
  if constexpr (U > 2)
    while (t + 2 <= n) step.template operator()<2>();
  while (t < n) step.template operator()<1>();
}

template <int NQ, class L>
void acc_heads(const float* p, int64_t hs, int64_t ldp, int64_t H, int64_t D, int64_t n,
               const L& ld, float* o) {
#if KVQ_CPU_AVX512
  if constexpr (Wide<L>) {
    if (D % 16 == 0) return acc_heads_w<NQ, 16, false>(p, hs, ldp, H, D, n, ld, o, 0);
  }
#endif
  acc_heads_w<NQ, 8, false>(p, hs, ldp, H, D, n, ld, o, 0);
}

/// Rows a stream kernel prefetches ahead of the one it reads (4 KB of 256-byte rows; measured
/// at 8k context, fp32, D 64: 7 -> 10 GB/s per thread).
constexpr int64_t kStreamAhead = 16;

/// dot_heads for a stream read once (a decode step): rows strictly in address order, TT rows
/// (not tokens) per step, so every load instruction walks memory with one constant stride (twice
/// the bandwidth of dot_heads' token pairs on a cold stream), and rows kStreamAhead ahead are
/// prefetched, up to `valid` rows from the base (the rows that exist). Same bits as dot_heads.
template <int kLoc, int NQ, int TT, class L>
void dot_heads_stream_at(const float* q, int64_t H, int64_t D, int64_t n, const L& ld, float* s,
                         int64_t hs, int64_t lds, int64_t valid) {
  const int64_t rows = n * H;
  int64_t r = 0, t = 0, h = 0;  // row r's token and head
  auto step = [&]<int U>() __attribute__((always_inline)) {
    if constexpr (Prefetchable<L>)
      for (int u = 0; u < U; ++u)
        if (r + u + kStreamAhead < valid) ld.template prefetch<kLoc>(r + u + kStreamAhead, D);
    const float* qs[U];
    int64_t rs[U], tu[U], hu[U];
    for (int u = 0; u < U; ++u) {
      qs[u] = q + h * NQ * D, rs[u] = r + u, tu[u] = t, hu[u] = h;
      if (++h == H) h = 0, ++t;
    }
    float res[NQ * U];
    dot_core<NQ, U>(qs, rs, D, ld, res);
    for (int u = 0; u < U; ++u)
      for (int i = 0; i < NQ; ++i) s[hu[u] * hs + i * lds + tu[u]] = res[i * U + u];
    r += U;
  };
  while (r + TT <= rows) step.template operator()<TT>();
  while (r < rows) step.template operator()<1>();
}
template <int NQ, int TT, class L>
void dot_heads_stream(const float* q, int64_t H, int64_t D, int64_t n, const L& ld, float* s,
                      int64_t hs, int64_t lds, int64_t valid) {
  if constexpr (Prefetchable<L>)
    with_stream_loc(H, D * L::kElemBytes, [&]<int kLoc>() {
      dot_heads_stream_at<kLoc, NQ, TT>(q, H, D, n, ld, s, hs, lds, valid);
    });
  else
    dot_heads_stream_at<kL2, NQ, TT>(q, H, D, n, ld, s, hs, lds, valid);
}

/// acc_heads for a stream read once: one row at a time in address order, prefetched as in
/// dot_heads_stream. Same bits as acc_heads.
template <int kLoc, int NQ, class L>
void acc_heads_stream_at(const float* p, int64_t hs, int64_t ldp, int64_t H, int64_t D, int64_t n,
                         const L& ld, float* o, int64_t valid) {
#if KVQ_CPU_AVX512
  if constexpr (Wide<L>) {
    if (D % 16 == 0) return acc_heads_w<NQ, 16, true, L, kLoc>(p, hs, ldp, H, D, n, ld, o, valid);
  }
#endif
  int64_t r = 0;
  for (int64_t t = 0; t < n; ++t)
    for (int64_t h = 0; h < H; ++h, ++r) {
      float* oh = o + h * NQ * D;
      if constexpr (Prefetchable<L>)
        if (r + kStreamAhead < valid) ld.template prefetch<kLoc>(r + kStreamAhead, D);
      __m256 pw[NQ];
      for (int i = 0; i < NQ; ++i) pw[i] = _mm256_set1_ps(p[h * hs + i * ldp + t]);
      for (int64_t d = 0; d < D; d += 8) {
        const __m256 v = ld(r, d);
        for (int i = 0; i < NQ; ++i) {
          float* x = oh + i * D + d;
          _mm256_storeu_ps(x, _mm256_fmadd_ps(pw[i], v, _mm256_loadu_ps(x)));
        }
      }
    }
}
template <int NQ, class L>
void acc_heads_stream(const float* p, int64_t hs, int64_t ldp, int64_t H, int64_t D, int64_t n,
                      const L& ld, float* o, int64_t valid) {
  if constexpr (Prefetchable<L>)
    with_stream_loc(H, D * L::kElemBytes, [&]<int kLoc>() {
      acc_heads_stream_at<kLoc, NQ>(p, hs, ldp, H, D, n, ld, o, valid);
    });
  else
    acc_heads_stream_at<kL2, NQ>(p, hs, ldp, H, D, n, ld, o, valid);
}

/// The stream or the cached variant; `valid`: rows that exist from the loader's base.
template <bool kStream, int NQ, int TT, class L>
void dot_heads_any(const float* q, int64_t H, int64_t D, int64_t n, const L& ld, float* s,
                   int64_t hs, int64_t lds, int64_t valid) {
  if constexpr (kStream)
    dot_heads_stream<NQ, TT>(q, H, D, n, ld, s, hs, lds, valid);
  else
    dot_heads<NQ, TT>(q, H, D, n, ld, s, hs, lds);  // rows come from cache: no prefetch
}
template <bool kStream, int NQ, class L>
void acc_heads_any(const float* p, int64_t hs, int64_t ldp, int64_t H, int64_t D, int64_t n,
                   const L& ld, float* o, int64_t valid) {
  if constexpr (kStream)
    acc_heads_stream<NQ>(p, hs, ldp, H, D, n, ld, o, valid);
  else
    acc_heads<NQ>(p, hs, ldp, H, D, n, ld, o);
}

template <int NQ>
constexpr int kTokensPerStep = NQ == 1   ? 4
                               : NQ == 2 ? 4
                               : NQ <= 4 ? 2
                                         : 1;
template <int NQ>
constexpr int kChannelVectors = NQ == 1   ? 8
                                : NQ == 2 ? 4
                                : NQ <= 4 ? 2
                                          : 1;

template <int NQ, class L>
void dot(const float* q, int64_t D, int64_t n, const L& ld, float* s, int64_t lds) {
  dot_rows<NQ, kTokensPerStep<NQ>>(q, D, n, ld, s, lds);
}
template <int NQ, class L>
void accumulate(const float* p, int64_t ldp, int64_t n, const L& ld, float* o, int64_t D) {
  acc_rows<NQ, kChannelVectors<NQ>>(p, ldp, n, ld, o, D);
}

}  // namespace
}  // namespace kvq::cpu::KVQ_CPU_PATH_NS::attn
