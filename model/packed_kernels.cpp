// The model's packed products' kernels (model/packed_kernels.h), compiled once per CPU path with
// that path's flags (cmake/cpu_paths.cmake defines KVQ_CPU_PATH_NS, the path's name, and makes the
// table's getter kvq_packed_path_<name> the one global symbol of the path's object). What the
// path's compiler targets (kernels/cpu/isa.h: KVQ_CPU_AVX2, KVQ_CPU_AVX512) picks each kernel's
// form: AVX2 + FMA + F16C decodes the quantized panels in registers, AVX-512 also transposes
// mapped rows in registers, the portable form goes through the scalar tile. Every form computes
// the chain of model/packed_matrix.h, so all give the same floats.
#include "model/packed_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/gguf.h"
#include "core/half.h"
#include "kernels/cpu/isa.h"

#define KVQ_PACKED_STR2(x) #x
#define KVQ_PACKED_STR(x) KVQ_PACKED_STR2(x)
#define KVQ_PACKED_CAT2(a, b) a##b
#define KVQ_PACKED_CAT(a, b) KVQ_PACKED_CAT2(a, b)

namespace kvq::packed::KVQ_CPU_PATH_NS {
namespace {

using gguf::GgmlType;
constexpr int64_t P = kPanel;
constexpr int64_t QK = kQK;

std::vector<float>& scratch(size_t n) {
  thread_local std::vector<float> buf;
  if (buf.size() < n) buf.resize(n);
  return buf;
}

// ---- fp32 tiles: tile[kk][64] -----------------------------------------------------------------

// acc[c] = fma(x[kk], tile[kk][c], acc[c]) for kk in [0, kc), in order.
void gemv_tile(const float* tile, int64_t kc, const float* x, float* acc) {
#if KVQ_CPU_AVX2
  __m256 a[8];
  for (int g = 0; g < 8; ++g) a[g] = _mm256_loadu_ps(acc + 8 * g);
  for (int64_t kk = 0; kk < kc; ++kk) {
    const __m256 xv = _mm256_broadcast_ss(x + kk);
    const float* w = tile + kk * P;
    for (int g = 0; g < 8; ++g) a[g] = _mm256_fmadd_ps(xv, _mm256_loadu_ps(w + 8 * g), a[g]);
  }
  for (int g = 0; g < 8; ++g) _mm256_storeu_ps(acc + 8 * g, a[g]);
#else
  for (int64_t kk = 0; kk < kc; ++kk)
    for (int64_t c = 0; c < P; ++c) acc[c] = std::fma(x[kk], tile[kk * P + c], acc[c]);
#endif
}

// Rows [0, R) of y [.., ldy] (64 columns) += the tile's chain over x [.., ldx] (k offset applied).
template <int R>
void gemm_tile(const float* tile, int64_t kc, const float* x, int64_t ldx, float* y, int64_t ldy) {
#if KVQ_CPU_AVX2
  for (int64_t s = 0; s < P; s += 16) {
    __m256 a[R][2];
    for (int r = 0; r < R; ++r) {
      a[r][0] = _mm256_loadu_ps(y + r * ldy + s);
      a[r][1] = _mm256_loadu_ps(y + r * ldy + s + 8);
    }
    for (int64_t kk = 0; kk < kc; ++kk) {
      const __m256 w0 = _mm256_loadu_ps(tile + kk * P + s),
                   w1 = _mm256_loadu_ps(tile + kk * P + s + 8);
      for (int r = 0; r < R; ++r) {
        const __m256 xv = _mm256_broadcast_ss(x + r * ldx + kk);
        a[r][0] = _mm256_fmadd_ps(xv, w0, a[r][0]);
        a[r][1] = _mm256_fmadd_ps(xv, w1, a[r][1]);
      }
    }
    for (int r = 0; r < R; ++r) {
      _mm256_storeu_ps(y + r * ldy + s, a[r][0]);
      _mm256_storeu_ps(y + r * ldy + s + 8, a[r][1]);
    }
  }
#else
  for (int r = 0; r < R; ++r) gemv_tile(tile, kc, x + r * ldx, y + r * ldy);
#endif
}

#if KVQ_CPU_AVX2
// Decode (one row): the quantized panels decoded in registers, 64 accumulators in 8 vectors.
// Each weight is formed exactly as decode_tile forms it, then enters the same fma chain.
template <bool kMin>
void gemv_q4(const uint8_t* blocks, int64_t block_bytes, int64_t nblocks, const float* x,
             float* acc) {
  __m256 a[8];
  for (int g = 0; g < 8; ++g) a[g] = _mm256_loadu_ps(acc + 8 * g);
  const __m256i lo4 = _mm256_set1_epi32(0x0f), eight = _mm256_set1_epi32(8);
  alignas(32) float dm[2][P] = {};
  for (int64_t b = 0; b < nblocks; ++b) {
    const uint8_t* blk = blocks + b * block_bytes;
    const uint16_t* d16 = reinterpret_cast<const uint16_t*>(blk);
    const uint8_t* qs = blk + (kMin ? 4 : 2) * P;
    for (int g = 0; g < 8; ++g) {
      _mm256_store_ps(
          dm[0] + 8 * g,
          _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(d16 + 8 * g))));
      if (kMin)
        _mm256_store_ps(
            dm[1] + 8 * g,
            _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(d16 + P + 8 * g))));
    }
    const float* xb = x + b * QK;
    for (int64_t j = 0; j < QK / 2; ++j) {
      const __m256 x0 = _mm256_broadcast_ss(xb + 2 * j), x1 = _mm256_broadcast_ss(xb + 2 * j + 1);
      const uint8_t* row = qs + j * P;
      for (int g = 0; g < 8; ++g) {
        const __m256i q =
            _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + 8 * g)));
        __m256i qlo = _mm256_and_si256(q, lo4), qhi = _mm256_srli_epi32(q, 4);
        const __m256 d = _mm256_load_ps(dm[0] + 8 * g);
        __m256 wlo, whi;
        if constexpr (kMin) {  // d * q + m; d * q is exact, so the fused add equals the separate
                               // one
          const __m256 m = _mm256_load_ps(dm[1] + 8 * g);
          wlo = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(qlo), m);
          whi = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(qhi), m);
        } else {  // d * (q - 8)
          qlo = _mm256_sub_epi32(qlo, eight);
          qhi = _mm256_sub_epi32(qhi, eight);
          wlo = _mm256_mul_ps(d, _mm256_cvtepi32_ps(qlo));
          whi = _mm256_mul_ps(d, _mm256_cvtepi32_ps(qhi));
        }
        a[g] = _mm256_fmadd_ps(x0, wlo, a[g]);
        a[g] = _mm256_fmadd_ps(x1, whi, a[g]);
      }
    }
  }
  for (int g = 0; g < 8; ++g) _mm256_storeu_ps(acc + 8 * g, a[g]);
}

