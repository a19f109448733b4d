#include "kernels/cpu/kivi.h"

#include <algorithm>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/isa.h"
#include "kivi/group.h"
#include "kivi/layout.h"

namespace kvq::cpu {
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
  __m256i valid;           // all ones where scale > 0, else every code is the zero code
};

inline __m256i inf_or_nan(__m256 v) {
  const __m256i e = _mm256_set1_epi32(0x7f800000);
  return _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_castps_si256(v), e), e);
}

// mn, mx: running min / max per lane; nf: 0 where every value was finite (sum of x * 0).
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
  p.valid = _mm256_castps_si256(ok);
  return p;
}

// kivi::encode's arithmetic on 8 values: the clamped IEEE quotient rounded to nearest even.
// Lanes whose quotient sits on a tie k + 1/2 are flagged in `tie` (they need resolve_tie).
template <int B, bool S>
inline __m256i codes8(__m256 x, const Params8& p, __m256& tie) {
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

template <int B, bool S>
void columns_t(const float* x, int64_t cols, int n, uint32_t* words, uint16_t* scales,
               uint16_t* mins) {
  constexpr int kCpw = codes_per_word(B);
  const int64_t wpg = words_for(n, B);
  alignas(32) uint32_t tmp[8 * 64];  // [word][lane]: words_for(n, B) <= 64 on this path
  int64_t c0 = 0;
  if (wpg <= 64 && cols >= 8) {
    // Min, max and finiteness of every column first, row by row: the group's rows are cols
    // floats apart (pages apart), which the hardware prefetchers follow only when read in
    // order. The code pass below then finds the group in L2.
    const int64_t cols8 = cols / 8 * 8;
    thread_local std::vector<float> stats;
    stats.resize(static_cast<size_t>(3 * cols8));
    float* smn = stats.data();
    float* smx = smn + cols8;
    float* snf = smx + cols8;
    const __m256 zero = _mm256_setzero_ps();
    for (int64_t c = 0; c < cols8; c += 8) {
      const __m256 v = _mm256_loadu_ps(x + c);
      _mm256_storeu_ps(smn + c, v);
      _mm256_storeu_ps(smx + c, v);
      _mm256_storeu_ps(snf + c, _mm256_mul_ps(v, zero));
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
          nf = _mm256_add_ps(nf, _mm256_mul_ps(v, zero));
        }
        _mm256_storeu_ps(smn + c, mn);
        _mm256_storeu_ps(smx + c, mx);
        _mm256_storeu_ps(snf + c, nf);
      }
    }
    for (; c0 < cols8; c0 += 8) {
      const float* xc = x + c0;
      const Params8 p = params8<B, S>(_mm256_loadu_ps(smn + c0), _mm256_loadu_ps(smx + c0),
                                      _mm256_loadu_ps(snf + c0));
      __m256 tie = zero;
      for (int64_t w = 0; w < wpg; ++w) {
        __m256i acc = _mm256_setzero_si256();
        const int i1 = static_cast<int>(std::min<int64_t>(n, (w + 1) * kCpw));
        for (int i = static_cast<int>(w) * kCpw; i < i1; ++i) {
          const __m256i k = codes8<B, S>(_mm256_loadu_ps(xc + i * cols), p, tie);
          acc = _mm256_or_si256(acc, _mm256_sll_epi32(k, _mm_cvtsi32_si128(kivi::shift_of(i, B))));
        }
        _mm256_store_si256(reinterpret_cast<__m256i*>(tmp + 8 * w), acc);
      }
      if (_mm256_movemask_ps(tie)) {  // a quotient on a tie: these 8 columns by the reference
        for (int64_t c = c0; c < c0 + 8; ++c)
          reference_group<B, S>(x + c, cols, n, words + c * wpg, scales, mins, c);
        continue;
      }
      _mm_storeu_si128(reinterpret_cast<__m128i*>(scales + c0), p.scale_h);
      if (!S) _mm_storeu_si128(reinterpret_cast<__m128i*>(mins + c0), p.min_h);
      for (int j = 0; j < 8; ++j)
        for (int64_t w = 0; w < wpg; ++w) words[(c0 + j) * wpg + w] = tmp[8 * w + j];
    }
  }
  for (; c0 < cols; ++c0)
    reference_group<B, S>(x + c0, cols, n, words + c0 * wpg, scales, mins, c0);
}

// Lane reductions (the result in every lane). Min / max of finite values do not depend on the
// order; a group with NaN/inf takes nan_params whatever they give.
inline __m256 lanes_min(__m256 m) {
  m = _mm256_min_ps(m, _mm256_permute2f128_ps(m, m, 1));
  m = _mm256_min_ps(m, _mm256_shuffle_ps(m, m, 0x4E));
  return _mm256_min_ps(m, _mm256_shuffle_ps(m, m, 0xB1));
}
inline __m256 lanes_max(__m256 m) {
  m = _mm256_max_ps(m, _mm256_permute2f128_ps(m, m, 1));
  m = _mm256_max_ps(m, _mm256_shuffle_ps(m, m, 0x4E));
  return _mm256_max_ps(m, _mm256_shuffle_ps(m, m, 0xB1));
}

// Sums of the 8 lanes of a, b, c, d -> out[0..3]. Packing: codes shifted into disjoint bit
// fields, so the sum of a word's lanes is their OR.
inline __m128i lane_sums4(__m256i a, __m256i b, __m256i c, __m256i d) {
  const __m256i s = _mm256_hadd_epi32(_mm256_hadd_epi32(a, b), _mm256_hadd_epi32(c, d));
  return _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
}

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
    alignas(32) uint32_t codes[256];
    for (int v = 0; v < nv; ++v)
      _mm256_store_si256(reinterpret_cast<__m256i*>(codes + 8 * v), k[v]);
    kivi::pack(codes, len, B, words);
  }
}

// Groups of one row, 8 at a time: their min / max are reduced into one lane each, so one params8
// (two divisions, the fp16 round trip) serves 8 groups, then each group's codes take its lane.
template <int B, bool S>
void row_t(const float* x, int64_t dim, int group, uint32_t* words, uint16_t* scales,
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
      p.valid = _mm256_permutevar8x32_epi32(pb.valid, lane);
      __m256 tie = zero;
      __m256i k[32];
      for (int v = 0; v < len / 8; ++v) k[v] = codes8<B, S>(_mm256_loadu_ps(g + 8 * v), p, tie);
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

}  // namespace kvq::cpu
