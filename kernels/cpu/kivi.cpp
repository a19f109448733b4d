#include "kernels/cpu/kivi.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/isa.h"
#include "kivi/group.h"
#include "kivi/layout.h"

namespace kvq::cpu::KVQ_CPU_PATH_NS {
namespace {

using kivi::codes_per_word;
using kivi::dispatch_bits;
using kivi::words_for;

// The reference for one group (what every fast path must equal, and what it falls back to).
// Group c's parameters go to scales[c] and (asym) mins[c]; mins is null for sym.
template <int B, bool S>
void reference_group(const float* x, int64_t stride, int n, uint32_t* words, uint16_t* scales,
                     uint16_t* mins, int64_t c) {
  kivi::quantize_group(x, stride, n, B, S, words, scales + c, S ? nullptr : mins + c);
}

#if KVQ_CPU_AVX2
constexpr int kRne = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;

// kivi::minmax_params on 8 groups at once (one per lane), plus what the code loop needs.
struct Params8 {
  __m128i scale_h, min_h;  // stored fp16 bits
  __m256 z, s;             // zero point and scale the quotient uses (0 and 1 where !ok)
  __m256 inv;              // 1 / s, for the quotient's fast estimate (estimate8)
  __m256i valid;           // all ones where scale > 0, else every code is the zero code
};

inline __m256i inf_or_nan(__m256 v) {
  const __m256i e = _mm256_set1_epi32(0x7f800000);
  return _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_castps_si256(v), e), e);
}

// mn, mx: running min / max per lane; nf: 0 where every value was finite, else a NaN or any
// nonzero pattern (row8 passes the sum of x * 0, columns8 a NaN-lane mask with the inf lanes).
template <int B, bool S>
inline Params8 params8(__m256 mn, __m256 mx, __m256 nf) {
  const __m256 zero = _mm256_setzero_ps();
  const __m256i not_finite = _mm256_castps_si256(_mm256_cmp_ps(nf, zero, _CMP_NEQ_UQ));
  mn = _mm256_blendv_ps(mn, zero, _mm256_cmp_ps(mn, zero, _CMP_EQ_OQ));  // zeros taken as +0
  mx = _mm256_blendv_ps(mx, zero, _mm256_cmp_ps(mx, zero, _CMP_EQ_OQ));
  Params8 p;
  if constexpr (S) {
    const __m256 neg = _mm256_xor_ps(mn, _mm256_set1_ps(-0.0f));
    const __m256 amax = _mm256_blendv_ps(mx, neg, _mm256_cmp_ps(neg, mx, _CMP_GT_OQ));
    p.scale_h = _mm256_cvtps_ph(
        _mm256_div_ps(amax, _mm256_set1_ps(static_cast<float>(kivi::sym_qmax(B)))), kRne);
    p.min_h = _mm_setzero_si128();
  } else {
    p.min_h = _mm256_cvtps_ph(mn, kRne);
    p.scale_h = _mm256_cvtps_ph(
        _mm256_div_ps(_mm256_sub_ps(mx, mn), _mm256_set1_ps(static_cast<float>(kivi::max_code(B)))),
        kRne);
  }
  __m256 scale = _mm256_cvtph_ps(p.scale_h), min = _mm256_cvtph_ps(p.min_h);
  const __m256i bad =
      _mm256_or_si256(not_finite, _mm256_or_si256(inf_or_nan(scale), inf_or_nan(min)));
  const __m128i bad16 =
      _mm_packs_epi32(_mm256_castsi256_si128(bad), _mm256_extracti128_si256(bad, 1));
  const __m128i nan_h = _mm_set1_epi16(static_cast<short>(kivi::kHalfNaN));
  p.scale_h = _mm_blendv_epi8(p.scale_h, nan_h, bad16);
  if (!S) p.min_h = _mm_blendv_epi8(p.min_h, nan_h, bad16);
  scale = _mm256_blendv_ps(scale, _mm256_cvtph_ps(nan_h), _mm256_castsi256_ps(bad));
  min = _mm256_blendv_ps(min, _mm256_cvtph_ps(nan_h), _mm256_castsi256_ps(bad));
  const __m256 ok = _mm256_cmp_ps(scale, zero, _CMP_GT_OQ);
  p.z = S ? zero : _mm256_and_ps(min, ok);
  p.s = _mm256_blendv_ps(_mm256_set1_ps(1.0f), scale, ok);
  p.inv = _mm256_div_ps(_mm256_set1_ps(1.0f), p.s);
  p.valid = _mm256_castps_si256(ok);
  return p;
}

// kivi::encode's arithmetic on 8 values: the clamped IEEE quotient rounded to nearest even.
// Lanes whose quotient sits on a tie k + 1/2 are flagged in `tie` (they need resolve_tie).
//
// The quotient is first estimated (estimate8) as (x - z) * (1 / s): it shares fl(x - z) with the
// IEEE quotient and is then two roundings off (x - z) / s where the quotient is one, so the two
// differ by less than 1.5 * 2^-23 relative: 1.5 * 2^-15 where it matters (|q| <= 256 after the
// clamp, which is monotone and moves no value further). Rounding the estimate can differ from
// rounding the quotient only if a half-integer lies between them, so only when the estimate is
// within that error of some k + 1/2; when any lane is within kNearTie of one (kNearTie = 2^-12,
// over 5x the bound), the values take the IEEE division instead (codes8_exact). kivi_test's
// nearTies cases place values 0 to 3 ulps either side of ties.
constexpr float kNearTie = 1.0f / 4096.0f;

template <int B, bool S>
inline __m256i codes8_exact(__m256 x, const Params8& p, __m256& tie) {
  __m256 q = _mm256_div_ps(_mm256_sub_ps(x, p.z), p.s);
  q = _mm256_max_ps(q, _mm256_set1_ps(kivi::quotient_lo(B, S)));  // q > lo ? q : lo (NaN -> lo)
  q = _mm256_min_ps(q, _mm256_set1_ps(kivi::quotient_hi(B, S)));  // q < hi ? q : hi
  const __m256 r = _mm256_round_ps(q, kRne);
  const __m256 d = _mm256_sub_ps(r, q);
  const __m256 t = _mm256_or_ps(_mm256_cmp_ps(d, _mm256_set1_ps(0.5f), _CMP_EQ_OQ),
                                _mm256_cmp_ps(d, _mm256_set1_ps(-0.5f), _CMP_EQ_OQ));
  tie = _mm256_or_ps(tie, _mm256_and_ps(t, _mm256_castsi256_ps(p.valid)));
  const __m256i k =
      _mm256_add_epi32(_mm256_cvttps_epi32(r), _mm256_set1_epi32(S ? kivi::sym_offset(B) : 0));
  return _mm256_blendv_epi8(_mm256_set1_epi32(static_cast<int>(kivi::zero_code(B, S))), k, p.valid);
}

