// Backend `cpu`, x86 attention blocks: the row loaders, which give the float kernels
// (float_dot.h) 8 (or 16) channels of one row at a time, and their prefetch: dense rows (fp32,
// bf16, fp16), fp8 rows (as their values times a power of two), and KIVI codes (per-channel key
// codes of a transposed group, per-token codes, per-token keys dequantized in registers).
#pragma once

#include "kernels/cpu/attention/x86/common.h"
#include "kernels/cpu/attention/x86/simd_math.h"

namespace kvq::cpu::KVQ_CPU_PATH_NS::attn {
// Internal to this path's attention sources: each file that includes it has its own copy (internal
// linkage), as when they were one translation unit, so the compiler inlines them as it did.
namespace {

// Loaders: row j of a call (token t0 + j), channels d .. d + 7, as 8 floats. Token-major rows of
// one head are H * D elements apart (2 KB for bf16 at H=8, D=128): a new page every other row,
// which the hardware prefetchers do not follow, so the kernels prefetch a sub-block ahead.
//
// Software prefetches ask for the line in L2 (kL2, prefetcht1), not L1, except the stream kernels'
// near prefetch where a token's rows are small (with_stream_loc): the block-ahead bursts (256
// tokens of a head's rows and parameters) are several times the 32 KB L1 and, as prefetcht0, pushed
// the rows, weights and accumulators being read out of it. Measured on the Zen 4 host of session 19
// (one thread, caches larger than L3): at 8 KV heads, d128, GQA 4 (32k) the L2 hint took 0.63-0.68x
// the time of prefetcht0 for bf16, int8 kivi4 and int8 FP8 and 0.81-0.95x for the exact int caches;
// prefetcht2 measured as prefetcht1. For bf16's near prefetch the L2 hint took 0.70-0.94x at shapes
// (H,D,GQA) 8,64,4 8,128,4 3,128,3 2,128,4 4,64,4 8,64,3 and 1.00x at 6,64,3, but 1.09-1.30x at
// 3,64,x (SmolLM2-135M's: a token's rows 384 bytes), hence with_stream_loc's threshold.
constexpr int kL1 = 3, kL2 = 2;  // __builtin_prefetch locality: prefetcht0, prefetcht1
template <int kLoc = kL2>
inline void prefetch_row(const void* p, int64_t bytes) {
  const char* c = static_cast<const char*>(p);
  for (int64_t o = 0; o < bytes; o += 64) __builtin_prefetch(c + o, 0, kLoc);
}
/// Runs f.template operator()<kLoc>() with the stream kernels' near-prefetch hint: L1 where a
/// token's H rows of row_bytes are under 512 bytes, else L2.
template <class F>
inline void with_stream_loc(int64_t H, int64_t row_bytes, F&& f) {
  if (H * row_bytes < 512)
    f.template operator()<kL1>();
  else
    f.template operator()<kL2>();
}
template <class L>
concept Prefetchable = requires(const L& l) {
  l.prefetch(int64_t{0}, int64_t{0});
};
constexpr int64_t kSubRows = 32;  // rows per prefetch step
/// Prefetches rows [j0, min(n, j0 + kSubRows)).
template <class L>
inline void prefetch_rows(const L& ld, int64_t j0, int64_t n, int64_t D) {
  for (int64_t j = j0; j < std::min(n, j0 + kSubRows); ++j) ld.prefetch(j, D);
}
// Loaders with a member z(j, d) also give channels d .. d + 15 as 16 floats (512-bit), the same
// values as two calls of operator(); the kernels use it where head_dim is a multiple of 16.
struct F32Rows {
  const float* base;
  int64_t stride;
  static constexpr int64_t kElemBytes = 4;
  template <int kLoc = kL2>
  void prefetch(int64_t j, int64_t D) const {
    prefetch_row<kLoc>(base + j * stride, D * kElemBytes);
  }
  __m256 operator()(int64_t j, int64_t d) const { return _mm256_loadu_ps(base + j * stride + d); }
#if KVQ_CPU_AVX512
  __m512 z(int64_t j, int64_t d) const { return _mm512_loadu_ps(base + j * stride + d); }
#endif
};
struct Bf16Rows {
  const uint16_t* base;
  int64_t stride;
  static constexpr int64_t kElemBytes = 2;
  template <int kLoc = kL2>
  void prefetch(int64_t j, int64_t D) const {
    prefetch_row<kLoc>(base + j * stride, D * kElemBytes);
  }
  __m256 operator()(int64_t j, int64_t d) const {
    return bf16_to_f32x8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(base + j * stride + d)));
  }
#if KVQ_CPU_AVX512
  __m512 z(int64_t j, int64_t d) const {
    return bf16_to_f32x16(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(base + j * stride + d)));
  }
