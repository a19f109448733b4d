#include "model/packed_matrix.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/half.h"
#include "kernels/cpu/isa.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define KVQ_PACKED_AVX2 1
#endif

namespace kvq {
namespace {

using gguf::GgmlType;
constexpr int64_t P = PackedMatrix::kPanel;
constexpr int64_t QK = 32;       // values per block of the legacy ggml formats
constexpr int64_t kChunk = 256;  // k values per prefill tile: 256 x 64 floats = 64 KB in L2

// ---- the panel blocks (one per panel and 32 values of k) -------------------------------------

struct PanelQ4_1 {  // W = d * q + m
  uint16_t d[P], m[P];
  uint8_t qs[QK / 2][P];  // qs[j][c]: column c, k = 2j (low nibble) and 2j + 1 (high nibble)
};
static_assert(sizeof(PanelQ4_1) == 1280, "5 bits per weight, as Q4_1 in the file");

struct PanelQ4_0 {  // W = d * (q - 8)
  uint16_t d[P];
  uint8_t qs[QK / 2][P];
};
static_assert(sizeof(PanelQ4_0) == 1152, "4.5 bits per weight, as Q4_0 in the file");

struct PanelQ8_0 {  // W = d * q
  uint16_t d[P];
  int8_t qs[QK][P];
};
static_assert(sizeof(PanelQ8_0) == 2176, "8.5 bits per weight, as Q8_0 in the file");

// The file's blocks (ggml-common.h); only the fields the packing reads.
struct FileQ4_1 {
  uint16_t d, m;
  uint8_t qs[QK / 2];  // element j: low nibble of qs[j]; element j + 16: high nibble
};
struct FileQ4_0 {
  uint16_t d;
  uint8_t qs[QK / 2];
};
struct FileQ8_0 {
  uint16_t d;
  int8_t qs[QK];
};

uint8_t nibble(const uint8_t* qs, int64_t j) {  // code j of a Q4 block
  return j < QK / 2 ? (qs[j] & 0x0f) : static_cast<uint8_t>(qs[j - QK / 2] >> 4);
}

std::vector<float>& scratch(size_t n) {
  thread_local std::vector<float> buf;
  if (buf.size() < n) buf.resize(n);
  return buf;
}

// ---- fp32 tiles: tile[kk][64] -----------------------------------------------------------------

// acc[c] = fma(x[kk], tile[kk][c], acc[c]) for kk in [0, kc), in order.
void gemv_tile(const float* tile, int64_t kc, const float* x, float* acc) {
#if KVQ_PACKED_AVX2
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
#if KVQ_PACKED_AVX2
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

#if KVQ_PACKED_AVX2
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

size_t dense_item(GgmlType type) { return type == GgmlType::kF32 ? 4 : 2; }

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

}  // namespace

// W [out][in] of F32 / F16 / BF16 values (checked), one value per k-block: from_dense's and
// from_mapped's shared fields.
PackedMatrix PackedMatrix::dense_shape(Kind kind, gguf::GgmlType type, int64_t out, int64_t in,
                                       const char* who) {
  KVQ_CHECK(out > 0 && in > 0, "PackedMatrix: empty matrix [{}, {}]", out, in);
  KVQ_CHECK(type == GgmlType::kF32 || type == GgmlType::kF16 || type == GgmlType::kBF16,
            "PackedMatrix::{}: {} is not F32, F16 or BF16", who,
            gguf::ggml_type_name(static_cast<uint32_t>(type)));
  PackedMatrix pm;
  pm.kind_ = kind;
  pm.type_ = type;
  pm.in_ = in;
  pm.out_ = out;
  pm.panels_ = (out + P - 1) / P;
  pm.kblock_ = 1;
  pm.kblocks_ = in;
  return pm;
}

PackedMatrix PackedMatrix::from_mapped(const uint8_t* w, gguf::GgmlType type, int64_t out,
                                       int64_t in, std::shared_ptr<const void> owner) {
  PackedMatrix pm = dense_shape(Kind::kMapped, type, out, in, "from_mapped");
  pm.rows_ = w;
  pm.owner_ = std::move(owner);
  pm.mapped_bytes_ = static_cast<size_t>(out * in) * dense_item(type);
  return pm;
}

PackedMatrix PackedMatrix::from_rows(const float* w, int64_t out, int64_t in) {
  return from_dense(reinterpret_cast<const uint8_t*>(w), GgmlType::kF32, out, in);
}

PackedMatrix PackedMatrix::from_dense(const uint8_t* w, gguf::GgmlType type, int64_t out,
                                      int64_t in) {
  const int64_t item = type == GgmlType::kF32 ? 4 : 2;
  PackedMatrix pm = dense_shape(item == 4 ? Kind::kF32 : Kind::k16, type, out, in, "from_dense");
  pm.block_bytes_ = P * item;
  pm.data_.assign(static_cast<size_t>(pm.panels_ * in * pm.block_bytes_), 0);
  if (item == 2) {  // the 16-bit values as they are, converted exactly when a tile is decoded
    auto* h = reinterpret_cast<uint16_t*>(pm.data_.data());
    for (int64_t c = 0; c < out; ++c)
      for (int64_t k = 0; k < in; ++k)
        std::memcpy(&h[((c / P) * in + k) * P + c % P], w + (c * in + k) * 2, 2);
    return pm;
  }
  auto* f = reinterpret_cast<float*>(pm.data_.data());
  for (int64_t c = 0; c < out; ++c)
    for (int64_t k = 0; k < in; ++k)
      std::memcpy(&f[((c / P) * in + k) * P + c % P], w + (c * in + k) * 4, 4);
  return pm;
}

PackedMatrix PackedMatrix::from_gguf(const gguf::GgufFile& f, const gguf::TensorInfo& t) {
  KVQ_CHECK(t.dims.size() == 2 && t.dims[0] > 0 && t.dims[1] > 0, "{}: tensor {} is not a matrix",
            f.name(), t.name);
  const gguf::TypeTraits* tr = gguf::type_traits(static_cast<uint32_t>(t.type));
  KVQ_CHECK(tr && tr->dequantizable, "{}: tensor {} has ggml type {}, which kvq cannot decode",
            f.name(), t.name, gguf::ggml_type_name(static_cast<uint32_t>(t.type)));
  const int64_t in = t.dims[0], out = t.dims[1];
  KVQ_CHECK(in % tr->block_elems == 0, "{}: tensor {} rows of {} are not whole {} blocks", f.name(),
            t.name, in, tr->name);
  const uint8_t* src = f.tensor_data(t).data();
  const int64_t row_bytes = in / tr->block_elems * tr->block_bytes;
  if (t.type == GgmlType::kF32 || t.type == GgmlType::kF16 || t.type == GgmlType::kBF16)
    return from_dense(src, t.type, out, in);
  PackedMatrix pm;
  pm.type_ = t.type;
  pm.in_ = in;
  pm.out_ = out;
  pm.panels_ = (out + P - 1) / P;
  const bool q41 = t.type == GgmlType::kQ4_1, q40 = t.type == GgmlType::kQ4_0,
             q80 = t.type == GgmlType::kQ8_0;
  if (q41 || q40 || q80) {
    pm.kind_ = q41 ? Kind::kQ4_1 : q40 ? Kind::kQ4_0 : Kind::kQ8_0;
    pm.kblock_ = QK;
    pm.block_bytes_ = q41 ? sizeof(PanelQ4_1) : q40 ? sizeof(PanelQ4_0) : sizeof(PanelQ8_0);
  } else {
    pm.kind_ = Kind::kBlocks;
    pm.kblock_ = tr->block_elems;
    pm.file_block_bytes_ = tr->block_bytes;
    pm.block_bytes_ = P * tr->block_bytes;
  }
  pm.kblocks_ = in / pm.kblock_;
  pm.data_.assign(static_cast<size_t>(pm.panels_ * pm.kblocks_ * pm.block_bytes_), 0);
  for (int64_t c = 0; c < out; ++c) {
    const int64_t p = c / P, cc = c % P;
    for (int64_t kb = 0; kb < pm.kblocks_; ++kb) {
      uint8_t* dst = pm.data_.data() + (p * pm.kblocks_ + kb) * pm.block_bytes_;
      const uint8_t* fb = src + c * row_bytes + kb * tr->block_bytes;
      if (q41) {
        FileQ4_1 b;
        std::memcpy(&b, fb, sizeof b);
        auto* pb = reinterpret_cast<PanelQ4_1*>(dst);
        pb->d[cc] = b.d;
        pb->m[cc] = b.m;
        for (int64_t j = 0; j < QK / 2; ++j)
          pb->qs[j][cc] =
              static_cast<uint8_t>(nibble(b.qs, 2 * j) | (nibble(b.qs, 2 * j + 1) << 4));
      } else if (q40) {
        FileQ4_0 b;
        std::memcpy(&b, fb, sizeof b);
        auto* pb = reinterpret_cast<PanelQ4_0*>(dst);
        pb->d[cc] = b.d;
        for (int64_t j = 0; j < QK / 2; ++j)
          pb->qs[j][cc] =
              static_cast<uint8_t>(nibble(b.qs, 2 * j) | (nibble(b.qs, 2 * j + 1) << 4));
      } else if (q80) {
        FileQ8_0 b;
        std::memcpy(&b, fb, sizeof b);
        auto* pb = reinterpret_cast<PanelQ8_0*>(dst);
        pb->d[cc] = b.d;
        for (int64_t j = 0; j < QK; ++j) pb->qs[j][cc] = b.qs[j];
      } else {
        std::memcpy(dst + cc * tr->block_bytes, fb, static_cast<size_t>(tr->block_bytes));
      }
    }
  }
  return pm;
}

std::string PackedMatrix::format() const {
  const gguf::TypeTraits* tr = gguf::type_traits(static_cast<uint32_t>(type_));
  const std::string name = tr ? tr->name : "?";
  switch (kind_) {
    case Kind::kF32:
      return name + " (fp32 panels)";
    case Kind::k16:
      return name + " (16-bit panels)";
    case Kind::kBlocks:
      return name + " (file blocks in panels)";
    case Kind::kMapped:
      return name + " (mapped rows)";
    default:
      return name + " (panels)";
  }
}

// tile[(k - k0) * 64 + c] = W[p * 64 + c][k] for k in [k0, k1) (k0, k1 on block boundaries).
void PackedMatrix::decode_tile(int64_t p, int64_t k0, int64_t k1, float* tile) const {
  if (kind_ == Kind::kMapped) {  // 64 rows' values k0 .. k1 - 1, transposed
    const int64_t width = std::min(P, out_ - p * P), item = static_cast<int64_t>(dense_item(type_));
    const uint8_t* w = rows_ + p * P * in_ * item;
#if KVQ_CPU_AVX512
    for (int64_t g = 0; g < P; g += 16) {
      const int rows = static_cast<int>(std::clamp<int64_t>(width - g, 0, 16));
      const uint8_t* wg = w + (rows > 0 ? g : 0) * in_ * item;
      if (type_ == GgmlType::kBF16)
        tile_mapped<GgmlType::kBF16>(wg, in_ * item, rows, k0, k1, tile + g);
      else if (type_ == GgmlType::kF16)
        tile_mapped<GgmlType::kF16>(wg, in_ * item, rows, k0, k1, tile + g);
      else
        tile_mapped<GgmlType::kF32>(wg, in_ * item, rows, k0, k1, tile + g);
    }
#else
    float row[256];
    for (int64_t c = 0; c < P; ++c)
      for (int64_t k = k0; k < k1; k += 256) {
        const int64_t n = std::min<int64_t>(256, k1 - k);
        if (c < width)
          gguf::dequantize_row(type_, w + (c * in_ + k) * item, n, row);
        else
          std::fill(row, row + n, 0.0f);
        for (int64_t j = 0; j < n; ++j) tile[(k - k0 + j) * P + c] = row[j];
      }
#endif
    return;
  }
  for (int64_t kb = k0 / kblock_; kb < k1 / kblock_; ++kb) {
    const uint8_t* blk = block_ptr(p, kb);
    float* t = tile + (kb * kblock_ - k0) * P;
    switch (kind_) {
#if KVQ_PACKED_AVX2
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
#if KVQ_PACKED_AVX2
        for (int g = 0; g < 8; ++g) {
          const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(u + 8 * g));
          _mm256_storeu_ps(
              t + 8 * g, type_ == GgmlType::kBF16
                             ? _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))
                             : _mm256_cvtph_ps(h));
        }
#else
        for (int64_t c = 0; c < P; ++c)
          t[c] = type_ == GgmlType::kBF16 ? bf16_bits_to_float(u[c]) : half_bits_to_float(u[c]);
#endif
        break;
      }
      case Kind::kMapped:  // handled above
        break;
      case Kind::kBlocks: {
        float col[256];  // the largest ggml block
        for (int64_t c = 0; c < P; ++c) {
          gguf::dequantize_row(type_, blk + c * file_block_bytes_, kblock_, col);
          for (int64_t j = 0; j < kblock_; ++j) t[j * P + c] = col[j];
        }
        break;
      }
    }
  }
}

