// Index arithmetic of the one-pass quantize kernels (issue 46): kivi_kernels.cu's per-channel
// kernel with its group in registers and vector word stores, fp8_kernels.cu's chunked quantize
// (16 codes a thread: four 16-byte loads, one 16-byte store). Every function is __host__
// __device__ (core/hostdev.h), so tests/kernels/cuda/quant_index_test.cpp checks it on the host
// against the plain definitions, exhaustively over small shapes.
#pragma once

#include <cstdint>

#include "core/hostdev.h"

namespace kvq::cuda::quant_index {

/// \brief Elements one thread of the chunked FP8 quantize handles: 4 float4 loads, 16 codes, one
/// 16-byte store.
inline constexpr int kFp8Chunk = 16;

/// \brief (token, head, channel) of flat element e of a C-order [T, H, D] tensor.
struct RowPos {
  int64_t t = 0, h = 0, d = 0;
};

/// \brief The position of flat element e in [T, heads, dim] (dim >= 1, heads >= 1).
KVQ_HD RowPos row_pos(int64_t e, int64_t heads, int64_t dim) {
  const int64_t row = e / dim, t = row / heads;
  RowPos p;
  p.t = t;
  p.h = row - t * heads;
  p.d = e - row * dim;
  return p;
}

/// \brief Whether every kFp8Chunk-element chunk of a [T, H, dim] tensor lies in one (t, h) row
/// and starts 16-byte aligned when the tensor does (floats and codes): dim a multiple of 16.
KVQ_HD bool fp8_chunks_fit(int64_t dim) { return dim > 0 && dim % kFp8Chunk == 0; }

/// \brief Puts byte j (0 <= j < 16) of a 16-byte run held as four little-endian words: the byte
/// that lands at address base + j when the words are stored at base (CUDA devices and x86 are
/// little-endian). w must start zeroed.
KVQ_HD void put_byte(uint32_t (&w)[4], int j, uint32_t b) {
  w[j / 4] |= (b & 0xffu) << (8 * (j % 4));
}

/// \brief Words per vector store of a thread that writes `wpg` consecutive words starting at a
/// multiple of wpg: the largest of 4, 2, 1 that divides wpg (16-, 8- or 4-byte stores; a run of
/// wpg words starting at a multiple of wpg then stays aligned to it when the base is).
KVQ_HD constexpr int store_words(int wpg) { return wpg % 4 == 0 ? 4 : wpg % 2 == 0 ? 2 : 1; }

}  // namespace kvq::cuda::quant_index
