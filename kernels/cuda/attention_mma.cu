// The tensor-core split kernels of decode attention (DecodeKernel::Mma, issue 46): bf16 caches
// (mma_split_kernel, below), KIVI 2- / 4-bit int caches (mma_int_split_kernel, further down) and
// FP8 caches with tensor, head, token or channel scales (mma_fp8_split_kernel, last; mma_fp8.h).
// Same grid, plan, workspace and merge as attention_kernels.cu's split kernels (one block =
// (split, kv head, sequence), 128 threads, all nq <= 8 query heads of the kv head); what differs
// is how a block computes its partial:
//   1. q of the GQA group -> A fragments of mma.m16n8k16 (mma_layout.h): rows 0..7 the heads'
//      q rounded to bf16, rows 8..15 the remainders, once per block, in registers.
//   2. scores: K tiles of kTile tokens come to shared memory through a two-stage cp.async
//      pipeline (16-byte copies, rows zero-filled past the split, chunks XOR-swizzled); each warp
//      takes 16 tokens of a tile (two n-tiles of 8), reads B fragments with ldmatrix.x4 and
//      accumulates D / 16 mma's per n-tile; score = (high row + low row) / sqrt(D) into the
//      shared score buffer (as the other kernels).
//   3. softmax partial: as the other kernels (one warp per query head).
//   4. values: V tiles through the same pipeline; each warp takes a 16-token k-step of a tile:
//      A fragments from the shared probabilities (high and low bf16 parts, zero past the split),
//      B fragments by ldmatrix.x4.trans, D / 8 n-tiles of fp32 accumulators in registers.
//   5. the warps' accumulators are summed through shared memory in a fixed order into the
//      partial (deterministic), m and l as the softmax wrote them.
// Numerics: K and V are bf16 (exact in the mma), q and p carry ~16 bits (high + low parts), the
// products and sums are fp32: within the exact kernels' tolerances (tests/cuda/).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <type_traits>

#include "kernels/cuda/attention_split.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/mma_fp8.h"
#include "kernels/cuda/mma_int.h"
#include "kernels/cuda/mma_layout.h"
#include "kernels/cuda/ptx.cuh"
#include "kernels/cuda/unpack.h"
#include "kivi/layout.h"

namespace kvq::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kTile = 16 * kWarps;  // tokens per pipeline stage: 16 per warp
constexpr int kStages = 2;
constexpr int kScoreFloats = 4096;  // as attention_kernels.cu: nq * split_tokens <= this
constexpr unsigned kFullMask = 0xffffffffu;

/// Shared memory of a block: the K / V stages (bf16), then the scores (float). The stages are
/// reused for the warps' output sums at the end (kWarps * 8 * D floats, which fit).
template <int D>
struct Smem {
  static constexpr int kStageHalves = kTile * D;
  static constexpr int kStageBytes = kStages * kStageHalves * 2;
  static_assert(kWarps * 8 * D * 4 <= kStageBytes, "the output sums reuse the stages");
  static size_t bytes(int64_t score_floats) {
    return static_cast<size_t>(kStageBytes) + static_cast<size_t>(score_floats) * 4;
  }
};

using namespace ptx;  // cp.async, ldmatrix, mma.m16n8k16 (ptx.cuh)

/// Issues the copies of tile [t0, t0 + kTile) of one side (rows (t * H + h) * D of `data`) into
/// `stage`; rows at or past t_end are zero-filled (their source clamped to row t0).
template <int D>
__device__ __forceinline__ void load_tile(uint16_t* stage, const uint16_t* data, int64_t t0,
                                          int64_t t_end, int H, int h, int tid) {
  constexpr int kChunks = D / mma::kChunk;  // per row
  for (int x = tid; x < kTile * kChunks; x += kThreads) {
    const int r = x / kChunks, c = x % kChunks;
    const bool in = t0 + r < t_end;
    const uint16_t* src = data + ((in ? t0 + r : t0) * H + h) * D + c * mma::kChunk;
    cp_async16(stage + mma::chunk_slot<D>(r, c) * mma::kChunk, src, in ? 16 : 0);
  }
}

/// The split's softmax partial over scores[i * ld + t] (t < n), one warp per query head (as
/// attention_kernels.cu): the scores become e^(s - m) times pscale (a power of two) and, where ts
/// is given, times token t's value scale ts[t * ts_stride]; m and l (the sum of e^(s - m)) go to
/// part_ml. Tokens t < packed are stored as mma_int::pack_p words (fp16 high + low parts, for the
/// int kernel's transposed value product) instead of floats.
template <class Params>
__device__ __forceinline__ void softmax_partial(const Params& p, float* scores, int n, int nq,
                                                int ld, int64_t qrow, int split, int warp, int lane,
                                                float pscale = 1.0f, const float* ts = nullptr,
                                                int ts_stride = 0, int packed = 0) {
  for (int i = warp; i < nq; i += kWarps) {
    float* row = scores + i * ld;
    float m = -INFINITY;
    for (int t = lane; t < n; t += 32) m = fmaxf(m, row[t]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(kFullMask, m, o));
    float l = 0.0f;
    for (int t = lane; t < n; t += 32) {
      const float e = expf(row[t] - m);
      // pscale s_t first: exact (a power of two) unless subnormal, so p' errs by <= 2^-150 abs.
      const float x = e * (ts ? pscale * __ldg(ts + static_cast<int64_t>(t) * ts_stride) : pscale);
      row[t] = t < packed ? __uint_as_float(mma_int::pack_p(x)) : x;
      l += e;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) l += __shfl_xor_sync(kFullMask, l, o);
    if (lane == 0) {
      float* ml = p.part_ml + ((qrow + i) * p.splits + split) * 2;
      ml[0] = m;
      ml[1] = l;
    }
  }
}

/// Where a block sits (one split of one kv head of one sequence, all nq query heads of it) and
/// its lane's place in the mma fragments; the same for every Mma kernel.
template <class View>
struct SplitBlock {
  int split, h, b;
  bool empty;      // the split starts past this sequence's end (a shorter sequence): no work
  int64_t s0, s1;  // the split's tokens [s0, s1)
  int n, ld;       // s1 - s0; the score buffer's row stride (split_tokens)
  int64_t qrow;    // the first query head's row of q / part_o: b q_heads + h nq
  int tid, lane, warp, g, tg;
  __device__ explicit SplitBlock(const detail::SplitParams<View>& p)
      : split(static_cast<int>(blockIdx.x)),
        h(static_cast<int>(blockIdx.y)),
        b(static_cast<int>(blockIdx.z)),
        s0(static_cast<int64_t>(split) * p.split_tokens),
        qrow(static_cast<int64_t>(b) * p.kv_heads * p.nq + static_cast<int64_t>(h) * p.nq),
        tid(static_cast<int>(threadIdx.x)),
        lane(tid % 32),
        warp(tid / 32),
        g(mma::group_of(lane)),
        tg(mma::tig_of(lane)) {
    const int64_t T = p.k[b].tokens;
    empty = s0 >= T;
    s1 = min(T, s0 + p.split_tokens);
    n = static_cast<int>(s1 - s0);
    ld = static_cast<int>(p.split_tokens);
  }
};

/// p of head g (zero for heads >= nq and tokens >= lim) at the lane's A columns of the k-step
/// of 16 tokens from tok0, as high + low A registers by split (bf16 or fp16 high + low parts).
template <class Split>
__device__ __forceinline__ void p_fragment(uint32_t (&pa)[4], const float* scores, int g, int nq,
                                           int ld, int tok0, int lim, int lane, Split split) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int tok = tok0 + mma::a_col(lane, 2 * half, 0);  // tokens tok, tok + 1
    const float x = g < nq && tok < lim ? scores[g * ld + tok] : 0.0f;
    const float y = g < nq && tok + 1 < lim ? scores[g * ld + tok + 1] : 0.0f;
    const auto s = split(x, y);
    pa[2 * half] = s.hi;      // row g
    pa[2 * half + 1] = s.lo;  // row g + 8
  }
}

/// The split's partial outputs: the warps' sums red[w][i][d] in a fixed order, plus extra(i, d)
/// (the residual window's values of the int kernel), times fac, into part_o.
template <int D, class Params, class Extra>
__device__ __forceinline__ void write_partial(const Params& p, const float* red, int64_t qrow,
                                              int split, int tid, float fac, Extra extra) {
  for (int x = tid; x < p.nq * D; x += kThreads) {
    const int i = x / D, d = x % D;
    float s = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) s += red[(w * 8 + i) * D + d];
    p.part_o[((qrow + i) * p.splits + split) * D + d] = extra(i, d, s) * fac;
  }
}