void gemv_q8(const uint8_t* blocks, int64_t block_bytes, int64_t nblocks, const float* x,
             float* acc) {
  __m256 a[8];
  for (int g = 0; g < 8; ++g) a[g] = _mm256_loadu_ps(acc + 8 * g);
  alignas(32) float dv[P];
  for (int64_t b = 0; b < nblocks; ++b) {
    const auto* blk = reinterpret_cast<const PanelQ8_0*>(blocks + b * block_bytes);
    for (int g = 0; g < 8; ++g)
      _mm256_store_ps(
          dv + 8 * g,
          _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk->d + 8 * g))));
    const float* xb = x + b * QK;
    for (int64_t kk = 0; kk < QK; ++kk) {
      const __m256 xv = _mm256_broadcast_ss(xb + kk);
      for (int g = 0; g < 8; ++g) {
        const __m256i q = _mm256_cvtepi8_epi32(
            _mm_loadl_epi64(reinterpret_cast<const __m128i*>(blk->qs[kk] + 8 * g)));
        const __m256 w = _mm256_mul_ps(_mm256_load_ps(dv + 8 * g), _mm256_cvtepi32_ps(q));
        a[g] = _mm256_fmadd_ps(xv, w, a[g]);
      }
    }
  }
  for (int g = 0; g < 8; ++g) _mm256_storeu_ps(acc + 8 * g, a[g]);
}

