// Fragment-layout arithmetic of the tensor-core decode kernel (DecodeKernel::Mma,
// kernels/cuda/attention_mma.cu), as __host__ __device__ functions so that the CPU tests
// (tests/kernels/cuda/mma_layout_test.cpp) check them exhaustively: every lane, register and
// half, every shared-memory row and chunk.
//
// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 (PTX ISA, "Matrix fragments for mma.m16n8k16
// with floating point type"): lane = 4 * group + tig (group = lane / 4, thread in group = lane %
// 4).
//   A (16 x 16 bf16, 4 registers of 2): register r holds row group + 8 (r % 2), columns
//     2 tig + 8 (r / 2) + {0, 1}.
//   B (16 x 8, 2 registers of 2): register r holds rows (k) 2 tig + 8 r + {0, 1}, column group.
//   C, D (16 x 8 float32, 4 values): value i is row group + 8 (i / 2), column 2 tig + i % 2.
// The kernel's M rows are the GQA group twice: row i < 8 is query head i's high part (q or p
// rounded to bf16), row 8 + i its low part (the remainder, rounded to bf16), so one mma gives both
// products and a lane adds its values i and i + 2 (rows g and g + 8, the same column): q and p
// carry ~16 significant bits instead of bf16's 8, and scores and outputs stay within the exact
// kernels' tolerances (tests/cuda/attention_kernel_test.cu).
//
// Shared memory tiles: rows of D bf16 (a token's K or V for one head), split into 16-byte chunks
// of 8 channels; chunk c of row r sits at chunk slot r * (D / 8) + (c ^ (r % 8)) (an XOR swizzle),
// so the 8 rows one ldmatrix phase reads at one logical chunk land in 8 different 16-byte bank
// groups (no bank conflict), and a row's cp.async stores stay 16-byte chunks.
//
// ldmatrix.x4: lane l gives the row address of matrix l / 8, row l % 8; after the load, lane l
// holds of matrix m (register m) the elements (row l / 4, columns 2 (l % 4) + {0, 1}), or with
// .trans (rows 2 (l % 4) + {0, 1}, column l / 4).
#pragma once

#include <cstdint>

#include "core/half.h"
#include "core/hostdev.h"

namespace kvq::cuda::mma {

inline constexpr int kM = 16, kN = 8, kK = 16;  // mma.m16n8k16
inline constexpr int kChunk = 8;                // bf16 per 16-byte chunk

KVQ_HD int group_of(int lane) { return lane / 4; }
KVQ_HD int tig_of(int lane) { return lane % 4; }

/// Row and column of element `half` (0, 1) of A register r (0..3) held by `lane`.
KVQ_HD int a_row(int lane, int r) { return group_of(lane) + 8 * (r % 2); }
KVQ_HD int a_col(int lane, int r, int half) { return 2 * tig_of(lane) + 8 * (r / 2) + half; }
/// Row (k) and column (n) of element `half` of B register r (0, 1).
KVQ_HD int b_row(int lane, int r, int half) { return 2 * tig_of(lane) + 8 * r + half; }
KVQ_HD int b_col(int lane) { return group_of(lane); }
/// Row and column of C value i (0..3).
KVQ_HD int c_row(int lane, int i) { return group_of(lane) + 8 * (i / 2); }
KVQ_HD int c_col(int lane, int i) { return 2 * tig_of(lane) + i % 2; }

/// Chunk slot of logical chunk c of row r in a tile of rows of D bf16 (D / 8 chunks a row).
template <int D>
KVQ_HD int chunk_slot(int r, int c) {
  static_assert(D % 64 == 0, "the swizzle permutes chunks within groups of 8");
  return r * (D / kChunk) + (c ^ (r % 8));
}

/// ldmatrix.x4 row addresses, K tile (scores, non-transposed): lane l points at row
/// row0 + l % 8 (token), logical chunk chunk0 + l / 8; registers 0, 1 are then B registers
/// 0, 1 of the k-step over channels [8 chunk0, 8 chunk0 + 16), registers 2, 3 those of the next.
KVQ_HD int k_ldm_row(int lane) { return lane % 8; }
KVQ_HD int k_ldm_chunk(int lane) { return lane / 8; }
/// ldmatrix.x4.trans row addresses, V tile (values): lane l points at row (token)
/// 8 ((l / 8) % 2) + l % 8 of the 16-token k-step, logical chunk chunk0 + l / 16; registers 0, 1
/// are then B registers 0, 1 of n-tile chunk0 (channels [8 chunk0, 8 chunk0 + 8)), registers
/// 2, 3 those of n-tile chunk0 + 1.
KVQ_HD int v_ldm_row(int lane) { return 8 * ((lane / 8) % 2) + lane % 8; }
KVQ_HD int v_ldm_chunk(int lane) { return lane / 16; }

/// Two floats as bf16x2 bits (x low), round to nearest even.
KVQ_HD uint32_t pack_bf16x2(float x, float y) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  uint32_t r;  // one cvt (the same rounding as float_to_bf16_bits for every non-NaN)
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(y), "f"(x));
  return r;
#else
  return static_cast<uint32_t>(float_to_bf16_bits(x)) |
         (static_cast<uint32_t>(float_to_bf16_bits(y)) << 16);
#endif
}

/// The high and low bf16x2 parts of (x, y): hi = bf16(x, y), lo = bf16(x - hi, y - hi). Both
/// subtractions are exact (Sterbenz), so hi + lo carries x and y to ~2^-17 relative.
struct HiLo {
  uint32_t hi, lo;
};
KVQ_HD HiLo split_bf16x2(float x, float y) {
  const uint32_t hi = pack_bf16x2(x, y);
  const float hx = bits_float(hi << 16), hy = bits_float(hi & 0xffff0000u);
  return {hi, pack_bf16x2(x - hx, y - hy)};
}

}  // namespace kvq::cuda::mma