/// q of head g (zero where !real) as fp16 A fragments of the D / 16 k-steps, high parts in
/// registers [ks][2 r], low parts in [ks][2 r + 1]; A register pair r of k-step ks holds the
/// channels chan(ks, r, 0), chan(ks, r, 1). Where cs is given, channel c of q is first multiplied
/// by cs[c] (key channel scales folded into q: q_c s_c, one fp32 rounding, as the CPU and the
/// tiled kernel fold them). q is multiplied by 2^e, e = q_shift(max |q| of the head) + bias
/// (bias 0: max |q'| in [2^14, 2^15); -15: in [1/2, 1)); returns e.
template <int D, class Chan>
__device__ __forceinline__ int q_fragments_f16(uint32_t (&qa)[D / mma::kK][4], const float* q_heads,
                                               bool real, int lane, int bias, Chan chan,
                                               const float* cs = nullptr) {
  const float* q = q_heads + mma::group_of(lane) * D;
  float2 qf[D / mma::kK][2];
  float amax = 0.0f;
#pragma unroll
  for (int ks = 0; ks < D / mma::kK; ++ks)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float x = real ? __ldg(q + chan(ks, r, 0)) : 0.0f;
      const float y = real ? __ldg(q + chan(ks, r, 1)) : 0.0f;
      qf[ks][r] = make_float2(x, y);
    }
  if (cs) {
#pragma unroll
    for (int ks = 0; ks < D / mma::kK; ++ks)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        qf[ks][r].x *= __ldg(cs + chan(ks, r, 0));
        qf[ks][r].y *= __ldg(cs + chan(ks, r, 1));
      }
  }
#pragma unroll
  for (int ks = 0; ks < D / mma::kK; ++ks)
#pragma unroll
    for (int r = 0; r < 2; ++r) amax = fmaxf(amax, fmaxf(fabsf(qf[ks][r].x), fabsf(qf[ks][r].y)));
  amax = fmaxf(amax, __shfl_xor_sync(kFullMask, amax, 1));  // the head's 4 lanes
  amax = fmaxf(amax, __shfl_xor_sync(kFullMask, amax, 2));
  const int e = max(mma_fp8::q_shift(amax) + bias, -126);
  const float scale = pow2(e);
#pragma unroll
  for (int ks = 0; ks < D / mma::kK; ++ks)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const mma_fp8::HiLo s = mma_fp8::split_half2(qf[ks][r].x * scale, qf[ks][r].y * scale);
      qa[ks][2 * r] = s.hi;      // row g
      qa[ks][2 * r + 1] = s.lo;  // row g + 8
    }
  return e;
}

template <int D>
__global__ void __launch_bounds__(kThreads, 2)
    mma_split_kernel(const __grid_constant__ detail::SplitParams<Bf16SideView> p) {
  const SplitBlock<Bf16SideView> blk(p);
  if (blk.empty) return;  // this sequence is shorter than the longest one
  const Bf16SideView& kv = p.k[blk.b];
  const Bf16SideView& vv = p.v[blk.b];
  const int64_t s0 = blk.s0, s1 = blk.s1, qrow = blk.qrow;
  const int n = blk.n, nq = p.nq, ld = blk.ld, H = p.kv_heads, h = blk.h, split = blk.split;
  const int tid = blk.tid, lane = blk.lane, warp = blk.warp, g = blk.g;

  extern __shared__ uint4 smem4[];
  uint16_t* stages = reinterpret_cast<uint16_t*>(smem4);
  float* scores = reinterpret_cast<float*>(reinterpret_cast<char*>(smem4) + Smem<D>::kStageBytes);
  const int tiles = (n + kTile - 1) / kTile;

  // K tile 0 in flight while q becomes A fragments.
  load_tile<D>(stages, kv.data, s0, s1, H, h, tid);
  cp_async_commit();

  uint32_t qa[D / mma::kK][4];  // per k-step: (head g high, head g low) x (columns 2tg.., +8)
#pragma unroll
  for (int ks = 0; ks < D / mma::kK; ++ks) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {  // A registers (0, 1), then (2, 3)
      const int d = mma::a_col(lane, 2 * half, 0) + ks * mma::kK;
      float x = 0.0f, y = 0.0f;
      if (g < nq) {
        x = __ldg(p.q + (qrow + g) * D + d);
        y = __ldg(p.q + (qrow + g) * D + d + 1);
      }
      const mma::HiLo s = mma::split_bf16x2(x, y);
      qa[ks][2 * half] = s.hi;      // row g
      qa[ks][2 * half + 1] = s.lo;  // row g + 8
    }
  }

  // ---- scores --------------------------------------------------------------------------------
  for (int i = 0; i < tiles; ++i) {
    if (i + 1 < tiles)
      load_tile<D>(stages + ((i + 1) % kStages) * Smem<D>::kStageHalves, kv.data,
                   s0 + static_cast<int64_t>(i + 1) * kTile, s1, H, h, tid);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    const uint16_t* st = stages + (i % kStages) * Smem<D>::kStageHalves;
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      const int row0 = 16 * warp + 8 * nt;  // the n-tile's first token in the tile
      float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
      for (int ks = 0; ks < D / mma::kK; ks += 2) {
        uint32_t r[4];
        const int row = row0 + mma::k_ldm_row(lane);
        ldmatrix_x4(r, st + mma::chunk_slot<D>(row, 2 * ks + mma::k_ldm_chunk(lane)) * mma::kChunk);
        mma_bf16(c, qa[ks], r[0], r[1]);
        mma_bf16(c, qa[ks + 1], r[2], r[3]);
      }
      const int tok = i * kTile + row0 + mma::c_col(lane, 0);  // tokens tok, tok + 1
      if (g < nq) {
        if (tok < n) scores[g * ld + tok] = (c[0] + c[2]) * p.inv_sqrt_d;
        if (tok + 1 < n) scores[g * ld + tok + 1] = (c[1] + c[3]) * p.inv_sqrt_d;
      }
    }
    __syncthreads();  // the stage is refilled next
  }

  // V tile 0 in flight during the softmax.
  load_tile<D>(stages, vv.data, s0, s1, H, h, tid);
  cp_async_commit();

  // ---- softmax partial
  // ---------------------------------------------------------------------------
  softmax_partial(p, scores, n, nq, ld, qrow, split, warp, lane);
  __syncthreads();

  // ---- values ----------------------------------------------------------------------------------
  constexpr int kNTiles = D / mma::kN;
  float o[kNTiles][4];
#pragma unroll
  for (int j = 0; j < kNTiles; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
  for (int i = 0; i < tiles; ++i) {
    if (i + 1 < tiles)
      load_tile<D>(stages + ((i + 1) % kStages) * Smem<D>::kStageHalves, vv.data,
                   s0 + static_cast<int64_t>(i + 1) * kTile, s1, H, h, tid);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    const uint16_t* st = stages + (i % kStages) * Smem<D>::kStageHalves;
    uint32_t pa[4];  // A: probabilities of head g at this warp's 16 tokens
    p_fragment(pa, scores, g, nq, ld, i * kTile + 16 * warp, n, lane, mma::split_bf16x2);
#pragma unroll
    for (int j = 0; j < kNTiles; j += 2) {
      uint32_t r[4];
      const int row = 16 * warp + mma::v_ldm_row(lane);
      ldmatrix_x4_trans(r, st + mma::chunk_slot<D>(row, j + mma::v_ldm_chunk(lane)) * mma::kChunk);
      mma_bf16(o[j], pa, r[0], r[1]);
      mma_bf16(o[j + 1], pa, r[2], r[3]);
    }
    __syncthreads();
  }
  cp_async_wait<0>();

  // ---- the warps' sums, in a fixed order -------------------------------------------------------
  float* red = reinterpret_cast<float*>(stages);  // [kWarps][8][D]
  if (g < nq) {
#pragma unroll
    for (int j = 0; j < kNTiles; ++j) {
      const int d = j * mma::kN + mma::c_col(lane, 0);
      *reinterpret_cast<float2*>(red + (warp * 8 + g) * D + d) =
          make_float2(o[j][0] + o[j][2], o[j][1] + o[j][3]);
    }
  }
  __syncthreads();
  write_partial<D>(p, red, qrow, split, tid, 1.0f, [](int, int, float s) { return s; });
}

