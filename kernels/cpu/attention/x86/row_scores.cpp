// Backend `cpu`, x86 attention blocks: the scores of dense (fp32, bf16, fp16) and fp8 keys, every
// kv head of a sub-block at once in address order: the float kernels (float_dot.h) in the exact
// mode, and for fp8 in the int8 mode the bf16 dot products (fp8_bf16dot.h) or the AMX tiles
// (amx.h), where the build has them; the exact mode's AMX tiles for fp8 where amx() holds. Values:
// row_values.cpp (one file each, so a build compiles them side by side).
#include "kernels/cpu/isa.h"

// The portable path compiles this file empty (its blocks are x86 SIMD: AVX2 and wider).
#if KVQ_CPU_AVX2

#include "kernels/cpu/attention/x86/amx.h"
#include "kernels/cpu/attention/x86/blocks.h"
#include "kernels/cpu/attention/x86/common.h"
#include "kernels/cpu/attention/x86/float_dot.h"
#include "kernels/cpu/attention/x86/fp8_bf16dot.h"
#include "kernels/cpu/attention/x86/loaders.h"
#include "kernels/cpu/attention/x86/simd_math.h"

namespace kvq::cpu::KVQ_CPU_PATH_NS::attn {

/// Scores of every kv head at once in address order (dot_heads, or dot_heads_stream for a stream
/// read once), for dense and fp8 keys: s[h * hs + i * lds + (t - t0)], unscaled.
template <int NQ, bool kStream>
void scores_rows(const Call& c, int64_t t0, int64_t t1, float* s, int64_t hs, int64_t lds,
                 Scratch& w) {
  constexpr int TT = kTokensPerStep<NQ>;
  const StoredSide& k = c.k;
  const int64_t H = c.H, D = c.D, row = H * D;
  if (is_dense(k.kind)) {
    const int64_t te = dense_end(k, t1), main = (dense_end(k, k.tokens) - t0) * H;
    if (t0 < te) {
      with_dense_rows(k, t0 * row, D, [&](const auto& ld) {
        dot_heads_any<kStream, NQ, TT>(c.q, H, D, te - t0, ld, s, hs, lds, main);
      });
    }
    const int64_t r0 = std::max(t0, te);
    if (r0 < t1)
      dot_heads_any<kStream, NQ, TT>(c.q, H, D, t1 - r0,
                                     F32Rows{k.residual + (r0 - k.quantized_tokens) * row, D},
                                     s + (r0 - t0), hs, lds, (k.tokens - r0) * H);
    return;
  }
#if KVQ_CPU_BF16DOT
  if (fp8_bf16(c.mode, k)) {  // q (times the per-channel scales) * 2^kFp8QShift as bf16
    const __m512 mul = _mm512_set1_ps(pow2(kFp8QShift));
    const bool ch = k.gran == Granularity::Channel;
    if (w.qb_of != c.q) {  // not yet converted in this segment
      for (int64_t j = 0; j < H * NQ; ++j)
        for (int64_t d = 0; d < D; d += 32) {
          const float* qj = c.q + j * D + d;
          __m512 lo = _mm512_mul_ps(_mm512_loadu_ps(qj), mul);
          __m512 hi = _mm512_mul_ps(_mm512_loadu_ps(qj + 16), mul);
          if (ch) {
            const float* sc = k.fp8_scales + (j / NQ) * D + d;
            lo = _mm512_mul_ps(lo, _mm512_loadu_ps(sc));
            hi = _mm512_mul_ps(hi, _mm512_loadu_ps(sc + 16));
          }
          const __m512bh b = _mm512_maskz_cvtne2ps_pbh(kAll32, hi, lo);
          _mm512_storeu_si512(w.qb.data() + j * D + d, from_bh(b));
        }
#if KVQ_CPU_AMX
      if (amx()) fp8_query_tiles<NQ>(w.qb.data(), H, D, w.qt.data());
#endif
      w.qb_of = c.q;
    }
    with_fp8_format(k.format, [&]<Fp8Format F>() {
      const float back = pow2(127 - fp8::Traits<F>::kBias - kFp8QShift);
      const int64_t ldf = kSubRows + 16;  // rowf[h * ldf + t - t0], 16 floats of padding
      KVQ_CHECK(t1 - t0 <= kSubRows, "cpu attention: fp8 keys of {} tokens at once", t1 - t0);
      fp8_row_factors(k, t0, t1, back, w.rowf.data(), ldf);
      auto keys = [&]<int kLoc>() {
#if KVQ_CPU_AMX
        if (amx())
          return fp8_dot_amx<NQ, F, kStream, kLoc>(w.qt.data(), H, D, t1 - t0, k.codes + t0 * row,
                                                   w.rowf.data(), ldf, s, hs, lds,
                                                   (k.tokens - t0) * H, w.ka.data());
#endif
        fp8_dot_bf16<NQ, F, kStream, kLoc>(w.qb.data(), H, D, t1 - t0, k.codes + t0 * row,
                                           w.rowf.data(), ldf, s, hs, lds, (k.tokens - t0) * H);
      };
      if constexpr (kStream)
        with_stream_loc(H, D, keys);  // one byte a channel
      else
        keys.template operator()<kL2>();
    });
    return;
  }
#endif
#if KVQ_CPU_AMX
  if constexpr (3 * NQ <= 16) {
    if (fp8_amx_exact(c.mode, k, NQ, D)) {  // exact products on tiles
      const bool ch = k.gran == Granularity::Channel;
      if (w.qb_of != c.q) {  // not yet laid out in this segment
        fp8_query_tiles_exact<NQ>(c.q, ch ? k.fp8_scales : nullptr, H, D, w.qt.data());
        w.qb_of = c.q;
      }
      KVQ_CHECK(t1 - t0 <= kSubRows, "cpu attention: fp8 keys of {} tokens at once", t1 - t0);
      const int64_t ldf = kSubRows + 16;  // rowf[h * ldf + t - t0], 16 floats of padding
      fp8_row_factors(k, t0, t1, 1.0f, w.rowf.data(), ldf);
      with_fp8_format(k.format, [&]<Fp8Format F>() {
        auto keys = [&]<int kLoc>() {
          fp8_dot_amx<NQ, F, kStream, kLoc, true>(w.qt.data(), H, D, t1 - t0, k.codes + t0 * row,
                                                  w.rowf.data(), ldf, s, hs, lds,
                                                  (k.tokens - t0) * H, w.ka.data());
        };
        if constexpr (kStream)
          with_stream_loc(H, D, keys);
        else
          keys.template operator()<kL2>();
      });
      return;
    }
  }
#endif
  // q times the per-channel scales, times the loader's power of two (Fp8Rows)
  with_fp8_format(k.format, [&]<Fp8Format F>() {
    if (w.qs_of != c.q) {  // not yet scaled in this segment
      const float restore = fp8_restore<F>();
      float* qs = w.qs.data();
      if (k.gran == Granularity::Channel) {
        for (int64_t h = 0; h < H; ++h)
          for (int64_t i = 0; i < NQ; ++i)
            for (int64_t d = 0, j = (h * NQ + i) * D; d < D; ++d, ++j)
              qs[j] = c.q[j] * k.fp8_scales[h * D + d] * restore;
      } else {
        for (int64_t j = 0; j < H * NQ * D; ++j) qs[j] = c.q[j] * restore;
      }
      w.qs_of = c.q;
    }
    with_fp8_rows<F>(k, k.codes + t0 * row, D, [&](const auto& rows) {
      dot_heads_any<kStream, NQ, TT>(w.qs.data(), H, D, t1 - t0, rows, s, hs, lds,
                                     (k.tokens - t0) * H);
    });
  });
  if (k.gran != Granularity::Channel)
    for (int64_t t = t0; t < t1; ++t)
      for (int64_t h = 0; h < H; ++h) {
        const float f = fp8_token_factor(k, t, h);
        for (int i = 0; i < NQ; ++i) s[h * hs + i * lds + (t - t0)] *= f;
      }
}

#define KVQ_CPU_INSTANTIATE(NQ)                                                                 \
  template void scores_rows<NQ, false>(const Call&, int64_t, int64_t, float*, int64_t, int64_t, \
                                       Scratch&);                                               \
  template void scores_rows<NQ, true>(const Call&, int64_t, int64_t, float*, int64_t, int64_t,  \
                                      Scratch&);
KVQ_CPU_FOR_NQ(KVQ_CPU_INSTANTIATE)
#undef KVQ_CPU_INSTANTIATE

}  // namespace kvq::cpu::KVQ_CPU_PATH_NS::attn

#endif  // KVQ_CPU_AVX2
