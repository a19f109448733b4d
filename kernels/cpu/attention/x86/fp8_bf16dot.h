// Backend `cpu`, x86 attention blocks: fp8 sides in the int8 mode on bf16 dot products
// (vdpbf16ps, where the build targets AVX-512 BF16 and VBMI: KVQ_CPU_BF16DOT).
//
// FP8 in the int8 mode (KVQ_CPU_BF16DOT, isa.h; fp8_dot_bf16 / fp8_acc_bf16): a code's sign,
// exponent and mantissa bits placed in a bf16 (bias 127, 7 mantissa bits) give its value times
// 2^(kBias - 127), normals alike; the subnormal codes (exponent field 0) become bf16 subnormals,
// which vdpbf16ps reads as zero. q * (per-channel scale) and the weights p * (token factor) are
// rounded to bf16 (nearest-even) with powers of two (kFp8QShift, kFp8OShift) that keep products
// of real K/V normal floats: vdpbf16ps flushes results below 2^-126, here e4m3 key products
// |q k| < 2^-70 and value products |p f v| < 2^-94. It sums two products per lane in float: keys
// pair adjacent channels, values pair adjacent tokens. The powers of two come back exactly: scores
// are multiplied by 2^(127 - kBias - kFp8QShift) with the token factor, and outputs carry
// 2^(-kFp8OShift) to the end (CausalAttention::finish).
#pragma once

#include "kernels/cpu/attention/x86/loaders.h"
#include "kernels/cpu/attention/x86/simd_math.h"