// One Q4 panel block -> tile rows [32][64], the same values decode_tile's scalar loop forms.
template <bool kMin>
void decode_q4_block(const uint8_t* blk, float* t) {
  const uint16_t* d16 = reinterpret_cast<const uint16_t*>(blk);
  const uint8_t* qs = blk + (kMin ? 4 : 2) * P;
  const __m256i lo4 = _mm256_set1_epi32(0x0f), eight = _mm256_set1_epi32(8);
  for (int g = 0; g < 8; ++g) {
    const __m256 d =
        _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(d16 + 8 * g)));
    const __m256 m =
        kMin ? _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(d16 + P + 8 * g)))
             : _mm256_setzero_ps();
    for (int64_t j = 0; j < QK / 2; ++j) {
      const __m256i q = _mm256_cvtepu8_epi32(
          _mm_loadl_epi64(reinterpret_cast<const __m128i*>(qs + j * P + 8 * g)));
      __m256i qlo = _mm256_and_si256(q, lo4), qhi = _mm256_srli_epi32(q, 4);
      if constexpr (kMin) {
        _mm256_storeu_ps(t + (2 * j) * P + 8 * g, _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(qlo), m));
        _mm256_storeu_ps(t + (2 * j + 1) * P + 8 * g,
                         _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(qhi), m));
      } else {
        qlo = _mm256_sub_epi32(qlo, eight);
        qhi = _mm256_sub_epi32(qhi, eight);
        _mm256_storeu_ps(t + (2 * j) * P + 8 * g, _mm256_mul_ps(d, _mm256_cvtepi32_ps(qlo)));
        _mm256_storeu_ps(t + (2 * j + 1) * P + 8 * g, _mm256_mul_ps(d, _mm256_cvtepi32_ps(qhi)));
      }
    }
  }
}

void decode_q8_block(const uint8_t* blk, float* t) {
  const auto* b = reinterpret_cast<const PanelQ8_0*>(blk);
  for (int g = 0; g < 8; ++g) {
    const __m256 d =
        _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b->d + 8 * g)));
    for (int64_t j = 0; j < QK; ++j) {
      const __m256i q =
          _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b->qs[j] + 8 * g)));
      _mm256_storeu_ps(t + j * P + 8 * g, _mm256_mul_ps(d, _mm256_cvtepi32_ps(q)));
    }
  }
}
#endif

// ---- mapped rows: W [out][in] row-major, F32 / F16 / BF16 ----------------------------------

#if KVQ_CPU_AVX512
using cpu::kAll16;
constexpr __mmask8 kAll8 = 0xff;