// The estimate's rounded, clamped quotient; `near` gains the lanes within kNearTie of a tie.
template <int B, bool S>
inline __m256 estimate8(__m256 x, const Params8& p, __m256& near) {
  __m256 q = _mm256_mul_ps(_mm256_sub_ps(x, p.z), p.inv);
  q = _mm256_max_ps(q, _mm256_set1_ps(kivi::quotient_lo(B, S)));
  q = _mm256_min_ps(q, _mm256_set1_ps(kivi::quotient_hi(B, S)));
  const __m256 r = _mm256_round_ps(q, kRne);
  // 1/2 - |r - q| <= kNearTie: the estimate is near a tie (and, exactly, on one).
  const __m256 off = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), _mm256_sub_ps(r, q));
  near = _mm256_or_ps(near, _mm256_cmp_ps(off, _mm256_set1_ps(0.5f - kNearTie), _CMP_GE_OQ));
  return r;
}

// The code of a rounded quotient r (valid lanes).
template <int B, bool S>
inline __m256i code_of(__m256 r) {
  return _mm256_add_epi32(_mm256_cvttps_epi32(r), _mm256_set1_epi32(S ? kivi::sym_offset(B) : 0));
}

template <int B, bool S>
void columns8(const float* x, int64_t cols, int n, uint32_t* words, uint16_t* scales,
              uint16_t* mins) {
  const int64_t wpg = words_for(n, B);
  const int64_t cols8 = cols / 8 * 8, blocks = cols / 8;
  // Both passes walk the group row by row: its rows are cols floats apart (pages apart), which
  // the hardware prefetchers follow only when read in order, and a walk down 8 columns would put
  // every row in the same L1 set.
  thread_local std::vector<float> stats;
  thread_local std::vector<Params8> params;
  struct Words8 {
    __m256i v;
  };
  thread_local std::vector<Words8> acc;    // [block][word]: the words of 8 columns
  thread_local std::vector<uint8_t> slow;  // block b goes through the reference
  stats.resize(static_cast<size_t>(3 * cols8));
  params.resize(static_cast<size_t>(blocks));
  acc.assign(static_cast<size_t>(blocks * wpg), Words8{_mm256_setzero_si256()});
  slow.assign(static_cast<size_t>(blocks), 0);
  // Min, max and NaN-ness (all bits set where a NaN was seen) per column.
  float* smn = stats.data();
  float* smx = smn + cols8;
  float* snf = smx + cols8;
  const __m256 zero = _mm256_setzero_ps();
  for (int64_t c = 0; c < cols8; c += 8) {
    const __m256 v = _mm256_loadu_ps(x + c);
    _mm256_storeu_ps(smn + c, v);
    _mm256_storeu_ps(smx + c, v);
    _mm256_storeu_ps(snf + c, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  }
  for (int i = 1; i < n; i += 4) {  // up to 4 rows per visit of the running values
    const int rows = std::min(4, n - i);
    const float* xr = x + i * cols;
    for (int64_t c = 0; c < cols8; c += 8) {
      __m256 mn = _mm256_loadu_ps(smn + c), mx = _mm256_loadu_ps(smx + c);
      __m256 nf = _mm256_loadu_ps(snf + c);
      for (int r = 0; r < rows; ++r) {
        const __m256 v = _mm256_loadu_ps(xr + r * cols + c);
        mn = _mm256_min_ps(v, mn);  // v < mn ? v : mn, as kivi::min_step
        mx = _mm256_max_ps(v, mx);
        nf = _mm256_or_ps(nf, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));  // NaN lanes
      }
      _mm256_storeu_ps(smn + c, mn);
      _mm256_storeu_ps(smx + c, mx);
      _mm256_storeu_ps(snf + c, nf);
    }
  }
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t c = 8 * blk;
    // Not finite: a NaN was seen, or the min or max is +-inf (all bits set reads as a NaN).
    const __m256 mn = _mm256_loadu_ps(smn + c), mx = _mm256_loadu_ps(smx + c);
    const __m256 nf =
        _mm256_or_ps(_mm256_loadu_ps(snf + c),
                     _mm256_castsi256_ps(_mm256_or_si256(inf_or_nan(mn), inf_or_nan(mx))));
    params[blk] = params8<B, S>(mn, mx, nf);
    // A column whose codes are all the zero code (scale not > 0: constant, NaN or inf) sends
    // its 8 columns to the reference, so the code loop below has no per-lane select.
    slow[blk] = _mm256_movemask_ps(_mm256_castsi256_ps(params[blk].valid)) != 0xff;
  }
  // Codes, row by row, OR-ed into the block's words: rows i .. i + kRows - 1 share a word.
  // (Plain pointers: the thread_local vectors would be looked up again in the loop.)
  Params8* const pp = params.data();
  Words8* const ap = acc.data();
  uint8_t* const sl = slow.data();
  constexpr int kCpw = codes_per_word(B);
  constexpr int kRows = kCpw % 4 == 0 ? 4 : 2;
  for (int i = 0; i < n; i += kRows) {
    const int rows = std::min(kRows, n - i);
    const int64_t w = i / kCpw;
    const float* xr = x + i * cols;
    for (int64_t blk = 0; blk < blocks; ++blk) {
      if (sl[blk]) continue;
      const Params8& p = pp[blk];
      __m256 tie = zero, near = zero, r[kRows];
      for (int j = 0; j < rows; ++j)
        r[j] = estimate8<B, S>(_mm256_loadu_ps(xr + j * cols + 8 * blk), p, near);
      __m256i word = ap[blk * wpg + w].v;
      if (!_mm256_movemask_ps(near)) [[likely]] {
        for (int j = 0; j < rows; ++j) {
          const __m256i k = code_of<B, S>(r[j]);  // (see columns16: no template commas in macros)
          word = _mm256_or_si256(word, _mm256_slli_epi32(k, kivi::shift_of(i + j, B)));
        }
      } else {
        for (int j = 0; j < rows; ++j) {
          const __m256i k = codes8_exact<B, S>(_mm256_loadu_ps(xr + j * cols + 8 * blk), p, tie);
          word = _mm256_or_si256(word, _mm256_slli_epi32(k, kivi::shift_of(i + j, B)));
        }
      }
      ap[blk * wpg + w].v = word;
      if (_mm256_movemask_ps(tie)) [[unlikely]]
        sl[blk] = 1;  // a quotient on a tie: these 8 columns by the reference
    }
  }
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t c0 = 8 * blk;
    if (slow[blk]) {
      for (int64_t c = c0; c < c0 + 8; ++c)
        reference_group<B, S>(x + c, cols, n, words + c * wpg, scales, mins, c);
      continue;
    }
    _mm_storeu_si128(reinterpret_cast<__m128i*>(scales + c0), params[blk].scale_h);
    if (!S) _mm_storeu_si128(reinterpret_cast<__m128i*>(mins + c0), params[blk].min_h);
    alignas(32) uint32_t lanes[8];
    for (int64_t w = 0; w < wpg; ++w) {
      _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), acc[blk * wpg + w].v);
      for (int j = 0; j < 8; ++j) words[(c0 + j) * wpg + w] = lanes[j];
    }
  }
  for (int64_t c = cols8; c < cols; ++c)
    reference_group<B, S>(x + c, cols, n, words + c * wpg, scales, mins, c);
}