#endif
};
struct Fp16Rows {
  const uint16_t* base;
  int64_t stride;
  static constexpr int64_t kElemBytes = 2;
  template <int kLoc = kL2>
  void prefetch(int64_t j, int64_t D) const {
    prefetch_row<kLoc>(base + j * stride, D * kElemBytes);
  }
  __m256 operator()(int64_t j, int64_t d) const {
    return _mm256_cvtph_ps(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(base + j * stride + d)));
  }
#if KVQ_CPU_AVX512
  __m512 z(int64_t j, int64_t d) const {
    return cvtph16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(base + j * stride + d)));
  }
#endif
};

/// fp8 rows as their values times 2^(kBias - 15) (fp8_raw8, simd_decode.h): the callers fold
/// fp8_restore<F>() into the query or the weights, a power of two, so the same products. kNaN
/// false: the rows hold no NaN code (StoredSide::fp8_nan), so e4m3's NaN decode is skipped.
template <Fp8Format F, bool kNaN = true>
struct Fp8Rows {
  const uint8_t* base;
  int64_t stride;
  static constexpr int64_t kElemBytes = 1;
  template <int kLoc = kL2>
  void prefetch(int64_t j, int64_t D) const {
    prefetch_row<kLoc>(base + j * stride, D * kElemBytes);
  }
  __m256 operator()(int64_t j, int64_t d) const { return fp8_raw8<F, kNaN>(base + j * stride + d); }
#if KVQ_CPU_AVX512
  __m512 z(int64_t j, int64_t d) const { return fp8_raw16<F, kNaN>(base + j * stride + d); }
#endif
};

#if KVQ_CPU_AVX512
template <class L>
concept Wide = requires(const L& l) {
  l.z(int64_t{0}, int64_t{0});
};
inline __m256 half8(__m512 v, int i) {  // lanes 8i .. 8i + 7
  const __m512d x = _mm512_castps_pd(v);
  return _mm256_castpd_ps(i == 0 ? _mm512_maskz_extractf64x4_pd(0xff, x, 0)
                                 : _mm512_maskz_extractf64x4_pd(0xff, x, 1));
}
inline __m256 fold16(__m512 v) { return _mm256_add_ps(half8(v, 0), half8(v, 1)); }
#else
template <class L>
concept Wide = false;
#endif

/// Float vectors of W lanes (8: AVX2, 16: AVX-512) for kernels written once for both widths.
template <int W>
struct FVec {
  using T = __m256;
  static T load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, T v) { _mm256_storeu_ps(p, v); }
  static T bcast(const float* p) { return _mm256_broadcast_ss(p); }
  static T fma(T a, T b, T c) { return _mm256_fmadd_ps(a, b, c); }
  /// W floats of a row loader's row r from channel d (its 8-float form).
  template <class L>
  static T row(const L& ld, int64_t r, int64_t d) {
    return ld(r, d);
  }
};
#if KVQ_CPU_AVX512
template <>
struct FVec<16> {
  using T = __m512;
  static T load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, T v) { _mm512_storeu_ps(p, v); }
  static T bcast(const float* p) { return _mm512_set1_ps(*p); }
  static T fma(T a, T b, T c) { return _mm512_fmadd_ps(a, b, c); }
  template <class L>
  static T row(const L& ld, int64_t r, int64_t d) {  // the 16-float form (Wide<L>)
    return ld.z(r, d);
  }
};
#endif

