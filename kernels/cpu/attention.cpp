// Backend `cpu`: the attention kernels of one CPU path (kernels/cpu/attention.h states what they
// compute), compiled once per path with its flags into kvq::cpu::<path> (kernels/cpu/isa.h): the
// portable row-at-a-time path, and where the build targets AVX2 the SIMD blocks. run_segment is
// the entry the causal scheduler (kernels/cpu/causal.cpp) calls through the path table.
#include "kernels/cpu/attention.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "fp8/format.h"
#include "fp8/scale.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/segment.h"
#include "kernels/cpu/simd_decode.h"
#include "kivi/group.h"
#include "kivi/layout.h"
#include "kivi/minmax.h"

// Int8 mode's 512-bit forms: byte dot products (VNNI) on codes brought into their lanes by byte
// permutes (VBMI).
#if KVQ_CPU_AVX512 && defined(__AVX512VNNI__) && defined(__AVX512VBMI__)
#define KVQ_INT8_512 1
#else
#define KVQ_INT8_512 0
#endif

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

namespace kvq::cpu::KVQ_CPU_PATH_NS {

namespace {

/// A dense side may read its tokens from quantized_tokens on from `residual` (a causal position's
/// exact tail, kernels/cpu/attention.h); the end of its own rows within [.., t1).
int64_t dense_end(const StoredSide& s, int64_t t1) {
  return s.residual ? std::min(t1, s.quantized_tokens) : t1;
}

// ---- portable path: one dequantized row at a time ----------------------------------------------

/// Row (t, h) as the reference reads it back (dequantized codes or exact values).
void fetch_row(const StoredSide& s, int64_t t, int64_t h, float* out) {
  const int64_t H = s.heads, D = s.dim, r = (t * H + h) * D;
  if (is_dense(s.kind) && t >= dense_end(s, t + 1)) {
    const float* x = s.residual + ((t - s.quantized_tokens) * H + h) * D;
    std::copy(x, x + D, out);
    return;
  }
  switch (s.kind) {
    case SchemeKind::Fp32:
      std::copy(s.f32 + r, s.f32 + r + D, out);
      return;
    case SchemeKind::Bf16:
      for (int64_t d = 0; d < D; ++d) out[d] = bf16_bits_to_float(s.half16[r + d]);
      return;
    case SchemeKind::Fp16:
      for (int64_t d = 0; d < D; ++d) out[d] = half_bits_to_float(s.half16[r + d]);
      return;
    case SchemeKind::Fp8:
      for (int64_t d = 0; d < D; ++d)
        out[d] = s.fp8_scales[fp8::scale_index(s.gran, t, h, d, H, D)] *
                 fp8::decode(s.format, s.codes[r + d]);
      return;
    case SchemeKind::Int:
      break;
  }
  if (t >= s.quantized_tokens) {
    const float* x = s.residual + ((t - s.quantized_tokens) * H + h) * D;
    std::copy(x, x + D, out);
    return;
  }
  for (int64_t d = 0; d < D; ++d) {
    int64_t p;
    uint32_t code;
    if (s.axis == Axis::Channel) {
      const kivi::ChannelLayout L{H, D, s.group, s.bits};
      p = L.param_index(t / s.group, h, d);
      code = L.code(s.words, t, h, d);
    } else {
      const kivi::TokenLayout L{H, D, s.group, s.bits};
      p = L.param_index(t, h, d / s.group);
      code = L.code(s.words, t, h, d);
    }
    const float sc = half_bits_to_float(s.scales[p]);
    const float mn = s.sym ? 0.0f : half_bits_to_float(s.mins[p]);
    out[d] = kivi::decode(code, sc, mn, s.bits, s.sym);
  }
}

/// Every score so far -inf (or NaN): the weights are 0 (a NaN stays NaN), as the reference's
/// softmax gives -inf scores beside any finite one; where all are -inf, l stays 0 and the output
/// is 0 / 0, NaN, as the reference's. (exp(s - mn) would be exp(NaN) here.)
inline bool all_minus_inf_step(float* s, int64_t n, float mn, float& l, float* o, int64_t D) {
  if (mn != -INFINITY) return false;
  float sum = 0;
  for (int64_t t = 0; t < n; ++t) sum += s[t] = s[t] == -INFINITY ? 0.0f : s[t];
  l = l * 0.0f + sum;  // the running max was -inf too: alpha = 0 (a NaN in l or o stays)
  for (int64_t d = 0; d < D; ++d) o[d] *= 0.0f;
  return true;
}

/// Online-softmax step for one query head over n new scores (already scaled): turns them into
/// weights e^(s - m_new) in place, rescales o by e^(m - m_new) and updates m and l.
void softmax_step_scalar(float* s, int64_t n, float& m, float& l, float* o, int64_t D) {
  float mb = -INFINITY;
  for (int64_t t = 0; t < n; ++t) mb = std::max(mb, s[t]);
  const float mn = std::max(m, mb);
  if (all_minus_inf_step(s, n, mn, l, o, D)) return;
  const float alpha = m == -INFINITY ? 0.0f : std::exp(m - mn);
  float sum = 0;
  for (int64_t t = 0; t < n; ++t) sum += s[t] = std::exp(s[t] - mn);
  l = l * alpha + sum;
  if (alpha != 1.0f)
    for (int64_t d = 0; d < D; ++d) o[d] *= alpha;
  m = mn;
}

void portable_range(const Call& c, int64_t a, int64_t b, Partial& P, Scratch& w) {
  const int64_t D = c.D;
  std::vector<float>& row = w.qs;
  w.qs_of = nullptr;  // qs now holds rows, not a scaled q
  std::vector<float>& s = w.s;
  if (row.size() < static_cast<size_t>(D)) row.resize(static_cast<size_t>(D));
  if (s.size() < static_cast<size_t>(c.nq * c.block)) s.resize(static_cast<size_t>(c.nq * c.block));
  for (int64_t t0 = a; t0 < b; t0 += c.block) {
    const int64_t t1 = std::min(b, t0 + c.block), n = t1 - t0;
    for (int64_t h = 0; h < c.H; ++h) {
      for (int64_t t = t0; t < t1; ++t) {
        fetch_row(c.k, t, h, row.data());
        for (int i = 0; i < c.nq; ++i) {
          const float* qi = c.q + (h * c.nq + i) * D;
          float acc = 0;
          for (int64_t d = 0; d < D; ++d) acc += qi[d] * row[static_cast<size_t>(d)];
          s[static_cast<size_t>(i * c.block + (t - t0))] = acc * c.scale;
        }
      }
      for (int i = 0; i < c.nq; ++i) {
        const int64_t j = h * c.nq + i;
        softmax_step_scalar(s.data() + i * c.block, n, P.m[static_cast<size_t>(j)],
                            P.l[static_cast<size_t>(j)], P.o.data() + j * D, D);
      }
      for (int64_t t = t0; t < t1; ++t) {
        fetch_row(c.v, t, h, row.data());
        for (int i = 0; i < c.nq; ++i) {
          const float w = s[static_cast<size_t>(i * c.block + (t - t0))];
          float* o = P.o.data() + (h * c.nq + i) * D;
          for (int64_t d = 0; d < D; ++d) o[d] += w * row[static_cast<size_t>(d)];
        }
      }
    }
  }
}

#if KVQ_CPU_AVX2

/// Whether an fp8 side takes the int8 mode's bf16 dot products.
bool fp8_bf16(IntMode mode, const StoredSide& s) {
  return KVQ_CPU_BF16DOT && fp8_bf16_side(mode, s);
}

/// Per-(token, head) factor of an fp8 side's scale (tensor / head / token; 1 for channel).
float fp8_token_factor(const StoredSide& s, int64_t t, int64_t h) {
  if (s.gran == Granularity::Channel) return 1.0f;
  return s.fp8_scales[fp8::scale_index(s.gran, t, h, 0, s.heads, s.dim)];
}

#if KVQ_CPU_BF16DOT
/// f[h * ld + t - t0] = fp8_token_factor(s, t, h) * mul for tokens [t0, t1) of every head: the
/// same products, one loop per granularity instead of an index per element (a gather of 16 tokens'
/// scales per token measured the same as this loop, session 28).
void fp8_row_factors(const StoredSide& s, int64_t t0, int64_t t1, float mul, float* f, int64_t ld) {
  const int64_t H = s.heads, n = t1 - t0;
  for (int64_t h = 0; h < H; ++h) {
    float* fh = f + h * ld;
    if (s.gran == Granularity::Token) {
      const float* sc = s.fp8_scales + t0 * H + h;  // scale_index: t * heads + h
      for (int64_t u = 0; u < n; ++u) fh[u] = sc[u * H] * mul;
    } else {
      std::fill(fh, fh + n, fp8_token_factor(s, t0, h) * mul);  // one factor a head
    }
  }
}
#endif

// ---- AVX2 path ---------------------------------------------------------------------------------

// e^x (Cephes expf: range reduction by ln 2 in two parts, degree-6 polynomial); x clamped to
// [-87, 88] (e^-87 ~ 1.6e-38 is zero next to the block's largest weight, 1). The same steps on 8
// lanes (exp8) and 16 (exp16), so the same values.
constexpr float kExpLo = -87.0f, kExpHi = 88.0f, kLog2e = 1.44269504088896341f;
constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
constexpr float kExpP[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                            4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};

inline __m256 exp8(__m256 x) {
  // the clamp's operands in this order pass a NaN through (max / min return their second operand
  // when either is NaN): a NaN score gives a NaN weight, as std::exp and the reference do
  x = _mm256_min_ps(_mm256_set1_ps(kExpHi), _mm256_max_ps(_mm256_set1_ps(kExpLo), x));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(kLog2e)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  x = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Hi), x);
  x = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Lo), x);
  __m256 y = _mm256_set1_ps(kExpP[0]);
  for (int k = 1; k < 6; ++k) y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(kExpP[k]));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
  const __m256i e =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