// (lanes_min / lanes_max, kernels/cpu/isa.h: min / max of finite values do not depend on the
// order; a group with NaN/inf takes nan_params whatever they give.)

// Sums of the 8 lanes of a, b, c, d -> out[0..3]. Packing: codes shifted into disjoint bit
// fields, so the sum of a word's lanes is their OR.
inline __m128i lane_sums4(__m256i a, __m256i b, __m256i c, __m256i d) {
  const __m256i s = _mm256_hadd_epi32(_mm256_hadd_epi32(a, b), _mm256_hadd_epi32(c, d));
  return _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
}

#if defined(__BMI2__)
// 3-bit codes, ten a word at bits 3i (kivi::pack): len codes as bytes in b, then zero bytes up to
// b[len + 16) (the empty fields of a short last word); each word from the low 3 bits of 8 + 2
// bytes by two pext.
inline void pack3_bytes(uint8_t* b, int len, uint32_t* words) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(b + len), _mm_setzero_si128());
  for (int w = 0; w * 10 < len; ++w) {
    uint64_t x8;
    uint16_t x2;
    std::memcpy(&x8, b + 10 * w, 8);
    std::memcpy(&x2, b + 10 * w + 8, 2);
    words[w] = static_cast<uint32_t>(_pext_u64(x8, 0x0707070707070707ull) |
                                     (_pext_u32(x2, 0x0707u) << 24));
  }
}
#endif

// Packs len codes (len a multiple of 8; k[v] holds codes 8v .. 8v+7) into words_for(len, B)
// words, as kivi::pack does.
template <int B>
inline __attribute__((always_inline)) void pack_vectors(const __m256i* k, int len,
                                                        uint32_t* words) {
  const int nv = len / 8;
  if constexpr (B == 8) {  // code i is byte i of the little-endian words
    for (int v = 0; v < nv; ++v) {
      const __m256i b16 = _mm256_packus_epi32(k[v], k[v]);
      const __m256i b8 = _mm256_packus_epi16(b16, b16);
      words[2 * v] = static_cast<uint32_t>(_mm256_extract_epi32(b8, 0));
      words[2 * v + 1] = static_cast<uint32_t>(_mm256_extract_epi32(b8, 4));
    }
  } else if constexpr (B == 4 || B == 2) {
    // One vector of shifted codes per word (B=4: 8 codes; B=2: 16 codes from two vectors).
    const __m256i sh0 = B == 4 ? _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28)
                               : _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
    const __m256i sh1 = _mm256_setr_epi32(16, 18, 20, 22, 24, 26, 28, 30);
    const int nw = static_cast<int>(words_for(len, B));
    auto word = [&](int w) {
      if (w >= nw) return _mm256_setzero_si256();
      if constexpr (B == 4) return _mm256_sllv_epi32(k[w], sh0);
      __m256i v = _mm256_sllv_epi32(k[2 * w], sh0);
      if (2 * w + 1 < nv) v = _mm256_add_epi32(v, _mm256_sllv_epi32(k[2 * w + 1], sh1));
      return v;
    };
    for (int w = 0; w < nw; w += 4) {
      const __m128i s = lane_sums4(word(w), word(w + 1), word(w + 2), word(w + 3));
      if (w + 4 <= nw) {
        _mm_storeu_si128(reinterpret_cast<__m128i*>(words + w), s);
      } else {
        alignas(16) uint32_t t[4];
        _mm_store_si128(reinterpret_cast<__m128i*>(t), s);
        for (int j = 0; j < nw - w; ++j) words[w + j] = t[j];
      }
    }
  } else {
#if defined(__BMI2__)
    if constexpr (B == 3) {
      alignas(32) uint8_t b[256 + 16];
      const __m256i low =
          _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 0, 4, 8, 12,
                           -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
      const __m256i join = _mm256_setr_epi32(0, 4, 0, 0, 0, 0, 0, 0);
      for (int v = 0; v < nv; ++v)
        _mm_storel_epi64(reinterpret_cast<__m128i*>(b + 8 * v),
                         _mm256_castsi256_si128(
                             _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(k[v], low), join)));
      pack3_bytes(b, len, words);
      return;
    }
#endif
    alignas(32) uint32_t codes[256];
    for (int v = 0; v < nv; ++v)
      _mm256_store_si256(reinterpret_cast<__m256i*>(codes + 8 * v), k[v]);
    kivi::pack(codes, len, B, words);
  }
}

