// Backend `cpu`, x86 attention blocks: fp8 sides on AMX tiles (tdpbf16ps, where the build targets
// AMX-TILE and AMX-BF16: KVQ_CPU_AMX, and amx() holds): the int8 mode's bf16 products, and the
// exact mode's exact products (each operand split into three bf16 parts).
#pragma once

#include "kernels/cpu/attention/x86/fp8_bf16dot.h"
#include "kernels/cpu/attention/x86/loaders.h"
#include "kernels/cpu/attention/x86/simd_math.h"

namespace kvq::cpu::KVQ_CPU_PATH_NS::attn {

#if KVQ_CPU_AMX
/// Loads cfg into this thread's tiles unless they hold it already (id names the configuration,
/// the same in every file; nothing in the process releases the tiles). Outside the unnamed
/// namespace below: the tiles are the thread's, so `held` is one variable for every file of the
/// path (row_scores.cpp and row_values.cpp load different configurations).
inline void use_tiles(const TileConfig& cfg, int id) {
  thread_local int held = -1;
  if (held != id) {
    _tile_loadconfig(&cfg);
    held = id;
  }
}
#endif

// Internal to this path's attention sources: each file that includes it has its own copy (internal
// linkage), as when they were one translation unit, so the compiler inlines them as it did.
namespace {

#if KVQ_CPU_BF16DOT
#if KVQ_CPU_AMX
// ---- AMX tiles (fp8 sides in the int8 mode, where amx()) ---------------------------------------
// The same bf16 operands as fp8_dot_bf16 / fp8_acc_bf16 (the codes' bits under a bf16's, q *
// scale and the weights rounded to bf16, subnormal inputs and results flushed as vdpbf16ps does),
// multiplied by tdpbf16ps: one instruction takes 16 x 32 x 16 bf16 products (each output a float
// chain over 16 pairs), where vdpbf16ps takes 32. Keys put 16 tokens in the rows and the NQ
// queries in the columns; values put the NQ queries in the rows and 16 channels in the columns.
// On the session-21 Xeon a tdpbf16ps took ~17 ns whatever its shape (a zmm vdpbf16ps ~1 ns).

// The tile intrinsics name their registers in the instruction's text, so a tile number must be a
// literal: these take one at run time (a constant once inlined), tiles 0..6 (all the kernels
// name this way).
#define KVQ_TILE_SWITCH(t, op) \
  switch (t) {                 \
    case 0:                    \
      op(0);                   \
      break;                   \
    case 1:                    \
      op(1);                   \
      break;                   \
    case 2:                    \
      op(2);                   \
      break;                   \
    case 3:                    \
      op(3);                   \
      break;                   \
    case 4:                    \
      op(4);                   \
      break;                   \
    case 5:                    \
      op(5);                   \
      break;                   \
    default:                   \
      op(6);                   \
      break;                   \
  }
inline void tile_zero(int t) {
#define KVQ_OP(T) _tile_zero(T)
  KVQ_TILE_SWITCH(t, KVQ_OP)
#undef KVQ_OP
}
inline void tile_load(int t, const void* p, int64_t stride) {
#define KVQ_OP(T) _tile_loadd(T, p, stride)
  KVQ_TILE_SWITCH(t, KVQ_OP)
#undef KVQ_OP
}
inline void tile_store(int t, void* p, int64_t stride) {
#define KVQ_OP(T) _tile_stored(T, p, stride)
  KVQ_TILE_SWITCH(t, KVQ_OP)
#undef KVQ_OP
}
/// tmm(c) += tmm(a) x tmm(3 + k) (fp8_dot_amx: c, a = 0, 2 or 1, 7).
/// A switch over k alone: every case's registers distinct, which the assembler checks in each
/// emitted case (unoptimized builds emit them all).
inline void tile_dp_keys(int k, bool second) {
#define KVQ_OP(T)            \
  if (second)                \
    _tile_dpbf16ps(1, 7, T); \
  else                       \
    _tile_dpbf16ps(0, 2, T)
  switch (k) {
    case 0:
      KVQ_OP(3);
      break;
    case 1:
      KVQ_OP(4);
      break;
    case 2:
      KVQ_OP(5);
      break;
    default:
      KVQ_OP(6);
      break;
  }
#undef KVQ_OP
}
/// tmm(c) += tmm4 x tmm(5 + c % 2) (fp8_acc_amx).
inline void tile_dp_values(int c) {
  switch (c) {
    case 0:
      _tile_dpbf16ps(0, 4, 5);
      break;
    case 1:
      _tile_dpbf16ps(1, 4, 6);
      break;
    case 2:
      _tile_dpbf16ps(2, 4, 5);
      break;
    default:
      _tile_dpbf16ps(3, 4, 6);
      break;
  }
}
#undef KVQ_TILE_SWITCH

/// Lane r holds r * K (gather and scatter indices: one element every K), loaded as
/// _mm512_loadu_si512(kLanesTimes<K>.data()).
template <int K>
inline constexpr auto kLanesTimes = [] {
  std::array<int32_t, 16> a{};
  for (int r = 0; r < 16; ++r) a[r] = r * K;
  return a;
}();

/// tile_column's permute indices: lane r of column k reads element (r * NC + k) % 32 of a pair of
/// vectors; kColHigh[k] marks the lanes whose element is 32 or past (the second pair).
template <int NC>
inline constexpr auto kColIndex = [] {
  std::array<std::array<int32_t, 16>, NC> a{};
  for (int k = 0; k < NC; ++k)
    for (int r = 0; r < 16; ++r) a[k][r] = (r * NC + k) % 32;
  return a;
}();
template <int NC>
inline constexpr auto kColHigh = [] {
  std::array<__mmask16, NC> a{};
  for (int k = 0; k < NC; ++k)
    for (int r = 0; r < 16; ++r)
      if (r * NC + k >= 32) a[k] = static_cast<__mmask16>(a[k] | (1u << r));
  return a;
}();

/// Column k of a stored [16, NC] float tile (cb, NC floats a row): the 16 values cb[r * NC + k].
/// NC <= 4: from the tile's NC vectors by two-source permutes (two and a blend at most), the same
/// values as the gather that serves wider tiles.
template <int NC>
inline __m512 tile_column(const float* cb, int k) {
  if constexpr (NC == 1) {
    return _mm512_loadu_ps(cb);
  } else if constexpr (NC <= 4) {
    const __m512i idx = _mm512_loadu_si512(kColIndex<NC>[k].data());
    const __m512 a = _mm512_permutex2var_ps(_mm512_loadu_ps(cb), idx, _mm512_loadu_ps(cb + 16));
    if constexpr (NC == 2) return a;
    const __m512 b =
        _mm512_permutex2var_ps(_mm512_loadu_ps(cb + 32), idx, _mm512_loadu_ps(cb + 16 * (NC - 1)));
    return _mm512_mask_blend_ps(kColHigh<NC>[k], a, b);
  } else {
    return _mm512_mask_i32gather_ps(_mm512_setzero_ps(), kAll16,
                                    _mm512_loadu_si512(kLanesTimes<NC>.data()), cb + k, 4);
  }
}

/// The key tiles' products of one head: tmm0 = a's rows 0..15 ([kSubRows, D] bf16, a row every D)
/// times the head's query tiles (qh: per chunk of 32 channels 16 rows of `cols` dwords), chunk by
/// chunk in tmm3..6, four chunks at a time; where `two`, tmm1 the same for rows 16..31.
inline void key_tile_products(const uint32_t* qh, int cols, int64_t D, const uint16_t* a,
                              bool two) {
  const int64_t C = D / 32;
  _tile_zero(0);
  _tile_zero(1);
  for (int64_t c0 = 0; c0 < C; c0 += 4) {
    const int m = static_cast<int>(std::min<int64_t>(4, C - c0));
    for (int k = 0; k < m; ++k) tile_load(3 + k, qh + (c0 + k) * 16 * cols, 4 * cols);
    for (int k = 0; k < m; ++k) {
      _tile_loadd(2, a + 32 * (c0 + k), 2 * D);
      tile_dp_keys(k, false);
      if (two) {
        _tile_loadd(7, a + 16 * D + 32 * (c0 + k), 2 * D);
        tile_dp_keys(k, true);
      }
    }
  }
}

/// fp8_dot_amx's query: qb's channel pairs as tdpbf16ps's second operand, per head and chunk of
/// 32 channels 16 rows (pairs) of NQ dwords (queries): qt[((h * D / 32 + c) * 16 + r) * NQ + i] is
/// pair 16c + r of query (h, i).
template <int NQ>
void fp8_query_tiles(const uint16_t* qb, int64_t H, int64_t D, uint32_t* qt) {
  const int64_t C = D / 32;
  for (int64_t h = 0; h < H; ++h)
    for (int64_t c = 0; c < C; ++c)
      for (int r = 0; r < 16; ++r)
        for (int i = 0; i < NQ; ++i)
          std::memcpy(qt + ((h * C + c) * 16 + r) * NQ + i, qb + (h * NQ + i) * D + 32 * c + 2 * r,
                      4);
}

/// fp8_dot_bf16's scores (the same arguments; n <= 32) from tiles: per head, its rows of the n
/// tokens as bf16 in a ([32, D]), then per chunk of 32 channels a tdpbf16ps for each 16 tokens
/// (tmm2 / tmm7) with the chunk's query tile (tmm3..6, four chunks at a time) into tmm0 / tmm1
/// ([16 tokens, NQ]); the scores leave by tile_column per query. kExact (the exact mode,
/// fp8_amx_exact): the rows as exact bf16 (fp8_bf16x64, kExactPerm's order), qt from
/// fp8_query_tiles_exact (3 NQ columns: the query's three parts), a score (hi + mid) + lo.
template <int NQ, Fp8Format F, bool kPrefetch, int kLoc = kL2, bool kExact = false>
void fp8_dot_amx(const uint32_t* qt, int64_t H, int64_t D, int64_t n, const uint8_t* base,
                 const float* rowf, int64_t ldf, float* s, int64_t hs, int64_t lds, int64_t valid,
                 uint16_t* a) {
  constexpr int NC = kExact ? 3 * NQ : NQ;  // the query tiles' columns
  static_assert(NQ >= 1 && NC <= 16);
  static const TileConfig cfg = [] {
    TileConfig t;
    for (int r : {0, 1, 3, 4, 5, 6}) t.shape(r, 16, 4 * NC);
    for (int r : {2, 7}) t.shape(r, 16, 64);
    return t;
  }();
  use_tiles(cfg, kExact ? 64 + NQ : NQ);
  const int64_t C = D / 32, rs = H * D;
  const Fp8Bf16Table* lut = kExact ? &fp8_bf16_table<F>() : nullptr;
  alignas(64) float cb[2][16 * NC];
  for (int64_t h = 0; h < H; ++h) {
    // this head's row of token n + u prefetched beside the conversion of token u's: spread over
    // the conversion, not one burst of 2n lines before it (a burst stalled on the fill buffers;
    // session 23 A/B at 32k: 0.80-0.82x time on one thread)
    for (int64_t u = 0; u < n; ++u) {
      if constexpr (kPrefetch)
        if ((n + u) * H + h < valid) prefetch_row<kLoc>(base + (n + u) * rs + h * D, D);
      if constexpr (kExact) {
        for (int64_t d = 0; d < D; d += 64) {
          __m512i x, y;
          fp8_bf16x64(*lut, _mm512_loadu_si512(base + u * rs + h * D + d), x, y);
          _mm512_storeu_si512(a + u * D + d, x);
          _mm512_storeu_si512(a + u * D + d + 32, y);
        }
      } else {
        for (int64_t d = 0; d < D; d += 32)
          _mm512_storeu_si512(a + u * D + d, fp8_bf16x32<F>(base + u * rs + h * D + d));
      }
    }
    const bool two = n > 16;  // rows 16 .. 31 too (rows past n: leftovers, discarded)
    key_tile_products(qt + h * C * 16 * NC, NC, D, a, two);
    _tile_stored(0, cb[0], 4 * NC);
    if (two) _tile_stored(1, cb[1], 4 * NC);
    for (int j = 0; j <= static_cast<int>(two); ++j) {
      const int64_t t0 = 16 * j, r = std::min<int64_t>(16, n - t0);
      const __mmask16 keep = r >= 16 ? kAll16 : static_cast<__mmask16>((1u << r) - 1);
      const __m512 f = _mm512_loadu_ps(rowf + h * ldf + t0);  // rowf padded by 16
      auto col = [&](int k) { return tile_column<NC>(cb[j], k); };
      for (int i = 0; i < NQ; ++i) {
        __m512 x = col(i);
        if constexpr (kExact) x = _mm512_add_ps(_mm512_add_ps(x, col(NQ + i)), col(2 * NQ + i));
        _mm512_mask_storeu_ps(s + h * hs + i * lds + t0, keep, _mm512_mul_ps(x, f));
      }
    }
  }
}

/// fp8_acc_bf16's outputs (the same arguments; n <= 32) from tiles, the weights of (h, i) at
/// wp + (h * NQ + i) * 16 (16 pairs, 0 past the last): per head, its weights in tmm4 ([NQ, 16
/// pairs]); per 64 channels (32 where head_dim ends), the pairs of rows as tdpbf16ps's second
/// operand in b ([4 x 16 channels][16 pairs][16 dwords], fp8_acc_slice's byte permutes), a
/// tdpbf16ps for each 16 channels into tmm0..3 ([NQ, 16]), added to o at the end. Pairs past n
/// hold finite leftovers against weights of 0.
template <int NQ, Fp8Format F, bool kPrefetch>
void fp8_acc_amx(const uint32_t* wp, int64_t H, int64_t D, int64_t n, const uint8_t* base, float* o,
                 int64_t valid, uint32_t* b) {
  static_assert(NQ >= 1 && NQ <= 16);
  static const TileConfig cfg = [] {
    TileConfig t;
    for (int r = 0; r < 5; ++r) t.shape(r, NQ, 64);  // outputs, weights
    for (int r : {5, 6}) t.shape(r, 16, 64);         // rows
    return t;
  }();
  use_tiles(cfg, 32 + NQ);
  const int64_t rs = H * D;
  const __m512i mask = _mm512_set1_epi16(kBf16Mask<F>);
  __m512i idx[4];
  for (int k = 0; k < 4; ++k) idx[k] = _mm512_loadu_si512(kPairIndex.data() + 64 * k);
  alignas(64) float cb[16 * NQ];
  for (int64_t h = 0; h < H; ++h) {
    _tile_loadd(4, wp + h * NQ * 16, 64);
    for (int64_t d0 = 0; d0 < D; d0 += 64) {
      const int G = D - d0 >= 64 ? 4 : 2;
      for (int64_t r = 0; 2 * r < n; ++r) {
        if constexpr (kPrefetch)  // this head's rows of tokens n + 2r, n + 2r + 1 (< 2n)
          if (d0 == 0)
            for (int64_t t = n + 2 * r; t < std::min(n + 2 * r + 2, 2 * n); ++t)
              if (t * H + h < valid) prefetch_row(base + t * rs + h * D, D);
        const uint8_t* r0 = base + 2 * r * rs + h * D + d0;
        const uint8_t* r1 = 2 * r + 1 < n ? r0 + rs : r0;  // odd n: read again, weight 0
        auto load = [G](const uint8_t* p) {
          return G == 4 ? _mm512_loadu_si512(p)
                        : _mm512_maskz_inserti64x4(
                              0xff, _mm512_setzero_si512(),
                              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)), 0);
        };
        const __m512i x0 = load(r0), x1 = load(r1);
        for (int g = 0; g < G; ++g) {
          const __m512i x = _mm512_maskz_permutex2var_epi8(kOddBytes, x0, idx[g], x1);
          _mm512_storeu_si512(
              b + (g * 16 + r) * 16,
              _mm512_and_si512(_mm512_maskz_srai_epi16(kAll32, x, 8 - kBf16Shift<F>), mask));
        }
      }
      for (int g = 0; g < G; ++g) tile_zero(g);
      for (int g = 0; g < G; ++g) {
        tile_load(5 + g % 2, b + g * 256, 64);
        tile_dp_values(g);
      }
      for (int g = 0; g < G; ++g) {
        tile_store(g, cb, 64);
        for (int i = 0; i < NQ; ++i) {
          float* oi = o + (h * NQ + i) * D + d0 + 16 * g;
          _mm512_storeu_ps(oi, _mm512_add_ps(_mm512_loadu_ps(oi), _mm512_load_ps(cb + 16 * i)));
        }
      }
    }
  }
}

