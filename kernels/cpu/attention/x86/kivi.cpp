// Backend `cpu`, x86 attention blocks: KIVI (int) sides, keys per channel or per token and values
// per token, in the exact mode (kivi_exact.h, float_dot.h) and the int8 mode (kivi_int8.h); the
// exact window through the float kernels.
#include "kernels/cpu/isa.h"

// The portable path compiles this file empty (its blocks are x86 SIMD: AVX2 and wider).
#if KVQ_CPU_AVX2

#include "kernels/cpu/attention/x86/blocks.h"
#include "kernels/cpu/attention/x86/common.h"
#include "kernels/cpu/attention/x86/float_dot.h"
#include "kernels/cpu/attention/x86/kivi_exact.h"
#include "kernels/cpu/attention/x86/kivi_int8.h"
#include "kernels/cpu/attention/x86/loaders.h"
#include "kernels/cpu/attention/x86/simd_math.h"

namespace kvq::cpu::KVQ_CPU_PATH_NS::attn {

namespace {

/// Per-token int values over rows [0, n), folded as the reference folds them: each code is
/// weighted by p_ij * scale_jc (one multiply per token and channel group), and
/// sum_j p_ij * min_jc is added to the group's channels once (scratch: scr's pw, msum, sct, mnt,
/// and for the int8 mode wb, fac, mv). Rows [n, nmax) exist: those a block (ahead rows) past the
/// sub-block being read are prefetched, not read.
template <int NQ, int B>
void acc_token_values(const float* p, int64_t ldp, int64_t n, const TokenCodes<B>& ld,
                      const uint16_t* scales, const uint16_t* mins, int64_t pstride, float* o,
                      int64_t D, Scratch& scr, bool int8, int64_t nmax, int64_t ahead,
                      int64_t pf_step) {
  const int64_t G = ld.group, ncg = (D + G - 1) / G;  // the last group may be shorter
  float *pw = scr.pw.data(), *msum = scr.msum.data(), *sct = scr.sct.data(), *mnt = scr.mnt.data();
  const float sym_min = -static_cast<float>(kivi::sym_offset(B));
  std::fill(msum, msum + NQ * ncg, 0.0f);
#if KVQ_INT8_512
  float* mv = scr.mv.data();  // int8 mode: 16-lane sums of p * min per query head and group
  if (int8) std::fill(mv, mv + 16 * NQ * ncg, 0.0f);
#endif
  for (int64_t j0 = 0; j0 < n; j0 += kSubRows) {
    const int64_t j1 = std::min(n, j0 + kSubRows), m = j1 - j0, m8 = m / 8 * 8;
    // A block ahead (rows up to nmax exist): the codes of one head's row are a line or less, a
    // block of rows apart from the next block's, whose lines the hardware prefetchers miss.
    prefetch_rows(ld, j0 + ahead, nmax, D);
    // The parameters: one prefetch a line (pf_step tokens), by the head that leads the line.
    if (pf_step > 0)
      for (int64_t j = j0 + ahead; j < std::min(nmax, j0 + ahead + kSubRows); j += pf_step) {
        prefetch_row(scales + j * pstride, 1);
        if (mins) prefetch_row(mins + j * pstride, 1);
      }
    // This sub-block's scales and minima as floats, [c][j - j0], 8 tokens per conversion.
    auto eight = [pstride](const uint16_t* x) {  // x[0], x[pstride], ... x[7 * pstride]
      return _mm256_cvtph_ps(_mm_setr_epi16(
          static_cast<int16_t>(x[0]), static_cast<int16_t>(x[pstride]),
          static_cast<int16_t>(x[2 * pstride]), static_cast<int16_t>(x[3 * pstride]),
          static_cast<int16_t>(x[4 * pstride]), static_cast<int16_t>(x[5 * pstride]),
          static_cast<int16_t>(x[6 * pstride]), static_cast<int16_t>(x[7 * pstride])));
    };
#if KVQ_INT8_512
    if constexpr (B == 2 || B == 4) {
      if (int8 && m == kSubRows && ncg == 4) {  // the weights' bytes straight from the fp16 params
        weights_sub4<NQ>(p + j0, ldp, scales + j0 * pstride, mins ? mins + j0 * pstride : nullptr,
                         sym_min, pstride, scr.wb.data(), scr.fac.data(), mv);
        acc_int8_rows<NQ, B>(scr.wb.data(), scr.fac.data(), m, ld, j0, o, D);
        continue;
      }
    }
#endif
    int64_t x0 = 0;  // tokens whose parameters are already in sct / mnt
#if KVQ_CPU_AVX512
    if (ncg == 4) {  // 8 tokens' four groups (one 64-bit load each), converted, then transposed
      const __m512i lo =
          _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 1, 5, 9, 13, 17, 21, 25, 29);
      const __m512i hi = _mm512_add_epi32(lo, _mm512_set1_epi32(2));
      auto four = [&](const uint16_t* par, float* out, int64_t x) {
        uint64_t t[8];
        for (int k = 0; k < 8; ++k) std::memcpy(&t[k], par + (j0 + x + k) * pstride, 8);
        const __m512 a = _mm512_maskz_cvtph_ps(
            kAll16, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(t)));  // tokens 0-3
        const __m512 b = _mm512_maskz_cvtph_ps(
            kAll16, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(t + 4)));  // 4-7
        const __m512 g01 = _mm512_maskz_permutex2var_ps(kAll16, a, lo, b);         // groups 0, 1
        const __m512 g23 = _mm512_maskz_permutex2var_ps(kAll16, a, hi, b);         // groups 2, 3
        _mm256_storeu_ps(out + x, _mm512_maskz_extractf32x8_ps(0xff, g01, 0));
        _mm256_storeu_ps(out + kSubRows + x, _mm512_maskz_extractf32x8_ps(0xff, g01, 1));
        _mm256_storeu_ps(out + 2 * kSubRows + x, _mm512_maskz_extractf32x8_ps(0xff, g23, 0));
        _mm256_storeu_ps(out + 3 * kSubRows + x, _mm512_maskz_extractf32x8_ps(0xff, g23, 1));
      };
      for (; x0 < m8; x0 += 8) {
        four(scales, sct, x0);
        if (mins) {
          four(mins, mnt, x0);
        } else {
          for (int64_t c = 0; c < 4; ++c)
            _mm256_storeu_ps(
                mnt + c * kSubRows + x0,
                _mm256_mul_ps(_mm256_set1_ps(sym_min), _mm256_loadu_ps(sct + c * kSubRows + x0)));
        }
      }
    }
#endif
    for (int64_t c = 0; c < ncg; ++c) {
      float* sc = sct + c * kSubRows;
      float* mn = mnt + c * kSubRows;
      int64_t x = x0;
      for (; x < m8; x += 8) {
        const __m256 v = eight(scales + (j0 + x) * pstride + c);
        _mm256_storeu_ps(sc + x, v);
        _mm256_storeu_ps(mn + x, mins ? eight(mins + (j0 + x) * pstride + c)
                                      : _mm256_mul_ps(_mm256_set1_ps(sym_min), v));
      }
      for (; x < m; ++x) {
        sc[x] = _cvtsh_ss(scales[(j0 + x) * pstride + c]);
        mn[x] = mins ? _cvtsh_ss(mins[(j0 + x) * pstride + c]) : sym_min * sc[x];
      }
    }
#if KVQ_INT8_512
    uint8_t* wb = scr.wb.data();
    float* fac = scr.fac.data();
    if constexpr (B == 2 || B == 4) {
      if (int8 && m == kSubRows) {  // the weights' bytes straight from p and the parameters
        for (int64_t c = 0; c < ncg; ++c)
          weights_sub<NQ>(p + j0, ldp, sct + c * kSubRows, mnt + c * kSubRows,
                          wb + c * NQ * kSubRows, fac + c * NQ, mv + 16 * c, 16 * ncg);
        acc_int8_rows<NQ, B>(wb, fac, m, ld, j0, o, D);
        continue;
      }
    }
#endif
    for (int64_t c = 0; c < ncg; ++c)
      for (int i = 0; i < NQ; ++i) {
        const float* pi = p + i * ldp + j0;
        float* wi = pw + (c * NQ + i) * kSubRows;
        const float* sc = sct + c * kSubRows;
        const float* mn = mnt + c * kSubRows;
        __m256 macc = _mm256_setzero_ps();
        for (int64_t x = 0; x < m8; x += 8) {
          const __m256 pv = _mm256_loadu_ps(pi + x);
          _mm256_storeu_ps(wi + x, _mm256_mul_ps(pv, _mm256_loadu_ps(sc + x)));
          macc = _mm256_fmadd_ps(pv, _mm256_loadu_ps(mn + x), macc);
        }
        float tail = 0;
        for (int64_t x = m8; x < m; ++x) {
          wi[x] = pi[x] * sc[x];
          tail += pi[x] * mn[x];
        }
        msum[i * ncg + c] += hsum8(macc) + tail;
      }
#if KVQ_INT8_512
    if constexpr (B == 2 || B == 4) {
      if (int8) {  // a last, shorter sub-block: the weights' bytes from pw
        for (int64_t c = 0; c < ncg; ++c)
          weight_bytes<NQ>(pw + c * NQ * kSubRows, m, wb + c * NQ * kSubRows, fac + c * NQ);
        acc_int8_rows<NQ, B>(wb, fac, m, ld, j0, o, D);
        continue;
      }
    }
#endif
    for (int64_t c = 0; c < ncg; ++c) {
      const float* w = pw + c * NQ * kSubRows;
      if constexpr (B == 2 || B == 4) {
        if (int8) {
          acc_int8_group<NQ, B>(w, m, ld, j0, c, o, D);
          continue;
        }
      }
      const int64_t d1 = std::min(D, (c + 1) * G);
#if KVQ_CPU_AVX512
      constexpr bool kInter = kInterCodes<B>;
      // Groups of 16 or 32 channels give one head 1 or 2 accumulators, too few to keep the fma
      // pipes busy: 4 vectors span 4 or 2 whole groups (their codes are contiguous, G * B being
      // a multiple of 32), each group with its own weights.
      if constexpr (NQ <= 4) {
        const int64_t vpg = G / 16, ng = vpg >= 1 && vpg <= 2 && G % 16 == 0 ? 4 / vpg : 0;
        if (ng > 0 && (c + ng) * G <= D) {
          const auto lz = [&ld, c, G](int64_t j, int64_t d) {
            return ld.template codez<kInter>(j, c, d - c * G);
          };
          const int64_t gs = NQ * kSubRows, e1 = (c + ng) * G;
          if (vpg == 1)
            acc_span<NQ, 4, 16, 1, kInter>(w, kSubRows, j0, j1, lz, o, D, c * G, e1, gs);
          else
            acc_span<NQ, 4, 16, 2, kInter>(w, kSubRows, j0, j1, lz, o, D, c * G, e1, gs);
          c += ng - 1;
          continue;
        }
      }
      if (G % 16 == 0 && d1 - c * G == G) {
        const auto lz = [&ld, c, G](int64_t j, int64_t d) {
          return ld.template codez<kInter>(j, c, d - c * G);
        };
        constexpr int kCw = NQ <= 2 ? 4 : NQ <= 4 ? 2 : 1;
        if (G % (16 * kCw) == 0)
          acc_span<NQ, kCw, 16, kCw, kInter>(w, kSubRows, j0, j1, lz, o, D, c * G, d1);
        else
          acc_span<NQ, 1, 16, 1, kInter>(w, kSubRows, j0, j1, lz, o, D, c * G, d1);
        continue;
      }
#endif
      const auto lc = [&ld, c, G](int64_t j, int64_t d) { return ld.code(j, c, d - c * G); };
      if (G % (8 * kChannelVectors<NQ>) == 0)
        acc_span<NQ, kChannelVectors<NQ>>(w, kSubRows, j0, j1, lc, o, D, c * G, d1);
      else
        acc_span<NQ, 1>(w, kSubRows, j0, j1, lc, o, D, c * G, d1);
    }
  }
