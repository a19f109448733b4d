// Backend `cpu`, x86 attention blocks: KIVI codes in the int8 mode (IntMode::Int8): the query and
// the weights rounded to bytes, byte dot products on the codes (vpdpbusd with VNNI, else
// vpmaddubsw + vpmaddwd: the same integers), 256-bit forms and, with AVX-512 VNNI and VBMI, 512-bit
// forms with the codes brought into their lanes by byte permutes (KVQ_INT8_512).
#pragma once

#include "kernels/cpu/attention/x86/loaders.h"
#include "kernels/cpu/attention/x86/simd_math.h"

// Int8 mode's 512-bit forms: byte dot products (VNNI) on codes brought into their lanes by byte
// permutes (VBMI).
#if KVQ_CPU_AVX512 && defined(__AVX512VNNI__) && defined(__AVX512VBMI__)
#define KVQ_INT8_512 1
#else
#define KVQ_INT8_512 0
#endif

namespace kvq::cpu::KVQ_CPU_PATH_NS::attn {
// Internal to this path's attention sources: each file that includes it has its own copy (internal
// linkage), as when they were one translation unit, so the compiler inlines them as it did.
namespace {

/// Int8 mode: f.template operator()<NH>(i0) for the query heads in blocks of up to 4 (i0 = 0, 4,
/// ...; 16 accumulators a block).
template <int NQ, class F>
inline void head_blocks(F&& f) {
  for (int i0 = 0; i0 + 4 <= NQ; i0 += 4) f.template operator()<4>(i0);
  if constexpr (NQ % 4 > 0) f.template operator()<NQ % 4>(NQ / 4 * 4);
}

/// Int8 mode: q * scale of one key group ([NQ, D]) as int8 per query head, q8 = rne(qs * (127 /
/// amax)), and qscale = amax / 127.
template <int NQ>
void quantize_q8(const float* qs, int64_t D, int8_t* q8, float* qscale) {
  for (int i = 0; i < NQ; ++i) {
    __m256 mx = _mm256_setzero_ps();
    const __m256 abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    for (int64_t d = 0; d < D; d += 8)
      mx = _mm256_max_ps(mx, _mm256_and_ps(_mm256_loadu_ps(qs + i * D + d), abs));
    const float amax = hmax8(mx);
    qscale[i] = amax / 127.0f;
    const __m256 inv = _mm256_set1_ps(amax > 0 ? 127.0f / amax : 0.0f);
    for (int64_t d = 0; d < D; d += 32) {
      __m256i v[4];
      for (int u = 0; u < 4; ++u)
        v[u] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(qs + i * D + d + 8 * u), inv));
      const __m256i b =
          _mm256_packs_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3]));
      _mm256_storeu_si256(
          reinterpret_cast<__m256i*>(q8 + i * D + d),
          _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
    }
  }
}

#if KVQ_INT8_512
/// Int8 mode, 512-bit: lane 4 i of the result holds op's reduction of v[i]'s 16 lanes (i < N <= 4;
/// lanes 4 i for i >= N are v[0]'s): the four vectors fold together, 8 shuffles and 5 ops where
/// four separate reductions take about 24 of each.
template <int N, class Op>
inline __m512 reduce4(const __m512* v, Op op) {
  static_assert(N >= 1 && N <= 4);
  auto at = [&](int i) { return v[i < N ? i : 0]; };
  auto fold = [&](__m512 a, __m512 b) {  // lane k < 8: a's 256-bit halves folded, k >= 8: b's
    return op(_mm512_maskz_shuffle_f32x4(kAll16, a, b, 0x44),
              _mm512_maskz_shuffle_f32x4(kAll16, a, b, 0xEE));
  };
  const __m512 x01 = fold(at(0), at(1)), x23 = fold(at(2), at(3));
  const __m512 y = op(_mm512_maskz_shuffle_f32x4(kAll16, x01, x23, 0x88),
                      _mm512_maskz_shuffle_f32x4(kAll16, x01, x23, 0xDD));  // 128-bit lane i: v[i]
  const __m512 z = op(y, _mm512_maskz_permute_ps(kAll16, y, 0x4E));
  return op(z, _mm512_maskz_permute_ps(kAll16, z, 0xB1));
}