// One panel for all m rows; y points at the panel's first column, row stride out_.
void PackedMatrix::panel(int64_t p, const float* x, int64_t m, float* y, bool accumulate) const {
  const int64_t width = std::min(P, out_ - p * P);
  // The last panel may be narrower than 64 columns: compute into a padded copy.
  std::vector<float> pad;
  float* yy = y;
  int64_t ldy = out_;
  if (width < P) {
    pad.assign(static_cast<size_t>(m * P), 0.0f);
    if (accumulate)
      for (int64_t r = 0; r < m; ++r)
        std::copy(y + r * out_, y + r * out_ + width, pad.data() + r * P);
    yy = pad.data();
    ldy = P;
  } else if (!accumulate) {
    for (int64_t r = 0; r < m; ++r) std::fill(y + r * out_, y + r * out_ + P, 0.0f);
  }
  if (m < 4) {  // decode: one row at a time, weights decoded in registers
    for (int64_t r = 0; r < m; ++r) {
      const float* xr = x + r * in_;
      float* acc = yy + r * ldy;
#if KVQ_PACKED_AVX2
      if (kind_ == Kind::kQ4_1 || kind_ == Kind::kQ4_0) {
        if (kind_ == Kind::kQ4_1)
          gemv_q4<true>(block_ptr(p, 0), block_bytes_, kblocks_, xr, acc);
        else
          gemv_q4<false>(block_ptr(p, 0), block_bytes_, kblocks_, xr, acc);
        continue;
      }
      if (kind_ == Kind::kQ8_0) {
        gemv_q8(block_ptr(p, 0), block_bytes_, kblocks_, xr, acc);
        continue;
      }
#endif
      if (kind_ == Kind::kF32) {
        gemv_tile(reinterpret_cast<const float*>(block_ptr(p, 0)), in_, xr, acc);
        continue;
      }
#if KVQ_CPU_AVX512
      if (kind_ == Kind::kMapped) {  // all m rows at once, in registers, 16 columns at a time
        mapped_gemv(p, x, m, yy, ldy);
        break;
      }
#endif
      const int64_t chunk = std::max(kChunk / kblock_, int64_t{1}) * kblock_;
      float* tile = scratch(static_cast<size_t>(chunk * P)).data();
      for (int64_t k0 = 0; k0 < in_; k0 += chunk) {
        const int64_t k1 = std::min(in_, k0 + chunk);
        decode_tile(p, k0, k1, tile);
        gemv_tile(tile, k1 - k0, xr + k0, acc);
      }
    }
  } else {  // prefill: decode a k-chunk of the panel once, then register tiles of 6 rows
    const int64_t chunk = std::max(kChunk / kblock_, int64_t{1}) * kblock_;
    float* buf = kind_ == Kind::kF32 ? nullptr : scratch(static_cast<size_t>(chunk * P)).data();
    for (int64_t k0 = 0; k0 < in_; k0 += chunk) {
      const int64_t k1 = std::min(in_, k0 + chunk), kc = k1 - k0;
      const float* tile = buf;
      if (kind_ == Kind::kF32)
        tile = reinterpret_cast<const float*>(block_ptr(p, 0)) + k0 * P;
      else
        decode_tile(p, k0, k1, buf);
      int64_t r = 0;
      for (; r + 6 <= m; r += 6) gemm_tile<6>(tile, kc, x + r * in_ + k0, in_, yy + r * ldy, ldy);
      for (; r + 3 <= m; r += 3) gemm_tile<3>(tile, kc, x + r * in_ + k0, in_, yy + r * ldy, ldy);
      for (; r < m; ++r) gemm_tile<1>(tile, kc, x + r * in_ + k0, in_, yy + r * ldy, ldy);
    }
  }
  if (width < P)
    for (int64_t r = 0; r < m; ++r)
      std::copy(pad.data() + r * P, pad.data() + r * P + width, y + r * out_);
}