// Groups of one row, 8 at a time: their min / max are reduced into one lane each, so one params8
// (two divisions, the fp16 round trip) serves 8 groups, then each group's codes take its lane.
template <int B, bool S>
void row8(const float* x, int64_t dim, int group, uint32_t* words, uint16_t* scales,
          uint16_t* mins) {
  const int64_t wpg = words_for(group, B);
  const int64_t groups = (dim + group - 1) / group;
  const __m256 zero = _mm256_setzero_ps();
  for (int64_t cg0 = 0; cg0 < groups; cg0 += 8) {
    const int nb = static_cast<int>(std::min<int64_t>(8, groups - cg0));
    alignas(32) float mnl[8] = {}, mxl[8] = {}, nfl[8] = {};
    bool fast[8] = {};
    for (int j = 0; j < nb; ++j) {
      const int64_t c0 = (cg0 + j) * group;
      const int len = static_cast<int>(dim - c0 < group ? dim - c0 : group);
      fast[j] = len % 8 == 0 && len <= 256;
      if (!fast[j]) continue;
      const float* g = x + c0;
      __m256 mn = _mm256_loadu_ps(g), mx = mn, nf = _mm256_mul_ps(mn, zero);
      for (int v = 1; v < len / 8; ++v) {
        const __m256 y = _mm256_loadu_ps(g + 8 * v);
        mn = _mm256_min_ps(y, mn);
        mx = _mm256_max_ps(y, mx);
        nf = _mm256_add_ps(nf, _mm256_mul_ps(y, zero));
      }
      const bool finite = _mm256_movemask_ps(_mm256_cmp_ps(nf, zero, _CMP_NEQ_UQ)) == 0;
      mnl[j] = _mm256_cvtss_f32(lanes_min(mn));
      mxl[j] = _mm256_cvtss_f32(lanes_max(mx));
      nfl[j] = finite ? 0.0f : bits_float(0x7fc00000u);
    }
    const Params8 pb = params8<B, S>(_mm256_load_ps(mnl), _mm256_load_ps(mxl), _mm256_load_ps(nfl));
    alignas(16) uint16_t sh[8], mh[8];
    _mm_store_si128(reinterpret_cast<__m128i*>(sh), pb.scale_h);
    _mm_store_si128(reinterpret_cast<__m128i*>(mh), pb.min_h);
    for (int j = 0; j < nb; ++j) {
      const int64_t cg = cg0 + j, c0 = cg * group;
      const int len = static_cast<int>(dim - c0 < group ? dim - c0 : group);
      const float* g = x + c0;
      uint32_t* wout = words + cg * wpg;
      if (!fast[j]) {
        reference_group<B, S>(g, 1, len, wout, scales, mins, cg);
        continue;
      }
      const __m256i lane = _mm256_set1_epi32(j);
      Params8 p;
      p.z = _mm256_permutevar8x32_ps(pb.z, lane);
      p.s = _mm256_permutevar8x32_ps(pb.s, lane);
      p.inv = _mm256_permutevar8x32_ps(pb.inv, lane);
      p.valid = _mm256_permutevar8x32_epi32(pb.valid, lane);
      __m256 tie = zero, near = zero, r[32];
      __m256i k[32];
      for (int v = 0; v < len / 8; ++v) r[v] = estimate8<B, S>(_mm256_loadu_ps(g + 8 * v), p, near);
      if (!_mm256_movemask_ps(_mm256_and_ps(near, _mm256_castsi256_ps(p.valid)))) [[likely]] {
        const __m256i zc = _mm256_set1_epi32(static_cast<int>(kivi::zero_code(B, S)));
        for (int v = 0; v < len / 8; ++v)
          k[v] = _mm256_blendv_epi8(zc, code_of<B, S>(r[v]), p.valid);
      } else {
        for (int v = 0; v < len / 8; ++v)
          k[v] = codes8_exact<B, S>(_mm256_loadu_ps(g + 8 * v), p, tie);
      }
      if (_mm256_movemask_ps(tie)) {
        reference_group<B, S>(g, 1, len, wout, scales, mins, cg);
        continue;
      }
      scales[cg] = sh[j];
      if (!S) mins[cg] = mh[j];
      pack_vectors<B>(k, len, wout);
    }
  }
}
#if KVQ_CPU_AVX512
// ---- 512-bit forms: the same arithmetic on 16 lanes, with mask registers for the selects -----

struct Params16 {
  __m256i scale_h, min_h;  // stored fp16 bits
  __m512 z, s, inv;        // as Params8
  __mmask16 valid;         // scale > 0
};

inline __mmask16 inf_or_nan16(__m512 v) {
  const __m512i e = _mm512_set1_epi32(0x7f800000);
  return _mm512_cmpeq_epi32_mask(_mm512_and_si512(_mm512_castps_si512(v), e), e);
}

// params8 on 16 lanes; not_finite: the lanes whose group held a NaN or +-inf.
template <int B, bool S>
inline Params16 params16(__m512 mn, __m512 mx, __mmask16 not_finite) {
  const __m512 zero = _mm512_setzero_ps();
  mn = _mm512_mask_mov_ps(mn, _mm512_cmp_ps_mask(mn, zero, _CMP_EQ_OQ), zero);  // zeros as +0
  mx = _mm512_mask_mov_ps(mx, _mm512_cmp_ps_mask(mx, zero, _CMP_EQ_OQ), zero);
  Params16 p;
  if constexpr (S) {
    const __m512 neg = _mm512_castsi512_ps(
        _mm512_xor_si512(_mm512_castps_si512(mn), _mm512_set1_epi32(INT32_MIN)));
    const __m512 amax = _mm512_mask_mov_ps(mx, _mm512_cmp_ps_mask(neg, mx, _CMP_GT_OQ), neg);
    p.scale_h = _mm512_maskz_cvtps_ph(
        kAll16, _mm512_div_ps(amax, _mm512_set1_ps(static_cast<float>(kivi::sym_qmax(B)))), kRne);
    p.min_h = _mm256_setzero_si256();
  } else {
    p.min_h = _mm512_maskz_cvtps_ph(kAll16, mn, kRne);
    p.scale_h = _mm512_maskz_cvtps_ph(
        kAll16,
        _mm512_div_ps(_mm512_sub_ps(mx, mn), _mm512_set1_ps(static_cast<float>(kivi::max_code(B)))),
        kRne);
  }
  __m512 scale = _mm512_maskz_cvtph_ps(kAll16, p.scale_h);
  __m512 min = _mm512_maskz_cvtph_ps(kAll16, p.min_h);
  const __mmask16 bad = not_finite | inf_or_nan16(scale) | inf_or_nan16(min);
  const __m256i nan_h = _mm256_set1_epi16(static_cast<short>(kivi::kHalfNaN));
  p.scale_h = _mm256_mask_mov_epi16(p.scale_h, bad, nan_h);
  if (!S) p.min_h = _mm256_mask_mov_epi16(p.min_h, bad, nan_h);
  const __m512 nan = _mm512_maskz_cvtph_ps(kAll16, nan_h);
  scale = _mm512_mask_mov_ps(scale, bad, nan);
  min = _mm512_mask_mov_ps(min, bad, nan);
  p.valid = _mm512_cmp_ps_mask(scale, zero, _CMP_GT_OQ);
  p.z = S ? zero : _mm512_maskz_mov_ps(p.valid, min);
  p.s = _mm512_mask_mov_ps(_mm512_set1_ps(1.0f), p.valid, scale);
  p.inv = _mm512_div_ps(_mm512_set1_ps(1.0f), p.s);
  return p;
}

// estimate8 on 16 lanes, returning the unclamped estimate (code_of16 rounds it and clamps the
// integer: rounding is monotone and the bounds are integers, so that equals rounding the clamped
// quotient). The near test then sees the unclamped estimate: within kNearTie of the quotient
// while |q| <= 2^10, and beyond that both lie far outside [lo, hi] (hi <= 255) and clamp alike; a
// flagged value outside [lo, hi] only costs the division. vreduceps gives q - round(q) exactly.
template <int B, bool S>
inline __m512 estimate16(__m512 x, const Params16& p, __mmask16& near) {
  const __m512 q = _mm512_mul_ps(_mm512_sub_ps(x, p.z), p.inv);
  const __m512 off = _mm512_castsi512_ps(_mm512_and_si512(
      _mm512_castps_si512(_mm512_maskz_reduce_ps(kAll16, q, kRne)), _mm512_set1_epi32(0x7fffffff)));
  near |= _mm512_cmp_ps_mask(off, _mm512_set1_ps(0.5f - kNearTie), _CMP_GE_OQ);
  return q;
}