/// Int8 mode, 512-bit: a key group's folded query for NQ heads (q: [NQ, D], D a multiple of 16)
/// from its fp16 scales and minima (mins null: symmetric, min = -sym_off * scale), in two passes
/// over the channels: base_i = sum_d q_id * min_d, and quantize_q8's q8 / qscale of qs = q *
/// scale, the same bytes (qs recomputed, not stored). Four heads' maxima and sums reduce together
/// (reduce4); |qs| and the running maximum in one vrangeps; four vectors of bytes a pack (signed
/// saturation to 16 and then 8 bits: vpmovsdb's to 8).
template <int NQ>
void int8_query(const float* q, int64_t D, const uint16_t* scales, const uint16_t* mins,
                float sym_off, int8_t* q8, float* qscale, float* base) {
  auto half16 = [](const uint16_t* x) {
    return _mm512_maskz_cvtph_ps(kAll16, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x)));
  };
  // after the packs, dword 4 m + k of 128-bit lane m holds channels 16 k + 4 m .. 16 k + 4 m + 3
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  auto block = [&]<int N>(int i0) {  // heads i0 .. i0 + N - 1
    __m512 bacc[N], amax[N], inv[N];
    for (int i = 0; i < N; ++i) bacc[i] = amax[i] = _mm512_setzero_ps();
    for (int64_t d = 0; d < D; d += 16) {
      const __m512 sc = half16(scales + d);
      const __m512 mn = mins ? half16(mins + d) : _mm512_mul_ps(_mm512_set1_ps(-sym_off), sc);
      for (int i = 0; i < N; ++i) {
        const __m512 qv = _mm512_loadu_ps(q + (i0 + i) * D + d);
        bacc[i] = _mm512_fmadd_ps(qv, mn, bacc[i]);
        // max(|amax|, |q * scale|), sign cleared (imm 0b1011)
        amax[i] = _mm512_maskz_range_ps(kAll16, amax[i], _mm512_mul_ps(qv, sc), 0x0B);
      }
    }
    alignas(64) float am[16], bs[16];
    _mm512_store_ps(
        am, reduce4<N>(amax, [](__m512 a, __m512 b) { return _mm512_maskz_max_ps(kAll16, a, b); }));
    _mm512_store_ps(bs, reduce4<N>(bacc, [](__m512 a, __m512 b) { return _mm512_add_ps(a, b); }));
    for (int i = 0; i < N; ++i) {
      base[i0 + i] = bs[4 * i];
      qscale[i0 + i] = am[4 * i] / 127.0f;
      inv[i] = _mm512_set1_ps(am[4 * i] > 0 ? 127.0f / am[4 * i] : 0.0f);
    }
    auto ints = [&](int i, int64_t d, __m512 sc) {
      const __m512 qs = _mm512_mul_ps(_mm512_loadu_ps(q + (i0 + i) * D + d), sc);
      return _mm512_maskz_cvtps_epi32(kAll16, _mm512_mul_ps(qs, inv[i]));
    };
    int64_t d = 0;
    for (; d + 64 <= D; d += 64) {
      __m512 sc[4];
      for (int k = 0; k < 4; ++k) sc[k] = half16(scales + d + 16 * k);
      for (int i = 0; i < N; ++i) {
        const __m512i lo =
            _mm512_maskz_packs_epi32(kAll32, ints(i, d, sc[0]), ints(i, d + 16, sc[1]));
        const __m512i hi =
            _mm512_maskz_packs_epi32(kAll32, ints(i, d + 32, sc[2]), ints(i, d + 48, sc[3]));
        _mm512_storeu_si512(q8 + (i0 + i) * D + d,
                            _mm512_maskz_permutexvar_epi32(
                                kAll16, order, _mm512_maskz_packs_epi16(kAll64, lo, hi)));
      }
    }
    for (; d < D; d += 16) {
      const __m512 sc = half16(scales + d);
      for (int i = 0; i < N; ++i)
        _mm_storeu_si128(reinterpret_cast<__m128i*>(q8 + (i0 + i) * D + d),
                         _mm512_maskz_cvtsepi32_epi8(kAll16, ints(i, d, sc)));
    }
  };
  int i0 = 0;
  for (; i0 + 4 <= NQ; i0 += 4) block.template operator()<4>(i0);
  if constexpr (NQ % 4 != 0) block.template operator()<NQ % 4>(i0);
}
#endif

/// Int8 mode: interleaved code bytes split by bit position into one code per byte. Bits 2: n[r] =
/// the field at bits 2r of every byte of x0 (x1 unused); bits 4: n[0], n[1] = the low and high
/// nibbles of x0, n[2], n[3] those of x1.
template <int B>
inline void split_fields(__m256i x0, __m256i x1, __m256i* n) {
  if constexpr (B == 2) {
    const __m256i mask = _mm256_set1_epi32(0x03030303);
    for (int r = 0; r < 4; ++r) n[r] = _mm256_and_si256(_mm256_srli_epi32(x0, 2 * r), mask);
  } else {
    const __m256i mask = _mm256_set1_epi32(0x0F0F0F0F);
    n[0] = _mm256_and_si256(x0, mask);
    n[1] = _mm256_and_si256(_mm256_srli_epi32(x0, 4), mask);
    n[2] = _mm256_and_si256(x1, mask);
    n[3] = _mm256_and_si256(_mm256_srli_epi32(x1, 4), mask);
  }
}

/// Int8 mode: the codes of 32 tokens (one slice of a per-channel key group) of channels d .. d + 3
/// (w: channel d's first word of the slice, channels wpg words apart), interleaved byte by byte so
/// that every 32-bit lane of n[r] holds one token's four codes in channel order; the token of lane
/// k of n[r] follows quad_codes' channel rule (2 bits: 4k + r; 4 bits: 2k + r, 16 + 2k + r - 2).
template <int B>
inline void key_quad(const uint32_t* w, int64_t wpg, __m256i* n) {
  // within each 128-bit lane, dword i byte b -> dword b byte i (a 4 x 4 byte transpose)
  const __m256i bt = _mm256_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15, 0, 4, 8,
                                      12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  if constexpr (B == 2) {  // two words a channel, 16 tokens each; byte b: tokens 4b .. 4b + 3
    __m256i x;
    if (wpg == 2) {
      x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w));
    } else {
      auto two = [&](int i) {
        return _mm_loadl_epi64(reinterpret_cast<const __m128i*>(w + i * wpg));
      };
      x = _mm256_set_m128i(_mm_unpacklo_epi64(two(2), two(3)), _mm_unpacklo_epi64(two(0), two(1)));
    }
    // [w(d,0) w(d+1,0) w(d+2,0) w(d+3,0) | w(d,1) ...], then lane 4x + b = the four byte b's
    x = _mm256_shuffle_epi8(
        _mm256_permutevar8x32_epi32(x, _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7)), bt);
    split_fields<2>(x, x, n);
  } else {  // four words a channel, 8 tokens each; byte b: tokens 2b, 2b + 1
    __m128i c[4];
    for (int i = 0; i < 4; ++i)
      c[i] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + i * wpg));
    const __m128i t0 = _mm_unpacklo_epi32(c[0], c[1]), t1 = _mm_unpackhi_epi32(c[0], c[1]);
    const __m128i t2 = _mm_unpacklo_epi32(c[2], c[3]), t3 = _mm_unpackhi_epi32(c[2], c[3]);
    const __m256i x0 = _mm256_shuffle_epi8(
        _mm256_set_m128i(_mm_unpackhi_epi64(t0, t2), _mm_unpacklo_epi64(t0, t2)), bt);
    const __m256i x1 = _mm256_shuffle_epi8(
        _mm256_set_m128i(_mm_unpackhi_epi64(t1, t3), _mm_unpacklo_epi64(t1, t3)), bt);
    split_fields<4>(x0, x1, n);
  }
}