// ---- AMX tiles, the exact mode (fp8 sides where fp8_amx_exact) ---------------------------------
// Every product exact: each code's value as a bf16 (fp8_bf16x64, exact for every code), the
// other operand (q * per-channel scale, or the weights p * token factor, each a float) split
// into three bf16 parts hi + mid + lo that sum to it exactly (bf16_split3), the parts side by side
// as 3 NQ tile columns (keys) or rows (values), where tdpbf16ps costs the same as for NQ. A
// score or an output is then (hi + mid) + lo of three float chains: float arithmetic in another
// order, the exact mode's tolerance. The codes come in fp8_bf16x64's order (within each 64
// channels a fixed permutation, kExactPerm), so the query is laid out in the same order and the
// outputs are put back in place.

/// x = hi + mid + lo exactly, each the nearest-even bf16 of what the parts before leave (8, 8 and
/// 8 significant bits of x's 24; the differences are exact): part[k] holds 32 bf16 (lanes of a,
/// then of b). Subnormal remainders read as 0 (vcvtne2ps2bf16, as the tiles read them), which
/// only a |x| under 2^-110 or so would leave.
inline void bf16_split3(__m512 a, __m512 b, __m512i* part) {
  for (int k = 0; k < 3; ++k) {
    const __m512i p = from_bh(_mm512_maskz_cvtne2ps_pbh(kAll32, b, a));
    part[k] = p;
    a = _mm512_sub_ps(a, bf16_to_f32x16(_mm512_maskz_extracti64x4_epi64(0xff, p, 0)));
    b = _mm512_sub_ps(b, bf16_to_f32x16(_mm512_maskz_extracti64x4_epi64(0xff, p, 1)));
  }
}