// codes8_exact on 16 lanes: the IEEE quotient; tie gains the valid lanes on a tie.
template <int B, bool S>
inline __m512i codes16_exact(__m512 x, const Params16& p, __mmask16& tie) {
  __m512 q = _mm512_div_ps(_mm512_sub_ps(x, p.z), p.s);
  q = _mm512_maskz_max_ps(kAll16, q, _mm512_set1_ps(kivi::quotient_lo(B, S)));  // NaN -> lo
  q = _mm512_maskz_min_ps(kAll16, q, _mm512_set1_ps(kivi::quotient_hi(B, S)));
  const __m512 r = _mm512_maskz_roundscale_ps(kAll16, q, kRne);
  const __m512 d = _mm512_sub_ps(r, q);
  tie |= p.valid & (_mm512_cmp_ps_mask(d, _mm512_set1_ps(0.5f), _CMP_EQ_OQ) |
                    _mm512_cmp_ps_mask(d, _mm512_set1_ps(-0.5f), _CMP_EQ_OQ));
  const __m512i k = _mm512_add_epi32(_mm512_maskz_cvttps_epi32(kAll16, r),
                                     _mm512_set1_epi32(S ? kivi::sym_offset(B) : 0));
  return _mm512_mask_mov_epi32(_mm512_set1_epi32(static_cast<int>(kivi::zero_code(B, S))), p.valid,
                               k);
}

// The code of an estimate q of a valid lane: q rounded to nearest even, clamped to [lo, hi],
// plus the offset. (|q| < 2^31 in a valid group: |x - z| is at most fp16's rounding of the
// group's min, 2^-11 |z| <= 32, over a scale of at least 2^-24.)
template <int B, bool S>
inline __m512i code_of16(__m512 q, bool clamp = true) {
  __m512i k = _mm512_maskz_cvt_roundps_epi32(kAll16, q, kRne);
  if (clamp) {
    k = _mm512_maskz_max_epi32(kAll16, k,
                               _mm512_set1_epi32(static_cast<int>(kivi::quotient_lo(B, S))));
    k = _mm512_maskz_min_epi32(kAll16, k,
                               _mm512_set1_epi32(static_cast<int>(kivi::quotient_hi(B, S))));
  }
  if constexpr (!S) return k;
  return _mm512_add_epi32(k, _mm512_set1_epi32(kivi::sym_offset(B)));
}

struct Words16 {  // word w of 16 columns, one per lane
  __m512i v;
};

// Lane by lane interleave of p[i] and q[i], i < N: out[2i], out[2i + 1] hold p[i][0] q[i][0]
// p[i][1] q[i][1] ... p[i][15] q[i][15].
template <int N>
inline void zip_seq(const __m512i* p, const __m512i* q, __m512i* out) {
  const __m512i lo = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
  const __m512i hi =
      _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
  for (int i = 0; i < N; ++i) {
    out[2 * i] = _mm512_maskz_permutex2var_epi32(kAll16, p[i], lo, q[i]);
    out[2 * i + 1] = _mm512_maskz_permutex2var_epi32(kAll16, p[i], hi, q[i]);
  }
}

// W words of 16 columns (w[k] holds word k of every column) in column-major order:
// W vectors whose lanes run column 0's words, then column 1's... Built as the interleave of the
// even words' and the odd words' orders (one zip level per halving).
template <int W>
inline void column_major(const __m512i* w, __m512i* out) {
  if constexpr (W == 1) {
    out[0] = w[0];
  } else {
    __m512i even[W / 2], odd[W / 2], pe[W / 2], po[W / 2];
    for (int i = 0; i < W / 2; ++i) {
      even[i] = w[2 * i];
      odd[i] = w[2 * i + 1];
    }
    column_major<W / 2>(even, pe);
    column_major<W / 2>(odd, po);
    zip_seq<W / 2>(pe, po, out);
  }
}

template <int W>
inline void return_words(const Words16* in, uint32_t* out) {
  __m512i w[W], o[W];
  for (int i = 0; i < W; ++i) w[i] = in[i].v;
  column_major<W>(w, o);
  for (int i = 0; i < W; ++i) _mm512_storeu_si512(out + 16 * i, o[i]);
}