/// Int8 mode: the packed codes of 32 channels (bits 2 or 4) of four tokens (rows p, p + stride,
/// p + 2 stride, p + 3 stride), interleaved byte by byte and split by bit position: every 32-bit
/// lane of n[r] holds one channel's four codes in token order. The channel of lane k of n[r] is,
/// for 2 bits, 4k + r; for 4 bits, 2k + r (r = 0, 1) and 16 + 2k + (r - 2) (r = 2, 3).
template <int B>
inline void quad_codes(const uint8_t* p, int64_t stride, __m256i* n) {
  if constexpr (B == 2) {  // 8 bytes a token: byte k holds channels 4k .. 4k + 3
    __m128i t[4];
    for (int u = 0; u < 4; ++u)
      t[u] = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + u * stride));
    const __m128i a = _mm_unpacklo_epi8(t[0], t[1]), c = _mm_unpacklo_epi8(t[2], t[3]);
    const __m256i x = _mm256_set_m128i(_mm_unpackhi_epi16(a, c), _mm_unpacklo_epi16(a, c));
    split_fields<2>(x, x, n);
  } else {  // 16 bytes a token: byte k holds channels 2k (low nibble) and 2k + 1
    __m128i t[4];
    for (int u = 0; u < 4; ++u)
      t[u] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + u * stride));
    const __m128i a = _mm_unpacklo_epi8(t[0], t[1]), b = _mm_unpackhi_epi8(t[0], t[1]);
    const __m128i c = _mm_unpacklo_epi8(t[2], t[3]), d = _mm_unpackhi_epi8(t[2], t[3]);
    const __m256i x0 = _mm256_set_m128i(_mm_unpackhi_epi16(a, c), _mm_unpacklo_epi16(a, c));
    const __m256i x1 = _mm256_set_m128i(_mm_unpackhi_epi16(b, d), _mm_unpacklo_epi16(b, d));
    split_fields<4>(x0, x1, n);
  }
}

/// quad_codes' lanes back in channel order: f[r] (lanes as n[r]) into out[0..3], channels 8r ..
/// 8r + 7.
template <int B>
inline void channel_order(const __m256* f, __m256* out) {
  if constexpr (B == 2) {  // a 4 x 8 transpose
    const __m256 t0 = _mm256_unpacklo_ps(f[0], f[1]), t1 = _mm256_unpackhi_ps(f[0], f[1]);
    const __m256 t2 = _mm256_unpacklo_ps(f[2], f[3]), t3 = _mm256_unpackhi_ps(f[2], f[3]);
    const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
    const __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
    out[0] = _mm256_permute2f128_ps(u0, u1, 0x20);
    out[1] = _mm256_permute2f128_ps(u2, u3, 0x20);
    out[2] = _mm256_permute2f128_ps(u0, u1, 0x31);
    out[3] = _mm256_permute2f128_ps(u2, u3, 0x31);
  } else {  // even and odd channels interleaved, per half
    for (int h = 0; h < 2; ++h) {
      const __m256 lo = _mm256_unpacklo_ps(f[2 * h], f[2 * h + 1]);
      const __m256 hi = _mm256_unpackhi_ps(f[2 * h], f[2 * h + 1]);
      out[2 * h] = _mm256_permute2f128_ps(lo, hi, 0x20);
      out[2 * h + 1] = _mm256_permute2f128_ps(lo, hi, 0x31);
    }
  }
}

/// Int8 mode, 256-bit key codes: key_quad's interleave (lane k of part r: the token of
/// quad_codes' channel rule), scores back in token order through channel_order.
template <int B>
struct Int8Keys256 {
  using Acc = __m256i;
  static constexpr int kParts = 4;
  static constexpr int64_t kSliceWords = B;  // words per channel in 32 tokens
  static Acc zero() { return _mm256_setzero_si256(); }
  static void codes(const uint32_t* w, int64_t wpg, Acc* c) { key_quad<B>(w, wpg, c); }
  static Acc bcast(int32_t q) { return _mm256_set1_epi32(q); }
  static Acc dp(Acc acc, Acc c, Acc q) { return dpbusd(acc, c, q); }
  /// t[0..31] = qs * sum + bs for the slice's 32 tokens in order.
  static void scores(const Acc* acc, float qs, float bs, float* t) {
    __m256 f[4], out[4];
    for (int r = 0; r < 4; ++r) f[r] = _mm256_cvtepi32_ps(acc[r]);
    channel_order<B>(f, out);
    for (int r = 0; r < 4; ++r)
      _mm256_storeu_ps(t + 8 * r, _mm256_fmadd_ps(out[r], _mm256_set1_ps(qs), _mm256_set1_ps(bs)));
  }
};