#if KVQ_CPU_AVX512
inline __m512 exp16(__m512 x) {
  x = _mm512_maskz_min_ps(kAll16, _mm512_set1_ps(kExpHi),
                          _mm512_maskz_max_ps(kAll16, _mm512_set1_ps(kExpLo), x));  // as exp8
  const __m512 n = _mm512_maskz_roundscale_ps(kAll16, _mm512_mul_ps(x, _mm512_set1_ps(kLog2e)),
                                              _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  x = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Hi), x);
  x = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Lo), x);
  __m512 y = _mm512_set1_ps(kExpP[0]);
  for (int k = 1; k < 6; ++k) y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(kExpP[k]));
  y = _mm512_fmadd_ps(y, _mm512_mul_ps(x, x), _mm512_add_ps(x, _mm512_set1_ps(1.0f)));
  const __m512i e = _mm512_maskz_slli_epi32(
      kAll16, _mm512_add_epi32(_mm512_maskz_cvtps_epi32(kAll16, n), _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(y, _mm512_castsi512_ps(e));
}
#endif

inline float hmax8(__m256 v) { return _mm256_cvtss_f32(lanes_max(v)); }

/// Unaligned 32- and 64-bit reads of packed bytes.
inline uint32_t load_u32(const void* p) {
  uint32_t x;
  std::memcpy(&x, p, 4);
  return x;
}
inline uint64_t load_u64(const void* p) {
  uint64_t x;
  std::memcpy(&x, p, 8);
  return x;
}

/// Lane sums of four vectors: {sum a, sum b, sum c, sum d}.
inline __m128 hsum4(__m256 a, __m256 b, __m256 c, __m256 d) {
  const __m256 t = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
  return _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
}

/// softmax_step's first pass: s *= scale in place; returns the largest.
float softmax_scale(float* s, int64_t n, float scale) {
  const __m256 sc = _mm256_set1_ps(scale);
  __m256 mx = _mm256_set1_ps(-INFINITY);
  int64_t t = 0;
#if KVQ_CPU_AVX512
  __m512 mx16 = _mm512_set1_ps(-INFINITY);
  for (; t + 16 <= n; t += 16) {
    const __m512 v = _mm512_mul_ps(_mm512_loadu_ps(s + t), _mm512_set1_ps(scale));
    _mm512_storeu_ps(s + t, v);
    mx16 = _mm512_maskz_max_ps(kAll16, mx16, v);
  }
  mx = _mm256_max_ps(_mm512_maskz_extractf32x8_ps(0xff, mx16, 0),
                     _mm512_maskz_extractf32x8_ps(0xff, mx16, 1));
#endif
  for (; t + 8 <= n; t += 8) {
    const __m256 v = _mm256_mul_ps(_mm256_loadu_ps(s + t), sc);
    _mm256_storeu_ps(s + t, v);
    mx = _mm256_max_ps(mx, v);
  }
  float mb = hmax8(mx);
  for (; t < n; ++t) mb = std::max(mb, s[t] *= scale);
  return mb;
}

/// The rest of softmax_step, from the first pass's largest score mb.
void softmax_finish(float* s, int64_t n, float mb, float& m, float& l, float* o, int64_t D) {
  const float mn = std::max(m, mb);
  if (all_minus_inf_step(s, n, mn, l, o, D)) return;
  const float alpha = m == -INFINITY ? 0.0f : std::exp(m - mn);
  const __m256 mv = _mm256_set1_ps(mn);
  __m256 sum = _mm256_setzero_ps();
  int64_t t = 0;
#if KVQ_CPU_AVX512
  __m512 sum16 = _mm512_setzero_ps();
  for (; t + 16 <= n; t += 16) {
    const __m512 p = exp16(_mm512_sub_ps(_mm512_loadu_ps(s + t), _mm512_set1_ps(mn)));
    _mm512_storeu_ps(s + t, p);
    sum16 = _mm512_add_ps(sum16, p);
  }
  sum = _mm256_add_ps(_mm512_maskz_extractf32x8_ps(0xff, sum16, 0),
                      _mm512_maskz_extractf32x8_ps(0xff, sum16, 1));
#endif
  for (; t + 8 <= n; t += 8) {
    const __m256 p = exp8(_mm256_sub_ps(_mm256_loadu_ps(s + t), mv));
    _mm256_storeu_ps(s + t, p);
    sum = _mm256_add_ps(sum, p);
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, sum);
  float total = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) +
                ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
  for (; t < n; ++t) total += s[t] = std::exp(s[t] - mn);
  l = l * alpha + total;
  if (alpha != 1.0f) {
    const __m256 a = _mm256_set1_ps(alpha);
    for (int64_t d = 0; d < D; d += 8)
      _mm256_storeu_ps(o + d, _mm256_mul_ps(_mm256_loadu_ps(o + d), a));
  }
  m = mn;
}

