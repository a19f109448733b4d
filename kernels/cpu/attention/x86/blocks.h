// Backend `cpu`, x86 attention blocks: the entries each block file defines for the tile driver
// (tile.cpp): the scores and values of one block's sub-block by side kind, for GQA groups NQ of
// 1..8 (instantiated in the file that defines them), and simd_block, the entry run_segment calls
// (kernels/cpu/attention/segment.cpp). Compiled where the build targets AVX2 (KVQ_CPU_AVX2).
#pragma once

#include <cstdint>
#include <span>

#include "kernels/cpu/isa.h"
#include "kernels/cpu/segment.h"

/// X(NQ) for each GQA group the SIMD blocks are instantiated for.
#define KVQ_CPU_FOR_NQ(X) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8)

namespace kvq::cpu::KVQ_CPU_PATH_NS::attn {

/// Int keys (kivi.cpp): scores of kv head h over tokens [t0, t1) into s[i * lds + (t - t0)]
/// (unscaled).
template <int NQ>
void scores(const Call& c, int64_t h, int64_t t0, int64_t t1, float* s, int64_t lds, Scratch& w);
/// Int values (kivi.cpp): o_i += sum_t p_i[t - t0] * V[t, h, :] for kv head h over [t0, t1).
template <int NQ>
void values(const Call& c, int64_t h, int64_t t0, int64_t t1, float* p, int64_t ldp, float* o,
            Scratch& w);
/// Dense and fp8 keys (row_scores.cpp): every kv head at once, s[h * hs + i * lds + (t - t0)].
template <int NQ, bool kStream>
void scores_rows(const Call& c, int64_t t0, int64_t t1, float* s, int64_t hs, int64_t lds,
                 Scratch& w);
/// Dense and fp8 values (row_values.cpp): every kv head at once, o is [H, NQ, D].
template <int NQ, bool kStream>
void values_rows(const Call& c, int64_t t0, int64_t t1, float* p, int64_t hs, int64_t ldp, float* o,
                 Scratch& w);

/// One block of the tile's slots (all members of one GQA group nq) on the SIMD blocks (tile.cpp).
void simd_block(int nq, std::span<const TileSlot> slots, Scratch& w);

}  // namespace kvq::cpu::KVQ_CPU_PATH_NS::attn
