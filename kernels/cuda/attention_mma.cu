// The tensor-core split kernels of decode attention (DecodeKernel::Mma, issue 46): bf16 caches
// (mma_split_kernel, below), KIVI 2- / 4-bit int caches (mma_int_split_kernel, further down) and
// FP8 caches with tensor / head scales (mma_fp8_split_kernel, last; mma_fp8.h).
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

#include "kernels/cuda/attention_split.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/mma_fp8.h"
#include "kernels/cuda/mma_int.h"
#include "kernels/cuda/mma_layout.h"
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

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

/// 16 bytes global -> shared, asynchronously; src_bytes 0 zero-fills the destination.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
               "r"(src_bytes));
}
/// N (4, 8 or 16) bytes global -> shared, asynchronously (16: through L2 only, as cp_async16).
template <int N>
__device__ __forceinline__ void cp_async(void* dst, const void* src, bool in) {
  if constexpr (N == 16) {
    cp_async16(dst, src, in ? 16 : 0);
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(smem_addr(dst)), "l"(src),
                 "n"(N), "r"(in ? N : 0));
  }
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(row)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(row)));
}

/// c += A B (m16n8k16, bf16 inputs, fp32 accumulators).
__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

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
/// attention_kernels.cu): the scores become e^(s - m); m and l go to part_ml.
template <class Params>
__device__ __forceinline__ void softmax_partial(const Params& p, float* scores, int n, int nq,
                                                int ld, int64_t qrow, int split, int warp,
                                                int lane) {
  for (int i = warp; i < nq; i += kWarps) {
    float* row = scores + i * ld;
    float m = -INFINITY;
    for (int t = lane; t < n; t += 32) m = fmaxf(m, row[t]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(kFullMask, m, o));
    float l = 0.0f;
    for (int t = lane; t < n; t += 32) {
      const float e = expf(row[t] - m);
      row[t] = e;
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

template <int D>
__global__ void __launch_bounds__(kThreads, 2)
    mma_split_kernel(const __grid_constant__ detail::SplitParams<Bf16SideView> p) {
  const int split = static_cast<int>(blockIdx.x), h = static_cast<int>(blockIdx.y),
            b = static_cast<int>(blockIdx.z);
  const Bf16SideView& kv = p.k[b];
  const Bf16SideView& vv = p.v[b];
  const int64_t T = kv.tokens;
  const int64_t s0 = static_cast<int64_t>(split) * p.split_tokens;
  if (s0 >= T) return;  // this sequence is shorter than the longest one
  const int64_t s1 = min(T, s0 + p.split_tokens);
  const int n = static_cast<int>(s1 - s0);
  const int nq = p.nq, ld = static_cast<int>(p.split_tokens), H = p.kv_heads;
  const int tid = static_cast<int>(threadIdx.x), lane = tid % 32, warp = tid / 32;
  const int g = mma::group_of(lane), tg = mma::tig_of(lane);

  extern __shared__ uint4 smem4[];
  uint16_t* stages = reinterpret_cast<uint16_t*>(smem4);
  float* scores = reinterpret_cast<float*>(reinterpret_cast<char*>(smem4) + Smem<D>::kStageBytes);
  const int tiles = (n + kTile - 1) / kTile;

  // K tile 0 in flight while q becomes A fragments.
  load_tile<D>(stages, kv.data, s0, s1, H, h, tid);
  cp_async_commit();

  const int q_heads = H * nq;
  const int64_t qrow = static_cast<int64_t>(b) * q_heads + static_cast<int64_t>(h) * nq;
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
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int tok = i * kTile + 16 * warp + mma::a_col(lane, 2 * half, 0);
      float x = 0.0f, y = 0.0f;
      if (g < nq) {
        if (tok < n) x = scores[g * ld + tok];
        if (tok + 1 < n) y = scores[g * ld + tok + 1];
      }
      const mma::HiLo s = mma::split_bf16x2(x, y);
      pa[2 * half] = s.hi;
      pa[2 * half + 1] = s.lo;
    }
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
  for (int x = tid; x < nq * D; x += kThreads) {
    const int i = x / D, d = x % D;
    float s = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) s += red[(w * 8 + i) * D + d];
    p.part_o[((qrow + i) * p.splits + split) * D + d] = s;
  }
}

// ---- int caches: KIVI 2- and 4-bit, per-channel keys and per-token values (mma_int.h) ---------
//
// A stage holds kTileI tokens: keys as kWarps runs of 32 tokens (one per warp, each inside one
// token group: [channel][B words], the run's scales and minima), values as kTileI rows of
// D B / 32 words (each warp takes 32 rows, two k-steps of 16) with the rows' scales and minima.
// Keys: A = q_c s_c (high + low bf16) per run, B = codes (mma_int.h), score = (C - C_ones) /
// kUnit + sum_c q_c m_c. Values: A = p_t s_t per channel set of 32 (one channel group), B =
// codes, o = (C - C_ones) / kUnit + sum_t p_t m_t. Tokens of the float32 residual window take
// plain fp32 loops (few: at most the window).

constexpr int kTileI = kWarps * mma_int::kSpan;  // tokens per int stage

template <int D, int B>
struct IntSmem {
  static constexpr int kWords = kTileI * D * B / 32;  // per stage (keys: kWarps runs of D x B)
  static constexpr int kParams = kWarps * D;  // halves per array (values: kTileI x n_cg <= this)
  static constexpr int kStageBytes = kWords * 4 + 2 * kParams * 2;
  static constexpr int kRedBytes = kWarps * 8 * D * 4;  // the warps' output sums, at the end
  static constexpr int kBytes =
      kStages * kStageBytes > kRedBytes ? kStages* kStageBytes : kRedBytes;
  static_assert(kStageBytes % 16 == 0 && (kWords * 4) % 16 == 0, "16-byte copies");
  static size_t bytes(int64_t score_floats) {
    return static_cast<size_t>(kBytes) + static_cast<size_t>(score_floats) * 4;
  }
};

__device__ __forceinline__ float2 half2_at(const uint16_t* p) {  // p 4-byte aligned
  return __half22float2(*reinterpret_cast<const __half2*>(p));
}

/// Warp `warp` issues the copies of its key run of tile [t0, t0 + kTileI), tokens
/// t0 + 32 warp .. + 32, if below q1 (q1 - t0 is a multiple of the group, itself one of 32).
/// Index math once per run: a lane's copies are pointer increments.
template <int D, int B>
__device__ __forceinline__ void load_key_run(char* stage, const IntSideView& k, int64_t t0,
                                             int64_t q1, int H, int h, int warp, int lane) {
  using S = IntSmem<D, B>;
  const int64_t t = t0 + mma_int::kSpan * warp;
  if (t >= q1) return;
  constexpr int kRun = D * B;  // words of a run
  uint32_t* words = reinterpret_cast<uint32_t*>(stage) + warp * kRun;
  uint16_t* sc = reinterpret_cast<uint16_t*>(stage + S::kWords * 4) + warp * D;
  const kivi::ChannelLayout L{H, D, k.group, B};
  const int64_t gi = t / k.group;
  const int wpg = static_cast<int>(L.words_per_group());
  const uint32_t* src = k.words + L.word_index(gi, h, 0) + (t % k.group) / kivi::codes_per_word(B);
  if (wpg == B) {  // G = 32: the run is its group's contiguous block
#pragma unroll
    for (int x = lane; x < kRun / 4; x += 32) cp_async<16>(words + 4 * x, src + 4 * x, true);
  } else {  // each channel's B words of the run (16 or 8 bytes), at a stride of the group's words
#pragma unroll
    for (int d = lane; d < D; d += 32) cp_async<4 * B>(words + d * B, src + d * wpg, true);
  }
  const int64_t pi = L.param_index(gi, h, 0);
  constexpr int kPChunks = D / 8;  // 16-byte chunks of a run's D scales (or minima)
  if (lane < 2 * kPChunks) {
    const int which = lane / kPChunks, c = lane % kPChunks;
    cp_async<16>(sc + which * S::kParams + 8 * c, (which ? k.mins : k.scales) + pi + 8 * c, true);
  }
}

/// Warp `warp` issues the copies of its 32 value rows of tile [t0, t0 + kTileI), one row a lane
/// (t0 < q1); rows at or past q1 are zero-filled (codes 0, scales 0: with p = 0 they add nothing).
template <int D, int B>
__device__ __forceinline__ void load_value_rows(char* stage, const IntSideView& v, int64_t t0,
                                                int64_t q1, int H, int h, int ncg, int warp,
                                                int lane) {
  using S = IntSmem<D, B>;
  constexpr int kRow = D * B / 32;  // words of a row
  const int r = mma_int::kSpan * warp + lane;
  const bool in = t0 + r < q1;
  const int64_t row = (in ? t0 + r : t0) * H + h;  // (token, head)
  uint32_t* words = reinterpret_cast<uint32_t*>(stage) + r * kRow;
  const uint32_t* src = v.words + row * kRow;
#pragma unroll
  for (int c = 0; c < kRow / 4; ++c) cp_async<16>(words + 4 * c, src + 4 * c, in);
  uint16_t* sc = reinterpret_cast<uint16_t*>(stage + S::kWords * 4) + r * ncg;
  for (int c = 0; c < ncg; c += 2) {  // 4-byte copies of two groups' scales and minima
    cp_async<4>(sc + c, v.scales + row * ncg + c, in);
    cp_async<4>(sc + S::kParams + c, v.mins + row * ncg + c, in);
  }
}

template <int D, int B>
__global__ void __launch_bounds__(kThreads, 2)
    mma_int_split_kernel(const __grid_constant__ detail::SplitParams<IntSideView> p) {
  using S = IntSmem<D, B>;
  namespace mi = mma_int;
  const int split = static_cast<int>(blockIdx.x), h = static_cast<int>(blockIdx.y),
            b = static_cast<int>(blockIdx.z);
  const IntSideView& kv = p.k[b];
  const IntSideView& vv = p.v[b];
  const int64_t T = kv.tokens;
  const int64_t s0 = static_cast<int64_t>(split) * p.split_tokens;
  if (s0 >= T) return;  // this sequence is shorter than the longest one
  const int64_t s1 = min(T, s0 + p.split_tokens);
  const int n = static_cast<int>(s1 - s0);
  const int nq = p.nq, ld = static_cast<int>(p.split_tokens), H = p.kv_heads;
  const int tid = static_cast<int>(threadIdx.x), lane = tid % 32, warp = tid / 32;
  const int g = mma::group_of(lane);

  extern __shared__ uint4 smem4[];
  char* stages = reinterpret_cast<char*>(smem4);
  float* scores = reinterpret_cast<float*>(stages + S::kBytes);

  // Key tile 0 in flight while q comes to registers.
  const int64_t kq1 = min(s1, max(s0, kv.quantized_tokens));  // quantized keys: [s0, kq1)
  const int ktiles = static_cast<int>((kq1 - s0 + kTileI - 1) / kTileI);
  if (ktiles > 0) load_key_run<D, B>(stages, kv, s0, kq1, H, h, warp, lane);
  cp_async_commit();

  const int q_heads = H * nq;
  const int64_t qrow = static_cast<int64_t>(b) * q_heads + static_cast<int64_t>(h) * nq;
  float2 qf[D / mma::kK][2];  // head g's q at this lane's A columns (k-step, +0 / +8)
#pragma unroll
  for (int ks = 0; ks < D / mma::kK; ++ks)
#pragma unroll
    for (int r2 = 0; r2 < 2; ++r2) {
      const int d = mma::a_col(lane, 2 * r2, 0) + ks * mma::kK;
      qf[ks][r2] =
          g < nq ? make_float2(__ldg(p.q + (qrow + g) * D + d), __ldg(p.q + (qrow + g) * D + d + 1))
                 : make_float2(0.0f, 0.0f);
    }

  // ---- scores, quantized keys: one 32-token run per warp and tile -----------------------------
  for (int i = 0; i < ktiles; ++i) {
    if (i + 1 < ktiles)
      load_key_run<D, B>(stages + ((i + 1) % kStages) * S::kStageBytes, kv,
                         s0 + static_cast<int64_t>(i + 1) * kTileI, kq1, H, h, warp, lane);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    const int r0 = i * kTileI + mi::kSpan * warp;  // the run's first token in the split
    if (s0 + r0 < kq1) {
      const char* st = stages + (i % kStages) * S::kStageBytes;
      const uint32_t* wr = reinterpret_cast<const uint32_t*>(st) + warp * D * B;
      const uint16_t* sc = reinterpret_cast<const uint16_t*>(st + S::kWords * 4) + warp * D;
      const uint16_t* mn = sc + S::kParams;
      float c[mi::kE][4] = {}, c1[4] = {};
      float base = 0.0f;  // sum over this lane's channels of q_c m_c (head g)
#pragma unroll
      for (int ks = 0; ks < D / mma::kK; ++ks) {
        uint32_t a[4], y[2];
#pragma unroll
        for (int r2 = 0; r2 < 2; ++r2) {  // channels d, d + 1: A registers 2 r2 (high), +1 (low)
          const int d = mma::a_col(lane, 2 * r2, 0) + ks * mma::kK;
          const float2 s2 = half2_at(sc + d), m2 = half2_at(mn + d);
          const mma::HiLo f = mma::split_bf16x2(qf[ks][r2].x * s2.x, qf[ks][r2].y * s2.y);
          a[2 * r2] = f.hi;
          a[2 * r2 + 1] = f.lo;
          base = fmaf(qf[ks][r2].x, m2.x, fmaf(qf[ks][r2].y, m2.y, base));
          y[r2] = mi::pair_slices<B>(wr[mi::key_word<B>(d, g)], wr[mi::key_word<B>(d + 1, g)],
                                     mi::slice_of<B>(g));
        }
#pragma unroll
        for (int j = 0; j < mi::kE; ++j)
          mma_bf16(c[j], a, mi::code_pair<B>(y[0], j), mi::code_pair<B>(y[1], j));
        mma_bf16(c1, a, mi::kOne2, mi::kOne2);
      }
      base += __shfl_xor_sync(kFullMask, base, 1);
      base += __shfl_xor_sync(kFullMask, base, 2);
      if (g < nq) {
#pragma unroll
        for (int j = 0; j < mi::kE; ++j)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float dot = ((c[j][e] - c1[e]) + (c[j][e + 2] - c1[e + 2])) * mi::kInvUnit<B>;
            scores[g * ld + r0 + mi::set_index(mma::c_col(lane, e), j)] =
                (dot + base) * p.inv_sqrt_d;
          }
      }
    }
    __syncthreads();  // the stage is refilled next
  }
  // ---- scores, the residual window's keys (fp32) -----------------------------------------------
  for (int64_t t = kq1 + tid; t < s1; t += kThreads) {
    const float* r = kv.residual + ((t - kv.quantized_tokens) * H + h) * D;
    for (int i = 0; i < nq; ++i) {
      const float* qi = p.q + (qrow + i) * D;
      float acc = 0.0f;
#pragma unroll 8
      for (int d = 0; d < D; ++d) acc = fmaf(__ldg(qi + d), __ldg(r + d), acc);
      scores[i * ld + (t - s0)] = acc * p.inv_sqrt_d;
    }
  }

  // Value tile 0 in flight during the softmax.
  const int64_t vq1 = min(s1, max(s0, vv.quantized_tokens));  // quantized values: [s0, vq1)
  const int vtiles = static_cast<int>((vq1 - s0 + kTileI - 1) / kTileI);
  const int ncg = D / vv.group;
  if (vtiles > 0) load_value_rows<D, B>(stages, vv, s0, vq1, H, h, ncg, warp, lane);
  cp_async_commit();
  __syncthreads();  // every score written

  // ---- softmax partial
  // ---------------------------------------------------------------------------
  softmax_partial(p, scores, n, nq, ld, qrow, split, warp, lane);
  __syncthreads();

  // ---- values, quantized: each warp 32 rows (two k-steps) of a tile, every channel set ----------
  constexpr int kSets = D / mi::kSpan;
  float o[kSets][mi::kE][4] = {}, o1[kSets][4] = {}, msum[kSets] = {};
  for (int i = 0; i < vtiles; ++i) {
    if (i + 1 < vtiles)
      load_value_rows<D, B>(stages + ((i + 1) % kStages) * S::kStageBytes, vv,
                            s0 + static_cast<int64_t>(i + 1) * kTileI, vq1, H, h, ncg, warp, lane);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    const char* st = stages + (i % kStages) * S::kStageBytes;
    const uint32_t* wv = reinterpret_cast<const uint32_t*>(st);
    const uint16_t* sc = reinterpret_cast<const uint16_t*>(st + S::kWords * 4);
    const uint16_t* mn = sc + S::kParams;
#pragma unroll
    for (int kk = 0; kk < 2; ++kk) {
      const int rk = mi::kSpan * warp + mma::kK * kk;  // the k-step's first row in the tile
      float2 pv[2];  // p of head g at this lane's A columns (rows rk + 2 tg + 8 r2 + {0, 1})
#pragma unroll
      for (int r2 = 0; r2 < 2; ++r2) {
        const int tok = i * kTileI + rk + mma::a_col(lane, 2 * r2, 0);  // in the split
        pv[r2].x = g < nq && s0 + tok < vq1 ? scores[g * ld + tok] : 0.0f;
        pv[r2].y = g < nq && s0 + tok + 1 < vq1 ? scores[g * ld + tok + 1] : 0.0f;
      }
#pragma unroll
      for (int cs = 0; cs < kSets; ++cs) {
        const int cg = cs * mi::kSpan / vv.group;
        uint32_t a[4], y[2];
#pragma unroll
        for (int r2 = 0; r2 < 2; ++r2) {
          const int row = rk + mma::a_col(lane, 2 * r2, 0);  // rows row, row + 1
          const float sx = __half2float(__ushort_as_half(sc[row * ncg + cg]));
          const float sy = __half2float(__ushort_as_half(sc[(row + 1) * ncg + cg]));
          const float mx = __half2float(__ushort_as_half(mn[row * ncg + cg]));
          const float my = __half2float(__ushort_as_half(mn[(row + 1) * ncg + cg]));
          const mma::HiLo f = mma::split_bf16x2(pv[r2].x * sx, pv[r2].y * sy);
          a[2 * r2] = f.hi;
          a[2 * r2 + 1] = f.lo;
          msum[cs] = fmaf(pv[r2].x, mx, fmaf(pv[r2].y, my, msum[cs]));
          y[r2] = mi::pair_slices<B>(wv[mi::value_word<D, B>(row, cs, g)],
                                     wv[mi::value_word<D, B>(row + 1, cs, g)], mi::slice_of<B>(g));
        }
#pragma unroll
        for (int j = 0; j < mi::kE; ++j)
          mma_bf16(o[cs][j], a, mi::code_pair<B>(y[0], j), mi::code_pair<B>(y[1], j));
        mma_bf16(o1[cs], a, mi::kOne2, mi::kOne2);
      }
    }
    __syncthreads();
  }
  cp_async_wait<0>();
  __syncthreads();

  // ---- the warps' sums, in a fixed order, plus the residual window's values (fp32) -------------
  float* red = reinterpret_cast<float*>(stages);  // [kWarps][8][D]
#pragma unroll
  for (int cs = 0; cs < kSets; ++cs) {
    msum[cs] += __shfl_xor_sync(kFullMask, msum[cs], 1);
    msum[cs] += __shfl_xor_sync(kFullMask, msum[cs], 2);
  }
  if (g < nq) {
#pragma unroll
    for (int cs = 0; cs < kSets; ++cs)
#pragma unroll
      for (int j = 0; j < mi::kE; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int d = cs * mi::kSpan + mi::set_index(mma::c_col(lane, e), j);
          red[(warp * 8 + g) * D + d] =
              ((o[cs][j][e] - o1[cs][e]) + (o[cs][j][e + 2] - o1[cs][e + 2])) * mi::kInvUnit<B> +
              msum[cs];
        }
  }
  __syncthreads();
  for (int x = tid; x < nq * D; x += kThreads) {
    const int i = x / D, d = x % D;
    float s = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) s += red[(w * 8 + i) * D + d];
    for (int64_t t = vq1; t < s1; ++t)
      s = fmaf(scores[i * ld + (t - s0)],
               __ldg(vv.residual + ((t - vv.quantized_tokens) * H + h) * D + d), s);
    p.part_o[((qrow + i) * p.splits + split) * D + d] = s;
  }
}

