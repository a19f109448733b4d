// Backend `cpu`: which instruction set a kernel translation unit is compiled for, and which CPU
// path this process runs. Each kernel source (attention/, kivi.cpp, fp8.cpp) is compiled once
// per path with that path's flags (kernels/cpu/paths.def: portable = baseline x86-64, avx2 =
// AVX2+FMA+F16C, avx512 = x86-64-v4 + VNNI, avx512bf16 = that + VBMI, BF16 and AMX-TILE/BF16), and
// the macros below say what the compiler targets in that build: without AVX2+FMA+F16C every
// kernel takes its portable scalar path (the same results: the quantizers are bit-identical
// either way, attention stays within the tolerances stated in kernels/cpu/attention.h). Where the
// compiler also targets AVX-512 F/BW/VL/DQ (and VNNI), the hot loops have 512-bit forms beside the
// AVX2 ones (KVQ_CPU_AVX512). kernels/cpu/dispatch.cpp chooses the path at run time (path()); a
// path's capabilities (PathInfo, below) are these macros in its build, so they follow its flags.
#pragma once

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define KVQ_CPU_AVX2 1
#include <immintrin.h>
#else
#define KVQ_CPU_AVX2 0
#endif

// Byte dot products (int8 mode, kernels/cpu/attention.h): VNNI's vpdpbusd where the compiler
// targets it (AVX-512 VNNI with VL, or AVX-VNNI), else vpmaddubsw + vpmaddwd. Both give the same
// integers whenever no pair of products reaches the int16 limit, which the callers guarantee.
#if KVQ_CPU_AVX2 && ((defined(__AVX512VNNI__) && defined(__AVX512VL__)) || defined(__AVXVNNI__))
#define KVQ_CPU_VNNI 1
#else
#define KVQ_CPU_VNNI 0
#endif

// 512-bit float rows (kernels/cpu/attention/x86/loaders.h): the dense and fp8 loaders also give 16
// floats at a time where the compiler targets AVX-512 F/BW/VL/DQ (and head_dim is a multiple of
// 16); the KIVI quantizers (kernels/cpu/kivi.cpp) run 16 columns or groups at a time.
#if KVQ_CPU_AVX2 && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && \
    defined(__AVX512DQ__)
#define KVQ_CPU_AVX512 1
#else
#define KVQ_CPU_AVX512 0
#endif

// bf16 dot products (vdpbf16ps; fp8 sides in the int8 mode, kernels/cpu/attention.h): AVX-512
// BF16, and VBMI for the values' byte permute.
#if KVQ_CPU_AVX512 && defined(__AVX512BF16__) && defined(__AVX512VBMI__)
#define KVQ_CPU_BF16DOT 1
#else
#define KVQ_CPU_BF16DOT 0
#endif

// AMX tiles (tdpbf16ps; fp8 sides, kernels/cpu/attention/x86/amx.h): where the
// compiler targets AMX-TILE and AMX-BF16 beside the bf16 dot products. Linux lends the tiles to a
// process that asks (arch_prctl ARCH_REQ_XCOMP_PERM); amx() says whether this one got them (and
// the CPU has them), and the kernels fall back to vdpbf16ps where it did not.
#if KVQ_CPU_BF16DOT && defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__linux__)
#define KVQ_CPU_AMX 1
#else
#define KVQ_CPU_AMX 0
#endif

#include <cstdint>
#include <string>

// The namespace a translation unit's SIMD helpers (below, kernels/cpu/simd_decode.h) and kernels
// live in: each CPU path's build names its own (cmake/cpu_paths.cmake), so the same helper
// compiled for two paths is two functions, never one the linker picks.
#ifndef KVQ_CPU_PATH_NS
#define KVQ_CPU_PATH_NS native
#endif