// columns8 with 16 columns per block; the last cols % 16 columns go through the reference.
template <int B, bool S>
void columns16(const float* x, int64_t cols, int n, uint32_t* words, uint16_t* scales,
               uint16_t* mins) {
  const int64_t wpg = words_for(n, B);
  const int64_t blocks = cols / 16, cols16 = blocks * 16;
  thread_local std::vector<float> stats;
  thread_local std::vector<__mmask16> nans;
  thread_local std::vector<Params16> params;
  thread_local std::vector<Words16> acc;   // [block][word]: the words of 16 columns
  thread_local std::vector<uint8_t> slow;  // block b goes through the reference
  stats.resize(static_cast<size_t>(2 * cols16));
  nans.assign(static_cast<size_t>(blocks), 0);
  params.resize(static_cast<size_t>(blocks));
  acc.assign(static_cast<size_t>(blocks * wpg), Words16{_mm512_setzero_si512()});
  slow.assign(static_cast<size_t>(blocks), 0);
  float* const smn = stats.data();
  float* const smx = smn + cols16;
  __mmask16* const sna = nans.data();
  Params16* const pp = params.data();
  Words16* const ap = acc.data();
  uint8_t* const sl = slow.data();
  // Min, max and the NaN lanes per column, walking the group's rows in order.
  for (int64_t b = 0; b < blocks; ++b) {
    const __m512 v = _mm512_loadu_ps(x + 16 * b);
    _mm512_storeu_ps(smn + 16 * b, v);
    _mm512_storeu_ps(smx + 16 * b, v);
    sna[b] = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  }
  for (int i = 1; i < n; i += 4) {
    const int rows = std::min(4, n - i);
    const float* xr = x + i * cols;
    for (int64_t b = 0; b < blocks; ++b) {
      __m512 mn = _mm512_loadu_ps(smn + 16 * b), mx = _mm512_loadu_ps(smx + 16 * b);
      __mmask16 na = sna[b];
      for (int r = 0; r < rows; ++r) {
        const __m512 v = _mm512_loadu_ps(xr + r * cols + 16 * b);
        mn = _mm512_maskz_min_ps(kAll16, v, mn);  // v < mn ? v : mn, as kivi::min_step
        mx = _mm512_maskz_max_ps(kAll16, v, mx);
        na |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
      }
      _mm512_storeu_ps(smn + 16 * b, mn);
      _mm512_storeu_ps(smx + 16 * b, mx);
      sna[b] = na;
    }
  }
  for (int64_t b = 0; b < blocks; ++b) {
    const __m512 mn = _mm512_loadu_ps(smn + 16 * b), mx = _mm512_loadu_ps(smx + 16 * b);
    pp[b] = params16<B, S>(mn, mx, sna[b] | inf_or_nan16(mn) | inf_or_nan16(mx));
    sl[b] = pp[b].valid != kAll16;  // a zero-code column: these 16 by the reference
  }
  constexpr int kCpw = codes_per_word(B);
  constexpr int kRows = kCpw % 4 == 0 ? 4 : 2;
  for (int i = 0; i < n; i += kRows) {
    const int rows = std::min(kRows, n - i);
    const int64_t w = i / kCpw;
    const float* xr = x + i * cols;
    for (int64_t b = 0; b < blocks; ++b) {
      if (sl[b]) continue;
      const Params16& p = pp[b];
      __mmask16 near = 0, tie = 0;
      __m512 r[kRows];
      for (int j = 0; j < rows; ++j)
        r[j] = estimate16<B, S>(_mm512_loadu_ps(xr + j * cols + 16 * b), p, near);
      __m512i word = ap[b * wpg + w].v;
      if (!near) [[likely]] {
        for (int j = 0; j < rows; ++j) {
          // (The code in a variable: without optimization GCC's shift intrinsics are macros, and
          // a template argument list's comma would split their arguments.)
          const __m512i k = code_of16<B, S>(r[j]);
          word =
              _mm512_or_si512(word, _mm512_maskz_slli_epi32(kAll16, k, kivi::shift_of(i + j, B)));
        }
      } else {
        for (int j = 0; j < rows; ++j) {
          const __m512i k = codes16_exact<B, S>(_mm512_loadu_ps(xr + j * cols + 16 * b), p, tie);
          word =
              _mm512_or_si512(word, _mm512_maskz_slli_epi32(kAll16, k, kivi::shift_of(i + j, B)));
        }
      }
      ap[b * wpg + w].v = word;
      if (tie) [[unlikely]]
        sl[b] = 1;  // a quotient on a tie: these 16 columns by the reference
    }
  }
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t c0 = 16 * b;
    if (sl[b]) {
      for (int64_t c = c0; c < c0 + 16; ++c)
        reference_group<B, S>(x + c, cols, n, words + c * wpg, scales, mins, c);
      continue;
    }
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(scales + c0), pp[b].scale_h);
    if (!S) _mm256_storeu_si256(reinterpret_cast<__m256i*>(mins + c0), pp[b].min_h);
    uint32_t* const out = words + c0 * wpg;
    const Words16* const in = ap + b * wpg;
    switch (wpg) {  // column c's words are out[c * wpg .. c * wpg + wpg - 1]
      case 1:
        return_words<1>(in, out);
        break;
      case 2:
        return_words<2>(in, out);
        break;
      case 4:
        return_words<4>(in, out);
        break;
      case 8:
        return_words<8>(in, out);
        break;
      default: {
        alignas(64) uint32_t lanes[16];
        for (int64_t w = 0; w < wpg; ++w) {
          _mm512_store_si512(lanes, in[w].v);
          for (int j = 0; j < 16; ++j) out[j * wpg + w] = lanes[j];
        }
      }
    }
  }
  for (int64_t c = cols16; c < cols; ++c)
    reference_group<B, S>(x + c, cols, n, words + c * wpg, scales, mins, c);
}

// Reduces each of v[0..15] over its 16 lanes with op (min or max): lane g of the result is
// op over v[g]. A transposing tree, each level pairing two vectors into one: their 256-bit,
// then 128-bit, 64-bit and 32-bit halves (45 ops, not 16 horizontal reductions of 8 each),
// then one permute puts the groups in order (the tree was checked by simulating the shuffles'
// lane maps). v is overwritten.
template <class Op>
inline __m512 lanes16x16(__m512* v, Op op) {
  for (int i = 0; i < 8; ++i)  // A = v[2i], B = v[2i+1]: [A 8 | B 8]
    v[i] = op(_mm512_maskz_shuffle_f32x4(kAll16, v[2 * i], v[2 * i + 1], 0x44),
              _mm512_maskz_shuffle_f32x4(kAll16, v[2 * i], v[2 * i + 1], 0xEE));
  for (int i = 0; i < 4; ++i)  // [A 4 | B 4 | C 4 | D 4]
    v[i] = op(_mm512_maskz_shuffle_f32x4(kAll16, v[2 * i], v[2 * i + 1], 0x88),
              _mm512_maskz_shuffle_f32x4(kAll16, v[2 * i], v[2 * i + 1], 0xDD));
  for (int i = 0; i < 2; ++i)  // per 128 bits: [X 2 | Y 2], X from v[2i], Y from v[2i+1]
    v[i] = op(_mm512_maskz_shuffle_ps(kAll16, v[2 * i], v[2 * i + 1], 0x44),
              _mm512_maskz_shuffle_ps(kAll16, v[2 * i], v[2 * i + 1], 0xEE));
  const __m512 m = op(_mm512_maskz_shuffle_ps(kAll16, v[0], v[1], 0x88),
                      _mm512_maskz_shuffle_ps(kAll16, v[0], v[1], 0xDD));
  // m's lane 4 q + r holds group 4 r + q: group g sits in lane 4 (g % 4) + g / 4.
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  return _mm512_maskz_permutexvar_ps(kAll16, order, m);
}

// pack16 (below) on 32 codes (two vectors, codes 0-15 and 16-31): 32 * B / 32 words.
template <int B>
inline void pack32(__m512i k0, __m512i k1, uint32_t* words) {
  const __m256i b8 =
      _mm256_inserti128_si256(_mm256_castsi128_si256(_mm512_maskz_cvtepi32_epi8(kAll16, k0)),
                              _mm512_maskz_cvtepi32_epi8(kAll16, k1), 1);  // code i in byte i
  if constexpr (B == 8) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(words), b8);
  } else if constexpr (B == 4) {
    const __m256i pairs = _mm256_maddubs_epi16(b8, _mm256_set1_epi16(0x1001));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(words), _mm256_maskz_cvtepi16_epi8(0xffff, pairs));
  } else {
    const __m256i pairs = _mm256_maddubs_epi16(b8, _mm256_set1_epi16(0x0401));
    const __m256i quads = _mm256_madd_epi16(pairs, _mm256_set1_epi32(0x00100001));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(words), _mm256_maskz_cvtepi32_epi8(0xff, quads));
  }
}

// Packs 16 codes (int32 lanes, each < 2^B) into 16 * B / 32 words as kivi::pack does (B = 2, 4,
// 8): the codes as bytes, then pairs and quads of those merged by byte multiply-adds.
template <int B>
inline void pack16(__m512i k, uint32_t* words) {
  const __m128i b8 = _mm512_maskz_cvtepi32_epi8(kAll16, k);  // code i in byte i
  if constexpr (B == 8) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(words), b8);
  } else if constexpr (B == 4) {  // byte j = c[2j] + 16 c[2j+1]
    const __m128i pairs = _mm_maddubs_epi16(b8, _mm_set1_epi16(0x1001));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(words), _mm_packus_epi16(pairs, pairs));
  } else {  // B == 2: byte j = c[4j] + 4 c[4j+1] + 16 c[4j+2] + 64 c[4j+3]
    const __m128i pairs = _mm_maddubs_epi16(b8, _mm_set1_epi16(0x0401));
    const __m128i quads = _mm_madd_epi16(pairs, _mm_set1_epi32(0x00100001));
    const __m128i w16 = _mm_packus_epi32(quads, quads);
    words[0] = static_cast<uint32_t>(_mm_cvtsi128_si32(_mm_packus_epi16(w16, w16)));
  }
}