/// Per-channel int keys of one token group, its words transposed to wt[w * D + d]: token jj0 + j
/// of the group is code (jj0 + j) % cpw of word (jj0 + j) / cpw.
template <int B>
struct ChannelCodes {
  const uint32_t* wt;
  int64_t D;
  int jj0;
  __m256 operator()(int64_t j, int64_t d) const {
    constexpr int kCpw = kivi::codes_per_word(B);
    const int jj = jj0 + static_cast<int>(j);
    const __m256i w =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wt + (jj / kCpw) * D + d));
    const __m256i c = _mm256_and_si256(_mm256_srl_epi32(w, _mm_cvtsi32_si128((jj % kCpw) * B)),
                                       _mm256_set1_epi32(static_cast<int>(kivi::code_mask(B))));
    return _mm256_cvtepi32_ps(c);
  }
};

#if KVQ_CPU_AVX512
/// Lane k of a 4-bit codes16<4, true> vector holds code kInter4[k] of its 16 (even lanes codes
/// 0-7, odd lanes codes 8-15: one 64-bit broadcast feeds both halves).
constexpr int kInter4[16] = {0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15};
/// Lane k of kInter4 order from a vector in code order, and back (vpermps indices).
inline __m512 to_inter4(__m512 v) {
  return _mm512_maskz_permutexvar_ps(kAll16, _mm512_loadu_si512(kInter4), v);
}
inline __m512 from_inter4(__m512 v) {
  return _mm512_maskz_permutexvar_ps(
      kAll16, _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15), v);
}

/// Whether the exact kernels read B-bit codes in kInter4 order (4 bits: one broadcast per 16).
template <int B>
constexpr bool kInterCodes = B == 4;

/// Codes e .. e + 15 (e a multiple of 16) of the packed words w (bits 2, 4 or 8; codes in order
/// from bit 0 of word 0), as 16 floats. Inter (4 bits only): lanes in kInter4 order, read with
/// one 64-bit broadcast where code order takes a second, merged broadcast (a blend).
template <int B, bool Inter = false>
inline __m512 codes16(const uint32_t* w, int64_t e) {
  static_assert(!Inter || B == 4);
  __m512i code;
  if constexpr (Inter) {
    uint64_t both;  // words e / 8 and e / 8 + 1
    std::memcpy(&both, w + e / 8, 8);
    code = _mm512_and_si512(
        _mm512_maskz_srlv_epi32(
            kAll16, _mm512_set1_epi64(static_cast<long long>(both)),
            _mm512_setr_epi32(0, 0, 4, 4, 8, 8, 12, 12, 16, 16, 20, 20, 24, 24, 28, 28)),
        _mm512_set1_epi32(15));
  } else if constexpr (B == 8) {
    code = _mm512_maskz_cvtepu8_epi32(kAll16,
                                      _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + e / 4)));
  } else if constexpr (B == 4) {  // words e / 8 and e / 8 + 1, eight codes each
    const __m512i x = _mm512_mask_set1_epi32(_mm512_set1_epi32(static_cast<int>(w[e / 8])), 0xff00,
                                             static_cast<int>(w[e / 8 + 1]));
    code = _mm512_and_si512(
        _mm512_maskz_srlv_epi32(
            kAll16, x, _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 0, 4, 8, 12, 16, 20, 24, 28)),
        _mm512_set1_epi32(15));
  } else {  // word e / 16, all sixteen codes
    static_assert(B == 2);
    code = _mm512_and_si512(
        _mm512_maskz_srlv_epi32(
            kAll16, _mm512_set1_epi32(static_cast<int>(w[e / 16])),
            _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30)),
        _mm512_set1_epi32(3));
  }
  return _mm512_maskz_cvtepi32_ps(kAll16, code);
}
#endif