namespace kvq::cpu::KVQ_CPU_PATH_NS::attn {
// Internal to this path's attention sources: each file that includes it has its own copy (internal
// linkage), as when they were one translation unit, so the compiler inlines them as it did.
namespace {

#if KVQ_CPU_BF16DOT
using Bh = __m512bh;
inline Bh as_bh(__m512i x) { return (Bh)x; }         // NOLINT: a vector cast (same bits)
inline __m512i from_bh(Bh x) { return (__m512i)x; }  // NOLINT

/// The 16 float sums of 16 vectors: lane m of the result is the sum of v[m]'s lanes, by the same
/// tree for every vector (within each 128-bit lane (l0 + l2) + (l1 + l3), then (L0 + L1) +
/// (L2 + L3) over the four), so a sum does not depend on the vectors beside it.
inline __m512 sum16x16(const __m512* v) {
  __m512 w[8], x[4], y[2];
  for (int i = 0; i < 8; ++i)
    w[i] = _mm512_add_ps(_mm512_maskz_unpacklo_ps(kAll16, v[2 * i], v[2 * i + 1]),
                         _mm512_maskz_unpackhi_ps(kAll16, v[2 * i], v[2 * i + 1]));
  for (int i = 0; i < 4; ++i)
    x[i] = _mm512_add_ps(_mm512_maskz_shuffle_ps(kAll16, w[2 * i], w[2 * i + 1], 0x44),
                         _mm512_maskz_shuffle_ps(kAll16, w[2 * i], w[2 * i + 1], 0xee));
  for (int i = 0; i < 2; ++i)
    y[i] = _mm512_add_ps(_mm512_maskz_shuffle_f32x4(kAll16, x[2 * i], x[2 * i + 1], 0x88),
                         _mm512_maskz_shuffle_f32x4(kAll16, x[2 * i], x[2 * i + 1], 0xdd));
  return _mm512_add_ps(_mm512_maskz_shuffle_f32x4(kAll16, y[0], y[1], 0x88),
                       _mm512_maskz_shuffle_f32x4(kAll16, y[0], y[1], 0xdd));
}

/// FP8 keys of tokens [0, n), head by head (row (t, h) at base + (t * H + h) * D, D bytes):
/// s[h * hs + i * lds + t] = (sum over channel pairs of qb * code-as-bf16) * rowf[h * ldf + t], qb
/// the [H, NQ, D] bf16 query, rowf padded by 16 floats. TU = 16 / NQ tokens of one head a step,
/// their scores for the head's NQ queries in the 16 lanes of one horizontal sum (sum16x16): each
/// query chunk is loaded once for the TU tokens, and each query's TU scores leave in one store.
/// The kernel before it took rows in address order (U heads of a token a step), loaded every
/// query chunk per row and stored each score alone; this one took 0.90-1.00x its time at 8 KV
/// heads, d128, GQA 4 (int8 FP8, 1k-32k, one and two threads), 0.89-0.97x at GQA 1 and 2,
/// 0.94-0.98x at SmolLM2-135M's 3,64,3, 0.98x at GQA 8 and d128, but 1.04-1.05x at GQA 8 and d64
/// (session 20, 3 interleaved rounds). `valid`: rows that exist from base; each head prefetches its
/// rows of the next n tokens first (spreading those prefetches over the steps, the same rows, took
/// 1.4-1.8x the time at 32k).
template <int NQ, Fp8Format F, bool kPrefetch, int kLoc = kL2>
void fp8_dot_bf16(const uint16_t* qb, int64_t H, int64_t D, int64_t n, const uint8_t* base,
                  const float* rowf, int64_t ldf, float* s, int64_t hs, int64_t lds,
                  int64_t valid) {
  static_assert(NQ >= 1 && NQ <= 16);
  constexpr int TU = 16 / NQ;    // tokens a step
  const int64_t rs = H * D;      // bytes from a token's row to the next token's of the head
  const __m512i lane_tok = [] {  // lane u * NQ + i: token u's factor
    alignas(64) int32_t a[16];
    for (int l = 0; l < 16; ++l) a[l] = l < TU * NQ ? l / NQ : 0;
    return _mm512_load_si512(a);
  }();
  // Lane u of per_query[i]: lane u * NQ + i (token u's score for query i).
  __m512i per_query[NQ];
  for (int i = 0; i < NQ; ++i) {
    alignas(64) int32_t a[16];
    for (int l = 0; l < 16; ++l) a[l] = l < TU ? l * NQ + i : 0;
    per_query[i] = _mm512_load_si512(a);
  }
  const __m512i to_query = [] {  // lane i * TU + u: lane u * NQ + i
    alignas(64) int32_t a[16];
    for (int l = 0; l < 16; ++l) a[l] = l < TU * NQ ? (l % TU) * NQ + l / TU : 0;
    return _mm512_load_si512(a);
  }();
  // Tokens row .. row + U - 1 (rs bytes apart) of one head, query q: lane u * NQ + i of the result
  // is token u's sum for query i (lanes from U * NQ on: 0).
  auto sums = [&]<int U>(const uint8_t* row, const uint16_t* q) {
    __m512 acc[16];
    for (auto& a : acc) a = _mm512_setzero_ps();
    for (int64_t d = 0; d < D; d += 32)
      for (int u = 0; u < U; ++u) {
        const Bh k = as_bh(fp8_bf16x32<F>(row + u * rs + d));
        for (int i = 0; i < NQ; ++i)
          acc[u * NQ + i] = _mm512_dpbf16_ps(
              acc[u * NQ + i], k,
              as_bh(_mm512_loadu_si512(reinterpret_cast<const __m512i*>(q + i * D + d))));
      }
    return sum16x16(acc);
  };
  for (int64_t h = 0; h < H; ++h) {
    if constexpr (kPrefetch)  // this head's rows of the next n tokens
      for (int64_t t = n; t < 2 * n; ++t)
        if (t * H + h < valid) prefetch_row<kLoc>(base + (t * H + h) * D, D);
    const uint16_t* q = qb + h * NQ * D;
    const uint8_t* hb = base + h * D;
    const float* fh = rowf + h * ldf;
    float* sh = s + h * hs;
    int64_t t = 0;
    for (; t + TU <= n; t += TU) {
      const __m512 f = _mm512_maskz_permutexvar_ps(kAll16, lane_tok, _mm512_loadu_ps(fh + t));
      const __m512 v = _mm512_mul_ps(sums.template operator()<TU>(hb + t * rs, q), f);
      if constexpr (TU == 2) {  // query i's two scores at lanes 2i, 2i + 1: 64-bit stores
        const __m512 x = _mm512_maskz_permutexvar_ps(kAll16, to_query, v);
        auto pair = [&]<int L>() {
          const __m128 y = _mm512_maskz_extractf32x4_ps(0xf, x, L);
          _mm_storel_pi(reinterpret_cast<__m64*>(sh + 2 * L * lds + t), y);
          _mm_storeh_pi(reinterpret_cast<__m64*>(sh + (2 * L + 1) * lds + t), y);
        };
        pair.template operator()<0>();
        pair.template operator()<1>();
        pair.template operator()<2>();
        pair.template operator()<3>();
      } else {
        for (int i = 0; i < NQ; ++i)
          _mm512_mask_storeu_ps(sh + i * lds + t, static_cast<__mmask16>((1u << TU) - 1),
                                _mm512_maskz_permutexvar_ps(kAll16, per_query[i], v));
      }
    }
    for (; t < n; ++t) {  // one token: the same sums, the factor applied per score
      alignas(64) float res[16];
      _mm512_store_ps(res, sums.template operator()<1>(hb + t * rs, q));
      for (int i = 0; i < NQ; ++i) sh[i * lds + t] = res[i] * fh[t];
    }
  }
}

/// The byte permutes of fp8_acc_bf16, 64 bytes per 16-channel slice k: dword j holds channel
/// 16k + j of the first token in byte 1 and of the second token in byte 3 (bytes 0 and 2 are
/// zeroed by the mask kOddBytes).
constexpr std::array<uint8_t, 256> kPairIndex = [] {
  std::array<uint8_t, 256> a{};
  for (int k = 0; k < 4; ++k)
    for (int j = 0; j < 16; ++j) {
      a[64 * k + 4 * j + 1] = static_cast<uint8_t>(16 * k + j);
      a[64 * k + 4 * j + 3] = static_cast<uint8_t>(64 + 16 * k + j);
    }
  return a;
}();
constexpr __mmask64 kOddBytes = 0xaaaaaaaaaaaaaaaaull;

/// fp8_acc_bf16's work on NV vectors of 16 channels of one head: rows from r (one token's row
/// to the next's: ts bytes), weights wh[i * np + pair], outputs oh[i * D + ..], the accumulators in
/// registers over every pair.
template <int NQ, int NV, Fp8Format F>
requires(NV == 2 || NV == 4) void fp8_acc_slice(const uint32_t* wh, int64_t np, int64_t n,
                                                const uint8_t* r, int64_t ts, float* oh,
                                                int64_t D) {
  // Plain loads: GCC 12 keeps the accumulators' stack copies in step, a store per vdpbf16ps,
  // when the loop holds a masked-load builtin.
  auto load = [](const uint8_t* p) {
    if constexpr (NV == 4)
      return _mm512_loadu_si512(p);
    else
      return _mm512_maskz_inserti64x4(0xff, _mm512_setzero_si512(),
                                      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)), 0);
  };
  const __m512i mask = _mm512_set1_epi16(kBf16Mask<F>);
  __m512i idx[NV];
  for (int k = 0; k < NV; ++k) idx[k] = _mm512_loadu_si512(kPairIndex.data() + 64 * k);
  __m512 acc[NQ * NV];
  for (int i = 0; i < NQ; ++i)
    for (int k = 0; k < NV; ++k) acc[i * NV + k] = _mm512_loadu_ps(oh + i * D + 16 * k);
  for (int64_t k2 = 0; k2 < np; ++k2, r += 2 * ts) {
    const __m512i a = load(r), b = load(2 * k2 + 1 < n ? r + ts : r);
    __m512i wv[NQ];
    for (int i = 0; i < NQ; ++i) wv[i] = _mm512_set1_epi32(static_cast<int>(wh[i * np + k2]));
    for (int k = 0; k < NV; ++k) {
      const __m512i x = _mm512_maskz_permutex2var_epi8(kOddBytes, a, idx[k], b);
      const Bh v =
          as_bh(_mm512_and_si512(_mm512_maskz_srai_epi16(kAll32, x, 8 - kBf16Shift<F>), mask));
      for (int i = 0; i < NQ; ++i)
        acc[i * NV + k] = _mm512_dpbf16_ps(acc[i * NV + k], v, as_bh(wv[i]));
    }
  }
  for (int i = 0; i < NQ; ++i)
    for (int k = 0; k < NV; ++k) _mm512_storeu_ps(oh + i * D + 16 * k, acc[i * NV + k]);
}