namespace kvq::cpu {

/// \brief One CPU path of backend cpu: its name and the instruction sets its kernels use (what
/// the macros above say in its build; amx: the AMX kernels are compiled in, whether they run is
/// amx()).
struct PathInfo {
  const char* name;
  bool avx2, vnni, avx512, bf16dot, amx;
};

/// \brief The path this process runs: the one KVQ_CPU_PATH names (a kvq::Error naming the
/// supported ones where this CPU lacks it or no path has that name), else the widest this CPU
/// runs. Chosen once, at first use, from cpuid / xgetbv (kernels/cpu/dispatch.cpp).
const PathInfo& path();

/// \brief The paths compiled in, widest last ("portable, avx2, avx512, avx512bf16"), and those of
/// them this CPU runs.
std::string compiled_paths();
std::string supported_paths();

/// \brief Whether this process may use the AMX tiles: the path runs AMX kernels, the CPU has
/// AMX-TILE and AMX-BF16, and Linux granted the tiles (arch_prctl ARCH_REQ_XCOMP_PERM, asked
/// once).
bool amx_granted();
/// \brief True when fp8 sides in the int8 mode take the AMX kernels: granted, and neither
/// KVQ_AMX=0 in the environment nor set_amx(false).
bool amx();
/// \brief Turns the AMX kernels on (where granted) or off, for tests and A/B runs; not while
/// an attention call runs.
void set_amx(bool on);

/// \brief The instruction set of the path this process runs, for result rows and bench output
/// ("portable", "avx2+fma+f16c", ..., "+amx" where amx() holds).
const char* isa();

inline namespace KVQ_CPU_PATH_NS {

#if KVQ_CPU_AVX512
/// \brief Every lane of a 16-lane mask. The kernels use the zero-masking forms of 512-bit
/// intrinsics with it: the same instructions as the unmasked ones, which GCC 12 builds on
/// _mm512_undefined_* and which trip -Wmaybe-uninitialized.
constexpr __mmask16 kAll16 = 0xffff;
/// \brief Every 16-bit lane of a 32-lane mask (the word forms' zero-masking, as kAll16).
constexpr __mmask32 kAll32 = ~__mmask32{0};
/// \brief Every byte of a 64-byte mask (the byte forms' zero-masking, as kAll16).
constexpr __mmask64 kAll64 = ~__mmask64{0};
#endif

#if KVQ_CPU_AMX
/// \brief A tile configuration (palette 1) as ldtilecfg reads it: rows and bytes per row of
/// tmm0..7. Keep the object one ldtilecfg reads static (or otherwise visibly used): GCC 12 drops
/// stores to a local configuration that only ldtilecfg reads.
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
  /// Gives tile t `r` rows of `bytes` bytes.
  constexpr TileConfig& shape(int t, int r, int bytes) {
    rows[t] = static_cast<uint8_t>(r);
    colsb[t] = static_cast<uint16_t>(bytes);
    return *this;
  }
};
static_assert(sizeof(TileConfig) == 64);
#endif

#if KVQ_CPU_AVX2
/// \brief acc + sum of the four products u8 x s8 in each 32-bit lane, without VNNI: vpmaddubsw
/// (pairs into int16, saturating) then vpmaddwd (pairs of those into int32). Exact when every
/// pair |u0 * s0 + u1 * s1| <= 32767.
inline __m256i dpbusd_avx2(__m256i acc, __m256i u8, __m256i s8) {
  return _mm256_add_epi32(acc,
                          _mm256_madd_epi16(_mm256_maddubs_epi16(u8, s8), _mm256_set1_epi16(1)));
}
/// \brief Min / max of the 8 lanes, in every lane (the compare-selects of vminps / vmaxps, so
/// the result for lanes holding NaN or signed zeros depends on the order: callers reduce finite
/// values of one sign of zero or treat NaN apart).
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

/// \brief The same sums with vpdpbusd where compiled in (one instruction, never saturates).
inline __m256i dpbusd(__m256i acc, __m256i u8, __m256i s8) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpbusd_epi32(acc, u8, s8);
#elif defined(__AVXVNNI__)
  return _mm256_dpbusd_avx_epi32(acc, u8, s8);
#else
  return dpbusd_avx2(acc, u8, s8);
#endif
}

#if KVQ_CPU_AVX512 && defined(__AVX512VNNI__)
/// \brief _mm512_dpbusd_epi32 (acc + the sums of four products u8 x s8 in each 32-bit lane) with
/// the accumulator tied to the instruction's destination. GCC 12 builds the intrinsic in the int8
/// kernels' loops with a register copy before and after each vpdpbusd (16 copies beside 8 dot
/// products a step, session 26); the asm keeps each accumulator in one register.
inline __m512i dpbusd512(__m512i acc, __m512i u8, __m512i s8) {
  asm("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(u8), "v"(s8));
  return acc;
}
#endif
#endif

}  // namespace KVQ_CPU_PATH_NS
}  // namespace kvq::cpu