/// Int8 mode scores of a per-channel key group (bits 2 or 4, G a multiple of 32; words
/// channel-major, word x of channel d at words[d * wpg + x]) for its tokens [j0, j0 + n): 32-token
/// slices, four channels at a time, s = qscale_i * sum_d q8_id * code_td + base_i - exact integer
/// sums (dpbusd: codes unsigned, q signed, pair sums <= 2 * 15 * 127) on the rounded query. K: the
/// vector form (Int8Keys256, or Int8Keys512 with AVX-512 VNNI and VBMI): the same integer sums and
/// the same final fma on them.
template <int NQ, class K>
void dot_int8_group(const uint32_t* words, int64_t D, int64_t wpg, const int8_t* q8,
                    const float* qscale, const float* base, int64_t j0, int64_t n, float* s,
                    int64_t lds) {
  constexpr int P = K::kParts;
  for (int64_t sl = j0 / 32; sl * 32 < j0 + n; ++sl) {
    const int64_t a = std::max(j0, sl * 32), b = std::min(j0 + n, sl * 32 + 32);
    auto heads = [&]<int NH>(int i0) {
      typename K::Acc acc[NH * P];
      for (auto& x : acc) x = K::zero();
      for (int64_t d = 0; d < D; d += 4) {
        typename K::Acc c[P];
        K::codes(words + d * wpg + sl * K::kSliceWords, wpg, c);
        for (int i = 0; i < NH; ++i) {
          int32_t qq;
          std::memcpy(&qq, q8 + (i0 + i) * D + d, 4);
          const auto qv = K::bcast(qq);
          for (int r = 0; r < P; ++r) acc[i * P + r] = K::dp(acc[i * P + r], c[r], qv);
        }
      }
      for (int i = 0; i < NH; ++i) {
        alignas(64) float t[32];
        typename K::Acc sums[P];  // a copy: acc's address not taken (GCC 12 then kept acc in
        for (int r = 0; r < P; ++r) sums[r] = acc[i * P + r];  // memory, a store a dot product)
        float* si = s + (i0 + i) * lds;
        if (b - a == 32) {  // a whole slice: straight to the scores (GCC made the copy below a
          K::scores(sums, qscale[i0 + i], base[i0 + i], si + (a - j0));  // memcpy call)
          continue;
        }
        K::scores(sums, qscale[i0 + i], base[i0 + i], t);
        for (int64_t jj = a; jj < b; ++jj) si[jj - j0] = t[jj - sl * 32];
      }
    };
    head_blocks<NQ>(heads);
  }
}

#if KVQ_INT8_512
/// Int8 mode, 512-bit: the shift of 32-bit lane L that brings code (L * B) % 8 of each of its bytes
/// to bit 0 (lane L's bytes, placed by a byte permute, hold its code at that position).
template <int B>
inline __m512i lane_shift() {
  if constexpr (B == 2) return _mm512_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6, 0, 2, 4, 6, 0, 2, 4, 6);
  return _mm512_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4);
}

/// key_tokens' byte permutes (u = 0, 1): byte 4t + r of part u is the byte of channel r's slice
/// words (channel r at dword B * r) that holds token 16u + t.
template <int B>
inline constexpr auto kKeyIndex = [] {
  std::array<uint8_t, 128> a{};
  for (int u = 0; u < 2; ++u)
    for (int t = 0; t < 16; ++t)
      for (int r = 0; r < 4; ++r) a[64 * u + 4 * t + r] = 4 * B * r + (16 * u + t) * B / 8;
  return a;
}();

/// Int8 mode, 512-bit: the codes of channels d .. d + 3 (w: channel d's first word of a 32-token
/// slice, channels wpg words apart) for the slice's tokens 16u .. 16u + 15 in c[u], tokens in the
/// lanes: byte r of lane t is channel d + r's code of token 16u + t (one vpdpbusd then takes four
/// channels of 16 tokens). One byte permute (kKeyIndex) puts each token's byte of every channel in
/// its lane, a shift per lane and a mask leave the codes.
template <int B>
inline void key_tokens(const uint32_t* w, int64_t wpg, __m512i* c) {
  __m512i x;       // channel r's slice word k at dword B * r + k (B == 2: the upper half unread)
  if (wpg == B) {  // (a masked load here was several times slower)
    if constexpr (B == 4)
      x = _mm512_loadu_si512(w);
    else
      x = _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w)));
  } else {
    alignas(64) uint32_t t[16] = {};
    for (int r = 0; r < 4; ++r)
      for (int k = 0; k < B; ++k) t[B * r + k] = w[r * wpg + k];
    x = _mm512_load_si512(t);
  }
  const __m512i sh = lane_shift<B>();
  for (int u = 0; u < 2; ++u) {
    const __m512i y =
        _mm512_maskz_permutexvar_epi8(kAll64, _mm512_loadu_si512(kKeyIndex<B>.data() + 64 * u), x);
    c[u] = _mm512_and_si512(_mm512_maskz_srlv_epi32(kAll16, y, sh),
                            _mm512_set1_epi8(static_cast<char>(kivi::code_mask(B))));
  }
}

/// Int8 mode, 512-bit key codes with the tokens in the lanes (key_tokens): scores in token order.
template <int B>
struct Int8Keys512 {
  using Acc = __m512i;
  static constexpr int kParts = 2;
  static constexpr int64_t kSliceWords = B;
  static Acc zero() { return _mm512_setzero_si512(); }
  static void codes(const uint32_t* w, int64_t wpg, Acc* c) { key_tokens<B>(w, wpg, c); }
  static Acc bcast(int32_t q) { return _mm512_set1_epi32(q); }
  static Acc dp(Acc acc, Acc c, Acc q) { return dpbusd512(acc, c, q); }
  static void scores(const Acc* acc, float qs, float bs, float* t) {
    for (int u = 0; u < 2; ++u)
      _mm512_storeu_ps(t + 16 * u, _mm512_fmadd_ps(_mm512_maskz_cvtepi32_ps(kAll16, acc[u]),
                                                   _mm512_set1_ps(qs), _mm512_set1_ps(bs)));
  }
};
#endif