/// softmax_step_scalar on 16 lanes (AVX-512) or 8 (softmax_scale, then softmax_finish); s has
/// room for n rounded up to 8.
void softmax_step(float* s, int64_t n, float scale, float& m, float& l, float* o, int64_t D) {
  softmax_finish(s, n, softmax_scale(s, n, scale), m, l, o, D);
}

/// softmax_step for NQ query heads (rows of s lds apart; m, l, o: the heads' in order, o rows D
/// apart). With AVX-512 and n a multiple of 16, the heads' passes run interleaved, each head's
/// arithmetic exactly softmax_step's (the same values, bits included): the heads' chains of
/// reductions and their scalar exps overlap instead of following one another.
template <int NQ>
void softmax_rows(float* s, int64_t lds, int64_t n, float scale, float* m, float* l, float* o,
                  int64_t D) {
#if KVQ_CPU_AVX512
  if (n > 0 && n % 16 == 0) {
    __m512 acc[NQ];
    float mb[NQ], mn[NQ], alpha[NQ];
    for (auto& x : acc) x = _mm512_set1_ps(-INFINITY);
    for (int64_t t = 0; t < n; t += 16)
      for (int i = 0; i < NQ; ++i) {
        float* si = s + i * lds + t;
        const __m512 v = _mm512_mul_ps(_mm512_loadu_ps(si), _mm512_set1_ps(scale));
        _mm512_storeu_ps(si, v);
        acc[i] = _mm512_maskz_max_ps(kAll16, acc[i], v);
      }
    bool all_finite = true;
    for (int i = 0; i < NQ; ++i) {
      mb[i] = hmax8(_mm256_max_ps(_mm512_maskz_extractf32x8_ps(0xff, acc[i], 0),
                                  _mm512_maskz_extractf32x8_ps(0xff, acc[i], 1)));
      mn[i] = std::max(m[i], mb[i]);
      all_finite = all_finite && mn[i] != -INFINITY;
    }
    if (!all_finite) {  // a head whose scores are all -inf so far: softmax_finish handles it
      for (int i = 0; i < NQ; ++i) softmax_finish(s + i * lds, n, mb[i], m[i], l[i], o + i * D, D);
      return;
    }
    for (int i = 0; i < NQ; ++i) {
      alpha[i] = m[i] == -INFINITY ? 0.0f : std::exp(m[i] - mn[i]);
      acc[i] = _mm512_setzero_ps();
    }
    for (int64_t t = 0; t < n; t += 16)
      for (int i = 0; i < NQ; ++i) {
        float* si = s + i * lds + t;
        const __m512 p = exp16(_mm512_sub_ps(_mm512_loadu_ps(si), _mm512_set1_ps(mn[i])));
        _mm512_storeu_ps(si, p);
        acc[i] = _mm512_add_ps(acc[i], p);
      }
    for (int i = 0; i < NQ; ++i) {
      alignas(32) float lanes[8];
      _mm256_store_ps(lanes, _mm256_add_ps(_mm512_maskz_extractf32x8_ps(0xff, acc[i], 0),
                                           _mm512_maskz_extractf32x8_ps(0xff, acc[i], 1)));
      const float total = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) +
                          ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
      l[i] = l[i] * alpha[i] + total;
      if (alpha[i] != 1.0f) {
        const __m256 a = _mm256_set1_ps(alpha[i]);
        float* oi = o + i * D;
        for (int64_t d = 0; d < D; d += 8)
          _mm256_storeu_ps(oi + d, _mm256_mul_ps(_mm256_loadu_ps(oi + d), a));
      }
      m[i] = mn[i];
    }
    return;
  }