// ---- int caches: KIVI 2- and 4-bit, per-channel keys and per-token values (mma_int.h) ---------
//
// A stage holds kTileI tokens: keys as kWarps runs of 32 tokens (one per warp, each inside one
// token group: [channel][B words], the run's scales and minima), values as kTileI rows of
// D B / 32 words (each warp takes 32 rows, two k-steps of 16) with the rows' scales and minima.
// Everything in fp16 (mma_int.h): codes as -(64 + c), the offset and the minima through two more
// mma's into one accumulator E per run (keys) or channel group (values).
// Keys: q' = q 2^qe (high + low rows, once per block), A = q'_c s_c by fold_f16x2 per run,
// score = (E - C) 2^-qe / sqrt(D), E = -64 sum_c a_c + sum_c q'_c m_c.
// Values: p' = p 2^ve (ve from the split's largest value scale, so p' s < 2^14), A = p'_t s_t
// per channel group, o = (E - C) 2^-ve, E = -64 sum_t a_t + sum_t p'_t m_t. Tokens of the
// float32 residual window take plain fp32 loops (few: at most the window).
// Values at GQA <= 4 (template flag T, chosen in launch_mma_int): the transposed product
// (mma_int.h), A = codes (16 channels x 16 tokens of a k-step: 256 codes an mma, twice the
// direct form's), B = p'_t s_t with columns h / 4 + h the heads' high / low parts. The softmax
// stores the quantized tokens' p' as pack_p words; a lane's B comes from two of them by
// p_select and fold_b (the direct form's three instructions a pair), the offsets go to one
// accumulator per channel group (A = -1), the minima to one more (A row g = m of group g % NCG),
// so the loop holds D / 16 code mma's per k-step plus NCG + 1 (the direct form: D / 8 + 2 NCG) and
// 8 D / 32 + 4 + 4 NCG accumulator registers (the direct form: 16 D / 32 + 4 NCG). Only the last
// tile reads p' under a predicate (tokens past the quantized ones must be zero rows of B).

constexpr int kTileI = kWarps * mma_int::kSpan;  // tokens per int stage

template <int D, int B>
struct IntSmem {
  // Key runs a warp takes a tile (D 64: two, so that the loop's copies, waits and addressing
  // spread over twice the codes); a key stage holds kKeyRuns kWarps runs of 32 tokens, kKeyTile.
  static constexpr int kKeyRuns = D == 64 ? 2 : 1;
  static constexpr int kKeyTile = kKeyRuns * kTileI;
  // Words per stage: keys' staged runs (mma_int.h: padded), values kTileI rows of D B / 32.
  static constexpr int kWords = kKeyRuns * kWarps * mma_int::kKeyRunWords<D, B>;
  // Halves per array (scales, minima): keys' staged runs' pairs, values kTileI x n_cg.
  static constexpr int kParams = kKeyRuns * kWarps * 2 * mma_int::kKeyParamWords<D>;
  static_assert(kWords >= kTileI * D * B / 32 && kParams >= kTileI * (D / 32), "values fit");
  static constexpr int kStageBytes = kWords * 4 + 2 * kParams * 2;
  static constexpr int kRedBytes = kWarps * 8 * D * 4;  // the warps' output sums, at the end
  static constexpr int kBytes =
      kStages * kStageBytes > kRedBytes ? kStages* kStageBytes : kRedBytes;
  static constexpr int kQBytes = D / 16 * 32 * 16;  // q' A fragments: [k-step][lane] uint4
  // The offset mma's constant operands (keys' B, the transposed values' A), read from shared
  // memory once a tile so that ptxas keeps them as one register pair / quad (as immediates it
  // rebuilds them per mma), by one ld.shared from a 32-bit address held in a register (through a
  // generic pointer ptxas recomputes the shared window's base every tile).
  static constexpr int kConstBytes = 32;
  static_assert(kStageBytes % 16 == 0 && (kWords * 4) % 16 == 0, "16-byte copies");
  static size_t bytes(int64_t score_floats) {
    return static_cast<size_t>(kBytes + kQBytes + kConstBytes) +
           static_cast<size_t>(score_floats) * 4;
  }
};

/// N (4, 8 or 16) bytes global -> shared address dst, asynchronously; in = false zero-fills.
template <int N>
__device__ __forceinline__ void cp_async_to(uint32_t dst, const void* src, bool in) {
  if constexpr (N == 16) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(in ? 16 : 0));
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(dst), "l"(src), "n"(N),
                 "r"(in ? N : 0));
  }
}

/// A lane's share of its warp's key-run copies, set up once per block: warp w takes runs
/// R = w + kWarps u (u < kKeyRuns), tokens s0 + kKeyTile i + 32 R .. + 32 of tile i (inside one
/// token group: G divides kTileI, s0 a multiple of G), so from run to run every source moves by
/// the same kTileI / G groups (step, pstep; a tile: kKeyRuns of them). The copies stage the run
/// as mma_int.h's key_slot / key_param_slot place it (4-byte copies: a lane's words of a k-step,
/// and its scale and minimum pairs of two, one 16-byte load each in the loop): lane L copies the
/// B words of channels L + 32 x (a channel's words of the run are contiguous, channels a group's
/// words apart; one path for every G, no branch in the loop). Scales (lanes
/// < 16) and minima (lanes >= 16): pairs L % 16 + 16 x.
template <int D, int B>
struct KeyRunCopy {
  const uint32_t* src;   // the lane's first source word, at the next tile
  const uint16_t* psrc;  // the lane's first scale or minimum pair, at the next tile
  int step, pstep;       // per tile: words, halves
  int rel;               // the run's first token at the next tile, from s0
  uint32_t dst, pdst;    // shared-memory byte offsets within a stage
  __device__ KeyRunCopy(const IntSideView& k, int64_t s0, int H, int h, int warp, int lane) {
    using S = IntSmem<D, B>;
    namespace mi = mma_int;
    const kivi::ChannelLayout L{H, D, k.group, B};
    rel = mi::kSpan * warp;
    const int64_t t0 = s0 + rel, gi = t0 / k.group, gstep = kTileI / k.group;
    const int wpg = static_cast<int>(L.words_per_group());
    step = static_cast<int>(L.word_index(gi + gstep, h, 0) - L.word_index(gi, h, 0));
    src = k.words + L.word_index(gi, h, 0) + (t0 % k.group) / kivi::codes_per_word(B) + lane * wpg;
    dst = (warp * mi::kKeyRunWords<D, B> + mi::key_slot<D, B>(lane, 0)) * 4;
    const int which = lane / 16;  // 0: scales, 1: minima
    pstep = static_cast<int>(L.param_index(gi + gstep, h, 0) - L.param_index(gi, h, 0));
    psrc = (which ? k.mins : k.scales) + L.param_index(gi, h, 0) + 2 * (lane % 16);
    pdst = S::kWords * 4 + (which * S::kParams / 2 + warp * mi::kKeyParamWords<D> +
                            mi::key_param_slot<D>(lane % 16)) *
                               4;
  }
  /// Issues the next tile's copies into the stage at shared address st, each run's if it starts
  /// below q1 - s0 (kstride = 32 wpg: the words from channel c to c + 32), then steps.
  __device__ __forceinline__ void load(uint32_t st, int q1_rel, int kstride) {
    using S = IntSmem<D, B>;
    namespace mi = mma_int;
#pragma unroll
    for (int u = 0; u < S::kKeyRuns; ++u) {  // run warp + kWarps u
      if (rel + u * kTileI < q1_rel) {
        const uint32_t d = st + dst + u * kWarps * mi::kKeyRunWords<D, B> * 4;
        const uint32_t* s = src + u * step;
#pragma unroll
        for (int x = 0; x < D / 32; ++x)
#pragma unroll
          for (int w = 0; w < B; ++w)
            cp_async_to<4>(d + 4 * mi::key_copy_offset<D>(x, w), s + x * kstride + w, true);
        const uint32_t pd = st + pdst + u * kWarps * mi::kKeyParamWords<D> * 4;
        const uint16_t* ps = psrc + u * pstep;
#pragma unroll
        for (int x = 0; x < D / 32; ++x)
          cp_async_to<4>(pd + 4 * mi::key_param_copy_offset(x), ps + 32 * x, true);
      }
    }
    src += S::kKeyRuns * step;
    psrc += S::kKeyRuns * pstep;
    rel += S::kKeyTile;
  }
};