/// Int8 mode: the weights w ([NQ][kSubRows], rows 0 .. m - 1) of one channel group as unsigned
/// bytes per query head, wmax = max_j w_j, wb_j = rne(w_j * float(255 / wmax)) in 0..255, and
/// fac = wmax / 255; bytes m .. 4 * ceil(m / 4) - 1 are zero (a last quad's missing tokens).
template <int NQ>
void weight_bytes(const float* w, int64_t m, uint8_t* wb, float* fac) {
  const int64_t quads = (m + 3) / 4;
  for (int i = 0; i < NQ; ++i) {
    const float* wi = w + i * kSubRows;
    uint8_t* bi = wb + i * kSubRows;
    __m256 mx = _mm256_setzero_ps();
    int64_t x = 0;
    for (; x + 8 <= m; x += 8) mx = _mm256_max_ps(mx, _mm256_loadu_ps(wi + x));
    float wmax = hmax8(mx);
    for (; x < m; ++x) wmax = std::max(wmax, wi[x]);
    const float inv = wmax > 0 ? 255.0f / wmax : 0.0f;
    fac[i] = wmax / 255.0f;
    const __m256 iv = _mm256_set1_ps(inv);
    for (x = 0; x + 8 <= m; x += 8) {
      const __m256i v = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(wi + x), iv));
      const __m128i h = _mm_packus_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
      _mm_storel_epi64(reinterpret_cast<__m128i*>(bi + x), _mm_packus_epi16(h, h));
    }
    for (; x < m; ++x) bi[x] = static_cast<uint8_t>(std::lrint(wi[x] * inv));
    for (; x < quads * 4; ++x) bi[x] = 0;
  }
}

/// Int8 mode, per-token values of channel group c (G a multiple of 32) over rows [j0, j0 + m),
/// m <= kSubRows, w = p * scale as acc_token_values computes it ([NQ][kSubRows]): per query head,
/// with weight_bytes' u_j and fac = wmax / 255,
///   o[d] += fac * sum_j u_j * code_jd      (exact integer sums, four tokens per
/// byte dot product; the weights' bytes are the unsigned operand, the codes the signed one: pair
/// sums <= 2 * 255 * 15, so the vpmaddubsw fallback never saturates).
template <int NQ, int B>
void acc_int8_group(const float* w, int64_t m, const TokenCodes<B>& ld, int64_t j0, int64_t c,
                    float* o, int64_t D) {
  const int64_t G = ld.group, quads = (m + 3) / 4;
  alignas(32) uint8_t wb[NQ * kSubRows];
  float fac[NQ];
  weight_bytes<NQ>(w, m, wb, fac);
  const auto* base = reinterpret_cast<const uint8_t*>(ld.words + j0 * ld.wstride + c * ld.wpg);
  const int64_t tstride = ld.wstride * 4;  // bytes per token
  // Heads in blocks of up to 4 (16 accumulators); a block rebuilds the interleaved codes.
  auto heads = [&]<int NH>(int i0, int64_t k) {
    __m256i acc[NH * 4];
    for (auto& x : acc) x = _mm256_setzero_si256();
    const uint8_t* chunk = base + k * B / 8;
    // A last quad of fewer than 4 tokens reads its rows from a zeroed copy (no branch per load).
    alignas(16) uint8_t part[4][16] = {};
    for (int64_t u = 4 * (m / 4); u < m; ++u) std::memcpy(part[u % 4], chunk + u * tstride, 4 * B);
    for (int64_t q = 0; q < quads; ++q) {
      __m256i n[4];
      if (4 * q + 4 <= m)
        quad_codes<B>(chunk + 4 * q * tstride, tstride, n);
      else
        quad_codes<B>(part[0], 16, n);
      for (int i = 0; i < NH; ++i) {
        uint32_t wq;
        std::memcpy(&wq, wb + (i0 + i) * kSubRows + 4 * q, 4);
        const __m256i wv = _mm256_set1_epi32(static_cast<int>(wq));
        for (int r = 0; r < 4; ++r) acc[i * 4 + r] = dpbusd(acc[i * 4 + r], wv, n[r]);
      }
    }
    for (int i = 0; i < NH; ++i) {
      float* oi = o + (i0 + i) * D + c * G + k;
      __m256 f[4], out[4];
      for (int r = 0; r < 4; ++r) f[r] = _mm256_cvtepi32_ps(acc[i * 4 + r]);
      channel_order<B>(f, out);
      const __m256 fv = _mm256_set1_ps(fac[i0 + i]);
      for (int r = 0; r < 4; ++r)
        _mm256_storeu_ps(oi + 8 * r, _mm256_fmadd_ps(out[r], fv, _mm256_loadu_ps(oi + 8 * r)));
    }
  };
  for (int64_t k = 0; k < G; k += 32)
    head_blocks<NQ>([&]<int NH>(int i0) { heads.template operator()<NH>(i0, k); });
}