/// The channel (within its 64) whose code fp8_bf16x64 puts at position e of a row of 64:
/// positions 0..31 from its first register, 32..63 from its second.
constexpr std::array<int, 64> kExactPerm = [] {
  std::array<int, 64> a{};
  for (int e = 0; e < 64; ++e) a[e] = fp8_bf16x64_code(e / 32, e % 32);
  return a;
}();

/// Whether a side's fp8 codes take the exact mode's AMX kernels: the exact mode, tiles granted,
/// 3 NQ <= 16 (the parts' columns / rows), head_dim a multiple of 64 (whole fp8_bf16x64 rows),
/// and no e4m3fnuz NaN code (fp8_bf16x64 reads it as -0).
[[maybe_unused]] bool fp8_amx_exact(IntMode mode, const StoredSide& s, int64_t nq, int64_t D) {
  return mode == IntMode::Exact && s.kind == SchemeKind::Fp8 && amx() && 3 * nq <= 16 &&
         D % 64 == 0 && !(s.format == Fp8Format::E4M3FNUZ && s.fp8_nan);
}

/// The exact mode's query tiles (fp8_dot_amx with kExact): q * (per-channel scales, where given:
/// scales[h * D + d]) in kExactPerm's order, split by bf16_split3, as tdpbf16ps's second operand
/// per head and chunk of 32 positions: qt[((h * D / 32 + c) * 16 + r) * 3 NQ + k * NQ + i] is part
/// k of query (h, i) at positions 32c + 2r, 32c + 2r + 1.
template <int NQ>
void fp8_query_tiles_exact(const float* q, const float* scales, int64_t H, int64_t D,
                           uint32_t* qt) {
  constexpr int NC = 3 * NQ;
  const int64_t C = D / 32;
  __m512i idx[2][2];  // chunk parity, half: kExactPerm's channels
  for (int c = 0; c < 2; ++c)
    for (int u = 0; u < 2; ++u) idx[c][u] = _mm512_loadu_si512(kExactPerm.data() + 32 * c + 16 * u);
  const __m512i rows = _mm512_loadu_si512(kLanesTimes<NC>.data());
  for (int64_t h = 0; h < H; ++h)
    for (int i = 0; i < NQ; ++i) {
      const float* qi = q + (h * NQ + i) * D;
      for (int64_t c = 0; c < C; ++c) {
        const int64_t d0 = 64 * (c / 2);
        __m512 v[2];
        for (int u = 0; u < 2; ++u) {
          const __m512i ch =
              _mm512_add_epi32(idx[c % 2][u], _mm512_set1_epi32(static_cast<int>(d0)));
          auto gather = [&ch](const float* x) {
            return _mm512_mask_i32gather_ps(_mm512_setzero_ps(), kAll16, ch, x, 4);
          };
          v[u] = gather(qi);
          if (scales) v[u] = _mm512_mul_ps(v[u], gather(scales + h * D));
        }
        __m512i part[3];
        bf16_split3(v[0], v[1], part);
        uint32_t* t = qt + (h * C + c) * 16 * NC + i;
        for (int k = 0; k < 3; ++k) _mm512_i32scatter_epi32(t + k * NQ, rows, part[k], 4);
      }
    }
}