/// Raw codes (no scale, no min) of per-token int values (bits 2, 4, 8; G a multiple of 8): token j,
/// channels d .. d + 7 of one channel group.
template <int B>
struct TokenCodes {
  const uint32_t* words;  // token t0, head h
  int64_t wstride;        // words per token
  int64_t group, wpg;
  /// The codes of a per-token side (layout L) from token t0 on, kv head h.
  static TokenCodes at(const StoredSide& s, const kivi::TokenLayout& L, int64_t t0, int64_t h) {
    return {s.words + L.word_index(t0, h, 0), s.heads * L.words_per_token_head(), s.group,
            kivi::words_for(s.group, B)};
  }
  void prefetch(int64_t j, int64_t D) const { prefetch_row(words + j * wstride, D * B / 8); }
  /// Codes e .. e + 7 of channel group c of token j.
  __m256 code(int64_t j, int64_t c, int64_t e) const {
    const uint32_t* wr = words + j * wstride + c * wpg;
    __m256i code;
    if constexpr (B == 8) {
      code = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(wr + e / 4)));
    } else if constexpr (B == 4) {
      code = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(wr[e / 8])),
                                                _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28)),
                              _mm256_set1_epi32(15));
    } else {
      const __m256i sh = _mm256_add_epi32(_mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14),
                                          _mm256_set1_epi32(static_cast<int>((e % 16) * 2)));
      code =
          _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(wr[e / 16])), sh),
                           _mm256_set1_epi32(3));
    }
    return _mm256_cvtepi32_ps(code);
  }
#if KVQ_CPU_AVX512
  /// Codes e .. e + 15 of channel group c of token j (e a multiple of 16).
  template <bool Inter = false>
  __m512 codez(int64_t j, int64_t c, int64_t e) const {
    return codes16<B, Inter>(words + j * wstride + c * wpg, e);
  }
#endif
};

/// Per-token int keys as rows of dequantized values (exact: kivi::decode's scale * code + min, or
/// (code - 2^(b-1)) * scale symmetric, 8 channels of one group at a time), for the float dot
/// kernels.
template <int B>
struct TokenKeyRows {
  TokenCodes<B> codes;
  const uint16_t* scales;  // token t0, head h
  const uint16_t* mins;    // null: symmetric
  int64_t pstride;         // parameters per token
  int gshift;              // log2(G) when G is a power of two (else -1: g=dim, one group)
  void prefetch(int64_t j, int64_t D) const { codes.prefetch(j, D); }
  __m256 operator()(int64_t j, int64_t d) const {
    const int64_t c = gshift >= 0 ? d >> gshift : d / codes.group;
    const float sc = _cvtsh_ss(scales[j * pstride + c]);
    const __m256 x = codes.code(j, c, d - c * codes.group);
    if (!mins)
      return _mm256_mul_ps(
          _mm256_sub_ps(x, _mm256_set1_ps(static_cast<float>(kivi::sym_offset(B)))),
          _mm256_set1_ps(sc));
    return _mm256_add_ps(_mm256_mul_ps(x, _mm256_set1_ps(sc)),
                         _mm256_set1_ps(_cvtsh_ss(mins[j * pstride + c])));
  }
};

/// Runs f(loader) with the loader of a dense side's kind, element `offset` of its storage first,
/// rows `stride` elements apart.
template <class F>
void with_dense_rows(const StoredSide& s, int64_t offset, int64_t stride, F&& f) {
  if (s.kind == SchemeKind::Fp32) return f(F32Rows{s.f32 + offset, stride});
  if (s.kind == SchemeKind::Bf16) return f(Bf16Rows{s.half16 + offset, stride});
  return f(Fp16Rows{s.half16 + offset, stride});
}

/// Runs f(Fp8Rows<F, kNaN>{codes, D}), kNaN from the side (StoredSide::fp8_nan).
template <Fp8Format F, class Fn>
void with_fp8_rows(const StoredSide& s, const uint8_t* codes, int64_t D, Fn&& f) {
  if (s.fp8_nan) return f(Fp8Rows<F>{codes, D});
  f(Fp8Rows<F, false>{codes, D});
}

/// Runs f.template operator()<F>() with the format.
template <class Fn>
void with_fp8_format(Fp8Format fmt, Fn&& f) {
  switch (fmt) {
    case Fp8Format::E4M3:
      return f.template operator()<Fp8Format::E4M3>();
    case Fp8Format::E4M3FNUZ:
      return f.template operator()<Fp8Format::E4M3FNUZ>();
    case Fp8Format::E5M2:
      return f.template operator()<Fp8Format::E5M2>();
  }
  fail("cpu attention: unknown fp8 format {}", static_cast<int>(fmt));
}

}  // namespace
}  // namespace kvq::cpu::KVQ_CPU_PATH_NS::attn
