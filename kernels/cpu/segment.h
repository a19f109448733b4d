// Backend `cpu`: what the causal scheduler (kernels/cpu/causal.cpp, compiled once) hands each CPU
// path's attention kernels (kernels/cpu/attention/, compiled once per path,
// kernels/cpu/isa.h): a call's view of one position, the partial results, a thread's scratch,
// and run_segment, the one entry the scheduler calls through the path table
// (kernels/cpu/dispatch.h). Internal to the backend.
#pragma once

#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include "core/stored_side.h"
#include "kernels/cpu/attention.h"

namespace kvq::cpu {

/// One thread's partial result: running max m, sum l and unnormalized output, per query head.
struct Partial {
  std::vector<float> m, l, o;
  void init(int64_t q_heads, int64_t D) {
    m.assign(static_cast<size_t>(q_heads), -INFINITY);
    l.assign(static_cast<size_t>(q_heads), 0.0f);
    o.assign(static_cast<size_t>(q_heads * D), 0.0f);
  }
};

inline constexpr int64_t kBlock = 256;  // tokens per block (rounded to a multiple of a key group)
// Tokens per segment = blocks * this: the unit of the split across threads and of the fold, the
// same for every position and thread count (so results depend on neither).
inline constexpr int64_t kBlocksPerSegment = 2;
// Positions per work item when a call has many: they share each K/V block while it is in cache.
inline constexpr int64_t kTile = 16;

struct Call {
  const float* q;
  int64_t q_heads, H, D;
  int nq;
  float scale;  // 1 / sqrt(D)
  const StoredSide& k;
  const StoredSide& v;
  IntMode mode;
  int64_t block;  // tokens per block
  bool ahead;     // the sides stream from memory (beyond_l3): prefetch ahead
};

/// One position's share of a tile's block (simd_tile_block): its call, partial, score rows
/// ([NQ, block + 8]) and token range.
struct TileSlot {
  const Call* c;
  Partial* P;
  float* s;
  int64_t t0, t1;
};

/// Scratch of one thread.
struct Scratch {
  std::vector<float> s, qs;  // s: the portable path's scores
  std::vector<TileSlot> slots;
  std::vector<uint32_t> wt;
  std::vector<int8_t> q8;        // int8 mode: the quantized query [NQ, D]
  std::vector<float> pw, msum;   // int values: weights per channel group, sums of p * min
  std::vector<float> sct, mnt;   // int values: a sub-block's scales and minima per channel group
  std::vector<uint8_t> wb;       // int8 values: weight_bytes per channel group
  std::vector<float> fac;        // and their factors
  std::vector<float> mv;         // and 16-lane sums of p * min
  std::vector<uint16_t> qb;      // fp8 in the int8 mode: q as bf16 [H, NQ, D]
  const float* qb_of = nullptr;  // the q that qb holds (reset at each segment, run_segment)
  const float* qs_of = nullptr;  // fp8 keys, exact mode: the q that qs holds scaled (the same)
  std::vector<float> rowf;       // the factor of each row's scores
  std::vector<uint32_t> wp;      // and the weights as bf16 pairs
  std::vector<uint32_t> qt;      // AMX: qb as tiles (fp8_query_tiles)
  std::vector<uint16_t> ka;      // AMX: one head's keys as bf16 [kSubRows, D]
  std::vector<uint32_t> vb;      // AMX: pairs of value rows as tiles [4, 16, 16]
};

inline bool is_dense(SchemeKind k) {
  return k == SchemeKind::Fp32 || k == SchemeKind::Bf16 || k == SchemeKind::Fp16;
}

inline constexpr int kFp8QShift = 64;  // q * 2^64: products are q * k * 2^(64 - 127 + bias)
inline constexpr int kFp8OShift = 32;  // outputs accumulate o * 2^-32

/// Whether an fp8 side would take the int8 mode's bf16 dot products on a path that has them
/// (PathInfo::bf16dot).
inline bool fp8_bf16_side(IntMode mode, const StoredSide& s) {
  return mode == IntMode::Int8 && s.kind == SchemeKind::Fp8 && s.dim % 32 == 0;
}

/// One position of a segment run: its call, whether the SIMD path takes it, its end (t + 1), its
/// partial and its score rows.
struct Member {
  const Call* c;
  bool fast;
  int64_t end;
  Partial* part;
  float* s;
  int64_t begin = 0;  // a sliding window's first token (portable members only)
};

/// Segment [a, a + seg) of every member, block by block, on the path this process runs
/// (kernels/cpu/attention/segment.cpp): each block's fast members together, the others on the
/// portable path. A member's arithmetic is the same alone or with others, so a decode step (one
/// member) and a prefill tile give the same bits.
void run_segment(std::span<const Member> ms, int64_t a, int64_t seg, Scratch& w);

}  // namespace kvq::cpu
