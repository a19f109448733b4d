// Index arithmetic of the fused FP8 per-token dynamic quantize (kernels/cuda/fp8_kernels.cu,
// fp8_quantize_dynamic_token; issue 46): how a warp's lanes share the (t, h) rows of a
// [T, H, D] tensor when D is a multiple of 16. Every function is __host__ __device__
// (core/hostdev.h), so tests/kernels/cuda/fp8_token_split_test.cpp checks it on the host against
// the plain definitions.
//
// A row of D values is D / 16 chunks of 16 (quant_index::kFp8Chunk: four float4 loads, one
// 16-byte store). `span` lanes (a power of two, <= 32) share a row, so a warp holds 32 / span
// rows; lane `part` of a row takes chunks part, part + span, ..., at most `chunks_per_lane` of
// them, so neighbouring lanes touch neighbouring 64-byte runs of x and 16-byte runs of codes
// (coalesced). E.g. D = 128: 8 chunks, span 8, 1 chunk a lane, 4 rows a warp.
#pragma once

#include <cstdint>

#include "core/hostdev.h"
#include "kernels/cuda/quant_index.h"

namespace kvq::cuda::fp8_token {

/// \brief Most chunks one lane holds in registers (16 floats each): D <= 32 * 4 * 16 = 2048.
inline constexpr int kMaxChunksPerLane = 4;

/// \brief How the lanes of a warp split rows of `dim` values (fp8_chunks_fit(dim)).
struct Split {
  int span = 1;             ///< lanes per row: the smallest power of two >= chunks, at most 32
  int chunks_per_lane = 1;  ///< ceil(chunks / span), rounded up to a power of two (the template)
  int chunks = 1;           ///< dim / 16
};

/// \brief The split for rows of `dim` values; dim must satisfy quant_index::fp8_chunks_fit.
KVQ_HD Split split_for(int64_t dim) {
  Split s;
  s.chunks = static_cast<int>(dim / quant_index::kFp8Chunk);
  while (s.span < s.chunks && s.span < 32) s.span *= 2;
  const int need = (s.chunks + s.span - 1) / s.span;
  while (s.chunks_per_lane < need) s.chunks_per_lane *= 2;
  return s;
}

/// \brief Whether the fused register kernel takes rows of `dim` values: chunks fit and a lane
/// holds at most kMaxChunksPerLane of them.
KVQ_HD bool fits_registers(int64_t dim) {
  return quant_index::fp8_chunks_fit(dim) &&
         dim <= int64_t{32} * kMaxChunksPerLane * quant_index::kFp8Chunk;
}

/// \brief The first channel of chunk c (0 <= c < chunks_per_lane) of lane `part` in its row, or
/// -1 when that chunk lies past the row's end (the lane idles for it).
KVQ_HD int64_t chunk_start(const Split& s, int part, int c) {
  const int k = c * s.span + part;
  return k < s.chunks ? int64_t{k} * quant_index::kFp8Chunk : -1;
}

}  // namespace kvq::cuda::fp8_token