#if KVQ_CPU_AVX512
// Decode rows x [m < 4][in] against panel p's mapped rows: y [m][64] (stride ldy) += the chain.
void PackedMatrix::mapped_gemv(int64_t p, const float* x, int64_t m, float* y, int64_t ldy) const {
  const int64_t width = std::min(P, out_ - p * P), item = static_cast<int64_t>(dense_item(type_));
  const int64_t ld = in_ * item;
  auto run = [&]<GgmlType T>() {
    for (int64_t g = 0; g < width; g += 16) {
      const int rows = static_cast<int>(std::min<int64_t>(width - g, 16));
      const uint8_t* w = rows_ + (p * P + g) * ld;
      if (m == 1)
        gemv_mapped<T, 1>(w, ld, rows, in_, x, in_, y + g, ldy);
      else if (m == 2)
        gemv_mapped<T, 2>(w, ld, rows, in_, x, in_, y + g, ldy);
      else
        gemv_mapped<T, 3>(w, ld, rows, in_, x, in_, y + g, ldy);
    }
  };
  if (type_ == GgmlType::kBF16)
    run.template operator()<GgmlType::kBF16>();
  else if (type_ == GgmlType::kF16)
    run.template operator()<GgmlType::kF16>();
  else
    run.template operator()<GgmlType::kF32>();
}
#endif

