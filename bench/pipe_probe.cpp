// pipe_probe: which vector instructions take issue slots from the fma and from vpdpbusd on this
// core. A loop of 8 independent 512-bit chains of one "main" instruction (vfmadd231ps, or
// vpdpbusd) runs at that instruction's throughput; adding 4 independent instructions of one other
// kind per iteration slows it only if they compete for the same pipes. Printed per kind: the
// loop's time over the main-only loop's, and the main instruction's slots each added instruction
// costs, (t / t0 - 1) * 8 / 4 (0: free beside it, 1: takes a whole slot). Best of 7 rounds of
// 2 * 10^7 iterations each, CPU-bound, no memory traffic. Used to explain what binds the attention
// kernels' inner loops (docs/benchmarks.md, session 17); it measures the core, not kvq.
//
//   build/<preset>/bench/pipe_probe
#include <chrono>
#include <cstdio>
#include <utility>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__) && \
    defined(__AVX512VBMI__) && defined(__AVX512VL__)
#include <immintrin.h>

namespace {

enum Main { kFma, kDot };
// The added instruction kinds.
enum Kind {
  kNone,
  kFmaOp,
  kMul,
  kSub,
  kCvtDq2Ps,
  kCvtPh2Ps,
  kTernlog,
  kAnd,
  kShiftImm,
  kShiftVar,
  kPermB,
  kPermT2B,
  kPermT2Ps,
  kShufB,
  kMultishift,
  kCmpMask,
  kMovzxWd,
  kKinds
};
const char* const kNames[kKinds] = {
    "(none)",       "vfmadd231ps",      "vmulps",      "vsubps",
    "vcvtdq2ps",    "vcvtph2ps",        "vpternlogd",  "vpandd",
    "vpslld imm",   "vpsrlvd",          "vpermb",      "vpermt2b",
    "vpermt2ps",    "vpshufb",          "vpmultishiftqb", "vpcmpeqb -> k",
    "vpmovzxwd"};

// Every lane (the zero-masking forms: GCC 12 builds the plain ones on _mm512_undefined_*, which
// trips -Wmaybe-uninitialized; the same instructions).
constexpr __mmask16 kAll = 0xffff;
inline __m256i low(__m512i x) { return _mm512_maskz_extracti64x4_epi64(0xff, x, 0); }

// Keeps a value live and opaque to the optimizer.
template <class T>
inline void keep(T& v) {
  asm volatile("" : "+v"(v));
}

template <Main M, Kind K>
__attribute__((noinline)) double run(long iters) {
  // distinct starting values: equal chains would be merged into one by the compiler
  __m512 f0 = _mm512_set1_ps(1.000f), f1 = _mm512_set1_ps(1.001f), f2 = _mm512_set1_ps(1.002f),
         f3 = _mm512_set1_ps(1.003f), f4 = _mm512_set1_ps(1.004f), f5 = _mm512_set1_ps(1.005f),
         f6 = _mm512_set1_ps(1.006f), f7 = _mm512_set1_ps(1.007f);
  __m512i d0 = _mm512_set1_epi32(1), d1 = _mm512_set1_epi32(2), d2 = _mm512_set1_epi32(3),
          d3 = _mm512_set1_epi32(4), d4 = _mm512_set1_epi32(5), d5 = _mm512_set1_epi32(6),
          d6 = _mm512_set1_epi32(7), d7 = _mm512_set1_epi32(8);
  const __m512 fb = _mm512_set1_ps(0.999f), fc = _mm512_set1_ps(1e-7f);
  const __m512i ib = _mm512_set1_epi8(3), ic = _mm512_set1_epi8(5), sh = _mm512_set1_epi32(1);
  __m512i x[4];
  __m512 y[4];
  for (int i = 0; i < 4; ++i) x[i] = _mm512_set1_epi32(i + 1), y[i] = _mm512_set1_ps(i + 1.0f);
  const auto t0 = std::chrono::steady_clock::now();
  for (long it = 0; it < iters; ++it) {
    if constexpr (M == kFma) {
      f0 = _mm512_fmadd_ps(f0, fb, fc), f1 = _mm512_fmadd_ps(f1, fb, fc);
      f2 = _mm512_fmadd_ps(f2, fb, fc), f3 = _mm512_fmadd_ps(f3, fb, fc);
      f4 = _mm512_fmadd_ps(f4, fb, fc), f5 = _mm512_fmadd_ps(f5, fb, fc);
      f6 = _mm512_fmadd_ps(f6, fb, fc), f7 = _mm512_fmadd_ps(f7, fb, fc);
    } else {
      d0 = _mm512_dpbusd_epi32(d0, ib, ic), d1 = _mm512_dpbusd_epi32(d1, ib, ic);
      d2 = _mm512_dpbusd_epi32(d2, ib, ic), d3 = _mm512_dpbusd_epi32(d3, ib, ic);
      d4 = _mm512_dpbusd_epi32(d4, ib, ic), d5 = _mm512_dpbusd_epi32(d5, ib, ic);
      d6 = _mm512_dpbusd_epi32(d6, ib, ic), d7 = _mm512_dpbusd_epi32(d7, ib, ic);
    }
    for (int i = 0; i < 4; ++i) {
      if constexpr (K == kFmaOp) y[i] = _mm512_fmadd_ps(y[i], fb, fc);
      if constexpr (K == kMul) y[i] = _mm512_mul_ps(y[i], fb);
      if constexpr (K == kSub) y[i] = _mm512_sub_ps(y[i], fc);
      if constexpr (K == kCvtDq2Ps) y[i] = _mm512_maskz_cvtepi32_ps(kAll, x[i]), x[i] = _mm512_castps_si512(y[i]);
      if constexpr (K == kCvtPh2Ps)
        y[i] = _mm512_maskz_cvtph_ps(kAll, low(x[i])), x[i] = _mm512_castps_si512(y[i]);
      if constexpr (K == kTernlog) x[i] = _mm512_maskz_ternarylogic_epi32(kAll, x[i], sh, ib, 0xEA);
      if constexpr (K == kAnd) x[i] = _mm512_and_si512(x[i], sh);
      if constexpr (K == kShiftImm) x[i] = _mm512_maskz_slli_epi32(kAll, x[i], 1);
      if constexpr (K == kShiftVar) x[i] = _mm512_maskz_srlv_epi32(kAll, x[i], sh);
      if constexpr (K == kPermB) x[i] = _mm512_maskz_permutexvar_epi8(~__mmask64{0}, sh, x[i]);
      if constexpr (K == kPermT2B) x[i] = _mm512_maskz_permutex2var_epi8(~__mmask64{0}, x[i], sh, ib);
      if constexpr (K == kPermT2Ps)
        y[i] = _mm512_maskz_permutex2var_ps(kAll, y[i], sh, fb);
      if constexpr (K == kShufB) x[i] = _mm512_maskz_shuffle_epi8(~__mmask64{0}, x[i], sh);
      if constexpr (K == kMultishift) x[i] = _mm512_maskz_multishift_epi64_epi8(~__mmask64{0}, sh, x[i]);
      if constexpr (K == kCmpMask)
        x[i] = _mm512_maskz_mov_epi8(_mm512_cmpeq_epi8_mask(x[i], ib), ic);
      if constexpr (K == kMovzxWd) x[i] = _mm512_maskz_cvtepu16_epi32(kAll, low(x[i]));
      keep(x[i]);
      keep(y[i]);
    }
  }
  const auto t1 = std::chrono::steady_clock::now();
  keep(f0), keep(f1), keep(f2), keep(f3), keep(f4), keep(f5), keep(f6), keep(f7);
  keep(d0), keep(d1), keep(d2), keep(d3), keep(d4), keep(d5), keep(d6), keep(d7);
  return std::chrono::duration<double, std::nano>(t1 - t0).count() / static_cast<double>(iters);
}

template <Main M, int... Ks>
void table(const char* main_name, std::integer_sequence<int, Ks...>) {
  constexpr long kIters = 20'000'000;
  double best[kKinds];
  for (double& b : best) b = 1e30;
  for (int round = 0; round < 7; ++round) {
    const double t[kKinds] = {run<M, static_cast<Kind>(Ks)>(kIters)...};
    for (int k = 0; k < kKinds; ++k) best[k] = t[k] < best[k] ? t[k] : best[k];
  }
  std::printf("\n8 chains of %s: %.3f ns per 8 (%.2f G per second)\n", main_name, best[0],
              8.0 / best[0]);
  std::printf("%-16s %10s %8s %14s\n", "+4 of", "ns/iter", "t/t0", "slots per op");
  for (int k = 1; k < kKinds; ++k)
    std::printf("%-16s %10.3f %8.2f %14.2f\n", kNames[k], best[k], best[k] / best[0],
                (best[k] / best[0] - 1.0) * 2.0);
}

}  // namespace

int main() {
  std::printf("pipe_probe: the main instruction's issue slots each added instruction costs\n");
  table<kFma>("vfmadd231ps (zmm)", std::make_integer_sequence<int, kKinds>{});
  table<kDot>("vpdpbusd (zmm)", std::make_integer_sequence<int, kKinds>{});
  return 0;
}
#else
int main() {
  std::printf("pipe_probe: needs AVX-512 F, BW, VL, VNNI and VBMI; this build has not\n");
  return 0;
}
#endif