#if KVQ_INT8_512
  if (int8 && ncg == 4 && (B == 2 || B == 4)) {  // weights_sub4's sums, mv[16 i + 4 t + g]
    for (int i = 0; i < NQ; ++i) {
      const __m512 a = _mm512_loadu_ps(mv + 16 * i);
      const __m512 b = _mm512_add_ps(a, _mm512_maskz_shuffle_f32x4(kAll16, a, a, 0x4E));
      alignas(16) float t[4];
      _mm_store_ps(t,
                   _mm512_maskz_extractf32x4_ps(
                       0xf, _mm512_add_ps(b, _mm512_maskz_shuffle_f32x4(kAll16, b, b, 0xB1)), 0));
      for (int64_t c = 0; c < 4; ++c) msum[i * 4 + c] += t[c];
    }
  } else if (int8) {
    for (int64_t k = 0; k < NQ * ncg; ++k) msum[k] += hsum16(_mm512_loadu_ps(mv + 16 * k));
  }
#endif
  for (int i = 0; i < NQ; ++i)
    for (int64_t c = 0; c < ncg; ++c) {
      const float add = msum[i * ncg + c];
      int64_t d = c * G;
      const int64_t d1 = std::min(D, d + G);
      for (; d + 8 <= d1; d += 8)
        _mm256_storeu_ps(o + i * D + d,
                         _mm256_add_ps(_mm256_loadu_ps(o + i * D + d), _mm256_set1_ps(add)));
      for (; d < d1; ++d) o[i * D + d] += add;
    }
}