/// The exact mode's weights for fp8_acc_amx_exact: w_t = p_t * f[h * n + t] (n <= 32) split by
/// bf16_split3; part k of (h, i) at wp + (h * 3 NQ + k * NQ + i) * 16 (16 pairs of tokens, 0 past
/// the last).
template <int NQ>
void fp8_weights_exact(const float* p, int64_t hs, int64_t ldp, int64_t H, int64_t n,
                       const float* f, uint32_t* wp) {
  const __mmask16 m0 = n >= 16 ? kAll16 : static_cast<__mmask16>((1u << n) - 1);
  const __mmask16 m1 = n >= 32 ? kAll16 : n > 16 ? static_cast<__mmask16>((1u << (n - 16)) - 1) : 0;
  for (int64_t h = 0; h < H; ++h) {
    const float* fh = f + h * n;
    const __m512 f0 = _mm512_maskz_loadu_ps(m0, fh), f1 = _mm512_maskz_loadu_ps(m1, fh + 16);
    for (int i = 0; i < NQ; ++i) {
      const float* pi = p + h * hs + i * ldp;
      __m512i part[3];
      bf16_split3(_mm512_mul_ps(_mm512_maskz_loadu_ps(m0, pi), f0),
                  _mm512_mul_ps(_mm512_maskz_loadu_ps(m1, pi + 16), f1), part);
      for (int k = 0; k < 3; ++k) _mm512_storeu_si512(wp + (h * 3 * NQ + k * NQ + i) * 16, part[k]);
    }
  }
}