#if KVQ_INT8_512
/// Int8 mode, 512-bit: four tokens' packed bytes of NS 32-channel slices (TB = 4 * NS * B bytes a
/// token, rows r[0..3]) as x0 = [r0 r1 ...] and, where they do not fit one register, x1 = [r2 r3].
template <int B, int NS>
inline void quad_rows(const uint8_t* const* r, __m512i& x0, __m512i& x1) {
  constexpr int TB = 4 * NS * B;
  if constexpr (TB == 8) {
    auto q = [&](int t) { return static_cast<long long>(load_u64(r[t])); };
    x0 = _mm512_castsi256_si512(_mm256_setr_epi64x(q(0), q(1), q(2), q(3)));
  } else if constexpr (TB == 16) {
    auto l = [&](int t) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(r[t])); };
    x0 = _mm512_castsi128_si512(l(0));
    x0 = _mm512_maskz_inserti32x4(kAll16, x0, l(1), 1);
    x0 = _mm512_maskz_inserti32x4(kAll16, x0, l(2), 2);
    x0 = _mm512_maskz_inserti32x4(kAll16, x0, l(3), 3);
  } else {
    static_assert(TB == 32);
    auto l = [&](int t) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r[t])); };
    x0 = _mm512_maskz_inserti64x4(0xff, _mm512_castsi256_si512(l(0)), l(1), 1);
    x1 = _mm512_maskz_inserti64x4(0xff, _mm512_castsi256_si512(l(2)), l(3), 1);
  }
}

/// quad_rows' byte permutes: for 16 channels z of the pass (index z), byte 4L + t of the result is
/// token t's byte that holds channel 16z + L (index 64 on: x1).
template <int B, int NS>
inline constexpr auto kQuadIndex = [] {
  std::array<uint8_t, 128 * NS> a{};
  for (int z = 0; z < 2 * NS; ++z)
    for (int L = 0; L < 16; ++L)
      for (int t = 0; t < 4; ++t) a[64 * z + 4 * L + t] = t * 4 * NS * B + (16 * z + L) * B / 8;
  return a;
}();

/// Int8 mode, 512-bit: NH query heads' sums over m rows (tstride bytes apart from col) of NS
/// 32-channel slices, slice s of head i weighted by the bytes wr[i * NS + s] (four tokens a
/// vpdpbusd) and added to orow[i][0 .. 32 NS) times fr[i * NS + s].
template <int B, int NS, int NH>
inline void int8_block(const uint8_t* col, int64_t tstride, int64_t m, const uint8_t* const* wr,
                       const float* fr, float* const* orow) {
  constexpr int Z = 2 * NS;  // 16-channel vectors
  alignas(64) static constexpr uint8_t kZero[64] = {};
  const __m512i sh = lane_shift<B>();
  const __m512i mask = _mm512_set1_epi8(static_cast<char>(kivi::code_mask(B)));
  __m512i acc[NH * Z];
  for (auto& x : acc) x = _mm512_setzero_si512();
  auto quad = [&](const uint8_t* const* r, int64_t x) {  // rows x .. x + 3
    __m512i x0, x1 = _mm512_setzero_si512();
    quad_rows<B, NS>(r, x0, x1);
    __m512i code[Z];
    for (int z = 0; z < Z; ++z) {
      const __m512i idx = _mm512_loadu_si512(kQuadIndex<B, NS>.data() + 64 * z);
      code[z] = _mm512_and_si512(
          _mm512_maskz_srlv_epi32(kAll16, _mm512_permutex2var_epi8(x0, idx, x1), sh), mask);
    }
    for (int i = 0; i < NH; ++i)
      for (int s = 0; s < NS; ++s) {
        const __m512i wv = _mm512_set1_epi32(static_cast<int>(load_u32(wr[i * NS + s] + x)));
        for (int z = 2 * s; z < 2 * s + 2; ++z)
          acc[i * Z + z] = dpbusd512(acc[i * Z + z], wv, code[z]);
      }
  };
  int64_t x = 0;
  for (const uint8_t* p = col; x + 4 <= m; x += 4, p += 4 * tstride) {
    const uint8_t* r[4] = {p, p + tstride, p + 2 * tstride, p + 3 * tstride};
    quad(r, x);
  }
  if (x < m) {  // a last quad of fewer than four rows: the missing ones read zeros (weights 0)
    const uint8_t* r[4];
    for (int t = 0; t < 4; ++t) r[t] = x + t < m ? col + (x + t) * tstride : kZero;
    quad(r, x);
  }
  for (int i = 0; i < NH; ++i)
    for (int z = 0; z < Z; ++z) {
      float* oz = orow[i] + 16 * z;
      _mm512_storeu_ps(oz,
                       _mm512_fmadd_ps(_mm512_maskz_cvtepi32_ps(kAll16, acc[i * Z + z]),
                                       _mm512_set1_ps(fr[i * NS + z / 2]), _mm512_loadu_ps(oz)));
    }
}