/// Whether per-channel int keys take the int8 mode's byte dot products (dot_int8_group).
bool int8_keys(IntMode mode, const StoredSide& k) {
  return mode == IntMode::Int8 && (k.bits == 2 || k.bits == 4) && k.group % 32 == 0 &&
         k.dim % 32 == 0;
}

/// Whether per-token int values take the int8 mode's byte dot products (acc_int8_rows with VBMI,
/// else acc_int8_group).
bool int8_values(IntMode mode, const StoredSide& v) {
  return mode == IntMode::Int8 && (v.bits == 2 || v.bits == 4) && v.group % 32 == 0 &&
         v.dim % v.group == 0;
}

}  // namespace

/// Int keys (per-channel): scores of kv head h over tokens [t0, t1) into s[i * lds + (t - t0)]
/// (unscaled). Dense and fp8 keys go through scores_rows.
template <int NQ>
void scores(const Call& c, int64_t h, int64_t t0, int64_t t1, float* s, int64_t lds, Scratch& w) {
  const StoredSide& k = c.k;
  const int64_t H = c.H, D = c.D, row = H * D;
  const float* q = c.q + h * NQ * D;
  const int64_t qt = k.quantized_tokens, te = std::min(t1, qt);
  if (k.axis == Axis::Token) {  // per-token int keys: rows dequantized in registers, exact floats
    if (t0 < te) {
      const kivi::TokenLayout L{H, D, k.group, k.bits};
      auto run = [&]<int B>() {
        if constexpr (B == 3) {
          fail("cpu attention: 3-bit per-token keys take the portable path");
        } else {
          const TokenKeyRows<B> ld{
              TokenCodes<B>::at(k, L, t0, h), k.scales + L.param_index(t0, h, 0),
              k.sym ? nullptr : k.mins + L.param_index(t0, h, 0), H * L.channel_groups(),
              (k.group & (k.group - 1)) == 0 ? std::countr_zero(static_cast<unsigned>(k.group))
                                             : -1};
          dot<NQ>(q, D, te - t0, ld, s, lds);
        }
      };
      kivi::dispatch_bits(k.bits, run);
    }
    const int64_t r0 = std::max(t0, qt);
    if (r0 < t1)
      dot<NQ>(q, D, t1 - r0, F32Rows{k.residual + (r0 - qt) * row + h * D, row}, s + (r0 - t0),
              lds);
    return;
  }
  // Per-channel int keys: each token group folds its scales into q; the window is exact.
  const int G = k.group;
  const kivi::ChannelLayout L{H, D, G, k.bits};
  const int64_t wpg = L.words_per_group();
  for (int64_t g = t0 / G; g * G < te; ++g) {
    const int64_t a = std::max(t0, g * G), b = std::min(te, (g + 1) * G);
    const int64_t p0 = L.param_index(g, h, 0);
    const uint32_t* words = k.words + L.word_index(g, h, 0);
    float* sg = s + (a - t0);
    const int jj0 = static_cast<int>(a - g * G);
    if (c.ahead && (g + 1) * G < qt) {  // the next group's parameters and codes (next call)
      const int64_t pn = L.param_index(g + 1, h, 0);
      prefetch_row(k.scales + pn, D * 2);
      if (!k.sym) prefetch_row(k.mins + pn, D * 2);
      prefetch_row(k.words + L.word_index(g + 1, h, 0), D * wpg * 4);
    }
#if KVQ_INT8_512
    if (int8_keys(c.mode, k)) {
      float base[NQ], qscale[NQ];
      int8_query<NQ>(q, D, k.scales + p0, k.sym ? nullptr : k.mins + p0,
                     static_cast<float>(kivi::sym_offset(k.bits)), w.q8.data(), qscale, base);
      if (k.bits == 2)
        dot_int8_group<NQ, Int8Keys512<2>>(words, D, wpg, w.q8.data(), qscale, base, jj0, b - a, sg,
                                           lds);
      else
        dot_int8_group<NQ, Int8Keys512<4>>(words, D, wpg, w.q8.data(), qscale, base, jj0, b - a, sg,
                                           lds);
      continue;
    }
#endif
    // q * scale per channel (scales folded into q once per group) and sum_d q_d * min_d.
    __m256 bacc[NQ];
    for (auto& x : bacc) x = _mm256_setzero_ps();
    const __m256 off = _mm256_set1_ps(-static_cast<float>(kivi::sym_offset(k.bits)));
    w.qs_of = nullptr;  // qs now holds this group's q * scale, not fp8's scaled q
    for (int64_t d = 0; d < D; d += 8) {
      const __m256 sc =
          _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(k.scales + p0 + d)));
      const __m256 mn =
          k.sym
              ? _mm256_mul_ps(off, sc)
              : _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(k.mins + p0 + d)));
      for (int i = 0; i < NQ; ++i) {
        const __m256 qv = _mm256_loadu_ps(q + i * D + d);
        _mm256_storeu_ps(w.qs.data() + i * D + d, _mm256_mul_ps(qv, sc));
        bacc[i] = _mm256_fmadd_ps(qv, mn, bacc[i]);
      }
    }
    float base[NQ];
    for (int i = 0; i < NQ; ++i) base[i] = hsum8(bacc[i]);
    auto run = [&]<int B>() {
      if constexpr (B == 2 || B == 4) {
        if (int8_keys(c.mode, k)) {
          float qscale[NQ];
          quantize_q8<NQ>(w.qs.data(), D, w.q8.data(), qscale);  // (512-bit: above, with VBMI)
          dot_int8_group<NQ, Int8Keys256<B>>(words, D, wpg, w.q8.data(), qscale, base, jj0, b - a,
                                             sg, lds);
          return;
        }
      }
#if KVQ_CPU_AVX512
      if constexpr (B == 2 || B == 4 || B == 8) {
        if (G % 16 == 0) {
          dot_channel_group<NQ, B>(words, D, wpg, w.qs.data(), base, jj0, b - a, sg, lds);
          return;
        }
      }
#endif
      transpose_words(words, D, wpg, w.wt.data());
      dot<NQ>(w.qs.data(), D, b - a, ChannelCodes<B>{w.wt.data(), D, jj0}, sg, lds);
      for (int i = 0; i < NQ; ++i)
        for (int64_t t = a; t < b; ++t) sg[i * lds + (t - a)] += base[i];
    };
    kivi::dispatch_bits(k.bits, run);
  }
  const int64_t r0 = std::max(t0, qt);
  if (r0 < t1)
    dot<NQ>(q, D, t1 - r0, F32Rows{k.residual + (r0 - qt) * row + h * D, row}, s + (r0 - t0), lds);
}