/// A lane's share of its warp's value-row copies, set up once per block: row r = 32 warp + lane
/// of every tile (token s0 + kTileI i + r: D B / 32 words by 16-byte copies, NCG scales and NCG
/// minima by 4-byte copies); rows at or past nv (from s0) are zero-filled (codes 0, scales 0,
/// minima 0: with a finite p they add nothing), their sources staying on the lane's last quantized
/// row (or row s0), so no address leaves the cache and no view pointer is reloaded.
template <int D, int B, int NCG>
struct ValueRowCopy {
  static constexpr int kRow = D * B / 32;  // words of a row
  const uint32_t* src;                     // the lane's row at the next tile
  const uint16_t *ssrc, *msrc;             // its scales and minima
  int step, pstep;                         // per tile: words, halves
  int rem;                                 // quantized rows from the lane's row at the next tile
  __device__ ValueRowCopy(const IntSideView& v, int64_t s0, int nv, int H, int h, int warp,
                          int lane) {
    const int rel = mma_int::kSpan * warp + lane;  // = the thread's index
    rem = nv - rel;
    const int64_t row = (s0 + (rem > 0 ? rel : 0)) * H + h;
    src = v.words + row * kRow;
    ssrc = v.scales + row * NCG;
    msrc = v.mins + row * NCG;
    step = kTileI * H * kRow;
    pstep = kTileI * H * NCG;
  }
  /// Issues the next tile's copies into the stage at shared address st (row r of the tile at
  /// byte r kRow 4, its parameters after the words), then steps.
  __device__ __forceinline__ void load(uint32_t st) {
    using S = IntSmem<D, B>;
    static_assert(mma_int::kSpan == 32, "row r of a tile is thread r's");
    const uint32_t r = threadIdx.x, dst = st + r * kRow * 4,
                   pdst = st + S::kWords * 4 + r * NCG * 2;
    const bool in = rem > 0;
#pragma unroll
    for (int c = 0; c < kRow / 4; ++c) cp_async_to<16>(dst + 16 * c, src + 4 * c, in);
#pragma unroll
    for (int c = 0; c < NCG; c += 2) {  // two groups' scales (minima) a copy
      cp_async_to<4>(pdst + 2 * c, ssrc + c, in);
      cp_async_to<4>(pdst + S::kParams * 2 + 2 * c, msrc + c, in);
    }
    if (rem > kTileI) {  // the row of the next tile is quantized too
      src += step;
      ssrc += pstep;
      msrc += pstep;
    }
    rem -= kTileI;
  }
};

/// The paired slices of channel set cs that a lane takes from a value k-step (tile rows rk + 2 tg +
/// 8 r and the next, r = 0, 1): the direct form's B registers and the transposed form's A.
template <int D, int B>
__device__ __forceinline__ void value_slices(uint32_t (&y)[2], const uint32_t* wv, int rk, int cs,
                                             int lane) {
  namespace mi = mma_int;
  const int g = mma::group_of(lane);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = rk + mma::a_col(lane, 2 * r, 0);
    y[r] = mi::pair_slices<B>(wv[mi::value_word<D, B>(row, cs, g)],
                              wv[mi::value_word<D, B>(row + 1, cs, g)], mi::slice_of<B>(g));
  }
}

/// The largest of the warps' maxima (written by every warp before a barrier).
__device__ __forceinline__ unsigned block_max(const unsigned* wmax) {
  unsigned m = wmax[0];
#pragma unroll
  for (int w = 1; w < kWarps; ++w) m = max(m, wmax[w]);
  return m;
}

/// The largest |value| of a split's per-token value scales (fp16 bits; the block's maximum in
/// wmax[warp]; block_max reads the block's after a barrier): one pass over [s0, q1), ncg halves
/// a token (ncg even).
__device__ __forceinline__ void value_scale_max(const IntSideView& v, int64_t s0, int64_t q1, int H,
                                                int h, int ncg, int tid, unsigned* wmax) {
  unsigned m = 0;
  for (int64_t t = s0 + tid; t < q1; t += kThreads) {
    const uint32_t* w = reinterpret_cast<const uint32_t*>(v.scales + (t * H + h) * ncg);
    for (int c = 0; c < ncg / 2; ++c) {
      const uint32_t x = __ldg(w + c);
      m = max(m, max(x & 0x7fffu, (x >> 16) & 0x7fffu));
    }
  }
  m = __reduce_max_sync(kFullMask, m);
  if (tid % 32 == 0) wmax[tid / 32] = m;
}