// out[j] = word j of in[0..15] (lane i from in[i]): the 16 x 16 transpose of 32-bit words.
inline void transpose16(const __m512i in[16], __m512i out[16]) {
  __m512i t[16], u[16];
  for (int i = 0; i < 8; ++i) {  // lane L of t[2i]: words 4L, 4L + 1 of in[2i], in[2i + 1]
    t[2 * i] = _mm512_maskz_unpacklo_epi32(kAll16, in[2 * i], in[2 * i + 1]);
    t[2 * i + 1] = _mm512_maskz_unpackhi_epi32(kAll16, in[2 * i], in[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {  // lane L of u[4i + e]: word 4L + e of in[4i .. 4i + 3]
    u[4 * i] = _mm512_maskz_unpacklo_epi64(kAll8, t[4 * i], t[4 * i + 2]);
    u[4 * i + 1] = _mm512_maskz_unpackhi_epi64(kAll8, t[4 * i], t[4 * i + 2]);
    u[4 * i + 2] = _mm512_maskz_unpacklo_epi64(kAll8, t[4 * i + 1], t[4 * i + 3]);
    u[4 * i + 3] = _mm512_maskz_unpackhi_epi64(kAll8, t[4 * i + 1], t[4 * i + 3]);
  }
  for (int e = 0; e < 4; ++e) {  // 128-bit lanes: lane L of out[4L' + e] from u[4i + e]'s lane L'
    const __m512i s0 = _mm512_maskz_shuffle_i32x4(kAll16, u[e], u[4 + e], 0x88),
                  s1 = _mm512_maskz_shuffle_i32x4(kAll16, u[e], u[4 + e], 0xDD),
                  s2 = _mm512_maskz_shuffle_i32x4(kAll16, u[8 + e], u[12 + e], 0x88),
                  s3 = _mm512_maskz_shuffle_i32x4(kAll16, u[8 + e], u[12 + e], 0xDD);
    out[e] = _mm512_maskz_shuffle_i32x4(kAll16, s0, s2, 0x88);
    out[4 + e] = _mm512_maskz_shuffle_i32x4(kAll16, s1, s3, 0x88);
    out[8 + e] = _mm512_maskz_shuffle_i32x4(kAll16, s0, s2, 0xDD);
    out[12 + e] = _mm512_maskz_shuffle_i32x4(kAll16, s1, s3, 0xDD);
  }
}

// A block of `rows` (<= 16) consecutive rows from `w` (row stride `ld` bytes), values k .. k + kn
// - 1 (kn <= the block's 16 F32 or 32 16-bit values), transposed: word j of lane i holds row i's
// j-th 32 bits (values 2j, 2j + 1 of 16-bit types; value j of F32). Rows and values past the ends
// read as zero and are not touched in memory.
template <GgmlType T>
inline void load_block(const uint8_t* w, int64_t ld, int rows, int64_t kn, __m512i out[16]) {
  __m512i r[16];
  constexpr bool k32 = T == GgmlType::kF32;
  const __mmask32 m16 = kn >= 32 ? ~__mmask32{0} : (__mmask32{1} << kn) - 1;
  const __mmask16 m32 = kn >= 16 ? __mmask16{0xffff} : static_cast<__mmask16>((1u << kn) - 1);
  for (int i = 0; i < 16; ++i) {
    const void* at = w + (i < rows ? i : 0) * ld;
    r[i] = k32 ? _mm512_maskz_loadu_epi32(i < rows ? m32 : 0, at)
               : _mm512_maskz_loadu_epi16(i < rows ? m16 : 0, at);
  }
  transpose16(r, out);
}

// Word j of a transposed block as floats: values 2j (lo) and 2j + 1 (hi) of a 16-bit type, the
// exact conversions (BF16: the bits shifted into a float's high half; F16: F16C).
template <GgmlType T>
inline void split_word(__m512i v, __m512& lo, __m512& hi) {
  if constexpr (T == GgmlType::kBF16) {
    lo = _mm512_castsi512_ps(_mm512_maskz_slli_epi32(kAll16, v, 16));
    hi = _mm512_castsi512_ps(
        _mm512_maskz_and_epi32(kAll16, v, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u))));
  } else {
    lo = _mm512_maskz_cvtph_ps(kAll16, _mm512_maskz_cvtepi32_epi16(kAll16, v));
    hi = _mm512_maskz_cvtph_ps(
        kAll16, _mm512_maskz_cvtepi32_epi16(kAll16, _mm512_maskz_srli_epi32(kAll16, v, 16)));
  }
}

// Decode: y [R][16] (stride ldy) += the chain over `in` values of x [R][in] (stride ldx) against
// 16 mapped rows (`rows` real ones), in increasing k, straight from the transposed blocks.
template <GgmlType T, int R>
void gemv_mapped(const uint8_t* w, int64_t ld, int rows, int64_t in, const float* x, int64_t ldx,
                 float* y, int64_t ldy) {
  constexpr int64_t kb = T == GgmlType::kF32 ? 16 : 32;  // values per block
  constexpr int64_t item = T == GgmlType::kF32 ? 4 : 2;
  __m512 a[R];
  for (int r = 0; r < R; ++r) a[r] = _mm512_loadu_ps(y + r * ldy);
  __m512i t[16];
  for (int64_t k0 = 0; k0 < in; k0 += kb) {
    const int64_t kn = std::min(kb, in - k0);
    load_block<T>(w + k0 * item, ld, rows, kn, t);
    const float* xk = x + k0;
    if constexpr (T == GgmlType::kF32) {
      for (int64_t j = 0; j < kn; ++j) {
        const __m512 wv = _mm512_castsi512_ps(t[j]);
        for (int r = 0; r < R; ++r)
          a[r] = _mm512_fmadd_ps(_mm512_set1_ps(xk[r * ldx + j]), wv, a[r]);
      }
    } else {
      for (int64_t j = 0; 2 * j < kn; ++j) {
        __m512 lo, hi;
        split_word<T>(t[j], lo, hi);
        for (int r = 0; r < R; ++r)
          a[r] = _mm512_fmadd_ps(_mm512_set1_ps(xk[r * ldx + 2 * j]), lo, a[r]);
        if (2 * j + 1 < kn)
          for (int r = 0; r < R; ++r)
            a[r] = _mm512_fmadd_ps(_mm512_set1_ps(xk[r * ldx + 2 * j + 1]), hi, a[r]);
      }
    }
  }
  for (int r = 0; r < R; ++r) _mm512_storeu_ps(y + r * ldy, a[r]);
}

// The tile: t[(k - k0) * 64 + c] for 16 mapped rows (columns c .. c + 15 of the tile), k in
// [k0, k1); rows past `rows` give zero columns.
template <GgmlType T>
void tile_mapped(const uint8_t* w, int64_t ld, int rows, int64_t k0, int64_t k1, float* t) {
  constexpr int64_t kb = T == GgmlType::kF32 ? 16 : 32;
  constexpr int64_t item = T == GgmlType::kF32 ? 4 : 2;
  __m512i v[16];
  for (int64_t k = k0; k < k1; k += kb) {
    const int64_t kn = std::min(kb, k1 - k);
    load_block<T>(w + k * item, ld, rows, kn, v);
    float* o = t + (k - k0) * P;
    if constexpr (T == GgmlType::kF32) {
      for (int64_t j = 0; j < kn; ++j) _mm512_storeu_ps(o + j * P, _mm512_castsi512_ps(v[j]));
    } else {
      for (int64_t j = 0; 2 * j < kn; ++j) {
        __m512 lo, hi;
        split_word<T>(v[j], lo, hi);
        _mm512_storeu_ps(o + 2 * j * P, lo);
        if (2 * j + 1 < kn) _mm512_storeu_ps(o + (2 * j + 1) * P, hi);
      }
    }
  }
}
#endif

#if KVQ_CPU_AVX512
// Decode rows x [m < 4][in] against panel p's mapped rows: y [m][64] (stride ldy) += the chain.
void mapped_gemv(const Layout& l, int64_t p, const float* x, int64_t m, float* y, int64_t ldy) {
  const int64_t width = std::min(P, l.out - p * P), item = static_cast<int64_t>(dense_item(l.type));
  const int64_t ld = l.in * item;
  auto run = [&]<GgmlType T>() {
    for (int64_t g = 0; g < width; g += 16) {
      const int rows = static_cast<int>(std::min<int64_t>(width - g, 16));
      const uint8_t* w = l.rows + (p * P + g) * ld;
      if (m == 1)
        gemv_mapped<T, 1>(w, ld, rows, l.in, x, l.in, y + g, ldy);
      else if (m == 2)
        gemv_mapped<T, 2>(w, ld, rows, l.in, x, l.in, y + g, ldy);
      else
        gemv_mapped<T, 3>(w, ld, rows, l.in, x, l.in, y + g, ldy);
    }
  };
  if (l.type == GgmlType::kBF16)
    run.template operator()<GgmlType::kBF16>();
  else if (l.type == GgmlType::kF16)
    run.template operator()<GgmlType::kF16>();
  else
    run.template operator()<GgmlType::kF32>();
}
#endif

// tile[(k - k0) * 64 + c] = W[p * 64 + c][k] for k in [k0, k1) (k0, k1 on block boundaries).
void decode_tile(const Layout& l, int64_t p, int64_t k0, int64_t k1, float* tile) {
  if (l.kind == Kind::kMapped) {  // 64 rows' values k0 .. k1 - 1, transposed
    const int64_t width = std::min(P, l.out - p * P),
                  item = static_cast<int64_t>(dense_item(l.type));
    const uint8_t* w = l.rows + p * P * l.in * item;
#if KVQ_CPU_AVX512
    for (int64_t g = 0; g < P; g += 16) {
      const int rows = static_cast<int>(std::clamp<int64_t>(width - g, 0, 16));
      const uint8_t* wg = w + (rows > 0 ? g : 0) * l.in * item;
      if (l.type == GgmlType::kBF16)
        tile_mapped<GgmlType::kBF16>(wg, l.in * item, rows, k0, k1, tile + g);
      else if (l.type == GgmlType::kF16)
        tile_mapped<GgmlType::kF16>(wg, l.in * item, rows, k0, k1, tile + g);
      else
        tile_mapped<GgmlType::kF32>(wg, l.in * item, rows, k0, k1, tile + g);
    }
#else
    float row[256];
    for (int64_t c = 0; c < P; ++c)
      for (int64_t k = k0; k < k1; k += 256) {
        const int64_t n = std::min<int64_t>(256, k1 - k);
        if (c < width)
          gguf::dequantize_row(l.type, w + (c * l.in + k) * item, n, row);
        else
          std::fill(row, row + n, 0.0f);
        for (int64_t j = 0; j < n; ++j) tile[(k - k0 + j) * P + c] = row[j];
      }
#endif
    return;
  }
  for (int64_t kb = k0 / l.kblock; kb < k1 / l.kblock; ++kb) {
    const uint8_t* blk = l.block_ptr(p, kb);
    float* t = tile + (kb * l.kblock - k0) * P;
    switch (l.kind) {
#if KVQ_CPU_AVX2
      case Kind::kQ4_1:
        decode_q4_block<true>(blk, t);
        break;
      case Kind::kQ4_0:
        decode_q4_block<false>(blk, t);
        break;
      case Kind::kQ8_0:
        decode_q8_block(blk, t);
        break;
#else
      case Kind::kQ4_1: {
        const auto* b = reinterpret_cast<const PanelQ4_1*>(blk);
        for (int64_t j = 0; j < QK / 2; ++j)
          for (int64_t c = 0; c < P; ++c) {
            const float d = half_bits_to_float(b->d[c]), m = half_bits_to_float(b->m[c]);
            t[(2 * j) * P + c] = d * static_cast<float>(b->qs[j][c] & 0x0f) + m;
            t[(2 * j + 1) * P + c] = d * static_cast<float>(b->qs[j][c] >> 4) + m;
          }
        break;
      }
      case Kind::kQ4_0: {
        const auto* b = reinterpret_cast<const PanelQ4_0*>(blk);
        for (int64_t j = 0; j < QK / 2; ++j)
          for (int64_t c = 0; c < P; ++c) {
            const float d = half_bits_to_float(b->d[c]);
            t[(2 * j) * P + c] = d * static_cast<float>((b->qs[j][c] & 0x0f) - 8);
            t[(2 * j + 1) * P + c] = d * static_cast<float>((b->qs[j][c] >> 4) - 8);
          }
        break;
      }
      case Kind::kQ8_0: {
        const auto* b = reinterpret_cast<const PanelQ8_0*>(blk);
        for (int64_t j = 0; j < QK; ++j)
          for (int64_t c = 0; c < P; ++c)
            t[j * P + c] = half_bits_to_float(b->d[c]) * static_cast<float>(b->qs[j][c]);
        break;
      }
#endif
      case Kind::kF32:
        std::memcpy(t, blk, static_cast<size_t>(P) * sizeof(float));
        break;
      case Kind::k16: {  // exact conversions of F16 / BF16
        const auto* u = reinterpret_cast<const uint16_t*>(blk);
#if KVQ_CPU_AVX2
        for (int g = 0; g < 8; ++g) {
          const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(u + 8 * g));
          _mm256_storeu_ps(
              t + 8 * g, l.type == GgmlType::kBF16
                             ? _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))
                             : _mm256_cvtph_ps(h));
        }
#else
        for (int64_t c = 0; c < P; ++c)
          t[c] = l.type == GgmlType::kBF16 ? bf16_bits_to_float(u[c]) : half_bits_to_float(u[c]);
#endif
        break;
      }
      case Kind::kMapped:  // handled above
        break;
      case Kind::kBlocks: {
        float col[256];  // the largest ggml block
        for (int64_t c = 0; c < P; ++c) {
          gguf::dequantize_row(l.type, blk + c * l.file_block_bytes, l.kblock, col);
          for (int64_t j = 0; j < l.kblock; ++j) t[j * P + c] = col[j];
        }
        break;
      }
    }
  }
}