/// FP8 values: o_h,i += sum_t w[t] * row (t, h), w the weights of tokens [0, n) as bf16 pairs
/// wp[(h * NQ + i) * np + k] = (token 2k, token 2k + 1) (np = (n + 1) / 2; an odd n's last pair
/// has weight 0 for a token it reads again), rows as in fp8_dot_bf16. Per head, slices of 64
/// channels (32 where head_dim ends or NQ > 4) with every pair of the range applied in token
/// order to accumulators in registers.
template <int NQ, Fp8Format F, bool kPrefetch>
void fp8_acc_bf16(const uint32_t* wp, int64_t H, int64_t D, int64_t n, const uint8_t* base,
                  float* o, int64_t valid) {
  constexpr int kVec = NQ <= 4 ? 4 : 2;  // 16-channel vectors per slice
  const int64_t np = (n + 1) / 2;
  for (int64_t h = 0; h < H; ++h) {
    if constexpr (kPrefetch)
      for (int64_t t = n; t < 2 * n; ++t)
        if (t * H + h < valid) prefetch_row(base + (t * H + h) * D, D);
    const uint32_t* wh = wp + h * NQ * np;
    int64_t d0 = 0;
    for (; d0 + 16 * kVec <= D; d0 += 16 * kVec)
      fp8_acc_slice<NQ, kVec, F>(wh, np, n, base + h * D + d0, H * D, o + h * NQ * D + d0, D);
    if (d0 < D)  // head_dim a multiple of 32
      fp8_acc_slice<NQ, 2, F>(wh, np, n, base + h * D + d0, H * D, o + h * NQ * D + d0, D);
  }
}