/// Exact-mode fp8 outputs from tiles (fp8_acc_amx's arguments and steps; wp from
/// fp8_weights_exact): per head, its weights' parts in tmm4 ([3 NQ, 16 pairs]); per 64 channels
/// the pairs of rows as exact bf16 (fp8_bf16x64, the two rows' words interleaved: tile g holds
/// channels 16k + 4g .. 16k + 4g + 3 of k = 0..3), a tdpbf16ps per tile into tmm0..3; per query
/// each tile's (hi + mid) + lo, its 128-bit lanes put back in channel order, added to o. Pairs
/// past n hold zeros (a NaN left from another call would poison the weights of 0).
template <int NQ, Fp8Format F, bool kPrefetch>
void fp8_acc_amx_exact(const uint32_t* wp, int64_t H, int64_t D, int64_t n, const uint8_t* base,
                       float* o, int64_t valid, uint32_t* b) {
  constexpr int NR = 3 * NQ;
  static_assert(NR <= 16);
  static const TileConfig cfg = [] {
    TileConfig t;
    for (int r = 0; r < 5; ++r) t.shape(r, NR, 64);  // outputs, weights
    for (int r : {5, 6}) t.shape(r, 16, 64);         // rows
    return t;
  }();
  use_tiles(cfg, 96 + NQ);
  alignas(64) static constexpr uint8_t kZero[64] = {};
  const Fp8Bf16Table& lut = fp8_bf16_table<F>();
  const int64_t rs = H * D, pairs = (n + 1) / 2;
  alignas(64) float cb[4][16 * NR];
  for (int64_t r = pairs; r < 16; ++r)
    for (int g = 0; g < 4; ++g) _mm512_storeu_si512(b + (g * 16 + r) * 16, _mm512_setzero_si512());
  for (int64_t h = 0; h < H; ++h) {
    _tile_loadd(4, wp + h * NR * 16, 64);
    for (int64_t d0 = 0; d0 < D; d0 += 64) {
      for (int64_t r = 0; r < pairs; ++r) {
        if constexpr (kPrefetch)  // as fp8_acc_amx
          if (d0 == 0)
            for (int64_t t = n + 2 * r; t < std::min(n + 2 * r + 2, 2 * n); ++t)
              if (t * H + h < valid) prefetch_row(base + t * rs + h * D, D);
        const uint8_t* r0 = base + 2 * r * rs + h * D + d0;
        const uint8_t* r1 = 2 * r + 1 < n ? r0 + rs : kZero;  // odd n: zeros, weight 0
        __m512i a0, b0, a1, b1;
        fp8_bf16x64(lut, _mm512_loadu_si512(r0), a0, b0);
        fp8_bf16x64(lut, _mm512_loadu_si512(r1), a1, b1);
        _mm512_storeu_si512(b + (0 * 16 + r) * 16, _mm512_unpacklo_epi16(a0, a1));
        _mm512_storeu_si512(b + (1 * 16 + r) * 16, _mm512_unpackhi_epi16(a0, a1));
        _mm512_storeu_si512(b + (2 * 16 + r) * 16, _mm512_unpacklo_epi16(b0, b1));
        _mm512_storeu_si512(b + (3 * 16 + r) * 16, _mm512_unpackhi_epi16(b0, b1));
      }
      for (int g = 0; g < 4; ++g) tile_zero(g);
      for (int g = 0; g < 4; ++g) {
        tile_load(5 + g % 2, b + g * 256, 64);
        tile_dp_values(g);
      }
      for (int g = 0; g < 4; ++g) tile_store(g, cb[g], 64);
      for (int i = 0; i < NQ; ++i) {
        __m512 t[4];  // tile g's (hi + mid) + lo: lane 4k + m is channel 16k + 4g + m
        for (int g = 0; g < 4; ++g)
          t[g] = _mm512_add_ps(
              _mm512_add_ps(_mm512_load_ps(cb[g] + 16 * i), _mm512_load_ps(cb[g] + 16 * (NQ + i))),
              _mm512_load_ps(cb[g] + 16 * (2 * NQ + i)));
        // out_k = [t0's lane k, t1's, t2's, t3's] (128-bit lanes): channels 16k .. 16k + 15
        const __m512 u0 = _mm512_maskz_shuffle_f32x4(kAll16, t[0], t[1], 0x44),
                     u1 = _mm512_maskz_shuffle_f32x4(kAll16, t[0], t[1], 0xee);
        const __m512 u2 = _mm512_maskz_shuffle_f32x4(kAll16, t[2], t[3], 0x44),
                     u3 = _mm512_maskz_shuffle_f32x4(kAll16, t[2], t[3], 0xee);
        const __m512 out[4] = {_mm512_maskz_shuffle_f32x4(kAll16, u0, u2, 0x88),
                               _mm512_maskz_shuffle_f32x4(kAll16, u0, u2, 0xdd),
                               _mm512_maskz_shuffle_f32x4(kAll16, u1, u3, 0x88),
                               _mm512_maskz_shuffle_f32x4(kAll16, u1, u3, 0xdd)};
        float* oi = o + (h * NQ + i) * D + d0;
        for (int k = 0; k < 4; ++k)
          _mm512_storeu_ps(oi + 16 * k, _mm512_add_ps(_mm512_loadu_ps(oi + 16 * k), out[k]));
      }
    }
  }
}
#endif  // KVQ_CPU_AMX
#endif  // KVQ_CPU_BF16DOT

}  // namespace
}  // namespace kvq::cpu::KVQ_CPU_PATH_NS::attn