template <int D, int B, int NCG, bool T>
__global__ void __launch_bounds__(kThreads, 4)
    mma_int_split_kernel(const __grid_constant__ detail::SplitParams<IntSideView> p) {
  using S = IntSmem<D, B>;
  namespace mi = mma_int;
  const SplitBlock<IntSideView> blk(p);
  if (blk.empty) return;  // this sequence is shorter than the longest one
  const IntSideView& kv = p.k[blk.b];
  const IntSideView& vv = p.v[blk.b];
  const int64_t s0 = blk.s0, s1 = blk.s1;
  const int n = blk.n, nq = p.nq, ld = blk.ld, H = p.kv_heads, h = blk.h;
  const int tid = blk.tid, lane = blk.lane, warp = blk.warp, g = blk.g;

  extern __shared__ uint4 smem4[];
  __shared__ unsigned wmax[kWarps];  // the warps' largest value scales (fp16 bits)
  char* stages = reinterpret_cast<char*>(smem4);
  uint4* qsm = reinterpret_cast<uint4*>(stages + S::kBytes);  // q' fragments, [k-step][lane]
  // [0]: B of the key offset mma (the offset constant); [1]: A of the transposed values' (-1).
  uint4* konst = reinterpret_cast<uint4*>(stages + S::kBytes + S::kQBytes);
  float* scores = reinterpret_cast<float*>(stages + S::kBytes + S::kQBytes + S::kConstBytes);

  // Key tile 0 in flight while q becomes fp16 A fragments.
  const int64_t kq1 = min(s1, max(s0, kv.quantized_tokens));  // quantized keys: [s0, kq1)
  const int ktiles = static_cast<int>((kq1 - s0 + S::kKeyTile - 1) / S::kKeyTile);
  const uint32_t st0 = smem_addr(stages);
  const uint32_t kconst = smem_addr(konst);
  KeyRunCopy<D, B> kcopy(kv, s0, H, h, warp, lane);
  const int kstride = 32 * static_cast<int>(kivi::words_for(kv.group, B));  // channel c -> c + 32
  const int kq1_rel = static_cast<int>(kq1 - s0);
  if (ktiles > 0) kcopy.load(st0, kq1_rel, kstride);
  cp_async_commit();

  // q' = q 2^qe (max |q'| in [1/2, 1): q' s < 65504 for every fp16 s) as high + low fp16 rows.
  // Kept in shared memory (one copy for the block's warps; the registers go to the loop).
  int qe;
  {
    uint32_t qa[D / mma::kK][4];
    qe = q_fragments_f16<D>(qa, p.q + blk.qrow * D, g < nq, lane, -15, [&](int ks, int r, int e) {
      return mma::a_col(lane, 2 * r, 0) + ks * mma::kK + e;
    });
    if (warp == 0)
#pragma unroll
      for (int ks = 0; ks < D / mma::kK; ++ks)
        qsm[ks * 32 + lane] = make_uint4(qa[ks][0], qa[ks][1], qa[ks][2], qa[ks][3]);
  }
  const float kfac = pow2(-qe) * p.inv_sqrt_d;
  if (tid == 0) {  // read after the loops' barriers
    const uint32_t ko = B == 2 ? mi::kMinus1x2 : mi::kMinus64x2;
    konst[0] = make_uint4(ko, ko, ko, ko);
    konst[1] = make_uint4(mi::kMinus1x2, mi::kMinus1x2, mi::kMinus1x2, mi::kMinus1x2);
  }

  // ---- scores, quantized keys: kKeyRuns 32-token runs per warp and tile -----------------------
  for (int i = 0; i < ktiles; ++i) {
    if (i + 1 < ktiles) kcopy.load(st0 + ((i + 1) % kStages) * S::kStageBytes, kq1_rel, kstride);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
#pragma unroll
    for (int u = 0; u < S::kKeyRuns; ++u) {
      const int run = warp + kWarps * u;                 // the run's index in the stage
      const int r0 = i * S::kKeyTile + mi::kSpan * run;  // the run's first token in the split
      // A run at or past q1 (the last tile) computes on stale words; its scores are not stored.
      const char* st = stages + (i % kStages) * S::kStageBytes;
      // The staged run (mma_int.h): the lane's words of k-step ks are wl[ks] (channels
      // 16 ks + 2 tg + 8 r2 + e at 2 r2 + e, its slice's word each), its scale and minimum pairs
      // of k-steps 2 k2, 2 k2 + 1 are sl[k2], ml[k2] (channels 16 ks + 2 tg + 8 r2 at
      // 2 (ks % 2) + r2).
      const uint32_t* wr = reinterpret_cast<const uint32_t*>(st) + run * mi::kKeyRunWords<D, B>;
      const uint32_t* sc =
          reinterpret_cast<const uint32_t*>(st + S::kWords * 4) + run * mi::kKeyParamWords<D>;
      const uint32_t* mn = sc + S::kParams / 2;
      const uint4* wl = reinterpret_cast<const uint4*>(wr + mi::key_lane_slot<D, B>(g, blk.tg));
      const uint4* sl = reinterpret_cast<const uint4*>(sc + mi::key_param_slot<D>(blk.tg));
      const uint4* ml = reinterpret_cast<const uint4*>(mn + mi::key_param_slot<D>(blk.tg));
      const uint4 ko = lds128(kconst);
      // ex: -64 sum a (4-bit; 2-bit: -sum a, in e1) + sum q' m; the columns are alike.
      float c[mi::kE][4] = {}, ex[4] = {}, e1[4] = {};
      uint4 s4{}, m4{};
#pragma unroll
      for (int ks = 0; ks < D / mma::kK; ++ks) {
        uint32_t a[4], m2[2], y[2];
        const uint4 q4 = qsm[ks * 32 + lane];
        const uint32_t qa[4] = {q4.x, q4.y, q4.z, q4.w};
        const uint4 w4 = wl[ks];
        const uint32_t wq[4] = {w4.x, w4.y, w4.z, w4.w};
        if (ks % 2 == 0) {
          s4 = sl[ks / 2];
          m4 = ml[ks / 2];
        }
        const uint32_t sq[4] = {s4.x, s4.y, s4.z, s4.w}, mq[4] = {m4.x, m4.y, m4.z, m4.w};
#pragma unroll
        for (int r2 = 0; r2 < 2; ++r2) {  // channels d, d + 1: A registers 2 r2 (high), +1 (low)
          const mi::HiLo16 f = mi::fold_f16x2(qa[2 * r2], qa[2 * r2 + 1], sq[2 * (ks % 2) + r2]);
          a[2 * r2] = f.hi;
          a[2 * r2 + 1] = f.lo;
          m2[r2] = mq[2 * (ks % 2) + r2];
          y[r2] = mi::pair_slices<B>(wq[2 * r2], wq[2 * r2 + 1], mi::slice_of<B>(g));
        }
        if constexpr (B == 2) {  // one shift per two codes; offsets 64 and 16 (key_code_half2)
#pragma unroll
          for (int j = 0; j < mi::kE; ++j)
            mma_f16(c[j], a, mi::key_code_half2(y[0], j), mi::key_code_half2(y[1], j));
          mma_f16(e1, a, ko.x, ko.y);  // -sum_c a_c
        } else {
#pragma unroll
          for (int j = 0; j < mi::kE; ++j)
            mma_f16(c[j], a, mi::code_half<B>(y[0], j), mi::code_half<B>(y[1], j));
          mma_f16(ex, a, ko.x, ko.y);  // -64 sum_c a_c: the codes' offsets
        }
        mma_f16(ex, qa, m2[0], m2[1]);  // sum_c q'_c m_c
      }
      if (g < nq && r0 < kq1_rel) {
        const float e = (ex[0] + ex[2]) * kfac, o1 = (e1[0] + e1[2]) * kfac;  // high + low rows
        static_assert(mi::kE == 4, "a column's kE scores are set_index(c, 0) .. + 3: one float4");
        float* row = scores + g * ld + r0;  // 16-byte aligned: ld and r0 multiples of 32
#pragma unroll
        for (int x = 0; x < 2; ++x) {
          float v[mi::kE];
#pragma unroll
          for (int j = 0; j < mi::kE; ++j)
            v[j] = fmaf(-(c[j][x] + c[j][x + 2]), kfac, B == 2 ? fmaf(o1, mi::key_base2(j), e) : e);
          *reinterpret_cast<float4*>(row + mi::set_index(mma::c_col(lane, x), 0)) =
              make_float4(v[0], v[1], v[2], v[3]);
        }
      }
    }
    __syncthreads();  // the stage is refilled next
  }
  // ---- scores, the residual window's keys (fp32) -----------------------------------------------
  for (int64_t t = kq1 + tid; t < s1; t += kThreads) {
    const float* r = kv.residual + ((t - kv.quantized_tokens) * H + h) * D;
    for (int i = 0; i < nq; ++i) {
      const float* qi = p.q + (blk.qrow + i) * D;
      float acc = 0.0f;
#pragma unroll 8
      for (int d = 0; d < D; ++d) acc = fmaf(__ldg(qi + d), __ldg(r + d), acc);
      scores[i * ld + (t - s0)] = acc * p.inv_sqrt_d;
    }
  }

  // Value tile 0 in flight during the softmax; the split's largest value scale.
  const int64_t vq1 = min(s1, max(s0, vv.quantized_tokens));  // quantized values: [s0, vq1)
  const int nv = static_cast<int>(vq1 - s0);
  const int vtiles = (nv + kTileI - 1) / kTileI;
  ValueRowCopy<D, B, NCG> vcopy(vv, s0, nv, H, h, warp, lane);
  if (vtiles > 0) vcopy.load(st0);
  cp_async_commit();
  value_scale_max(vv, s0, vq1, H, h, NCG, tid, wmax);
  __syncthreads();  // every score written, wmax complete

  // ---- softmax partial: p' = p 2^ve in the score buffer
  // ------------------------------------------
  const int ve = mma_int::value_shift(block_max(wmax));
  softmax_partial(p, scores, n, nq, ld, blk.qrow, blk.split, warp, lane, pow2(ve), nullptr, 0,
                  T ? nv : 0);
  __syncthreads();
  constexpr int kSets = D / mi::kSpan, kSetsPerGroup = kSets / NCG;
  float* red = reinterpret_cast<float*>(stages);  // [kWarps][8][D], after the loop
  if constexpr (T) {
    // ---- values, transposed (nq <= 4): codes as A, p'_t s_t as B (mma_int.h) -----------------
    float o[kSets][2][4] = {}, em[4] = {}, eo[NCG][4] = {};  // minima (row cg), offsets
    const bool low = g >= mi::kTHeads;  // this lane's B column: head hh's low part
    const int hh = g % mi::kTHeads;
    const uint32_t psel = mi::p_selector(low), pmask = mi::p_mask(low);
    // The lane's first p' word (k-step 0, B register 0) of the next tile, and how many words from
    // it are pack_p words: tiles but the last are quantized throughout, so only the last reads
    // zero past them (an absent head's lanes read head 0's words: their columns are not written).
    const int p0 = mi::kSpan * warp + mma::b_row(lane, 0, 0);
    const uint32_t* pw = reinterpret_cast<const uint32_t*>(scores) + (hh < nq ? hh : 0) * ld + p0;
    const int prem = nv - p0 - (vtiles - 1) * kTileI;  // in the last tile
    static_assert(NCG % 2 == 0, "a lane's two minima groups share a word");
    const int mcg0 = mi::t_min_group(g, NCG, 0);
    const uint32_t msel0 = mi::half_pair_selector(mcg0 % 2),
                   msel1 = mi::half_pair_selector(mi::t_min_group(g, NCG, 1) % 2);
    for (int i = 0; i < vtiles; ++i) {
      if (i + 1 < vtiles) vcopy.load(st0 + ((i + 1) % kStages) * S::kStageBytes);
      cp_async_commit();
      cp_async_wait<1>();
      __syncthreads();
      const char* st = stages + (i % kStages) * S::kStageBytes;
      const uint32_t* wv = reinterpret_cast<const uint32_t*>(st);
      const uint32_t* sc = reinterpret_cast<const uint32_t*>(st + S::kWords * 4);  // [row][NCG/2]
      const uint32_t* mn = sc + S::kParams / 2;
      const uint4 ao4 = lds128(kconst + 16);  // (a register quad: S::kConstBytes)
      const uint32_t ao[4] = {ao4.x, ao4.y, ao4.z, ao4.w};
      // The lane's p' words of both k-steps, [kk][r]: tokens 16 kk + 8 r (+ 1), 8-byte aligned
      // (ld, a multiple of the key group, and the offsets are even).
      uint2 pv[4];
      if (i + 1 < vtiles) {
#pragma unroll
        for (int x = 0; x < 4; ++x) pv[x] = *reinterpret_cast<const uint2*>(pw + 8 * x);
      } else {
#pragma unroll
        for (int x = 0; x < 4; ++x) {
          pv[x] = 8 * x < prem ? *reinterpret_cast<const uint2*>(pw + 8 * x) : make_uint2(0u, 0u);
          if (8 * x + 1 >= prem) pv[x].y = 0u;
        }
      }
      pw += kTileI;
#pragma unroll
      for (int kk = 0; kk < 2; ++kk) {
        const int rk = mi::kSpan * warp + mma::kK * kk;  // the k-step's first row in the tile
        mi::HiLo16 xs[2];                                // B inputs, tokens 2 tg + 8 r, + 1
        uint32_t am[4];  // minima A: rows g (group mcg0), g + 8 (the word's other group)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int row = rk + mma::b_row(lane, r, 0);
          xs[r] = mi::p_select(pv[2 * kk + r].x, pv[2 * kk + r].y, psel, pmask);
          const int w = row * (NCG / 2) + mcg0 / 2;  // groups mcg0 and mcg1 = mcg0 ^ 1
          am[2 * r] = mi::byte_perm(mn[w], mn[w + NCG / 2], msel0);
          am[2 * r + 1] = mi::byte_perm(mn[w], mn[w + NCG / 2], msel1);
        }
        mma_f16(em, am, xs[0].lo, xs[1].lo);  // sum_t p'_t m_t (row cg: group cg)
#pragma unroll
        for (int cg = 0; cg < NCG; ++cg) {
          uint32_t b[2];
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            const int w = (rk + mma::b_row(lane, r, 0)) * (NCG / 2) + cg / 2;
            b[r] = mi::fold_b(
                xs[r], mi::byte_perm(sc[w], sc[w + NCG / 2], mi::half_pair_selector(cg % 2)));
          }
          mma_f16(eo[cg], ao, b[0], b[1]);  // -sum_t b_t (every row): the offsets
#pragma unroll
          for (int u = 0; u < kSetsPerGroup; ++u) {
            const int cs = cg * kSetsPerGroup + u;
            uint32_t y[2];
            value_slices<D, B>(y, wv, rk, cs, lane);
#pragma unroll
            for (int mt = 0; mt < 2; ++mt) {
              const uint32_t a[4] = {mi::t_code_half<B>(y[0], mi::t_code(mt, 0)),
                                     mi::t_code_half<B>(y[0], mi::t_code(mt, 1)),
                                     mi::t_code_half<B>(y[1], mi::t_code(mt, 2)),
                                     mi::t_code_half<B>(y[1], mi::t_code(mt, 3))};
              mma_f16(o[cs][mt], a, b[0], b[1]);
            }
          }
        }
      }
      __syncthreads();
    }
    cp_async_wait<0>();
    __syncthreads();
    // Columns h and h + 4 (lanes tg, tg ^ 2) summed; lanes tg < 2 then hold heads 2 tg + x.