/// Int values (per-token): o_i += sum_t p_i[t - t0] * V[t, h, :] for kv head h over tokens
/// [t0, t1). Dense and fp8 values go through values_rows.
template <int NQ>
void values(const Call& c, int64_t h, int64_t t0, int64_t t1, float* p, int64_t ldp, float* o,
            Scratch& w) {
  const StoredSide& v = c.v;
  const int64_t H = c.H, D = c.D, row = H * D;
  const int64_t qt = v.quantized_tokens, te = std::min(t1, qt);
  if (t0 < te) {
    const kivi::TokenLayout L{H, D, v.group, v.bits};
    auto run = [&]<int B>() {
      if constexpr (B == 3) {
        fail("cpu attention: 3-bit per-token values take the portable path");
      } else {
        const auto ld = TokenCodes<B>::at(v, L, t0, h);
        // A token's parameters of all heads are contiguous (pstride halves): the first head whose
        // parameters start a new 64-byte span prefetches them, one line every pf tokens.
        const int64_t pstride = H * L.channel_groups(), hb = 2 * L.channel_groups();
        const bool lead = h == 0 || (h * hb) / 64 != ((h - 1) * hb) / 64;
        const int64_t pf = lead && c.ahead ? std::max<int64_t>(1, 64 / (2 * pstride)) : 0;
        acc_token_values<NQ, B>(p, ldp, te - t0, ld, v.scales + L.param_index(t0, h, 0),
                                v.sym ? nullptr : v.mins + L.param_index(t0, h, 0), pstride, o, D,
                                w, int8_values(c.mode, v), (c.ahead ? qt : te) - t0, c.block, pf);
      }
    };
    kivi::dispatch_bits(v.bits, run);
  }
  const int64_t r0 = std::max(t0, qt);
  if (r0 < t1)
    accumulate<NQ>(p + (r0 - t0), ldp, t1 - r0, F32Rows{v.residual + (r0 - qt) * row + h * D, row},
                   o, D);
}

#define KVQ_CPU_INSTANTIATE(NQ)                                                                \
  template void scores<NQ>(const Call&, int64_t, int64_t, int64_t, float*, int64_t, Scratch&); \
  template void values<NQ>(const Call&, int64_t, int64_t, int64_t, float*, int64_t, float*,    \
                           Scratch&);
KVQ_CPU_FOR_NQ(KVQ_CPU_INSTANTIATE)
#undef KVQ_CPU_INSTANTIATE

}  // namespace kvq::cpu::KVQ_CPU_PATH_NS::attn

#endif  // KVQ_CPU_AVX2