/// Int8 mode, 512-bit, a whole sub-block (kSubRows tokens) of channel group c, straight from the
/// softmax weights p ([NQ] rows ldp apart) and the group's scales sc and minima mn: weight_bytes'
/// bytes (wb, [NQ][kSubRows]) and factors (fac) of w = p * scale, the same values, and p_j * min_j
/// added to the 16-lane sums mv[i * mstride ..] (reduced once, after the last sub-block).
template <int NQ>
void weights_sub(const float* p, int64_t ldp, const float* sc, const float* mn, uint8_t* wb,
                 float* fac, float* mv, int64_t mstride) {
  static_assert(kSubRows == 32);
  const __m512 s0 = _mm512_loadu_ps(sc), s1 = _mm512_loadu_ps(sc + 16);
  const __m512 n0 = _mm512_loadu_ps(mn), n1 = _mm512_loadu_ps(mn + 16);
  __m512 w[NQ][2], inv[NQ];
  for (int i = 0; i < NQ; ++i) {
    const __m512 p0 = _mm512_loadu_ps(p + i * ldp), p1 = _mm512_loadu_ps(p + i * ldp + 16);
    w[i][0] = _mm512_mul_ps(p0, s0);
    w[i][1] = _mm512_mul_ps(p1, s1);
    float* mi = mv + i * mstride;
    _mm512_storeu_ps(mi, _mm512_fmadd_ps(p1, n1, _mm512_fmadd_ps(p0, n0, _mm512_loadu_ps(mi))));
    const float wmax = hmax16(_mm512_maskz_max_ps(kAll16, w[i][0], w[i][1]));
    inv[i] = _mm512_set1_ps(wmax > 0 ? 255.0f / wmax : 0.0f);
    fac[i] = wmax / 255.0f;
  }
  // rne, then 0..255 by signed saturation (negative and NaN, which converts to INT_MIN, give 0):
  // w <= wmax keeps the values at 255 or less, so the packs' saturation to 65535 and the 16-bit
  // pack's sign never matter.
  auto ints = [&](int i, int h) {
    return _mm512_maskz_cvtps_epi32(kAll16, _mm512_mul_ps(w[i][h], inv[i]));
  };
  // Two heads' 64 bytes a store: after the packs, dword 4m + k of a 128-bit lane m holds tokens
  // 4m .. 4m + 3 of (head, half) k = (i, 0), (i, 1), (i + 1, 0), (i + 1, 1); out dword j is in
  // dword 4 (j % 4) + j / 4.
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  int i = 0;
  for (; i + 2 <= NQ; i += 2) {
    const __m512i lo = _mm512_maskz_packus_epi32(kAll32, ints(i, 0), ints(i, 1));
    const __m512i hi = _mm512_maskz_packus_epi32(kAll32, ints(i + 1, 0), ints(i + 1, 1));
    _mm512_storeu_si512(
        wb + i * kSubRows,
        _mm512_maskz_permutexvar_epi32(kAll16, order, _mm512_maskz_packus_epi16(kAll64, lo, hi)));
  }
  if (i < NQ) {  // an odd last head
    auto bytes = [&](int h) {
      return _mm512_maskz_cvtusepi32_epi8(
          kAll16, _mm512_maskz_max_epi32(kAll16, ints(i, h), _mm512_setzero_si512()));
    };
    _mm_storeu_si128(reinterpret_cast<__m128i*>(wb + i * kSubRows), bytes(0));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(wb + i * kSubRows + 16), bytes(1));
  }
}

/// weights_sub4's byte permute: byte 32 g + 4 k + t of its output is the byte of group g, token 4 k
/// + t of the sub-block, from two packed vectors (index 64 on: the second) whose byte 16 t + 4 k +
/// g holds quad k (of four) token t, group g.
inline constexpr auto kWeightIndex = [] {
  std::array<uint8_t, 128> a{};
  for (int h = 0; h < 2; ++h)  // output vector h: groups 2 h, 2 h + 1
    for (int g = 0; g < 2; ++g)
      for (int k = 0; k < 8; ++k)
        for (int t = 0; t < 4; ++t)
          a[64 * h + 32 * g + 4 * k + t] =
              static_cast<uint8_t>(64 * (k / 4) + 16 * t + 4 * (k % 4) + 2 * h + g);
  return a;
}();