// ---- FP8 caches: e4m3 / e5m2 / e4m3fnuz, tensor or head scales (mma_fp8.h) --------------------
//
// As the bf16 kernel, with fp16 operands: a stage holds kTile rows of D code bytes (swizzled
// 16-byte chunks, mma_fp8::chunk_offset); B registers come from 16-byte shared loads of codes, two
// codes per register by the integer conversion (mma_fp8.h); q (times a power of two per head) and
// p (times 2^kPShift) are fp16 high + low A rows. The scale and the powers of two multiply each
// score and each output once.

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

/// c += A B (m16n8k16, fp16 inputs, fp32 accumulators).
__device__ __forceinline__ void mma_f16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                        uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/// The scale of a tensor- or head-scaled side for head h.
__device__ __forceinline__ float fp8_head_scale(const Fp8SideView& s, int h) {
  return __ldg(s.scales + (s.gran == Granularity::Head ? h : 0));
}

template <int D, Fp8Format F>
__global__ void __launch_bounds__(kThreads, 2)
    mma_fp8_split_kernel(const __grid_constant__ detail::SplitParams<Fp8SideView> p) {
  using S = Fp8Smem<D>;
  namespace mf = mma_fp8;
  const int split = static_cast<int>(blockIdx.x), h = static_cast<int>(blockIdx.y),
            b = static_cast<int>(blockIdx.z);
  const Fp8SideView& kv = p.k[b];
  const Fp8SideView& vv = p.v[b];
  const int64_t T = kv.tokens;
  const int64_t s0 = static_cast<int64_t>(split) * p.split_tokens;
  if (s0 >= T) return;  // this sequence is shorter than the longest one
  const int64_t s1 = min(T, s0 + p.split_tokens);
  const int n = static_cast<int>(s1 - s0);
  const int nq = p.nq, ld = static_cast<int>(p.split_tokens), H = p.kv_heads;
  const int tid = static_cast<int>(threadIdx.x), lane = tid % 32, warp = tid / 32;
  const int g = mma::group_of(lane), tg = mma::tig_of(lane);

  extern __shared__ uint4 smem4[];
  char* stages = reinterpret_cast<char*>(smem4);
  float* scores = reinterpret_cast<float*>(stages + S::kBytes);
  const int tiles = (n + kTile - 1) / kTile;

  // K tile 0 in flight while q becomes A fragments.
  const Fp8TileCopy<D> copy(tid, H, h);
  copy.load(stages, kv.codes, s0, s1);
  cp_async_commit();

  const int q_heads = H * nq;
  const int64_t qrow = static_cast<int64_t>(b) * q_heads + static_cast<int64_t>(h) * nq;
  float2 qf[D / mma::kK][2];  // head g's q at this lane's k rows (k-step, register pair r)
  float amax = 0.0f;
#pragma unroll
  for (int ks = 0; ks < D / mma::kK; ++ks)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float x = 0.0f, y = 0.0f;
      if (g < nq) {
        x = __ldg(p.q + (qrow + g) * D + mf::key_channel(D, tg, ks, r, 0));
        y = __ldg(p.q + (qrow + g) * D + mf::key_channel(D, tg, ks, r, 1));
      }
      qf[ks][r] = make_float2(x, y);
      amax = fmaxf(amax, fmaxf(fabsf(x), fabsf(y)));
    }
  amax = fmaxf(amax, __shfl_xor_sync(kFullMask, amax, 1));
  amax = fmaxf(amax, __shfl_xor_sync(kFullMask, amax, 2));
  const int qe = mf::q_shift(amax);
  const float qscale = pow2(qe);
  uint32_t qa[D / mma::kK][4];