#endif
  for (int i = 0; i < NQ; ++i) softmax_step(s + i * lds, n, scale, m[i], l[i], o + i * D, D);
}

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

inline float hsum8(__m256 v) {
  const __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 y = _mm_add_ps(x, _mm_movehl_ps(x, x));
  return _mm_cvtss_f32(_mm_add_ss(y, _mm_movehdup_ps(y)));
}

#if KVQ_CPU_AVX512
inline float hsum16(__m512 v) {
  return hsum8(_mm256_add_ps(_mm512_maskz_extractf32x8_ps(0xff, v, 0),
                             _mm512_maskz_extractf32x8_ps(0xff, v, 1)));
}
inline float hmax16(__m512 v) {
  return hmax8(_mm256_max_ps(_mm512_maskz_extractf32x8_ps(0xff, v, 0),
                             _mm512_maskz_extractf32x8_ps(0xff, v, 1)));
}
#endif

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

/// o_i[d] += sum_j w[i * ldw + j - j0] * code_j[d] for rows [j0, j1) and d in [d0, d1), CW vectors
/// of W channels at a time (ld(j, d): W floats). Per element the same fma chain in row order
/// whatever W and CW. VPG < CW: the CW vectors span CW / VPG channel groups of VPG vectors each,
/// group g weighted by w + g * gstride, and [d0, d1) is a whole number of such spans (more
/// independent accumulators per row than one group's vectors give). Inter (W = 16): ld gives its
/// channels in kInter4 lane order, and the accumulators are held in that order.
template <int NQ, int CW, int W = 8, int VPG = CW, bool Inter = false, class L>
void acc_span(const float* w, int64_t ldw, int64_t j0, int64_t j1, const L& ld, float* o, int64_t D,
              int64_t d0, int64_t d1, int64_t gstride = 0) {
  using V = FVec<W>;
  static_assert(CW % VPG == 0);
  static_assert(!Inter || W == 16);
  constexpr int NG = CW / VPG;
  for (; d0 + W * CW <= d1; d0 += W * CW, w += NG * gstride) {
    typename V::T a[NQ * CW];
    for (int i = 0; i < NQ; ++i)
      for (int c = 0; c < CW; ++c) {
        a[i * CW + c] = V::load(o + i * D + d0 + W * c);
#if KVQ_CPU_AVX512
        if constexpr (Inter) a[i * CW + c] = to_inter4(a[i * CW + c]);
#endif
      }
    for (int64_t j = j0; j < j1; ++j) {
      typename V::T vv[CW];
      for (int c = 0; c < CW; ++c) vv[c] = ld(j, d0 + W * c);
      for (int i = 0; i < NQ; ++i)
        for (int g = 0; g < NG; ++g) {
          const auto pw = V::bcast(w + g * gstride + i * ldw + (j - j0));
          for (int c = g * VPG; c < (g + 1) * VPG; ++c)
            a[i * CW + c] = V::fma(pw, vv[c], a[i * CW + c]);
        }
    }
    for (int i = 0; i < NQ; ++i)
      for (int c = 0; c < CW; ++c) {
#if KVQ_CPU_AVX512
        if constexpr (Inter) a[i * CW + c] = from_inter4(a[i * CW + c]);
#endif
        V::store(o + i * D + d0 + W * c, a[i * CW + c]);
      }
  }
  if constexpr (CW > 1 && NG == 1) {
    if (d0 < d1) acc_span<NQ, 1, W, 1, Inter>(w, ldw, j0, j1, ld, o, D, d0, d1);
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

#if KVQ_CPU_AVX512
/// Exact scores of a per-channel key group (bits 2, 4 or 8, G a multiple of 16; words
/// channel-major, word x of channel d at words[d * wpg + x]) for its tokens [j0, j0 + n), tokens in
/// the lanes: s_i[t] = base_i + sum_d qs_i[d] * code_t[d], the sum taken in channel order by one
/// fma per channel, 16 tokens a vector, two vectors (32 tokens) at a time where the group has them.
/// No horizontal sums and no transposed copy of the words.
template <int NQ, int B>
void dot_channel_group(const uint32_t* words, int64_t D, int64_t wpg, const float* qs,
                       const float* base, int64_t j0, int64_t n, float* s, int64_t lds) {
  constexpr bool kInter = kInterCodes<B>;
  auto slices = [&]<int S>(int64_t k) {  // tokens 16k .. 16k + 16 S - 1 of the group
    __m512 acc[NQ * S];
    for (auto& a : acc) a = _mm512_setzero_ps();
    for (int64_t d = 0; d < D; ++d) {
      const uint32_t* wd = words + d * wpg;
      __m512 f[S];
      for (int u = 0; u < S; ++u) f[u] = codes16<B, kInter>(wd, 16 * (k + u));  // 16 (k + u) on
      for (int i = 0; i < NQ; ++i) {
        const __m512 qv = _mm512_set1_ps(qs[i * D + d]);
        for (int u = 0; u < S; ++u) acc[i * S + u] = _mm512_fmadd_ps(qv, f[u], acc[i * S + u]);
      }
    }
    const int64_t a = std::max(j0, 16 * k), b = std::min(j0 + n, 16 * (k + S));
    for (int i = 0; i < NQ; ++i) {
      alignas(64) float tmp[16 * S];
      for (int u = 0; u < S; ++u) {
        __m512 x = _mm512_add_ps(acc[i * S + u], _mm512_set1_ps(base[i]));
        if constexpr (kInter) x = from_inter4(x);  // tokens back in order
        _mm512_store_ps(tmp + 16 * u, x);
      }
      for (int64_t t = a; t < b; ++t) s[i * lds + (t - j0)] = tmp[t - 16 * k];
    }
  };
  int64_t k = j0 / 16;
  const int64_t k1 = (j0 + n + 15) / 16;
  for (; k + 2 <= k1; k += 2) slices.template operator()<2>(k);
  if (k < k1) slices.template operator()<1>(k);
}
#endif

/// A key group's words, channel-major (words[d * wpg + x]), as wt[x * D + d]: word x of 8
/// consecutive channels in one vector.
inline void transpose_words(const uint32_t* words, int64_t D, int64_t wpg, uint32_t* wt) {
  if (wpg == 2) {  // kivi2 at G=32: split even / odd words of 8 channels
    const __m256i idx = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
    for (int64_t d = 0; d < D; d += 8) {
      const __m256i a = _mm256_permutevar8x32_epi32(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(words + 2 * d)), idx);
      const __m256i b = _mm256_permutevar8x32_epi32(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(words + 2 * d + 8)), idx);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(wt + d),
                          _mm256_permute2x128_si256(a, b, 0x20));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(wt + D + d),
                          _mm256_permute2x128_si256(a, b, 0x31));
    }
    return;
  }
  if (wpg == 4 && D % 8 == 0) {  // kivi4 at G=32: a 4 x 8 transpose per 8 channels
    const __m256i idx = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    auto pairs = [&](int64_t d) {  // channels d, d+1: [w(d,0) w(d+1,0) w(d,1) w(d+1,1) ...]
      return _mm256_permutevar8x32_epi32(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(words + 4 * d)), idx);
    };
    for (int64_t d = 0; d < D; d += 8) {
      const __m256i v0 = pairs(d), v1 = pairs(d + 2), v2 = pairs(d + 4), v3 = pairs(d + 6);
      const __m256i t0 = _mm256_unpacklo_epi64(v0, v1), t1 = _mm256_unpackhi_epi64(v0, v1);
      const __m256i t2 = _mm256_unpacklo_epi64(v2, v3), t3 = _mm256_unpackhi_epi64(v2, v3);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(wt + d),
                          _mm256_permute2x128_si256(t0, t2, 0x20));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(wt + D + d),
                          _mm256_permute2x128_si256(t1, t3, 0x20));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(wt + 2 * D + d),
                          _mm256_permute2x128_si256(t0, t2, 0x31));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(wt + 3 * D + d),
                          _mm256_permute2x128_si256(t1, t3, 0x31));
    }
    return;
  }
  for (int64_t d = 0; d < D; ++d)
    for (int64_t x = 0; x < wpg; ++x) wt[x * D + d] = words[d * wpg + x];
}

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