// row8 with 16 groups per parameter computation, each group 16 channels a step (groups whose
// length is a multiple of 16, up to 256; the others through the reference). B = 2, 4, 8, and 3
// where the target has BMI2 (pack3_bytes).
// NV > 0: the row's groups are NV * 16 long (the loops unroll; a shorter last group goes through
// the reference); NV = 0: any multiple of 16, counted at run time.
template <int B, bool S, int NV>
void row16(const float* x, int64_t dim, int group, uint32_t* words, uint16_t* scales,
           uint16_t* mins) {
  const int64_t wpg = words_for(group, B);
  const int64_t groups = (dim + group - 1) / group;
  for (int64_t cg0 = 0; cg0 < groups; cg0 += 16) {
    const int nb = static_cast<int>(std::min<int64_t>(16, groups - cg0));
    // The batch after next, into L1 ahead of its fold: the hardware prefetchers alone leave the
    // first loads of each group waiting on memory at this rate.
    if (cg0 + 48 <= groups) {
      const char* next = reinterpret_cast<const char*>(x + (cg0 + 32) * group);
      for (int64_t off = 0; off < 16 * group * static_cast<int64_t>(sizeof(float)); off += 64)
        _mm_prefetch(next + off, _MM_HINT_T0);
    }
    __m512 mnv[16], mxv[16];
    __mmask16 fast = 0, bad = 0;
#pragma GCC unroll 16
    for (int j = 0; j < 16; ++j) {
      mnv[j] = mxv[j] = _mm512_setzero_ps();  // lanes of absent or slow groups go unused
      if (j >= nb) continue;
      const int64_t c0 = (cg0 + j) * group;
      const int len = static_cast<int>(dim - c0 < group ? dim - c0 : group);
      if (NV ? len != 16 * NV : len % 16 != 0 || len > 256) continue;
      fast |= static_cast<__mmask16>(1u << j);
      const float* g = x + c0;
      __m512 mn = _mm512_loadu_ps(g), mx = mn;
      __mmask16 na = _mm512_cmp_ps_mask(mn, mn, _CMP_UNORD_Q);
      for (int v = 1; v < (NV ? NV : len / 16); ++v) {
        const __m512 y = _mm512_loadu_ps(g + 16 * v);
        mn = _mm512_maskz_min_ps(kAll16, y, mn);
        mx = _mm512_maskz_max_ps(kAll16, y, mx);
        na |= _mm512_cmp_ps_mask(y, y, _CMP_UNORD_Q);
      }
      mnv[j] = mn;
      mxv[j] = mx;
      if (na) bad |= static_cast<__mmask16>(1u << j);
    }
    // Min / max of finite values do not depend on the order; NaN / inf make the group bad.
    const __m512 mn =
        lanes16x16(mnv, [](__m512 a, __m512 b) { return _mm512_maskz_min_ps(kAll16, a, b); });
    const __m512 mx =
        lanes16x16(mxv, [](__m512 a, __m512 b) { return _mm512_maskz_max_ps(kAll16, a, b); });
    const Params16 pb = params16<B, S>(mn, mx, bad | inf_or_nan16(mn) | inf_or_nan16(mx));
    // The fast groups' parameters in one store (a group redone by the reference below writes
    // the same bits again).
    const __mmask16 stored = fast & pb.valid & static_cast<__mmask16>((1u << nb) - 1);
    _mm256_mask_storeu_epi16(scales + cg0, stored, pb.scale_h);
    if (!S) _mm256_mask_storeu_epi16(mins + cg0, stored, pb.min_h);
    // Groups whose every estimate rounds inside [lo, hi] need no clamp: the estimate is monotone
    // in x, so the estimates of the min and max bound the group's (ties at lo - 1/2 or hi + 1/2
    // take the division).
    const __mmask16 inside =
        _mm512_cmp_ps_mask(_mm512_mul_ps(_mm512_sub_ps(mn, pb.z), pb.inv),
                           _mm512_set1_ps(kivi::quotient_lo(B, S) - 0.5f), _CMP_GT_OQ) &
        _mm512_cmp_ps_mask(_mm512_mul_ps(_mm512_sub_ps(mx, pb.z), pb.inv),
                           _mm512_set1_ps(kivi::quotient_hi(B, S) + 0.5f), _CMP_LT_OQ);
#pragma GCC unroll 16
    for (int j = 0; j < nb; ++j) {
      const int64_t cg = cg0 + j, c0 = cg * group;
      const int len = static_cast<int>(dim - c0 < group ? dim - c0 : group);
      const float* g = x + c0;
      uint32_t* wout = words + cg * wpg;
      // Slow: a length the steps do not cover, or a zero-code group (scale not > 0).
      if (!((fast & pb.valid) >> j & 1)) {
        reference_group<B, S>(g, 1, len, wout, scales, mins, cg);
        continue;
      }
      const __m512i lane = _mm512_set1_epi32(j);
      Params16 p;
      p.z = _mm512_maskz_permutexvar_ps(kAll16, lane, pb.z);
      p.inv = _mm512_maskz_permutexvar_ps(kAll16, lane, pb.inv);
      p.valid = kAll16;
      __mmask16 near = 0, tie = 0;
      const int nv = NV ? NV : len / 16;
      __m512 r[NV ? NV : 16];
      __m512i k[NV ? NV : 16];
      for (int v = 0; v < nv; ++v) r[v] = estimate16<B, S>(_mm512_loadu_ps(g + 16 * v), p, near);
      if (!near) [[likely]] {
        const bool clamp = !(inside >> j & 1);
        for (int v = 0; v < nv; ++v) k[v] = code_of16<B, S>(r[v], clamp);
      } else {
        p.s = _mm512_maskz_permutexvar_ps(kAll16, lane, pb.s);
        for (int v = 0; v < nv; ++v)
          k[v] = codes16_exact<B, S>(_mm512_loadu_ps(g + 16 * v), p, tie);
        if (tie) {
          reference_group<B, S>(g, 1, len, wout, scales, mins, cg);
          continue;
        }
      }
      if constexpr (B == 3) {
#if defined(__BMI2__)
        alignas(64) uint8_t b[256 + 16];
        for (int v = 0; v < nv; ++v)
          _mm_store_si128(reinterpret_cast<__m128i*>(b + 16 * v),
                          _mm512_maskz_cvtepi32_epi8(kAll16, k[v]));
        pack3_bytes(b, len, wout);
#endif
      } else {
        int v = 0;
        for (; v + 2 <= nv; v += 2) pack32<B>(k[v], k[v + 1], wout + v * (16 * B / 32));
        if (v < nv) pack16<B>(k[v], wout + v * (16 * B / 32));
      }
    }
  }
}
#endif  // KVQ_CPU_AVX512