/// Int8 mode, 512-bit, four channel groups a head (ncg == 4) and a whole sub-block: weights_sub's
/// bytes (wb), factors (fac) and p * min sums of every group at once, straight from the fp16
/// parameters (scales and mins of sub-block token 0, pstride halves a token; mins null: symmetric,
/// min = sym_min * scale). A vector holds four tokens' four groups as they are stored (lane 4 t +
/// g), so no float copies (sct, mnt) are made; the products, divisions and roundings are
/// weights_sub's, and so are the maxima of the weights (which are >= 0), so the bytes and factors
/// are the same. The p * min sums go to mv[16 i + 4 t + g]
/// (summed over t once, after the last sub-block: acc_token_values).
template <int NQ>
void weights_sub4(const float* p, int64_t ldp, const uint16_t* scales, const uint16_t* mins,
                  float sym_min, int64_t pstride, uint8_t* wb, float* fac, float* mv) {
  static_assert(kSubRows == 32);
  auto params = [&](const uint16_t* x, int64_t k) {  // tokens 4k .. 4k + 3, their four groups
    const uint16_t* r = x + 4 * k * pstride;
    const __m128i lo =
        _mm_unpacklo_epi64(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(r)),
                           _mm_loadl_epi64(reinterpret_cast<const __m128i*>(r + pstride)));
    const __m128i hi =
        _mm_unpacklo_epi64(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(r + 2 * pstride)),
                           _mm_loadl_epi64(reinterpret_cast<const __m128i*>(r + 3 * pstride)));
    return _mm512_maskz_cvtph_ps(kAll16, _mm256_set_m128i(hi, lo));
  };
  __m512 sc[8], mn[8];
  for (int64_t k = 0; k < 8; ++k) {
    sc[k] = params(scales, k);
    mn[k] = mins ? params(mins, k) : _mm512_mul_ps(_mm512_set1_ps(sym_min), sc[k]);
  }
  // lane 4 t + g of quad k (of a 16-token half) takes token 4 k + t's weight
  const __m512i spread[4] = {
      _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3),
      _mm512_setr_epi32(4, 4, 4, 4, 5, 5, 5, 5, 6, 6, 6, 6, 7, 7, 7, 7),
      _mm512_setr_epi32(8, 8, 8, 8, 9, 9, 9, 9, 10, 10, 10, 10, 11, 11, 11, 11),
      _mm512_setr_epi32(12, 12, 12, 12, 13, 13, 13, 13, 14, 14, 14, 14, 15, 15, 15, 15)};
  const __m512i i0 = _mm512_loadu_si512(kWeightIndex.data()),
                i1 = _mm512_loadu_si512(kWeightIndex.data() + 64);
  for (int i = 0; i < NQ; ++i) {
    const __m512 ph[2] = {_mm512_loadu_ps(p + i * ldp), _mm512_loadu_ps(p + i * ldp + 16)};
    __m512 w[8], mx = _mm512_setzero_ps(), ms = _mm512_loadu_ps(mv + 16 * i);
    for (int k = 0; k < 8; ++k) {
      const __m512 pk = _mm512_maskz_permutexvar_ps(kAll16, spread[k % 4], ph[k / 4]);
      w[k] = _mm512_mul_ps(pk, sc[k]);
      mx = _mm512_maskz_max_ps(kAll16, mx, w[k]);
      ms = _mm512_fmadd_ps(pk, mn[k], ms);
    }
    _mm512_storeu_ps(mv + 16 * i, ms);
    // each group's maximum over the four tokens of a 128-bit lane and the four lanes
    mx = _mm512_maskz_max_ps(kAll16, mx, _mm512_maskz_shuffle_f32x4(kAll16, mx, mx, 0x4E));
    mx = _mm512_maskz_max_ps(kAll16, mx, _mm512_maskz_shuffle_f32x4(kAll16, mx, mx, 0xB1));
    const __m128 wmax = _mm512_maskz_extractf32x4_ps(0xf, mx, 0);
    const __m128 inv4 =
        _mm_and_ps(_mm_cmpgt_ps(wmax, _mm_setzero_ps()), _mm_div_ps(_mm_set1_ps(255.0f), wmax));
    alignas(16) float f[4];
    _mm_store_ps(f, _mm_div_ps(wmax, _mm_set1_ps(255.0f)));
    for (int g = 0; g < 4; ++g) fac[g * NQ + i] = f[g];
    const __m512 inv = _mm512_maskz_broadcast_f32x4(kAll16, inv4);
    __m512i u[8];
    for (int k = 0; k < 8; ++k) u[k] = _mm512_maskz_cvtps_epi32(kAll16, _mm512_mul_ps(w[k], inv));
    // rne, then 0..255 by unsigned saturation as weights_sub: byte 16 t + 4 k + g of x / y holds
    // quad k (0-3 / 4-7), token t, group g
    const __m512i x =
        _mm512_maskz_packus_epi16(kAll64, _mm512_maskz_packus_epi32(kAll32, u[0], u[1]),
                                  _mm512_maskz_packus_epi32(kAll32, u[2], u[3]));
    const __m512i y =
        _mm512_maskz_packus_epi16(kAll64, _mm512_maskz_packus_epi32(kAll32, u[4], u[5]),
                                  _mm512_maskz_packus_epi32(kAll32, u[6], u[7]));
    const __m512i g01 = _mm512_maskz_permutex2var_epi8(kAll64, x, i0, y);
    const __m512i g23 = _mm512_maskz_permutex2var_epi8(kAll64, x, i1, y);
    auto put = [&](int g, __m256i b) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(wb + (g * NQ + i) * kSubRows), b);
    };
    put(0, _mm512_maskz_extracti64x4_epi64(0xff, g01, 0));
    put(1, _mm512_maskz_extracti64x4_epi64(0xff, g01, 1));
    put(2, _mm512_maskz_extracti64x4_epi64(0xff, g23, 0));
    put(3, _mm512_maskz_extracti64x4_epi64(0xff, g23, 1));
  }
}

/// Int8 mode, 512-bit (AVX-512 VBMI + VNNI): acc_int8_group's sums for every channel group of rows
/// [j0, j0 + m) (m <= kSubRows) at once, wb / fac: weight_bytes of group c at c * NQ * kSubRows /
/// c * NQ. Passes of one 32-channel slice (NS = 1; see below), per four tokens: one byte
/// permute per 16 channels puts the four tokens' bytes of channel d in lane d, a shift per lane and
/// a mask leave the codes, and one vpdpbusd per query head takes the four tokens' weights of the
/// channels' group. The same integer sums and the same final fma per channel as acc_int8_group.
template <int NQ, int B>
void acc_int8_rows(const uint8_t* wb, const float* fac, int64_t m, const TokenCodes<B>& ld,
                   int64_t j0, float* o, int64_t D) {
  static_assert(B == 2 || B == 4);
  const int64_t G = ld.group, tstride = ld.wstride * 4;
  const auto* base = reinterpret_cast<const uint8_t*>(ld.words + j0 * ld.wstride);
  auto pass = [&]<int NS>(int64_t d0) {
    const uint8_t* col = base + d0 * B / 8;
    int64_t g[NS];
    for (int s = 0; s < NS; ++s) g[s] = (d0 + 32 * s) / G;
    auto heads = [&]<int NH>(int i0) {
      const uint8_t* wr[NH * NS];
      float fr[NH * NS];
      float* orow[NH];
      for (int i = 0; i < NH; ++i) {
        orow[i] = o + (i0 + i) * D + d0;
        for (int s = 0; s < NS; ++s) {
          wr[i * NS + s] = wb + (g[s] * NQ + i0 + i) * kSubRows;
          fr[i * NS + s] = fac[g[s] * NQ + i0 + i];
        }
      }
      int8_block<B, NS, NH>(col, tstride, m, wr, fr, orow);
    };
    head_blocks<NQ>(heads);
  };
  // One 32-channel slice a pass: two (NS = 2) held 16 accumulators, the codes and the permute
  // indices in 32 registers and spilled accumulators to the stack; one slice a pass took 0.85-0.93x
  // the time at GQA 4 (int8 kivi2 and kivi4, 1k-32k, one thread; session 17).
  for (int64_t d0 = 0; d0 < D; d0 += 32) pass.template operator()<1>(d0);
}
#endif

}  // namespace
}  // namespace kvq::cpu::KVQ_CPU_PATH_NS::attn
