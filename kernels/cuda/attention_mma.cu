// The tensor-core split kernel of decode attention (DecodeKernel::Mma, issue 46), bf16 caches.
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

#include <cmath>

#include "kernels/cuda/attention_split.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/mma_layout.h"

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

  // ---- softmax partial: one warp per query head (as attention_kernels.cu) --------------------
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

}  // namespace

namespace detail {

bool mma_bf16_supported(int head_dim, int nq, int64_t split_tokens) {
  return (head_dim == 64 || head_dim == 128) && nq >= 1 && nq <= 8 &&
         nq * split_tokens <= kScoreFloats;
}

cudaError_t launch_mma_bf16(int head_dim, const SplitParams<Bf16SideView>& p, dim3 grid,
                            cudaStream_t stream) {
  auto run = [&](auto kern, size_t smem) -> cudaError_t {
    if (smem > 48 * 1024)
      KVQ_CUDA_CALL(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(smem)));
    kern<<<grid, kThreads, smem, stream>>>(p);
    return cudaGetLastError();
  };
  const int64_t score_floats = static_cast<int64_t>(p.nq) * p.split_tokens;
  if (head_dim == 64) return run(mma_split_kernel<64>, Smem<64>::bytes(score_floats));
  return run(mma_split_kernel<128>, Smem<128>::bytes(score_floats));
}

}  // namespace detail
}  // namespace kvq::cuda