// One panel for all m rows; y points at the panel's first column, row stride l.out.
void panel(const Layout& l, int64_t p, const float* x, int64_t m, float* y, bool accumulate) {
  const int64_t width = std::min(P, l.out - p * P);
  // The last panel may be narrower than 64 columns: compute into a padded copy.
  std::vector<float> pad;
  float* yy = y;
  int64_t ldy = l.out;
  if (width < P) {
    pad.assign(static_cast<size_t>(m * P), 0.0f);
    if (accumulate)
      for (int64_t r = 0; r < m; ++r)
        std::copy(y + r * l.out, y + r * l.out + width, pad.data() + r * P);
    yy = pad.data();
    ldy = P;
  } else if (!accumulate) {
    for (int64_t r = 0; r < m; ++r) std::fill(y + r * l.out, y + r * l.out + P, 0.0f);
  }
  if (m < 4) {  // decode: one row at a time, weights decoded in registers
    for (int64_t r = 0; r < m; ++r) {
      const float* xr = x + r * l.in;
      float* acc = yy + r * ldy;
#if KVQ_CPU_AVX2
      if (l.kind == Kind::kQ4_1 || l.kind == Kind::kQ4_0) {
        if (l.kind == Kind::kQ4_1)
          gemv_q4<true>(l.block_ptr(p, 0), l.block_bytes, l.kblocks, xr, acc);
        else
          gemv_q4<false>(l.block_ptr(p, 0), l.block_bytes, l.kblocks, xr, acc);
        continue;
      }
      if (l.kind == Kind::kQ8_0) {
        gemv_q8(l.block_ptr(p, 0), l.block_bytes, l.kblocks, xr, acc);
        continue;
      }
#endif
      if (l.kind == Kind::kF32) {
        gemv_tile(reinterpret_cast<const float*>(l.block_ptr(p, 0)), l.in, xr, acc);
        continue;
      }
#if KVQ_CPU_AVX512
      if (l.kind == Kind::kMapped) {  // all m rows at once, in registers, 16 columns at a time
        mapped_gemv(l, p, x, m, yy, ldy);
        break;
      }
#endif
      const int64_t chunk = std::max(kChunk / l.kblock, int64_t{1}) * l.kblock;
      float* tile = scratch(static_cast<size_t>(chunk * P)).data();
      for (int64_t k0 = 0; k0 < l.in; k0 += chunk) {
        const int64_t k1 = std::min(l.in, k0 + chunk);
        decode_tile(l, p, k0, k1, tile);
        gemv_tile(tile, k1 - k0, xr + k0, acc);
      }
    }
  } else {  // prefill: decode a k-chunk of the panel once, then register tiles of 6 rows
    const int64_t chunk = std::max(kChunk / l.kblock, int64_t{1}) * l.kblock;
    float* buf = l.kind == Kind::kF32 ? nullptr : scratch(static_cast<size_t>(chunk * P)).data();
    for (int64_t k0 = 0; k0 < l.in; k0 += chunk) {
      const int64_t k1 = std::min(l.in, k0 + chunk), kc = k1 - k0;
      const float* tile = buf;
      if (l.kind == Kind::kF32)
        tile = reinterpret_cast<const float*>(l.block_ptr(p, 0)) + k0 * P;
      else
        decode_tile(l, p, k0, k1, buf);
      int64_t r = 0;
      for (; r + 6 <= m; r += 6) gemm_tile<6>(tile, kc, x + r * l.in + k0, l.in, yy + r * ldy, ldy);
      for (; r + 3 <= m; r += 3) gemm_tile<3>(tile, kc, x + r * l.in + k0, l.in, yy + r * ldy, ldy);
      for (; r < m; ++r) gemm_tile<1>(tile, kc, x + r * l.in + k0, l.in, yy + r * ldy, ldy);
    }
  }
  if (width < P)
    for (int64_t r = 0; r < m; ++r)
      std::copy(pad.data() + r * P, pad.data() + r * P + width, y + r * l.out);
}

constexpr Kernels kTable{KVQ_PACKED_STR(KVQ_CPU_PATH_NS), &panel, &decode_tile};

}  // namespace
}  // namespace kvq::packed::KVQ_CPU_PATH_NS

extern "C" const kvq::packed::Kernels* KVQ_PACKED_CAT(kvq_packed_path_, KVQ_CPU_PATH_NS)() {
  return &kvq::packed::KVQ_CPU_PATH_NS::kTable;
}