#pragma unroll
    for (int x = 0; x < 2; ++x) {
      em[x] += __shfl_xor_sync(kFullMask, em[x], 2);
#pragma unroll
      for (int cg = 0; cg < NCG; ++cg) eo[cg][x] += __shfl_xor_sync(kFullMask, eo[cg][x], 2);
    }
#pragma unroll
    for (int cs = 0; cs < kSets; ++cs)
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int x = 0; x < 4; ++x) o[cs][mt][x] += __shfl_xor_sync(kFullMask, o[cs][mt][x], 2);
    float emc[NCG][2];  // EM row cg at this lane's columns (lane group cg holds it)
#pragma unroll
    for (int cg = 0; cg < NCG; ++cg)
#pragma unroll
      for (int x = 0; x < 2; ++x) emc[cg][x] = __shfl_sync(kFullMask, em[x], cg * 4 + blk.tg);
#pragma unroll
    for (int x = 0; x < 2; ++x) {
      const int hd = 2 * blk.tg + x;
      if (blk.tg < 2 && hd < nq) {
#pragma unroll
        for (int cs = 0; cs < kSets; ++cs) {
          const int cg = cs / kSetsPerGroup;
#pragma unroll
          for (int mt = 0; mt < 2; ++mt)
#pragma unroll
            for (int i2 = 0; i2 < 2; ++i2) {
              const int d = cs * mi::kSpan + mi::t_channel(mt, g + 8 * i2);
              red[(warp * 8 + hd) * D + d] =
                  fmaf(mi::t_base<B>(mi::t_code(mt, i2)), eo[cg][x], emc[cg][x]) -
                  o[cs][mt][2 * i2 + x];
            }
        }
      }
    }
  } else {
    // ---- values, quantized: each warp 32 rows (two k-steps) of a tile, every channel group
    // ---------
    float o[kSets][mi::kE][4] = {}, ex[NCG][4] = {};
    for (int i = 0; i < vtiles; ++i) {
      if (i + 1 < vtiles) vcopy.load(st0 + ((i + 1) % kStages) * S::kStageBytes);
      cp_async_commit();
      cp_async_wait<1>();
      __syncthreads();
      const char* st = stages + (i % kStages) * S::kStageBytes;
      const uint32_t* wv = reinterpret_cast<const uint32_t*>(st);
      const uint32_t* sc = reinterpret_cast<const uint32_t*>(st + S::kWords * 4);  // [row][NCG / 2]
      const uint32_t* mn = sc + S::kParams / 2;
#pragma unroll
      for (int kk = 0; kk < 2; ++kk) {
        const int rk = mi::kSpan * warp + mma::kK * kk;  // the k-step's first row in the tile
        uint32_t pa[4];  // p' of head g at this lane's A columns, high + low fp16 rows
        p_fragment(pa, scores, g, nq, ld, i * kTileI + rk, nv, lane, mma_fp8::split_half2);
#pragma unroll
        for (int cg = 0; cg < NCG; ++cg) {
          uint32_t a[4], m2[2];
#pragma unroll
          for (int r2 = 0; r2 < 2; ++r2) {
            const int row = rk + mma::a_col(lane, 2 * r2, 0);  // rows row, row + 1
            const uint32_t sel = mi::half_pair_selector(cg % 2);
            const int w = row * (NCG / 2) + cg / 2;
            const uint32_t s2 = mi::byte_perm(sc[w], sc[w + NCG / 2], sel);
            m2[r2] = mi::byte_perm(mn[w], mn[w + NCG / 2], sel);
            const mi::HiLo16 f = mi::fold_f16x2(pa[2 * r2], pa[2 * r2 + 1], s2);
            a[2 * r2] = f.hi;
            a[2 * r2 + 1] = f.lo;
          }
          mma_f16(ex[cg], a, mi::kMinus64x2, mi::kMinus64x2);  // -64 sum_t a_t: the offsets
          mma_f16(ex[cg], pa, m2[0], m2[1]);                   // sum_t p'_t m_t
#pragma unroll
          for (int u = 0; u < kSetsPerGroup; ++u) {
            const int cs = cg * kSetsPerGroup + u;
            uint32_t y[2];
            value_slices<D, B>(y, wv, rk, cs, lane);
#pragma unroll
            for (int j = 0; j < mi::kE; ++j)
              mma_f16(o[cs][j], a, mi::code_half<B>(y[0], j), mi::code_half<B>(y[1], j));
          }
        }
      }
      __syncthreads();
    }
    cp_async_wait<0>();
    __syncthreads();

    // ---- the warps' sums, in a fixed order, plus the residual window's values (fp32)
    // -------------
    if (g < nq) {
#pragma unroll
      for (int cs = 0; cs < kSets; ++cs) {
        const int cg = cs / kSetsPerGroup;
        const float e = ex[cg][0] + ex[cg][2];  // columns alike
#pragma unroll
        for (int j = 0; j < mi::kE; ++j)
#pragma unroll
          for (int x = 0; x < 2; ++x) {
            const int d = cs * mi::kSpan + mi::set_index(mma::c_col(lane, x), j);
            red[(warp * 8 + g) * D + d] = e - (o[cs][j][x] + o[cs][j][x + 2]);
          }
      }
    }
  }
  __syncthreads();
  const float vfac = pow2(-ve);
  write_partial<D>(p, red, blk.qrow, blk.split, tid, vfac, [&](int i, int d, float s) {
    for (int64_t t = vq1; t < s1; ++t)  // the residual window's values (fp32)
      s = fmaf(scores[i * ld + (t - s0)],
               __ldg(vv.residual + ((t - vv.quantized_tokens) * H + h) * D + d), s);
    return s;
  });
}

// ---- FP8 caches: e4m3 / e5m2 / e4m3fnuz, tensor, head, token or channel scales (mma_fp8.h) ----
//
// As the bf16 kernel, with fp16 operands: a stage holds kTile rows of D code bytes (swizzled
// 16-byte chunks, mma_fp8::chunk_offset); B registers come from 16-byte shared loads of codes, two
// codes per register by the integer conversion (mma_fp8.h); q (times a power of two per head) and
// p (times 2^kPShift) are fp16 high + low A rows. A tensor / head scale and the powers of two
// multiply each score and each output once. Token scales: a key's scale multiplies its score (one
// load and multiply a score); a value's scale folds into p in the softmax (p_t s_t 2^pe, pe from
// the split's largest value scale, mma_fp8::token_pshift, so p' < 2^14). Channel scales: a key's
// fold into q before its high / low split (q_c s_c, q_fragments_f16), a value's multiply each
// output channel once (write_partial); neither touches the loops.