#if KVQ_CPU_AMX
// ---- AMX tiles (fp8 sides in the int8 mode, where amx()) ---------------------------------------
// The same bf16 operands as fp8_dot_bf16 / fp8_acc_bf16 (the codes' bits under a bf16's, q *
// scale and the weights rounded to bf16, subnormal inputs and results flushed as vdpbf16ps does),
// multiplied by tdpbf16ps: one instruction takes 16 x 32 x 16 bf16 products (each output a float
// chain over 16 pairs), where vdpbf16ps takes 32. Keys put 16 tokens in the rows and the NQ
// queries in the columns; values put the NQ queries in the rows and 16 channels in the columns.
// On the session-21 Xeon a tdpbf16ps took ~17 ns whatever its shape (a zmm vdpbf16ps ~1 ns).

/// Loads cfg into this thread's tiles unless they hold it already (id names the configuration;
/// nothing in the process releases the tiles).
inline void use_tiles(const TileConfig& cfg, int id) {
  thread_local int held = -1;
  if (held != id) {
    _tile_loadconfig(&cfg);
    held = id;
  }
}

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
bool fp8_amx_exact(IntMode mode, const StoredSide& s, int64_t nq, int64_t D) {
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

#endif

/// Whether per-channel int keys take the int8 mode's byte dot products (dot_int8_group).
bool int8_keys(IntMode mode, const StoredSide& k) {
  return mode == IntMode::Int8 && (k.bits == 2 || k.bits == 4) && k.group % 32 == 0 &&
         k.dim % 32 == 0;
}

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

/// Whether per-token int values take the int8 mode's byte dot products (acc_int8_rows with VBMI,
/// else acc_int8_group).
bool int8_values(IntMode mode, const StoredSide& v) {
  return mode == IntMode::Int8 && (v.bits == 2 || v.bits == 4) && v.group % 32 == 0 &&
         v.dim % v.group == 0;
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

/// Sizes one thread's scratch for a call (grows only; contents need no initial values).
void prepare(Scratch& w, const Call& c) {
  const int64_t D = c.D;
  auto grow = [](auto& v, int64_t n) {
    if (v.size() < static_cast<size_t>(n)) v.resize(static_cast<size_t>(n));
  };
  grow(w.qs, c.q_heads * D);
  if (c.k.kind == SchemeKind::Int) {
    grow(w.wt, D * kivi::words_for(c.k.group, c.k.bits));
    grow(w.q8, c.nq * D);
  }
  if (fp8_bf16(c.mode, c.k)) {
    grow(w.qb, c.q_heads * D);
    grow(w.rowf, (kSubRows + 16) * c.H);
    if (amx()) {
      grow(w.qt, c.q_heads * D / 2);
      grow(w.ka, kSubRows * D);
    }
  }
  if (fp8_bf16(c.mode, c.v)) {
    grow(w.wp, c.q_heads * kSubRows / 2);
    grow(w.rowf, kSubRows * c.H + 16);
    if (amx()) grow(w.vb, 4 * 16 * 16);
  }
#if KVQ_CPU_AMX
  if (fp8_amx_exact(c.mode, c.k, c.nq, D)) {
    grow(w.qt, 3 * c.q_heads * D / 2);
    grow(w.ka, kSubRows * D);
    grow(w.rowf, (kSubRows + 16) * c.H);
  }
  if (fp8_amx_exact(c.mode, c.v, c.nq, D)) {
    grow(w.wp, 3 * c.q_heads * kSubRows / 2);
    grow(w.rowf, kSubRows * c.H + 16);
    grow(w.vb, 4 * 16 * 16);
  }
#endif
  if (c.v.kind == SchemeKind::Int) {
    const int64_t groups = D / c.v.group + 1;
    grow(w.pw, c.nq * kSubRows * groups);
    grow(w.msum, c.nq * groups);
    grow(w.sct, kSubRows * groups);
    grow(w.mnt, kSubRows * groups);
    grow(w.wb, c.nq * kSubRows * groups);
    grow(w.fac, c.nq * groups);
    grow(w.mv, 16 * c.nq * groups);
  }
}

bool row_kind(SchemeKind k) { return is_dense(k) || k == SchemeKind::Fp8; }

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

/// One block of every kv head for several positions at once (one for a decode step), each with
/// exactly the arithmetic it has alone (scores, each head's softmax step, values): scores and
/// values go sub-block by sub-block, every position of the tile through the same sub-block while
/// it is in L1. Dense and fp8 sides stream every head of a sub-block in address order (a token's
/// heads are contiguous); int sides go head by head. None of this changes a bit: a score is one
/// token's own dot product, a value row is one more fma on o (kept in memory between sub-blocks,
/// exactly), and each head's softmax step still comes between its scores and its values.
/// Per-token int values fold their minima once per call, so they take their block whole.
template <int NQ>
void simd_tile_block(std::span<const TileSlot> slots, Scratch& w) {
  const Call& c0 = *slots[0].c;
  const int64_t D = c0.D, H = c0.H, lds = c0.block + 8, hs = NQ * lds;
  const int64_t sub =
      c0.k.kind == SchemeKind::Int ? std::max<int64_t>(kSubRows, c0.k.group) : kSubRows;
  // One position streams its rows from memory once where they do not stay in the L3 (fp8 rows
  // always); several reuse them from cache.
  auto streams = [&](const StoredSide& x) {
    return slots.size() == 1 && (c0.ahead || x.kind == SchemeKind::Fp8);
  };
  const bool stream_k = streams(c0.k), stream_v = streams(c0.v);
  int64_t longest = 0;
  for (const TileSlot& x : slots) {
    prepare(w, *x.c);
    longest = std::max(longest, x.t1 - x.t0);
  }
  for (int64_t u = 0; u < longest; u += sub)
    for (const TileSlot& x : slots) {
      const int64_t a = x.t0 + u, b = std::min(x.t1, a + sub);
      if (a >= b) continue;
      if (row_kind(x.c->k.kind)) {
        if (stream_k)
          scores_rows<NQ, true>(*x.c, a, b, x.s + u, hs, lds, w);
        else
          scores_rows<NQ, false>(*x.c, a, b, x.s + u, hs, lds, w);
      } else {
        for (int64_t h = 0; h < H; ++h) scores<NQ>(*x.c, h, a, b, x.s + h * hs + u, lds, w);
      }
    }
  for (const TileSlot& x : slots)
    for (int64_t h = 0; h < H; ++h)
      softmax_rows<NQ>(x.s + h * hs, lds, x.t1 - x.t0, x.c->scale, x.P->m.data() + h * NQ,
                       x.P->l.data() + h * NQ, x.P->o.data() + h * NQ * D, D);
  const bool whole = c0.v.kind == SchemeKind::Int;
  for (int64_t u = 0; u < longest; u += whole ? longest : kSubRows)
    for (const TileSlot& x : slots) {
      const int64_t a = x.t0 + u, b = whole ? x.t1 : std::min(x.t1, a + kSubRows);
      if (a >= b) continue;
      if (row_kind(x.c->v.kind)) {
        if (stream_v)
          values_rows<NQ, true>(*x.c, a, b, x.s + u, hs, lds, x.P->o.data(), w);
        else
          values_rows<NQ, false>(*x.c, a, b, x.s + u, hs, lds, x.P->o.data(), w);
      } else {
        for (int64_t h = 0; h < H; ++h)
          values<NQ>(*x.c, h, a, b, x.s + h * hs + u, lds, x.P->o.data() + h * NQ * D, w);
      }
    }
}

/// Calls f.template operator()<NQ>() for the call's GQA group.
template <class F>
void dispatch_nq(int nq, F&& f) {
  switch (nq) {
    case 1:
      return f.template operator()<1>();
    case 2:
      return f.template operator()<2>();
    case 3:
      return f.template operator()<3>();
    case 4:
      return f.template operator()<4>();
    case 5:
      return f.template operator()<5>();
    case 6:
      return f.template operator()<6>();
    case 7:
      return f.template operator()<7>();
    case 8:
      return f.template operator()<8>();
  }
  fail("cpu attention: GQA group {} outside 1..8", nq);
}

#endif

}  // namespace

// kernels/cpu/segment.h states the contract.
void run_segment(std::span<const Member> ms, int64_t a, int64_t seg, Scratch& w) {
  const int64_t block = ms[0].c->block;
  // A new segment: a member's q may hold another query at the same address (kvq model reuses
  // it); within the segment it does not change, so its converted forms serve every block.
  w.qb_of = w.qs_of = nullptr;
  for (int64_t t0 = a; t0 < a + seg; t0 += block) {
    w.slots.clear();
    for (const Member& x : ms) {
      const int64_t b = std::min(x.end, a + seg), t1 = std::min(b, t0 + block);
      if (t0 >= b) continue;
      if (!x.fast) {
        if (std::max(t0, x.begin) < t1) portable_range(*x.c, std::max(t0, x.begin), t1, *x.part, w);
        continue;
      }
      w.slots.push_back({x.c, x.part, x.s, t0, t1});
    }
#if KVQ_CPU_AVX2
    if (!w.slots.empty())
      dispatch_nq(ms[0].c->nq, [&]<int NQ>() { simd_tile_block<NQ>(w.slots, w); });
#endif
  }
}

}  // namespace kvq::cpu::KVQ_CPU_PATH_NS
