// Backend `cpu`, x86 attention blocks: the outputs over dense (fp32, bf16, fp16) and fp8 values,
// every kv head of a sub-block at once in address order: the float kernels (float_dot.h) in the
// exact mode, and for fp8 in the int8 mode the bf16 dot products (fp8_bf16dot.h) or the AMX tiles
// (amx.h), where the build has them; the exact mode's AMX tiles for fp8 where amx() holds. Keys:
// row_scores.cpp.
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

/// Values of every kv head at once in address order (acc_heads, or acc_heads_stream), for dense
/// and fp8 values; o is [H, NQ, D].
template <int NQ, bool kStream>
void values_rows(const Call& c, int64_t t0, int64_t t1, float* p, int64_t hs, int64_t ldp, float* o,
                 Scratch& w) {
  const StoredSide& v = c.v;
  const int64_t H = c.H, D = c.D, row = H * D;
  if (is_dense(v.kind)) {
    const int64_t te = dense_end(v, t1), main = (dense_end(v, v.tokens) - t0) * H;
    if (t0 < te) {
      with_dense_rows(v, t0 * row, D, [&](const auto& ld) {
        acc_heads_any<kStream, NQ>(p, hs, ldp, H, D, te - t0, ld, o, main);
      });
    }
    const int64_t r0 = std::max(t0, te);
    if (r0 < t1)
      acc_heads_any<kStream, NQ>(p + (r0 - t0), hs, ldp, H, D, t1 - r0,
                                 F32Rows{v.residual + (r0 - v.quantized_tokens) * row, D}, o,
                                 (v.tokens - r0) * H);
    return;
  }
#if KVQ_CPU_BF16DOT
  if (fp8_bf16(c.mode, v)) {  // outputs carry 2^-kFp8OShift (CausalAttention::finish)
    KVQ_CHECK(t1 - t0 <= kSubRows, "cpu attention: fp8 values of {} tokens at once", t1 - t0);
    with_fp8_format(v.format, [&]<Fp8Format F>() {
      // each row's factor (its token factor; per-channel scales multiply the final output)
      // times 2^(127 - kBias - kFp8OShift), per head: f[h * n + t - t0]
      const float mul = pow2(127 - fp8::Traits<F>::kBias - kFp8OShift);
      fp8_row_factors(v, t0, t1, mul, w.rowf.data(), t1 - t0);
#if KVQ_CPU_AMX
      if (amx()) {  // 16 pairs a head and query (fp8_acc_amx)
        fp8_weights_bf16<NQ>(p, hs, ldp, H, t1 - t0, w.rowf.data(), w.wp.data(), kSubRows / 2);
        return fp8_acc_amx<NQ, F, kStream>(w.wp.data(), H, D, t1 - t0, v.codes + t0 * row, o,
                                           (v.tokens - t0) * H, w.vb.data());
      }
#endif
      fp8_weights_bf16<NQ>(p, hs, ldp, H, t1 - t0, w.rowf.data(), w.wp.data(), (t1 - t0 + 1) / 2);
      fp8_acc_bf16<NQ, F, kStream>(w.wp.data(), H, D, t1 - t0, v.codes + t0 * row, o,
                                   (v.tokens - t0) * H);
    });
    return;
  }
#else
  (void)w;
#endif
#if KVQ_CPU_AMX
  if constexpr (3 * NQ <= 16) {
    if (fp8_amx_exact(c.mode, v, NQ, D)) {  // exact products on tiles
      KVQ_CHECK(t1 - t0 <= kSubRows, "cpu attention: fp8 values of {} tokens at once", t1 - t0);
      const int64_t n = t1 - t0;  // (per-channel scales: the final output)
      fp8_row_factors(v, t0, t1, 1.0f, w.rowf.data(), n);
      fp8_weights_exact<NQ>(p, hs, ldp, H, n, w.rowf.data(), w.wp.data());
      with_fp8_format(v.format, [&]<Fp8Format F>() {
        fp8_acc_amx_exact<NQ, F, kStream>(w.wp.data(), H, D, n, v.codes + t0 * row, o,
                                          (v.tokens - t0) * H, w.vb.data());
      });
      return;
    }
  }
#endif
  // the weights times the token factors (per-channel scales multiply the final output) and the
  // loader's power of two (Fp8Rows)
  with_fp8_format(v.format, [&]<Fp8Format F>() {
    const float restore = fp8_restore<F>();
    const bool ch = v.gran == Granularity::Channel;
    for (int64_t t = t0; t < t1; ++t)
      for (int64_t h = 0; h < H; ++h) {
        const float f = (ch ? 1.0f : fp8_token_factor(v, t, h)) * restore;
        for (int i = 0; i < NQ; ++i) p[h * hs + i * ldp + (t - t0)] *= f;
      }
    with_fp8_rows<F>(v, v.codes + t0 * row, D, [&](const auto& rows) {
      acc_heads_any<kStream, NQ>(p, hs, ldp, H, D, t1 - t0, rows, o, (v.tokens - t0) * H);
    });
  });
}

#define KVQ_CPU_INSTANTIATE(NQ)                                                                 \
  template void values_rows<NQ, false>(const Call&, int64_t, int64_t, float*, int64_t, int64_t, \
                                       float*, Scratch&);                                       \
  template void values_rows<NQ, true>(const Call&, int64_t, int64_t, float*, int64_t, int64_t,  \
                                      float*, Scratch&);
KVQ_CPU_FOR_NQ(KVQ_CPU_INSTANTIATE)
#undef KVQ_CPU_INSTANTIATE

}  // namespace kvq::cpu::KVQ_CPU_PATH_NS::attn

#endif  // KVQ_CPU_AVX2