template <int D>
struct Fp8Smem {
  static constexpr int kStageBytes = kTile * D;
  static constexpr int kRedBytes = kWarps * 8 * D * 4;
  static constexpr int kBytes =
      kStages * kStageBytes > kRedBytes ? kStages* kStageBytes : kRedBytes;
  static size_t bytes(int64_t score_floats) {
    return static_cast<size_t>(kBytes) + static_cast<size_t>(score_floats) * 4;
  }
};

/// A thread's share of the copies of one FP8 tile: rows r0 + k kRowStep (k < kPer), chunk c;
/// the index math once per block: a step of kRowStep rows (16 or 32: a multiple of 8) moves a
/// chunk's swizzled offset by kRowStep D bytes (mma_fp8::chunk_offset, host-tested).
template <int D>
struct Fp8TileCopy {
  static constexpr int kChunks = D / mma_fp8::kChunkBytes;  // per row
  static constexpr int kRowStep = kThreads / kChunks;
  static constexpr int kPer = kTile / kRowStep;
  static_assert(kTile % kRowStep == 0, "whole steps");
  int r0, dst0;
  int64_t off0;  // element offset of (row r0, head h, chunk c) from a tile's first token
  int64_t row;   // elements per token: H D
  __device__ Fp8TileCopy(int tid, int H, int h)
      : r0(tid / kChunks),
        dst0(mma_fp8::chunk_offset<D>(tid / kChunks, tid % kChunks)),
        off0((static_cast<int64_t>(tid / kChunks) * H + h) * D + (tid % kChunks) * 16),
        row(static_cast<int64_t>(H) * D) {}
  /// Issues the copies of tile [t0, t0 + kTile) into `stage`; rows at or past t_end are
  /// zero-filled (their source clamped to the tile's first row).
  __device__ __forceinline__ void load(char* stage, const uint8_t* codes, int64_t t0,
                                       int64_t t_end) const {
    const uint8_t* base = codes + t0 * row;
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      const bool in = t0 + r0 + k * kRowStep < t_end;
      cp_async16(stage + dst0 + k * kRowStep * D, in ? base + off0 + k * kRowStep * row : base,
                 in ? 16 : 0);
    }
  }
};

/// The scale of a tensor- or head-scaled side for head h, 1 otherwise.
__device__ __forceinline__ float fp8_head_scale(const Fp8SideView& s, int h) {
  // per token: fp8_token_scale; per channel: fp8_channel_scales
  if (s.gran == Granularity::Token || s.gran == Granularity::Channel) return 1.0f;
  return __ldg(s.scales + (s.gran == Granularity::Head ? h : 0));
}

/// Head h's D channel scales (index h D + c, fp8/scale.h) of a channel-scaled side, else null.
__device__ __forceinline__ const float* fp8_channel_scales(const Fp8SideView& s, int h, int D) {
  return s.gran == Granularity::Channel ? s.scales + static_cast<int64_t>(h) * D : nullptr;
}

/// The scale of token t (absolute) of a token-scaled side, 1 otherwise (head / tensor scales:
/// fp8_head_scale).
__device__ __forceinline__ float fp8_token_scale(const Fp8SideView& s, int64_t t, int H, int h) {
  return s.gran == Granularity::Token ? __ldg(s.scales + t * H + h) : 1.0f;
}

/// The largest |token scale| of [s0, s1) of a token-scaled side (float bits, the warp's into
/// wmax[warp]; block_max reads the block's after a barrier).
__device__ __forceinline__ void fp8_token_scale_max(const Fp8SideView& s, int64_t s0, int64_t s1,
                                                    int H, int h, int tid, unsigned* wmax) {
  float m = 0.0f;
  for (int64_t t = s0 + tid; t < s1; t += kThreads)
    m = fmaxf(m, fabsf(__ldg(s.scales + t * H + h)));
  const unsigned b = __reduce_max_sync(kFullMask, float_bits(m));  // non-negative: ordered as ints
  if (tid % 32 == 0) wmax[tid / 32] = b;
}

template <int D, Fp8Format F>
__global__ void __launch_bounds__(kThreads, 2)
    mma_fp8_split_kernel(const __grid_constant__ detail::SplitParams<Fp8SideView> p) {
  using S = Fp8Smem<D>;
  namespace mf = mma_fp8;
  const SplitBlock<Fp8SideView> blk(p);
  if (blk.empty) return;  // this sequence is shorter than the longest one
  const Fp8SideView& kv = p.k[blk.b];
  const Fp8SideView& vv = p.v[blk.b];
  const int64_t s0 = blk.s0, s1 = blk.s1, qrow = blk.qrow;
  const int n = blk.n, nq = p.nq, ld = blk.ld, H = p.kv_heads, h = blk.h, split = blk.split;
  const int tid = blk.tid, lane = blk.lane, warp = blk.warp, g = blk.g, tg = blk.tg;

  extern __shared__ uint4 smem4[];
  __shared__ unsigned wmax[kWarps];  // the warps' largest value token scales (float bits)
  char* stages = reinterpret_cast<char*>(smem4);
  float* scores = reinterpret_cast<float*>(stages + S::kBytes);
  const int tiles = (n + kTile - 1) / kTile;

  // K tile 0 in flight while q becomes A fragments.
  const Fp8TileCopy<D> copy(tid, H, h);
  copy.load(stages, kv.codes, s0, s1);
  cp_async_commit();

  // q (times the key channel scales) times 2^qe (max |q| in [2^14, 2^15)) as fp16 high + low
  // rows, channels in key_channel order.
  uint32_t qa[D / mma::kK][4];
  const int qe = q_fragments_f16<D>(
      qa, p.q + qrow * D, g < nq, lane, 0,
      [&](int ks, int r, int e) { return mf::key_channel(D, tg, ks, r, e); },
      fp8_channel_scales(kv, h, D));
  const float kfac = pow2(unpack::kHalfExpShift<F> - qe) * fp8_head_scale(kv, h) * p.inv_sqrt_d;

  // ---- scores --------------------------------------------------------------------------------
  for (int i = 0; i < tiles; ++i) {
    if (i + 1 < tiles)
      copy.load(stages + ((i + 1) % kStages) * S::kStageBytes, kv.codes,
                s0 + static_cast<int64_t>(i + 1) * kTile, s1);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    const char* st = stages + (i % kStages) * S::kStageBytes;
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      const int row0 = 16 * warp + 8 * nt;  // the n-tile's first token in the tile
      uint32_t w[D / mma::kK];              // this lane's D / 4 codes of token row0 + g
#pragma unroll
      for (int c = 0; c < D / 64; ++c) {
        const uint4 x =
            *reinterpret_cast<const uint4*>(st + mf::chunk_offset<D>(row0 + g, tg * (D / 64) + c));
        w[4 * c] = x.x, w[4 * c + 1] = x.y, w[4 * c + 2] = x.z, w[4 * c + 3] = x.w;
      }
      float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
      for (int ks = 0; ks < D / mma::kK; ++ks)
        mma_f16(c, qa[ks], mf::fp8_hi_pair_half2<F>(mf::key_pair_word(w[ks], 0)),
                mf::fp8_hi_pair_half2<F>(mf::key_pair_word(w[ks], 1)));
      const int tok = i * kTile + row0 + mma::c_col(lane, 0);  // tokens tok, tok + 1
      if (g < nq) {
        if (tok < n)
          scores[g * ld + tok] = (c[0] + c[2]) * kfac * fp8_token_scale(kv, s0 + tok, H, h);
        if (tok + 1 < n)
          scores[g * ld + tok + 1] = (c[1] + c[3]) * kfac * fp8_token_scale(kv, s0 + tok + 1, H, h);
      }
    }
    __syncthreads();  // the stage is refilled next
  }

  // V tile 0 in flight during the softmax.
  copy.load(stages, vv.codes, s0, s1);
  cp_async_commit();

  // p' = p 2^pe (times s_t for token value scales, pe from the split's largest: p' < 2^14).
  const bool vtok = vv.gran == Granularity::Token;
  if (vtok) fp8_token_scale_max(vv, s0, s1, H, h, tid, wmax);
  __syncthreads();
  const int pe = vtok ? mf::token_pshift(bits_float(block_max(wmax))) : mf::kPShift;

  // ---- softmax partial -------------------------------------------------------------------------
  softmax_partial(p, scores, n, nq, ld, qrow, split, warp, lane, pow2(pe),
                  vtok ? vv.scales + s0 * H + h : nullptr, H);
  __syncthreads();

  // ---- values ----------------------------------------------------------------------------------
  constexpr int kNTiles = D / mma::kN;
  constexpr int kWords = D / 32;  // words of a lane's D / 8 channels of one token
  float o[kNTiles][4];