/// The weights of fp8_acc_bf16 from p[h * hs + i * ldp + t] (t < n) times f[h * n + t], rounded
/// to bf16, (h * NQ + i)'s pairs from wp + (h * NQ + i) * ldw (ldw >= (n + 1) / 2: pairs past the
/// last written as 0 up to the next multiple of 16 within ldw).
template <int NQ>
void fp8_weights_bf16(const float* p, int64_t hs, int64_t ldp, int64_t H, int64_t n, const float* f,
                      uint32_t* wp, int64_t ldw) {
  for (int64_t h = 0; h < H; ++h)
    for (int i = 0; i < NQ; ++i) {
      const float* pi = p + h * hs + i * ldp;
      const float* fh = f + h * n;
      uint32_t* w = wp + (h * NQ + i) * ldw;
      for (int64_t t = 0; t < n; t += 32) {
        const int64_t r = std::min<int64_t>(32, n - t);
        const __mmask16 m0 = r >= 16 ? kAll16 : static_cast<__mmask16>((1u << r) - 1);
        const __mmask16 m1 = r >= 32  ? kAll16
                             : r > 16 ? static_cast<__mmask16>((1u << (r - 16)) - 1)
                                      : 0;
        const __m512 lo =
            _mm512_mul_ps(_mm512_maskz_loadu_ps(m0, pi + t), _mm512_maskz_loadu_ps(m0, fh + t));
        const __m512 hi = _mm512_mul_ps(_mm512_maskz_loadu_ps(m1, pi + t + 16),
                                        _mm512_maskz_loadu_ps(m1, fh + t + 16));
        const __m512bh b =
            _mm512_maskz_cvtne2ps_pbh(kAll32, hi, lo);             // tokens t .. t + 31 in order
        const int64_t pairs = std::min<int64_t>(16, ldw - t / 2);  // (r + 1) / 2 at least
        _mm512_mask_storeu_epi32(w + t / 2,
                                 pairs >= 16 ? kAll16 : static_cast<__mmask16>((1u << pairs) - 1),
                                 from_bh(b));
      }
    }
}

#endif  // KVQ_CPU_BF16DOT

}  // namespace
}  // namespace kvq::cpu::KVQ_CPU_PATH_NS::attn