void PackedMatrix::weight_row(int64_t c, float* out) const {
  KVQ_CHECK(c >= 0 && c < out_, "PackedMatrix: row {} outside [0, {})", c, out_);
  if (kind_ == Kind::kMapped) {  // the row as it lies, converted exactly
    gguf::dequantize_row(type_, rows_ + static_cast<size_t>(c * in_) * dense_item(type_), in_, out);
    return;
  }
  const int64_t chunk = std::max(kChunk / kblock_, int64_t{1}) * kblock_;
  std::vector<float> tile(static_cast<size_t>(chunk * P));
  for (int64_t k0 = 0; k0 < in_; k0 += chunk) {
    const int64_t k1 = std::min(in_, k0 + chunk);
    decode_tile(c / P, k0, k1, tile.data());
    for (int64_t k = k0; k < k1; ++k) out[k] = tile[static_cast<size_t>((k - k0) * P + c % P)];
  }
}

void PackedMatrix::multiply(const float* x, int64_t m, float* y, bool accumulate) const {
  if (m <= 0) return;
#pragma omp parallel for schedule(static)
  for (int64_t p = 0; p < panels_; ++p) panel(p, x, m, y + p * P, accumulate);
}

void PackedMatrix::multiply(const float* x, int64_t m, float* y, bool accumulate, int member,
                            int members) const {
  if (m <= 0) return;
  const int64_t p0 = panels_ * member / members, p1 = panels_ * (member + 1) / members;
  for (int64_t p = p0; p < p1; ++p) panel(p, x, m, y + p * P, accumulate);
}

}  // namespace kvq