#pragma unroll
  for (int j = 0; j < kNTiles; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
  for (int i = 0; i < tiles; ++i) {
    if (i + 1 < tiles)
      copy.load(stages + ((i + 1) % kStages) * S::kStageBytes, vv.codes,
                s0 + static_cast<int64_t>(i + 1) * kTile, s1);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    const char* st = stages + (i % kStages) * S::kStageBytes;
    uint32_t pa[4];  // A: p' of head g at this warp's 16 tokens (times 2^pe, s_t)
    p_fragment(pa, scores, g, nq, ld, i * kTile + 16 * warp, n, lane, mf::split_half2);
    uint32_t w[4][kWords];  // tokens 2 tg, 2 tg + 1, 2 tg + 8, 2 tg + 9: channels [g D/8, ..)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int row = 16 * warp + 2 * tg + (e % 2) + 8 * (e / 2);
      const char* src = st + mf::chunk_offset<D>(row, (g * (D / 8)) / mf::kChunkBytes) +
                        (g * (D / 8)) % mf::kChunkBytes;
      if constexpr (D == 128) {
        const uint4 x = *reinterpret_cast<const uint4*>(src);
        w[e][0] = x.x, w[e][1] = x.y, w[e][2] = x.z, w[e][3] = x.w;
      } else {
        const uint2 x = *reinterpret_cast<const uint2*>(src);
        w[e][0] = x.x, w[e][1] = x.y;
      }
    }
#pragma unroll
    for (int j = 0; j < kNTiles; ++j)
      mma_f16(o[j], pa,
              mf::fp8_hi_pair_half2<F>(mf::value_pair_word(w[0][j / 4], w[1][j / 4], j % 4)),
              mf::fp8_hi_pair_half2<F>(mf::value_pair_word(w[2][j / 4], w[3][j / 4], j % 4)));
    __syncthreads();
  }
  cp_async_wait<0>();
  __syncthreads();

  // ---- the warps' sums, in a fixed order, times the scale once --------------------------------
  float* red = reinterpret_cast<float*>(stages);  // [kWarps][8][D]
  if (g < nq) {
#pragma unroll
    for (int j = 0; j < kNTiles; ++j) {
      red[(warp * 8 + g) * D + mf::value_channel(D, 2 * tg, j)] = o[j][0] + o[j][2];
      red[(warp * 8 + g) * D + mf::value_channel(D, 2 * tg + 1, j)] = o[j][1] + o[j][3];
    }
  }
  __syncthreads();
  const float vfac = pow2(unpack::kHalfExpShift<F> - pe) * fp8_head_scale(vv, h);
  const float* vcs = fp8_channel_scales(vv, h, D);  // value channel scales: once an output
  write_partial<D>(p, red, qrow, split, tid, vfac,
                   [vcs](int, int d, float s) { return vcs ? s * __ldg(vcs + d) : s; });
}

}  // namespace

namespace detail {

bool mma_bf16_supported(int head_dim, int nq, int64_t split_tokens) {
  return (head_dim == 64 || head_dim == 128) && nq >= 1 && nq <= 8 &&
         nq * split_tokens <= kScoreFloats;
}

bool mma_int_supported(int bits, int head_dim, int nq, int64_t split_tokens,
                       std::span<const IntSideView> k, std::span<const IntSideView> v) {
  if ((bits != 2 && bits != 4) || !mma_bf16_supported(head_dim, nq, split_tokens)) return false;
  const auto aligned = [](const void* x, uintptr_t a) {
    return reinterpret_cast<uintptr_t>(x) % a == 0;
  };
  for (size_t b = 0; b < k.size(); ++b) {
    const IntSideView& x = k[b];
    const IntSideView& y = v[b];
    if (x.axis != Axis::Channel || x.sym || x.group % mma_int::kSpan != 0 || kTileI % x.group != 0)
      return false;
    if (y.axis != Axis::Token || y.sym || y.group % mma_int::kSpan != 0 ||
        head_dim % y.group != 0 || (head_dim / y.group) % 2 != 0 || y.group != v[0].group)
      return false;
    if (x.quantized_tokens > 0 &&
        !(aligned(x.words, 16) && aligned(x.scales, 16) && aligned(x.mins, 16)))
      return false;
    if (y.quantized_tokens > 0 &&
        !(aligned(y.words, 16) && aligned(y.scales, 4) && aligned(y.mins, 4)))
      return false;
  }
  return true;
}

bool mma_fp8_supported(int head_dim, int nq, int64_t split_tokens, std::span<const Fp8SideView> k,
                       std::span<const Fp8SideView> v) {
  if (!mma_bf16_supported(head_dim, nq, split_tokens)) return false;
  for (auto side : {k, v})
    for (const Fp8SideView& x : side)
      if (x.tokens > 0 && reinterpret_cast<uintptr_t>(x.codes) % 16 != 0) return false;
  return true;
}

namespace {
template <class Kernel, class Params>
cudaError_t launch_with_smem(Kernel kern, size_t smem, const Params& p, dim3 grid,
                             cudaStream_t stream) {
  if (smem > 48 * 1024)
    KVQ_CUDA_CALL(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(smem)));
  kern<<<grid, kThreads, smem, stream>>>(p);
  return cudaGetLastError();
}
}  // namespace

cudaError_t launch_mma_bf16(int head_dim, const SplitParams<Bf16SideView>& p, dim3 grid,
                            cudaStream_t stream) {
  const int64_t score_floats = static_cast<int64_t>(p.nq) * p.split_tokens;
  if (head_dim == 64)
    return launch_with_smem(mma_split_kernel<64>, Smem<64>::bytes(score_floats), p, grid, stream);
  return launch_with_smem(mma_split_kernel<128>, Smem<128>::bytes(score_floats), p, grid, stream);
}

cudaError_t launch_mma_int(int bits, int head_dim, const SplitParams<IntSideView>& p, dim3 grid,
                           cudaStream_t stream) {
  const int64_t sf = static_cast<int64_t>(p.nq) * p.split_tokens;
  const int ncg = head_dim / static_cast<int>(p.v[0].group);  // 2 or 4 (mma_int_supported)
  // GQA <= 4: the transposed value product (mma_int.h); 5..8 the direct one.
  const bool transposed = p.nq <= mma_int::kTHeads;
  auto run = [&](auto dc, auto bc, auto nc) {
    constexpr int D = decltype(dc)::value, B = decltype(bc)::value, NCG = decltype(nc)::value;
    return transposed ? launch_with_smem(mma_int_split_kernel<D, B, NCG, true>,
                                         IntSmem<D, B>::bytes(sf), p, grid, stream)
                      : launch_with_smem(mma_int_split_kernel<D, B, NCG, false>,
                                         IntSmem<D, B>::bytes(sf), p, grid, stream);
  };
  using I64 = std::integral_constant<int, 64>;
  using I128 = std::integral_constant<int, 128>;
  using I2 = std::integral_constant<int, 2>;
  using I4 = std::integral_constant<int, 4>;
  if (head_dim == 64) return bits == 2 ? run(I64{}, I2{}, I2{}) : run(I64{}, I4{}, I2{});
  if (ncg == 2) return bits == 2 ? run(I128{}, I2{}, I2{}) : run(I128{}, I4{}, I2{});
  return bits == 2 ? run(I128{}, I2{}, I4{}) : run(I128{}, I4{}, I4{});
}

cudaError_t launch_mma_fp8(Fp8Format format, int head_dim, const SplitParams<Fp8SideView>& p,
                           dim3 grid, cudaStream_t stream) {
  const int64_t sf = static_cast<int64_t>(p.nq) * p.split_tokens;
  auto run = [&](auto fc) {
    constexpr Fp8Format F = decltype(fc)::value;
    return head_dim == 64 ? launch_with_smem(mma_fp8_split_kernel<64, F>, Fp8Smem<64>::bytes(sf), p,
                                             grid, stream)
                          : launch_with_smem(mma_fp8_split_kernel<128, F>, Fp8Smem<128>::bytes(sf),
                                             p, grid, stream);
  };
  switch (format) {
    case Fp8Format::E4M3:
      return run(std::integral_constant<Fp8Format, Fp8Format::E4M3>{});
    case Fp8Format::E5M2:
      return run(std::integral_constant<Fp8Format, Fp8Format::E5M2>{});
    case Fp8Format::E4M3FNUZ:
      return run(std::integral_constant<Fp8Format, Fp8Format::E4M3FNUZ>{});
  }
  return cudaErrorInvalidValue;
}

}  // namespace detail
}  // namespace kvq::cuda