#pragma unroll
  for (int ks = 0; ks < D / mma::kK; ++ks)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const mf::HiLo s = mf::split_half2(qf[ks][r].x * qscale, qf[ks][r].y * qscale);
      qa[ks][2 * r] = s.hi;      // row g
      qa[ks][2 * r + 1] = s.lo;  // row g + 8
    }
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
        if (tok < n) scores[g * ld + tok] = (c[0] + c[2]) * kfac;
        if (tok + 1 < n) scores[g * ld + tok + 1] = (c[1] + c[3]) * kfac;
      }
    }
    __syncthreads();  // the stage is refilled next
  }

  // V tile 0 in flight during the softmax.
  copy.load(stages, vv.codes, s0, s1);
  cp_async_commit();

  // ---- softmax partial -------------------------------------------------------------------------
  softmax_partial(p, scores, n, nq, ld, qrow, split, warp, lane);
  __syncthreads();

  // ---- values ----------------------------------------------------------------------------------
  constexpr int kNTiles = D / mma::kN;
  constexpr int kWords = D / 32;  // words of a lane's D / 8 channels of one token
  const float pscale = pow2(mf::kPShift);
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
    uint32_t pa[4];  // A: probabilities of head g at this warp's 16 tokens, times 2^kPShift
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int tok = i * kTile + 16 * warp + mma::a_col(lane, 2 * half, 0);
      float x = 0.0f, y = 0.0f;
      if (g < nq) {
        if (tok < n) x = scores[g * ld + tok] * pscale;
        if (tok + 1 < n) y = scores[g * ld + tok + 1] * pscale;
      }
      const mf::HiLo s = mf::split_half2(x, y);
      pa[2 * half] = s.hi;
      pa[2 * half + 1] = s.lo;
    }
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
  const float vfac = pow2(unpack::kHalfExpShift<F> - mf::kPShift) * fp8_head_scale(vv, h);
  for (int x = tid; x < nq * D; x += kThreads) {
    const int i = x / D, d = x % D;
    float s = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) s += red[(w * 8 + i) * D + d];
    p.part_o[((qrow + i) * p.splits + split) * D + d] = s * vfac;
  }
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
    if (x.axis != Axis::Channel || x.sym || x.group % mma_int::kSpan != 0) return false;
    if (y.axis != Axis::Token || y.sym || y.group % mma_int::kSpan != 0 ||
        head_dim % y.group != 0 || (head_dim / y.group) % 2 != 0)
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
    for (const Fp8SideView& x : side) {
      if (x.gran != Granularity::Tensor && x.gran != Granularity::Head) return false;
      if (x.tokens > 0 && reinterpret_cast<uintptr_t>(x.codes) % 16 != 0) return false;
    }
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
  if (bits == 2)
    return head_dim == 64 ? launch_with_smem(mma_int_split_kernel<64, 2>, IntSmem<64, 2>::bytes(sf),
                                             p, grid, stream)
                          : launch_with_smem(mma_int_split_kernel<128, 2>,
                                             IntSmem<128, 2>::bytes(sf), p, grid, stream);
  return head_dim == 64 ? launch_with_smem(mma_int_split_kernel<64, 4>, IntSmem<64, 4>::bytes(sf),
                                           p, grid, stream)
                        : launch_with_smem(mma_int_split_kernel<128, 4>, IntSmem<128, 4>::bytes(sf),
                                           p, grid, stream);
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