template <int B, bool S>
void columns_t(const float* x, int64_t cols, int n, uint32_t* words, uint16_t* scales,
               uint16_t* mins) {
#if KVQ_CPU_AVX512
  columns16<B, S>(x, cols, n, words, scales, mins);
#else
  columns8<B, S>(x, cols, n, words, scales, mins);
#endif
}

template <int B, bool S>
void row_t(const float* x, int64_t dim, int group, uint32_t* words, uint16_t* scales,
           uint16_t* mins) {
#if KVQ_CPU_AVX512
  // 16-lane groups where the group is a multiple of 16 channels (3-bit codes, ten a word, packed
  // by pext where the target has BMI2); row8 otherwise.
#if defined(__BMI2__)
  constexpr bool kRow16 = true;
#else
  constexpr bool kRow16 = B != 3;
#endif
  if constexpr (kRow16) {
    if (group % 16 == 0) {
      switch (group / 16) {
        case 1:
          return row16<B, S, 1>(x, dim, group, words, scales, mins);
        case 2:
          return row16<B, S, 2>(x, dim, group, words, scales, mins);
        case 4:
          return row16<B, S, 4>(x, dim, group, words, scales, mins);
        case 8:
          return row16<B, S, 8>(x, dim, group, words, scales, mins);
        default:
          return row16<B, S, 0>(x, dim, group, words, scales, mins);
      }
    }
  }
#endif
  row8<B, S>(x, dim, group, words, scales, mins);
}
#else
template <int B, bool S>
void columns_t(const float* x, int64_t cols, int n, uint32_t* words, uint16_t* scales,
               uint16_t* mins) {
  const int64_t wpg = words_for(n, B);
  for (int64_t c = 0; c < cols; ++c)
    reference_group<B, S>(x + c, cols, n, words + c * wpg, scales, mins, c);
}
template <int B, bool S>
void row_t(const float* x, int64_t dim, int group, uint32_t* words, uint16_t* scales,
           uint16_t* mins) {
  const int64_t wpg = words_for(group, B);
  for (int64_t c0 = 0, cg = 0; c0 < dim; c0 += group, ++cg)
    reference_group<B, S>(x + c0, 1, static_cast<int>(dim - c0 < group ? dim - c0 : group),
                          words + cg * wpg, scales, mins, cg);
}
#endif

}  // namespace

void kivi_quantize_columns(const float* x, int64_t cols, int n, int bits, bool sym, uint32_t* words,
                           uint16_t* scales, uint16_t* mins) {
  dispatch_bits(bits, sym,
                [&]<int B, bool S>() { columns_t<B, S>(x, cols, n, words, scales, mins); });
}

void kivi_quantize_row(const float* x, int64_t dim, int group, int bits, bool sym, uint32_t* words,
                       uint16_t* scales, uint16_t* mins) {
  dispatch_bits(bits, sym,
                [&]<int B, bool S>() { row_t<B, S>(x, dim, group, words, scales, mins); });
}

kivi::GroupQuantizers kivi_group_quantizers() {
  kivi::GroupQuantizers q;
  q.columns = kivi_quantize_columns;
  q.row = kivi_quantize_row;
  return q;
}

void kivi_quantize(const IntSpec& spec, Role role, const float* x, int64_t tokens, int64_t heads,
                   int64_t dim, KiviPacked& out) {
  const int b = spec.bits;
  KVQ_CHECK(b == 2 || b == 3 || b == 4 || b == 8,
            "kivi: {} bits not supported (allowed: 2, 3, 4, 8)", b);
  KVQ_CHECK(heads >= 1 && dim >= 1 && tokens >= 0, "kivi: shape [{}, {}, {}] is not valid", tokens,
            heads, dim);
  KVQ_CHECK(spec.arith == Arith::Exact,
            "kivi: cpu::kivi_quantize computes the exact arithmetic; arith=fp16 quantizes through "
            "kivi::SideCache");
  const Axis axis = spec.axis(role);
  KVQ_CHECK(axis == Axis::Token || spec.group != kGroupWholeDim,
            "kivi: g=dim groups channels, but the per-channel side ({}) groups tokens; give g=G",
            to_string(role));
  const int G = spec.group_for(dim);
  KVQ_CHECK(G >= 1 && (axis == Axis::Channel || G <= dim),
            "kivi: group g={} does not fit head_dim {} on the {} side", G, dim, to_string(axis));
  const int64_t row = heads * dim;
  if (axis == Axis::Channel) {
    const kivi::ChannelLayout lay{heads, dim, G, b};
    const int64_t tq = tokens / G * G;
    out.quantized_tokens = tq;
    out.words.resize(static_cast<size_t>(lay.words_for_tokens(tq)));
    out.scales.resize(static_cast<size_t>(lay.params_for_tokens(tq)));
    out.mins.resize(spec.sym ? 0 : out.scales.size());
    for (int64_t g = 0; g < tq / G; ++g)
      kivi_quantize_columns(x + g * G * row, row, G, b, spec.sym,
                            out.words.data() + lay.word_index(g, 0, 0),
                            out.scales.data() + lay.param_index(g, 0, 0),
                            spec.sym ? nullptr : out.mins.data() + lay.param_index(g, 0, 0));
  } else {
    const kivi::TokenLayout lay{heads, dim, G, b};
    out.quantized_tokens = tokens;
    out.words.resize(static_cast<size_t>(lay.words_for_tokens(tokens)));
    out.scales.resize(static_cast<size_t>(lay.params_for_tokens(tokens)));
    out.mins.resize(spec.sym ? 0 : out.scales.size());
    if (dim % G == 0) {  // then the whole tensor is one row of groups in the layout's order
      kivi_quantize_row(x, tokens * row, G, b, spec.sym, out.words.data(), out.scales.data(),
                        spec.sym ? nullptr : out.mins.data());
      return;
    }
    for (int64_t t = 0; t < tokens; ++t)
      for (int64_t h = 0; h < heads; ++h)
        kivi_quantize_row(x + t * row + h * dim, dim, G, b, spec.sym,
                          out.words.data() + lay.word_index(t, h, 0),
                          out.scales.data() + lay.param_index(t, h, 0),
                          spec.sym ? nullptr : out.mins.data() + lay.param_index(t, h, 0));
  }
}

}  // namespace kvq::cpu::KVQ_CPU_PATH_NS
