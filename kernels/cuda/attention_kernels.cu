// Fused decode attention (flash-decoding): ports of reference_cpu/attention.cpp's decode_attention
// with the reads of schemes/{float,fp8,int}/reads.cpp (bf16, fp8, packed int codes).
//
// One block = (split, kv head h, sequence b), kThreads threads, all nq query heads of h:
//   1. scores  s[i][t] = <q_i, K[t, h]> / sqrt(D) for the split's tokens into shared memory.
//      Token-major rows (bf16, fp8, per-token int, the float32 residual): one thread per token
//      walks its row in 8-channel chunks (q from shared memory, broadcast). Per-channel int
//      groups: one warp per group of G tokens, one lane per token, the group's scales folded
//      into q once (as schemes/int/reads.cpp's dot_channel).
//   2. softmax partial: one warp per query head takes m = max s, p = e^(s - m), l = sum p.
//   3. values  o[i][d] = sum_t p[i][t] V[t, h, d]. Token-major rows: a token's D channels are
//      spread over D/4 lanes (4 channels each, coalesced); per-channel int groups: one warp per
//      group, one lane per channel (as schemes/int/reads.cpp's acc_channel). Warp
//      partials go through shared memory and are summed in a fixed order (deterministic).
//   4. the partial (m, l, o) goes to the workspace; merge_kernel combines the splits.
// Accumulation is float32 throughout (the CPU reference accumulates in float too, with the
// softmax sum in double). Per-token int sides and fp8 rows are dequantized in registers
// (code * scale + min; s * decode(code)) and then dotted / weighted, where the CPU folds
// p * scale and p * min apart: the same sums, rounded differently (tests/cuda/ says how much).
// FP8 codes decode with the sm_89+ conversion instruction where it exists (e4m3, e5m2, both
// exact through fp16), else with fp8::decode<F> (fp8/format.h, the one definition).
//
// That is the baseline kernel (DecodeKernel::Baseline). The tiled kernel (DecodeKernel::Tiled,
// "tiled phases" below) has the same block, plan, softmax and merge, and reads token-major rows
// a warp at a time (8 channels a lane, q and the output sums in registers: bf16, fp8, per-token
// int keys and values, the residual) and stages each per-channel key or value group in shared
// memory with coalesced loads; its fp8 and 4-bit codes unpack through unpack.h.
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "fp8/format.h"
#include "kernels/cuda/attention_kernels.cuh"
#include "kernels/cuda/attention_split.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/unpack.h"
#include "kivi/layout.h"
#include "kivi/minmax.h"
#include "kivi/pack.h"

namespace kvq::cuda {
namespace {

constexpr int kThreads = 128;  // threads per split block
constexpr int kWarps = kThreads / 32;
constexpr int kScoreFloats = 4096;       // shared scores per block: nq * split_tokens <= this
constexpr int64_t kTargetBlocks = 1024;  // splits aim for this many blocks per launch
constexpr int64_t kMinSplit = 64;        // ... but no split shorter than this
constexpr int kKChunk = 8;               // channels per step of a token-major score row
constexpr int kVChunk = 4;               // channels per lane in a token-major value row
constexpr int kIntUnroll = 2;            // value rows in flight per warp, int caches (bf16 /
                                         // fp8: 4; more would cost int kernels occupancy)
constexpr unsigned kFullMask = 0xffffffffu;

// ---- parameters ------------------------------------------------------------------------------

// SplitParams holds kMaxBatch views per side (about 8 KB for int views): kernel parameters over
// 4 KB need nvcc and a driver of CUDA 12.1 or newer (checked here and in launch()).
#if defined(__CUDACC_VER_MAJOR__) && \
    (__CUDACC_VER_MAJOR__ < 12 || (__CUDACC_VER_MAJOR__ == 12 && __CUDACC_VER_MINOR__ < 1))
#error "kvq's decode-attention kernels take about 8 KB of parameters: CUDA 12.1 or newer is needed"
#endif
constexpr int kMinDriver = 12010;  // cudaDriverGetVersion's 12.1

using detail::SplitParams;  // (attention_split.cuh: shared with attention_mma.cu)

struct MergeParams {
  int64_t tokens[kMaxBatch];
  const float* part_o;
  const float* part_ml;
  float* out;
  int64_t split_tokens;
  int splits;
  int q_heads;
  int dim;
};

/// Where the tiled int kernels' staged per-channel words start in shared memory (floats from its
/// start: after q_s, scratch and scores, rounded up to 16 bytes), and the words each warp stages.
KVQ_HD int64_t stage_offset(int nq, int D, int64_t ld) {
  return (static_cast<int64_t>(nq) * D * (1 + kWarps) + nq * ld + 3) / 4 * 4;
}
constexpr int kStageWords = 1024;  // 4 KB per warp: a per-channel group's words

/// What one block works on, and its shared memory.
struct Block {
  int64_t s0 = 0, s1 = 0;  // tokens [s0, s1) of the sequence
  int h = 0, H = 0, nq = 0;
  int ld = 0;  // row stride of `scores` (split_tokens)
  float inv_sqrt_d = 0;
  float* q_s = nullptr;       // [nq, D]: q of the GQA group (key-channel scales folded in)
  float* scratch = nullptr;   // [kWarps, nq, D]: per-warp folded q (phase 1), partial o (phase 3)
  float* scores = nullptr;    // [nq, ld]: scores, then e^(s - m)
  uint32_t* stage = nullptr;  // tiled int kernels: [kWarps, kStageWords] staged per-channel words
  int tid = 0, lane = 0, warp = 0;
};

// ---- small device helpers ----------------------------------------------------------------------

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(kFullMask, x, o);
  return x;
}
__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(kFullMask, x, o));
  return x;
}

__device__ __forceinline__ float half_at(const uint16_t* p, int64_t i) {
  return half_bits_to_float(__ldg(p + i));
}

/// The effective min of an int group: the stored one, or -2^(b-1) * scale for sym
/// (schemes/int/reads.cpp's params()).
template <int B>
__device__ __forceinline__ float group_min(const IntSideView& v, int64_t i, float scale) {
  return v.sym ? -static_cast<float>(kivi::sym_offset(B)) * scale : half_at(v.mins, i);
}

/// bf16 pair (one 32-bit word, element 0 low) -> two floats.
__device__ __forceinline__ void bf16x2(uint32_t w, float& a, float& b) {
  a = bits_float(w << 16);
  b = bits_float(w & 0xffff0000u);
}

/// Two FP8 codes (low 16 bits, element 0 low) -> two floats. sm_89+ converts e4m3 / e5m2 in
/// hardware (exact: both widen to fp16 exactly); elsewhere, and for e4m3fnuz, fp8::decode<F>.
template <Fp8Format F>
__device__ __forceinline__ void fp8x2(uint32_t w, float& a, float& b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  constexpr bool kHardware = F != Fp8Format::E4M3FNUZ;
#else
  constexpr bool kHardware = false;
#endif
  if constexpr (kHardware) {
    const __half2_raw r = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(w & 0xffffu),
                                                     F == Fp8Format::E5M2 ? __NV_E5M2 : __NV_E4M3);
    const float2 f = __half22float2(__half2(r));
    a = f.x;
    b = f.y;
  } else {
    a = fp8::decode<F>(static_cast<uint8_t>(w & 0xffu));
    b = fp8::decode<F>(static_cast<uint8_t>((w >> 8) & 0xffu));
  }
}

template <Fp8Format F>
__device__ __forceinline__ void fp8x4(uint32_t w, float* v) {
  fp8x2<F>(w, v[0], v[1]);
  fp8x2<F>(w >> 16, v[2], v[3]);
}

/// acc[i] += <q_i[d0 .. d0+8), v> for every query head i < nq (q_s rows of D floats).
template <int D>
__device__ __forceinline__ void dot8(const float* q_s, int nq, int d0, const float (&v)[kKChunk],
                                     float (&acc)[kMaxGqa]) {
#pragma unroll
  for (int i = 0; i < kMaxGqa; ++i) {
    if (i < nq) {
      const float4 a = *reinterpret_cast<const float4*>(q_s + i * D + d0);
      const float4 b = *reinterpret_cast<const float4*>(q_s + i * D + d0 + 4);
      float s = acc[i];
      s = fmaf(a.x, v[0], s);
      s = fmaf(a.y, v[1], s);
      s = fmaf(a.z, v[2], s);
      s = fmaf(a.w, v[3], s);
      s = fmaf(b.x, v[4], s);
      s = fmaf(b.y, v[5], s);
      s = fmaf(b.z, v[6], s);
      s = fmaf(b.w, v[7], s);
      acc[i] = s;
    }
  }
}

// ---- generic phases ----------------------------------------------------------------------------

/// Phase 1 over token-major rows: one thread per token t in [t0, t1); row(t, acc) adds
/// <q_i, K[t]> into acc[i] (and may scale it), the score is acc * 1/sqrt(D).
template <class RowDot>
__device__ void scores_rows(const Block& bk, int64_t t0, int64_t t1, RowDot row) {
  for (int64_t t = t0 + bk.tid; t < t1; t += kThreads) {
    float acc[kMaxGqa];
#pragma unroll
    for (int i = 0; i < kMaxGqa; ++i) acc[i] = 0.0f;
    row(t, acc);
#pragma unroll
    for (int i = 0; i < kMaxGqa; ++i)
      if (i < bk.nq) bk.scores[i * bk.ld + (t - bk.s0)] = acc[i] * bk.inv_sqrt_d;
  }
}

/// Phase 3 over token-major rows: D/kVChunk lanes share a token, lane chunk c reads channels
/// [4c, 4c + 4) through vals(t, d0, v) (dequantized in registers). Adds this warp's sums into
/// scratch[warp] (which the caller zeroed).
template <int D, int kUnroll = 4, class Vals>
__device__ void values_rows(const Block& bk, int64_t t0, int64_t t1, Vals vals) {
  constexpr int kLanes = D / kVChunk;    // lanes per token: 16 or 32
  constexpr int kPerWarp = 32 / kLanes;  // tokens per warp step: 2 or 1
  constexpr int kSlots = kWarps * kPerWarp;
  static_assert(kLanes <= 32 && 32 % kLanes == 0, "a token's lanes sit in one warp");
  const int d0 = (bk.lane % kLanes) * kVChunk;
  const int slot = bk.warp * kPerWarp + bk.lane / kLanes;
  float acc[kMaxGqa][kVChunk];
#pragma unroll
  for (int i = 0; i < kMaxGqa; ++i)
#pragma unroll
    for (int c = 0; c < kVChunk; ++c) acc[i][c] = 0.0f;
      // Unrolled so each warp has several rows' loads in flight (one 256-byte bf16 row per warp
      // step would leave the loop latency-bound).
#pragma unroll kUnroll
  for (int64_t t = t0 + slot; t < t1; t += kSlots) {
    float v[kVChunk];
    vals(t, d0, v);
    const float* p = bk.scores + (t - bk.s0);
#pragma unroll
    for (int i = 0; i < kMaxGqa; ++i) {
      if (i < bk.nq) {
        const float pi = p[i * bk.ld];
#pragma unroll
        for (int c = 0; c < kVChunk; ++c) acc[i][c] = fmaf(pi, v[c], acc[i][c]);
      }
    }
  }
  // Tokens of one warp step sit in lanes that differ in the bits at and above kLanes.
#pragma unroll
  for (int o = kLanes; o < 32; o <<= 1)
#pragma unroll
    for (int i = 0; i < kMaxGqa; ++i)
      if (i < bk.nq)
#pragma unroll
        for (int c = 0; c < kVChunk; ++c) acc[i][c] += __shfl_xor_sync(kFullMask, acc[i][c], o);
  if (bk.lane < kLanes) {
    float* red = bk.scratch + bk.warp * bk.nq * D + d0;
#pragma unroll
    for (int i = 0; i < kMaxGqa; ++i)
      if (i < bk.nq)
#pragma unroll
        for (int c = 0; c < kVChunk; ++c) red[i * D + c] += acc[i][c];
  }
}

/// Phase 1 over the float32 residual window: K[t] = residual[t - first].
template <int D>
__device__ void scores_residual(const Block& bk, const float* residual, int64_t first, int64_t t0,
                                int64_t t1) {
  scores_rows(bk, t0, t1, [&](int64_t t, float(&acc)[kMaxGqa]) {
    const float4* r = reinterpret_cast<const float4*>(residual + ((t - first) * bk.H + bk.h) * D);
#pragma unroll 4
    for (int c = 0; c < D / kKChunk; ++c) {
      const float4 a = __ldg(r + 2 * c), b = __ldg(r + 2 * c + 1);
      const float v[kKChunk] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
      dot8<D>(bk.q_s, bk.nq, c * kKChunk, v, acc);
    }
  });
}

template <int D>
__device__ void values_residual(const Block& bk, const float* residual, int64_t first, int64_t t0,
                                int64_t t1) {
  values_rows<D, kIntUnroll>(bk, t0, t1, [&](int64_t t, int d0, float(&v)[kVChunk]) {
    const float4 a =
        __ldg(reinterpret_cast<const float4*>(residual + ((t - first) * bk.H + bk.h) * D + d0));
    v[0] = a.x;
    v[1] = a.y;
    v[2] = a.z;
    v[3] = a.w;
  });
}

// ---- bf16 ------------------------------------------------------------------------------------

struct Bf16Policy {
  using View = Bf16SideView;
  static constexpr int kMinBlocks = 1;  // 64-80 registers
  __device__ static float key_channel_factor(const View&, int64_t) { return 1.0f; }
  __device__ static float value_channel_factor(const View&, int64_t) { return 1.0f; }

  template <int D>
  __device__ static void scores(const Block& bk, const View& k) {
    scores_rows(bk, bk.s0, bk.s1, [&](int64_t t, float(&acc)[kMaxGqa]) {
      const uint4* r = reinterpret_cast<const uint4*>(k.data + (t * bk.H + bk.h) * D);
#pragma unroll 4
      for (int c = 0; c < D / kKChunk; ++c) {
        const uint4 w = __ldg(r + c);
        float v[kKChunk];
        bf16x2(w.x, v[0], v[1]);
        bf16x2(w.y, v[2], v[3]);
        bf16x2(w.z, v[4], v[5]);
        bf16x2(w.w, v[6], v[7]);
        dot8<D>(bk.q_s, bk.nq, c * kKChunk, v, acc);
      }
    });
  }

  template <int D>
  __device__ static void values(const Block& bk, const View& v) {
    values_rows<D>(bk, bk.s0, bk.s1, [&](int64_t t, int d0, float(&x)[kVChunk]) {
      const uint2 w = __ldg(reinterpret_cast<const uint2*>(v.data + (t * bk.H + bk.h) * D + d0));
      bf16x2(w.x, x[0], x[1]);
      bf16x2(w.y, x[2], x[3]);
    });
  }
};

// ---- fp8 -------------------------------------------------------------------------------------

/// The scale of element (t, h, d) factors as token_factor(t, h) * channel factor
/// (schemes/fp8/reads.cpp's token_factor and channel_factors): tensor / head / token
/// scales are token factors, channel scales channel factors.
__device__ __forceinline__ float fp8_token_factor(const Fp8SideView& s, int64_t t, int h, int H) {
  switch (s.gran) {
    case Granularity::Tensor:
      return __ldg(s.scales);
    case Granularity::Head:
      return __ldg(s.scales + h);
    case Granularity::Token:
      return __ldg(s.scales + t * H + h);
    case Granularity::Channel:
      return 1.0f;
  }
  return 1.0f;
}

template <Fp8Format F>
struct Fp8Policy {
  using View = Fp8SideView;
  static constexpr int kMinBlocks = 1;  // 64-80 registers
  /// Channel scales (index h * D + d, fp8/scale.h) fold into q for keys (Fp8Side::dot) ...
  __device__ static float key_channel_factor(const View& k, int64_t hd) {
    return k.gran == Granularity::Channel ? __ldg(k.scales + hd) : 1.0f;
  }
  /// ... and multiply the summed values once (Fp8Side::accumulate).
  __device__ static float value_channel_factor(const View& v, int64_t hd) {
    return v.gran == Granularity::Channel ? __ldg(v.scales + hd) : 1.0f;
  }

  template <int D>
  __device__ static void scores(const Block& bk, const View& k) {
    scores_rows(bk, bk.s0, bk.s1, [&](int64_t t, float(&acc)[kMaxGqa]) {
      const uint2* r = reinterpret_cast<const uint2*>(k.codes + (t * bk.H + bk.h) * D);
#pragma unroll 4
      for (int c = 0; c < D / kKChunk; ++c) {
        const uint2 w = __ldg(r + c);
        float v[kKChunk];
        fp8x4<F>(w.x, v);
        fp8x4<F>(w.y, v + 4);
        dot8<D>(bk.q_s, bk.nq, c * kKChunk, v, acc);
      }
      const float f = fp8_token_factor(k, t, bk.h, bk.H);  // s = f * <q, codes> (Fp8Side::dot)
#pragma unroll
      for (int i = 0; i < kMaxGqa; ++i) acc[i] *= f;
    });
  }

  template <int D>
  __device__ static void values(const Block& bk, const View& v) {
    values_rows<D>(bk, bk.s0, bk.s1, [&](int64_t t, int d0, float(&x)[kVChunk]) {
      const uint32_t w =
          __ldg(reinterpret_cast<const uint32_t*>(v.codes + (t * bk.H + bk.h) * D + d0));
      fp8x4<F>(w, x);
      const float f = fp8_token_factor(v, t, bk.h, bk.H);  // weight p * f (Fp8Side::accumulate)
#pragma unroll
      for (int c = 0; c < kVChunk; ++c) x[c] *= f;
    });
  }
};

// ---- int (kivi/layout.h) -----------------------------------------------------------------------

template <int B>
struct IntPolicy {
  using View = IntSideView;
  static constexpr int kMinBlocks = 4;  // <= 128 registers: no spills (ptxas -v)
  static constexpr int kCpw = kivi::codes_per_word(B);
  static constexpr uint32_t kMask = kivi::code_mask(B);

  __device__ static float key_channel_factor(const View&, int64_t) { return 1.0f; }
  __device__ static float value_channel_factor(const View&, int64_t) { return 1.0f; }

  /// Per-channel keys, token groups [g0, g1): <q, k_t> = sum_d (q_d * scale_gd) * code_td +
  /// sum_d q_d * min_gd (schemes/int/reads.cpp's dot_channel). One warp per group, one
  /// lane per token.
  template <int D>
  __device__ static void scores_channel(const Block& bk, const View& k, int64_t g0, int64_t g1) {
    scores_channel_as<D, kMaxGqa, false>(bk, k, g0, g1, nullptr);
  }

  /// scores_channel for query heads [0, NQ) (those below bk.nq). kStaged (the tiled kernel): each
  /// group's D * wpg words are first copied to this warp's `stage` (shared memory, 16-byte
  /// aligned, kStageWords) by coalesced loads, 16 bytes a lane where the words are 16-byte
  /// aligned, and the per-code reads (lane = token) hit shared memory instead of each issuing a
  /// global load. The same arithmetic either way.
  template <int D, int NQ, bool kStaged>
  __device__ static void scores_channel_as(const Block& bk, const View& k, int64_t g0, int64_t g1,
                                           uint32_t* stage) {
    const kivi::ChannelLayout L{bk.H, D, k.group, B};
    const int G = k.group;
    const int64_t wpg = L.words_per_group();
    float* qs = bk.scratch + bk.warp * bk.nq * D;  // this warp's q * scale, [nq, D]
    for (int64_t g = g0 + bk.warp; g < g1; g += kWarps) {
      const uint32_t* gw = k.words + L.word_index(g, bk.h, 0);  // channel d: gw[d * wpg + w]
      const uint32_t* src = gw;
      if constexpr (kStaged) {
        const int n = static_cast<int>(D * wpg);
        if (reinterpret_cast<uintptr_t>(gw) % 16 == 0 && n % 4 == 0) {
          for (int x = bk.lane; x < n / 4; x += 32)
            reinterpret_cast<uint4*>(stage)[x] = __ldg(reinterpret_cast<const uint4*>(gw) + x);
        } else {
          for (int x = bk.lane; x < n; x += 32) stage[x] = __ldg(gw + x);
        }
        src = stage;
      }
      const int64_t pbase = L.param_index(g, bk.h, 0);
      float base[NQ];
#pragma unroll
      for (int i = 0; i < NQ; ++i) base[i] = 0.0f;
      for (int d = bk.lane; d < D; d += 32) {
        const float sc = half_at(k.scales, pbase + d);
        const float mn = group_min<B>(k, pbase + d, sc);
#pragma unroll
        for (int i = 0; i < NQ; ++i) {
          if (i < bk.nq) {
            const float qv = bk.q_s[i * D + d];
            qs[i * D + d] = qv * sc;
            base[i] = fmaf(qv, mn, base[i]);
          }
        }
      }
#pragma unroll
      for (int i = 0; i < NQ; ++i)
        if (i < bk.nq) base[i] = warp_sum(base[i]);
      __syncwarp();  // qs (and the stage) complete
      for (int j = bk.lane; j < G; j += 32) {
        const uint32_t* cw = src + j / kCpw;
        const int sh = (j % kCpw) * B;
        float acc[NQ];
#pragma unroll
        for (int i = 0; i < NQ; ++i) acc[i] = 0.0f;
#pragma unroll 2
        for (int d = 0; d < D; d += 4) {
          float c4[4];
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            uint32_t w;
            if constexpr (kStaged)
              w = cw[(d + e) * wpg];
            else
              w = __ldg(cw + (d + e) * wpg);
            c4[e] = code_to_float((w >> sh) & kMask);
          }
#pragma unroll
          for (int i = 0; i < NQ; ++i) {
            if (i < bk.nq) {
              const float4 a = *reinterpret_cast<const float4*>(qs + i * D + d);
              float s = acc[i];
              s = fmaf(a.x, c4[0], s);
              s = fmaf(a.y, c4[1], s);
              s = fmaf(a.z, c4[2], s);
              s = fmaf(a.w, c4[3], s);
              acc[i] = s;
            }
          }
        }
        const int64_t t = g * G + j;
#pragma unroll
        for (int i = 0; i < NQ; ++i)
          if (i < bk.nq) bk.scores[i * bk.ld + (t - bk.s0)] = (acc[i] + base[i]) * bk.inv_sqrt_d;
      }
      __syncwarp();  // qs (and the stage) are rewritten for the next group
    }
  }

  /// Per-token keys, tokens [t0, t1): each channel group's codes dequantized as code * scale +
  /// min in registers and dotted with q. The words of a group are read in order, so any G and b
  /// (3-bit words hold 10 codes) work.
  template <int D>
  __device__ static void scores_token(const Block& bk, const View& k, int64_t t0, int64_t t1) {
    const kivi::TokenLayout L{bk.H, D, k.group, B};
    const int G = k.group;
    const int ncg = static_cast<int>(L.channel_groups());
    const int64_t wpg = kivi::words_for(G, B);
    scores_rows(bk, t0, t1, [&](int64_t t, float(&acc)[kMaxGqa]) {
      const uint32_t* row = k.words + L.word_index(t, bk.h, 0);
      const int64_t pbase = L.param_index(t, bk.h, 0);
      for (int c = 0; c < ncg; ++c) {
        const float sc = half_at(k.scales, pbase + c);
        const float mn = group_min<B>(k, pbase + c, sc);
        const int len = L.group_len(c);
        const uint32_t* gw = row + c * wpg;
        for (int j0 = 0; j0 < len; j0 += kCpw) {
          const uint32_t word = __ldg(gw + j0 / kCpw);
#pragma unroll
          for (int e = 0; e < kCpw; ++e) {
            if (j0 + e < len) {
              const int d = c * G + j0 + e;
              const float x = fmaf(code_to_float((word >> (e * B)) & kMask), sc, mn);
#pragma unroll
              for (int i = 0; i < kMaxGqa; ++i)
                if (i < bk.nq) acc[i] = fmaf(bk.q_s[i * D + d], x, acc[i]);
            }
          }
        }
      }
    });
  }

  template <int D>
  __device__ static void scores(const Block& bk, const View& k) {
    const int64_t qe = min(bk.s1, k.quantized_tokens);
    if (bk.s0 < qe) {
      if (k.axis == Axis::Channel)
        scores_channel<D>(bk, k, bk.s0 / k.group, qe / k.group);
      else
        scores_token<D>(bk, k, bk.s0, qe);
    }
    const int64_t r0 = max(bk.s0, k.quantized_tokens);
    if (r0 < bk.s1) scores_residual<D>(bk, k.residual, k.quantized_tokens, r0, bk.s1);
  }

  /// Per-token values, tokens [t0, t1): lane chunk [d0, d0 + 4) dequantized as code * scale + min.
  /// When every group starts on a word (G % codes_per_word == 0, b != 3), a token's codes form
  /// one packed run and the chunk's 4 codes sit in one word; otherwise each code is located
  /// through TokenLayout (offsets computed once per lane).
  template <int D>
  __device__ static void values_token(const Block& bk, const View& v, int64_t t0, int64_t t1) {
    const kivi::TokenLayout L{bk.H, D, v.group, B};
    const int G = v.group;
    const int d0 = (bk.lane % (D / kVChunk)) * kVChunk;
    const bool run = B != 3 && G % kCpw == 0;
    const bool one_group = d0 / G == (d0 + kVChunk - 1) / G;
    int woff[kVChunk], wsh[kVChunk], cg[kVChunk];
#pragma unroll
    for (int e = 0; e < kVChunk; ++e) {
      const int d = d0 + e, c = d / G, j = d % G;
      cg[e] = c;
      woff[e] = static_cast<int>(L.word_offset(c)) + j / kCpw;
      wsh[e] = (j % kCpw) * B;
    }
    values_rows<D, kIntUnroll>(bk, t0, t1, [&](int64_t t, int, float(&x)[kVChunk]) {
      const uint32_t* row = v.words + L.word_index(t, bk.h, 0);
      const int64_t pbase = L.param_index(t, bk.h, 0);
      uint32_t code[kVChunk];
      if (run) {
        const uint32_t w = __ldg(row + d0 / kCpw) >> ((d0 % kCpw) * B);
#pragma unroll
        for (int e = 0; e < kVChunk; ++e) code[e] = (w >> (e * B)) & kMask;
      } else {
#pragma unroll
        for (int e = 0; e < kVChunk; ++e) code[e] = (__ldg(row + woff[e]) >> wsh[e]) & kMask;
      }
      if (one_group) {
        const float sc = half_at(v.scales, pbase + cg[0]);
        const float mn = group_min<B>(v, pbase + cg[0], sc);
#pragma unroll
        for (int e = 0; e < kVChunk; ++e) x[e] = fmaf(code_to_float(code[e]), sc, mn);
      } else {
#pragma unroll
        for (int e = 0; e < kVChunk; ++e) {
          const float sc = half_at(v.scales, pbase + cg[e]);
          x[e] = fmaf(code_to_float(code[e]), sc, group_min<B>(v, pbase + cg[e], sc));
        }
      }
    });
  }

  /// Per-channel values, token groups [g0, g1): o_d += scale_gd * sum_j p_j code_jd +
  /// min_gd * sum_j p_j (schemes/int/reads.cpp's acc_channel). One warp per group, lanes
  /// own channels lane, lane + 32, ...; adds into scratch[warp].
  template <int D>
  __device__ static void values_channel(const Block& bk, const View& v, int64_t g0, int64_t g1) {
    values_channel_as<D, kMaxGqa, false>(bk, v, g0, g1, nullptr);
  }

  /// Words a staged per-channel group keeps per channel: words_per_group rounded up to an odd
  /// count, so the lanes (one channel each) reading word w of their channels hit 32 different
  /// banks.
  __device__ static int stage_stride(int64_t wpg) { return static_cast<int>(wpg) | 1; }

  /// values_channel for query heads [0, NQ) (those below bk.nq). kStaged (the tiled kernel): each
  /// group's D * wpg words are first copied to this warp's `stage` (stage_stride words a
  /// channel, D of them within kStageWords) by coalesced loads, 16 bytes a lane where the words
  /// are 16-byte aligned, so a lane's reads of its channel's words hit shared memory; the sum of
  /// the group's weights is split over the lanes. The same products either way; the weights'
  /// sum is added in another order.
  template <int D, int NQ, bool kStaged>
  __device__ static void values_channel_as(const Block& bk, const View& v, int64_t g0, int64_t g1,
                                           uint32_t* stage) {
    const kivi::ChannelLayout L{bk.H, D, v.group, B};
    const int G = v.group;
    const int64_t wpg = L.words_per_group();
    const int sw = kStaged ? stage_stride(wpg) : static_cast<int>(wpg);
    constexpr int kPerLane = D / 32;
    float acc[NQ][kPerLane];
#pragma unroll
    for (int i = 0; i < NQ; ++i)
#pragma unroll
      for (int c = 0; c < kPerLane; ++c) acc[i][c] = 0.0f;
    for (int64_t g = g0 + bk.warp; g < g1; g += kWarps) {
      const float* p = bk.scores + (g * G - bk.s0);
      const int64_t pbase = L.param_index(g, bk.h, 0);
      const uint32_t* gw = v.words + L.word_index(g, bk.h, 0);  // channel d: gw[d * wpg + w]
      const uint32_t* src = gw;
      float psum[NQ];
      if constexpr (kStaged) {
        const int n = static_cast<int>(D * wpg), w = static_cast<int>(wpg);
        auto put = [&](int x, uint32_t word) { stage[(x / w) * sw + x % w] = word; };
        if (reinterpret_cast<uintptr_t>(gw) % 16 == 0 && n % 4 == 0) {
          for (int x = bk.lane; x < n / 4; x += 32) {
            const uint4 q = __ldg(reinterpret_cast<const uint4*>(gw) + x);
            put(4 * x, q.x);
            put(4 * x + 1, q.y);
            put(4 * x + 2, q.z);
            put(4 * x + 3, q.w);
          }
        } else {
          for (int x = bk.lane; x < n; x += 32) put(x, __ldg(gw + x));
        }
        src = stage;
#pragma unroll
        for (int i = 0; i < NQ; ++i) {
          psum[i] = 0.0f;
          if (i < bk.nq) {  // bk.nq is the same on every lane: the whole warp sums
            for (int j = bk.lane; j < G; j += 32) psum[i] += p[i * bk.ld + j];
            psum[i] = warp_sum(psum[i]);
          }
        }
        __syncwarp();  // the stage complete
      } else {
#pragma unroll
        for (int i = 0; i < NQ; ++i) {
          psum[i] = 0.0f;
          if (i < bk.nq)
            for (int j = 0; j < G; ++j) psum[i] += p[i * bk.ld + j];
        }
      }
#pragma unroll
      for (int c = 0; c < kPerLane; ++c) {
        const int d = bk.lane + 32 * c;
        const float sc = half_at(v.scales, pbase + d);
        const float mn = group_min<B>(v, pbase + d, sc);
        const uint32_t* cw = src + static_cast<int64_t>(d) * sw;
        float a[NQ];
#pragma unroll
        for (int i = 0; i < NQ; ++i) a[i] = 0.0f;
        for (int j0 = 0; j0 < G; j0 += kCpw) {
          uint32_t word;
          if constexpr (kStaged)
            word = cw[j0 / kCpw];
          else
            word = __ldg(cw + j0 / kCpw);
#pragma unroll
          for (int e = 0; e < kCpw; ++e) {
            if (j0 + e < G) {
              const float x = code_to_float((word >> (e * B)) & kMask);
#pragma unroll
              for (int i = 0; i < NQ; ++i)
                if (i < bk.nq) a[i] = fmaf(p[i * bk.ld + j0 + e], x, a[i]);
            }
          }
        }
#pragma unroll
        for (int i = 0; i < NQ; ++i) acc[i][c] += sc * a[i] + mn * psum[i];
      }
      if constexpr (kStaged) __syncwarp();  // the stage is rewritten for the next group
    }
    float* red = bk.scratch + bk.warp * bk.nq * D;
#pragma unroll
    for (int i = 0; i < NQ; ++i)
      if (i < bk.nq)
#pragma unroll
        for (int c = 0; c < kPerLane; ++c) red[i * D + bk.lane + 32 * c] += acc[i][c];
  }

  template <int D>
  __device__ static void values(const Block& bk, const View& v) {
    const int64_t qe = min(bk.s1, v.quantized_tokens);
    if (bk.s0 < qe) {
      if (v.axis == Axis::Token)
        values_token<D>(bk, v, bk.s0, qe);
      else
        values_channel<D>(bk, v, bk.s0 / v.group, qe / v.group);
    }
    __syncwarp();  // both paths add into this warp's scratch
    const int64_t r0 = max(bk.s0, v.quantized_tokens);
    if (r0 < bk.s1) values_residual<D>(bk, v.residual, v.quantized_tokens, r0, bk.s1);
  }
};

// ---- tiled phases (DecodeKernel::Tiled, issue 12) ---------------------------------------------
//
// Token-major rows (bf16, fp8, per-token int keys and values, the float32 residual) are read a warp
// at a time: a row's D channels are spread over D / 8 lanes (8 channels each: one 16-byte load of
// bf16, 8 bytes of fp8), so a warp step reads 32 / (D / 8) whole rows, each a contiguous run, and U
// steps are loaded before any is used (several loads in flight per lane). Scores: each lane dots
// its 8 channels with q held in registers and the row's lanes add by shuffles; values: each lane
// keeps NQ x 8 sums in registers, added across the warp's rows once at the end. NQ is the GQA group
// rounded up to 1, 2, 4 or 8 (register arrays sized by it, the rest masked by bk.nq). FP8 codes
// and 4-bit int codes are unpacked two at a time by kernels/cuda/unpack.h (tested on the host).
// Per-token int keys and values share one row loader (code * scale + min per lane). Per-channel
// int groups are staged in shared memory by coalesced 16-byte loads (keys: lane = token; values:
// lane = channel, each channel's words padded to an odd count so the lanes' reads hit different
// banks). Per-token sides with 3-bit words or groups that split a lane's 8 channels, and
// per-channel groups too long for the stage, take the baseline phases.

constexpr int kTiledChannels = 8;  // channels per lane of a token-major row
constexpr int kTiledUnroll = 2;    // warp steps loaded before use

/// A lane's place in a warp step: lane = r * kLanes + sub takes channels [c0, c0 + 8) of the
/// step's row slot r; warp w's steps start at rows w * kRows + m * kStep.
template <int D>
struct RowTile {
  static constexpr int kLanes = D / kTiledChannels;  // lanes per row: 8 (D 64) or 16 (D 128)
  static constexpr int kRows = 32 / kLanes;          // rows per warp step
  static constexpr int64_t kStep = static_cast<int64_t>(kWarps) * kRows;  // rows per block step
  static_assert(kLanes <= 32 && 32 % kLanes == 0, "a row's lanes sit in one warp");
  int sub, r, c0;
  __device__ explicit RowTile(int lane)
      : sub(lane % kLanes), r(lane / kLanes), c0(sub * kTiledChannels) {}
};

/// The rows of kTiledUnroll warp steps, all loaded before any is used: step u's row is
/// base + u * step; rows at or past t1 read as zeros with factor 0.
template <class Row>
__device__ __forceinline__ void tiled_load(int64_t base, int64_t step, int64_t t1, int c0, Row& row,
                                           float (&v)[kTiledUnroll][kTiledChannels],
                                           float (&f)[kTiledUnroll]) {
#pragma unroll
  for (int u = 0; u < kTiledUnroll; ++u) {
    const int64_t t = base + u * step;
    if (t < t1) {
      f[u] = row(t, c0, v[u]);
    } else {
      f[u] = 0.0f;
#pragma unroll
      for (int c = 0; c < kTiledChannels; ++c) v[u][c] = 0.0f;
    }
  }
}

/// Phase 1 over token-major rows [t0, t1): row(t, c0, v) loads channels [c0, c0 + 8) of K[t] as
/// floats into v and returns the factor the row's dot is multiplied by (fp8: the token factor).
template <int D, int NQ, class Row>
__device__ void tiled_scores(const Block& bk, int64_t t0, int64_t t1, Row row) {
  using Tile = RowTile<D>;
  constexpr int kL = Tile::kLanes, C = kTiledChannels;
  constexpr int64_t kStep = Tile::kStep;
  const Tile lt(bk.lane);
  const int sub = lt.sub, r = lt.r, c0 = lt.c0;
  float qr[NQ][C];
#pragma unroll
  for (int i = 0; i < NQ; ++i)
#pragma unroll
    for (int c = 0; c < C; ++c) qr[i][c] = i < bk.nq ? bk.q_s[i * D + c0 + c] : 0.0f;
  for (int64_t base = t0 + bk.warp * Tile::kRows + r; base - r < t1; base += kTiledUnroll * kStep) {
    float v[kTiledUnroll][C], f[kTiledUnroll];
    tiled_load(base, kStep, t1, c0, row, v, f);
#pragma unroll
    for (int u = 0; u < kTiledUnroll; ++u) {
      float acc[NQ];
#pragma unroll
      for (int i = 0; i < NQ; ++i) {
        float x = 0.0f;
#pragma unroll
        for (int c = 0; c < C; ++c) x = fmaf(qr[i][c], v[u][c], x);
        acc[i] = x;
      }
      // the row's lanes differ in the bits below kL (every lane takes part: full mask)
#pragma unroll
      for (int o = kL / 2; o > 0; o >>= 1)
#pragma unroll
        for (int i = 0; i < NQ; ++i) acc[i] += __shfl_xor_sync(kFullMask, acc[i], o);
      const int64_t t = base + u * kStep;
      if (sub == 0 && t < t1) {
#pragma unroll
        for (int i = 0; i < NQ; ++i)
          if (i < bk.nq) bk.scores[i * bk.ld + (t - bk.s0)] = acc[i] * f[u] * bk.inv_sqrt_d;
      }
    }
  }
}

/// Phase 3 over token-major rows [t0, t1): o_i += p_i[t] * f * V[t] with row() as in
/// tiled_scores (f: the factor it returns). Adds this warp's sums into scratch[warp].
template <int D, int NQ, class Row>
__device__ void tiled_values(const Block& bk, int64_t t0, int64_t t1, Row row) {
  using Tile = RowTile<D>;
  constexpr int kL = Tile::kLanes, C = kTiledChannels;
  constexpr int64_t kStep = Tile::kStep;
  const Tile lt(bk.lane);
  const int sub = lt.sub, r = lt.r, c0 = lt.c0;
  float acc[NQ][C];
#pragma unroll
  for (int i = 0; i < NQ; ++i)
#pragma unroll
    for (int c = 0; c < C; ++c) acc[i][c] = 0.0f;
  for (int64_t base = t0 + bk.warp * Tile::kRows + r; base - r < t1; base += kTiledUnroll * kStep) {
    float v[kTiledUnroll][C], f[kTiledUnroll];
    tiled_load(base, kStep, t1, c0, row, v, f);
#pragma unroll
    for (int u = 0; u < kTiledUnroll; ++u) {
      const int64_t t = base + u * kStep;
      const float* p = bk.scores + (t - bk.s0);
#pragma unroll
      for (int i = 0; i < NQ; ++i) {
        const float w = (t < t1 && i < bk.nq) ? p[i * bk.ld] * f[u] : 0.0f;
#pragma unroll
        for (int c = 0; c < C; ++c) acc[i][c] = fmaf(w, v[u][c], acc[i][c]);
      }
    }
  }
  // the warp's rows differ in the lane bits at and above kL
#pragma unroll
  for (int o = kL; o < 32; o <<= 1)
#pragma unroll
    for (int i = 0; i < NQ; ++i)
#pragma unroll
      for (int c = 0; c < C; ++c) acc[i][c] += __shfl_xor_sync(kFullMask, acc[i][c], o);
  if (r == 0) {
    float* red = bk.scratch + bk.warp * bk.nq * D + c0;
#pragma unroll
    for (int i = 0; i < NQ; ++i)
      if (i < bk.nq)
#pragma unroll
        for (int c = 0; c < C; ++c) red[i * D + c] += acc[i][c];
  }
  __syncwarp();  // the next phase of this warp may add into the same scratch
}

/// Row loaders of the tiled phases: channels [c0, c0 + 8) of row (t, h) as floats.
__device__ __forceinline__ void bf16x8(const uint16_t* row, int c0, float (&v)[kTiledChannels]) {
  const uint4 w = __ldg(reinterpret_cast<const uint4*>(row + c0));
  bf16x2(w.x, v[0], v[1]);
  bf16x2(w.y, v[2], v[3]);
  bf16x2(w.z, v[4], v[5]);
  bf16x2(w.w, v[6], v[7]);
}

__device__ __forceinline__ void half2x2(uint32_t bits, float& a, float& b) {
  __half2_raw r;
  r.x = static_cast<unsigned short>(bits & 0xffffu);
  r.y = static_cast<unsigned short>(bits >> 16);
  const float2 f = __half22float2(__half2(r));
  a = f.x;
  b = f.y;
}

/// 8 FP8 codes as floats times 2^-kHalfExpShift (unpack.h: two codes a half2); the caller folds
/// the power of two into the row's factor.
template <Fp8Format F>
__device__ __forceinline__ void fp8x8_scaled(const uint8_t* row, int c0,
                                             float (&v)[kTiledChannels]) {
  const uint2 w = __ldg(reinterpret_cast<const uint2*>(row + c0));
  const uint32_t x[2] = {w.x, w.y};
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const uint32_t two = (x[k / 2] >> (16 * (k % 2))) & 0xffffu;
    half2x2(unpack::fp8_pair_half2<F>(static_cast<uint16_t>(two)), v[2 * k], v[2 * k + 1]);
  }
}

__device__ __forceinline__ void f32x8(const float* row, int c0, float (&v)[kTiledChannels]) {
  const float4 a = __ldg(reinterpret_cast<const float4*>(row + c0));
  const float4 b = __ldg(reinterpret_cast<const float4*>(row + c0 + 4));
  v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
  v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}

/// The row loader of the float32 residual window (first: the window's first token).
template <int D>
__device__ auto residual_rows(const Block& bk, const float* residual, int64_t first) {
  return [&bk, residual, first](int64_t t, int c0, float(&v)[kTiledChannels]) {
    f32x8(residual + ((t - first) * bk.H + bk.h) * D, c0, v);
    return 1.0f;
  };
}

struct Bf16Tiled {
  static constexpr int kStageWords = 0;  // shared words per warp (none)
  template <int D, int NQ>
  __device__ static void scores(const Block& bk, const Bf16SideView& k) {
    tiled_scores<D, NQ>(bk, bk.s0, bk.s1, [&](int64_t t, int c0, float(&v)[kTiledChannels]) {
      bf16x8(k.data + (t * bk.H + bk.h) * D, c0, v);
      return 1.0f;
    });
  }
  template <int D, int NQ>
  __device__ static void values(const Block& bk, const Bf16SideView& v) {
    tiled_values<D, NQ>(bk, bk.s0, bk.s1, [&](int64_t t, int c0, float(&x)[kTiledChannels]) {
      bf16x8(v.data + (t * bk.H + bk.h) * D, c0, x);
      return 1.0f;
    });
  }
};

template <Fp8Format F>
struct Fp8Tiled {
  static constexpr int kStageWords = 0;
  template <int D, int NQ>
  __device__ static void scores(const Block& bk, const Fp8SideView& k) {
    const float p2 = pow2(unpack::kHalfExpShift<F>);
    tiled_scores<D, NQ>(bk, bk.s0, bk.s1, [&](int64_t t, int c0, float(&v)[kTiledChannels]) {
      fp8x8_scaled<F>(k.codes + (t * bk.H + bk.h) * D, c0, v);
      return fp8_token_factor(k, t, bk.h, bk.H) * p2;
    });
  }
  template <int D, int NQ>
  __device__ static void values(const Block& bk, const Fp8SideView& v) {
    const float p2 = pow2(unpack::kHalfExpShift<F>);
    tiled_values<D, NQ>(bk, bk.s0, bk.s1, [&](int64_t t, int c0, float(&x)[kTiledChannels]) {
      fp8x8_scaled<F>(v.codes + (t * bk.H + bk.h) * D, c0, x);
      return fp8_token_factor(v, t, bk.h, bk.H) * p2;
    });
  }
};

template <int B>
struct IntTiled {
  using Base = IntPolicy<B>;

  /// Whether a per-token side (keys or values) takes the tiled row loader: a lane's 8 channels
  /// sit in one group and in one word (B 2, 4) or two (B 8) of the token's packed run.
  __device__ static bool tiled_token_rows(const IntSideView& s) {
    // (3-bit words hold 10 codes: a lane's 8 channels may straddle two)
    return B != 3 && s.axis == Axis::Token && s.group % kTiledChannels == 0 &&
           s.group % Base::kCpw == 0;
  }

  /// Codes of channels [c0, c0 + 8) of a per-token row (tiled_token_rows holds) as floats.
  __device__ static void codes8(const uint32_t* row, int c0, float (&x)[kTiledChannels]) {
    static_assert(B != 3, "tiled_token_rows excludes 3-bit words");
    if constexpr (B == 4) {  // one word: pairs (k, k + 4) by the magic number (unpack.h)
      const uint32_t w = __ldg(row + c0 / 8);
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        float a, b;
        half2x2(unpack::int_pair_magic<4>(w, k), a, b);
        x[k] = a - 1024.0f;
        x[k + 4] = b - 1024.0f;
      }
    } else if constexpr (B == 2) {  // half a word
      const uint32_t w = __ldg(row + c0 / 16) >> ((c0 % 16) * 2);
#pragma unroll
      for (int e = 0; e < 8; ++e) x[e] = code_to_float((w >> (2 * e)) & 3u);
    } else {  // B == 8: two words (4-byte aligned only: two loads)
      const uint32_t w0 = __ldg(row + c0 / 4), w1 = __ldg(row + c0 / 4 + 1);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        x[e] = code_to_float((w0 >> (8 * e)) & 0xffu);
        x[e + 4] = code_to_float((w1 >> (8 * e)) & 0xffu);
      }
    }
  }

  /// The row loader of a per-token side's quantized rows (tiled_token_rows holds): channels
  /// [c0, c0 + 8) of row (t, h) as code * scale + min, one group's parameters per lane.
  template <int D>
  __device__ static auto token_rows(const Block& bk, const IntSideView& s) {
    return [&bk, &s](int64_t t, int c0, float(&x)[kTiledChannels]) {
      const kivi::TokenLayout L{bk.H, D, s.group, B};
      const int64_t pi = L.param_index(t, bk.h, c0 / s.group);
      const float sc = half_at(s.scales, pi);
      const float mn = group_min<B>(s, pi, sc);
      codes8(s.words + L.word_index(t, bk.h, 0), c0, x);
#pragma unroll
      for (int e = 0; e < kTiledChannels; ++e) x[e] = fmaf(x[e], sc, mn);
      return 1.0f;
    };
  }

  /// A per-channel group's words fit a warp's stage (keys: D * wpg words; values: each channel's
  /// run padded to an odd count, IntPolicy::stage_stride).
  __device__ static bool keys_staged(const IntSideView& k, int D) {
    return D * kivi::words_for(k.group, B) <= kStageWords;
  }
  __device__ static bool values_staged(const IntSideView& v, int D) {
    return D * Base::stage_stride(kivi::words_for(v.group, B)) <= kStageWords;
  }

  static constexpr int kStageWords = cuda::kStageWords;  // per-channel groups

  template <int D, int NQ>
  __device__ static void scores(const Block& bk, const IntSideView& k) {
    const int64_t qe = min(bk.s1, k.quantized_tokens);
    if (bk.s0 < qe) {
      if (tiled_token_rows(k)) {
        if constexpr (B != 3) tiled_scores<D, NQ>(bk, bk.s0, qe, token_rows<D>(bk, k));
      } else if (k.axis == Axis::Channel && keys_staged(k, D)) {
        Base::template scores_channel_as<D, NQ, true>(bk, k, bk.s0 / k.group, qe / k.group,
                                                      bk.stage + bk.warp * kStageWords);
      } else if (k.axis == Axis::Channel) {  // (a group too long to stage)
        Base::template scores_channel<D>(bk, k, bk.s0 / k.group, qe / k.group);
      } else {
        Base::template scores_token<D>(bk, k, bk.s0, qe);
      }
    }
    const int64_t r0 = max(bk.s0, k.quantized_tokens);
    if (r0 < bk.s1)
      tiled_scores<D, NQ>(bk, r0, bk.s1, residual_rows<D>(bk, k.residual, k.quantized_tokens));
  }

  template <int D, int NQ>
  __device__ static void values(const Block& bk, const IntSideView& v) {
    const int64_t qe = min(bk.s1, v.quantized_tokens);
    if (bk.s0 < qe) {
      if (tiled_token_rows(v)) {
        if constexpr (B != 3) tiled_values<D, NQ>(bk, bk.s0, qe, token_rows<D>(bk, v));
      } else {
        if (v.axis == Axis::Channel && values_staged(v, D))
          Base::template values_channel_as<D, NQ, true>(bk, v, bk.s0 / v.group, qe / v.group,
                                                        bk.stage + bk.warp * kStageWords);
        else if (v.axis == Axis::Channel)  // (a group too long to stage)
          Base::template values_channel<D>(bk, v, bk.s0 / v.group, qe / v.group);
        else
          Base::template values_token<D>(bk, v, bk.s0, qe);
        __syncwarp();  // the residual rows add into the same scratch
      }
    }
    const int64_t r0 = max(bk.s0, v.quantized_tokens);
    if (r0 < bk.s1)
      tiled_values<D, NQ>(bk, r0, bk.s1, residual_rows<D>(bk, v.residual, v.quantized_tokens));
  }
};

/// The tiled form of each baseline policy.
template <class Policy>
struct TiledOf;
template <>
struct TiledOf<Bf16Policy> {
  using type = Bf16Tiled;
};
template <Fp8Format F>
struct TiledOf<Fp8Policy<F>> {
  using type = Fp8Tiled<F>;
};
template <int B>
struct TiledOf<IntPolicy<B>> {
  using type = IntTiled<B>;
};

// ---- the kernels -------------------------------------------------------------------------------

/// One split block. kTiled: the tiled phases (TiledOf<Policy>, GQA group padded to NQ), else the
/// baseline's (NQ unused).
template <int D, class Policy, bool kTiled, int NQ>
__global__ void __launch_bounds__(kThreads, kTiled ? 1 : Policy::kMinBlocks)
    split_kernel(const __grid_constant__ SplitParams<typename Policy::View> p) {
  const int split = static_cast<int>(blockIdx.x), h = static_cast<int>(blockIdx.y),
            b = static_cast<int>(blockIdx.z);
  const auto& kv = p.k[b];
  const auto& vv = p.v[b];
  const int64_t T = kv.tokens;
  Block bk;
  bk.s0 = static_cast<int64_t>(split) * p.split_tokens;
  if (bk.s0 >= T) return;  // this sequence is shorter than the longest one
  bk.s1 = min(T, bk.s0 + p.split_tokens);
  bk.h = h;
  bk.H = p.kv_heads;
  bk.nq = p.nq;
  bk.ld = static_cast<int>(p.split_tokens);
  bk.inv_sqrt_d = p.inv_sqrt_d;
  bk.tid = static_cast<int>(threadIdx.x);
  bk.lane = bk.tid % 32;
  bk.warp = bk.tid / 32;
  extern __shared__ float4 smem4[];
  float* smem = reinterpret_cast<float*>(smem4);
  bk.q_s = smem;
  bk.scratch = bk.q_s + bk.nq * D;
  bk.scores = bk.scratch + kWarps * bk.nq * D;
  bk.stage = reinterpret_cast<uint32_t*>(smem + stage_offset(bk.nq, D, bk.ld));

  const int q_heads = p.kv_heads * p.nq;
  const int64_t qrow = static_cast<int64_t>(b) * q_heads + static_cast<int64_t>(h) * p.nq;
  for (int x = bk.tid; x < bk.nq * D; x += kThreads)
    bk.q_s[x] = __ldg(p.q + qrow * D + x) *
                Policy::key_channel_factor(kv, static_cast<int64_t>(h) * D + x % D);
  __syncthreads();

  if constexpr (kTiled)
    TiledOf<Policy>::type::template scores<D, NQ>(bk, kv);
  else
    Policy::template scores<D>(bk, kv);
  __syncthreads();

  // Softmax partial: one warp per query head.
  const int n = static_cast<int>(bk.s1 - bk.s0);
  for (int i = bk.warp; i < bk.nq; i += kWarps) {
    float* row = bk.scores + i * bk.ld;
    float m = -INFINITY;
    for (int t = bk.lane; t < n; t += 32) m = fmaxf(m, row[t]);
    m = warp_max(m);
    float l = 0.0f;
    for (int t = bk.lane; t < n; t += 32) {
      const float e = expf(row[t] - m);
      row[t] = e;
      l += e;
    }
    l = warp_sum(l);
    if (bk.lane == 0) {
      float* ml = p.part_ml + ((qrow + i) * p.splits + split) * 2;
      ml[0] = m;
      ml[1] = l;
    }
  }
  for (int x = bk.tid; x < kWarps * bk.nq * D; x += kThreads) bk.scratch[x] = 0.0f;
  __syncthreads();

  if constexpr (kTiled)
    TiledOf<Policy>::type::template values<D, NQ>(bk, vv);
  else
    Policy::template values<D>(bk, vv);
  __syncthreads();

  for (int x = bk.tid; x < bk.nq * D; x += kThreads) {
    float s = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) s += bk.scratch[w * bk.nq * D + x];
    const int i = x / D, d = x % D;
    p.part_o[((qrow + i) * p.splits + split) * D + d] =
        s * Policy::value_channel_factor(vv, static_cast<int64_t>(h) * D + d);
  }
}

__global__ void merge_kernel(const __grid_constant__ MergeParams p) {
  const int qh = static_cast<int>(blockIdx.x), b = static_cast<int>(blockIdx.y);
  const int ns = static_cast<int>((p.tokens[b] + p.split_tokens - 1) / p.split_tokens);
  const int64_t row = static_cast<int64_t>(b) * p.q_heads + qh;
  const float* ml = p.part_ml + row * p.splits * 2;
  const float* o = p.part_o + row * p.splits * p.dim;
  float m = -INFINITY;
  for (int s = 0; s < ns; ++s) m = fmaxf(m, ml[2 * s]);
  for (int d = static_cast<int>(threadIdx.x); d < p.dim; d += static_cast<int>(blockDim.x)) {
    float l = 0.0f, acc = 0.0f;
    for (int s = 0; s < ns; ++s) {
      const float w = expf(ml[2 * s] - m);
      l = fmaf(w, ml[2 * s + 1], l);
      acc = fmaf(w, o[static_cast<int64_t>(s) * p.dim + d], acc);
    }
    p.out[row * p.dim + d] = acc / l;
  }
}

// ---- host: checks, plan, launch ----------------------------------------------------------------

constexpr const char* kFn = "kvq::cuda::decode_attention";

[[noreturn]] void bad(const std::string& what) { throw Error(std::string(kFn) + ": " + what); }

std::string seq_side(size_t b, const char* side) {
  return "sequence " + std::to_string(b) + " " + side + ": ";
}

void check_aligned(const void* ptr, size_t align, const std::string& what) {
  if (reinterpret_cast<uintptr_t>(ptr) % align != 0)
    bad(what + " is not " + std::to_string(align) + "-byte aligned");
}

template <class View>
int64_t check_common(const DecodeShape& s, std::span<const View> k, std::span<const View> v) {
  if (s.batch < 1 || s.batch > kMaxBatch)
    bad("batch " + std::to_string(s.batch) + " outside [1, " + std::to_string(kMaxBatch) + "]");
  if (s.kv_heads < 1) bad("kv_heads " + std::to_string(s.kv_heads) + " must be positive");
  if (s.q_heads < 1 || s.q_heads % s.kv_heads != 0)
    bad("q_heads " + std::to_string(s.q_heads) + " is not a positive multiple of kv_heads " +
        std::to_string(s.kv_heads));
  if (s.q_heads / s.kv_heads > kMaxGqa)
    bad("GQA ratio " + std::to_string(s.q_heads / s.kv_heads) + " (q_heads " +
        std::to_string(s.q_heads) + " / kv_heads " + std::to_string(s.kv_heads) +
        ") exceeds the supported " + std::to_string(kMaxGqa));
  dispatch_head_dim(kFn, s.head_dim, [](auto) { return 0; });
  if (k.size() != static_cast<size_t>(s.batch) || v.size() != static_cast<size_t>(s.batch))
    bad("batch " + std::to_string(s.batch) + " but " + std::to_string(k.size()) + " K and " +
        std::to_string(v.size()) + " V views");
  int64_t max_tokens = 0;
  for (size_t b = 0; b < k.size(); ++b) {
    if (k[b].tokens < 1)
      bad(seq_side(b, "K") + "tokens " + std::to_string(k[b].tokens) + " (a cache must hold >= 1)");
    if (k[b].tokens != v[b].tokens)
      bad(seq_side(b, "K") + "tokens " + std::to_string(k[b].tokens) + " != V tokens " +
          std::to_string(v[b].tokens));
    max_tokens = std::max(max_tokens, k[b].tokens);
  }
  return max_tokens;
}

void check_view(const Bf16SideView& x, size_t b, const char* side) {
  if (x.data == nullptr) bad(seq_side(b, side) + "data is null");
  check_aligned(x.data, 16, seq_side(b, side) + "data");
}

void check_view(const Fp8SideView& x, size_t b, const char* side) {
  if (x.codes == nullptr) bad(seq_side(b, side) + "codes is null");
  if (x.scales == nullptr) bad(seq_side(b, side) + "scales is null");
  check_aligned(x.codes, 8, seq_side(b, side) + "codes");
  if (x.gran != Granularity::Tensor && x.gran != Granularity::Head &&
      x.gran != Granularity::Token && x.gran != Granularity::Channel)
    bad(seq_side(b, side) + "unknown Granularity value " +
        std::to_string(static_cast<int>(x.gran)));
}

void check_view(const IntSideView& x, size_t b, const char* side, int64_t dim) {
  const std::string where = seq_side(b, side);
  dispatch_bits(kFn, x.bits, [](auto) { return 0; });
  if (x.axis != Axis::Channel && x.axis != Axis::Token)
    bad(where + "unknown Axis value " + std::to_string(static_cast<int>(x.axis)));
  if (x.group < 1) bad(where + "group " + std::to_string(x.group) + " must be positive");
  if (x.axis == Axis::Token && x.group > dim)
    bad(where + "per-token group " + std::to_string(x.group) + " exceeds head_dim " +
        std::to_string(dim));
  if (x.quantized_tokens < 0 || x.quantized_tokens > x.tokens)
    bad(where + "quantized_tokens " + std::to_string(x.quantized_tokens) + " outside [0, " +
        std::to_string(x.tokens) + "]");
  if (x.axis == Axis::Channel && x.quantized_tokens % x.group != 0)
    bad(where + "per-channel quantized_tokens " + std::to_string(x.quantized_tokens) +
        " is not a multiple of group " + std::to_string(x.group));
  if (x.quantized_tokens > 0) {
    if (x.words == nullptr) bad(where + "words is null");
    if (x.scales == nullptr) bad(where + "scales is null");
    if (!x.sym && x.mins == nullptr) bad(where + "mins is null (asymmetric codes need them)");
    check_aligned(x.words, 4, where + "words");
    check_aligned(x.scales, 2, where + "scales");
    if (!x.sym) check_aligned(x.mins, 2, where + "mins");
  }
  if (x.tokens > x.quantized_tokens) {
    if (x.residual == nullptr) bad(where + "residual is null");
    check_aligned(x.residual, 16, where + "residual");
  }
}

/// Splits (see DecodePlan): about kTargetBlocks blocks, at least kMinSplit tokens each, a
/// multiple of `align`, and no more tokens than the shared score buffer holds; or the shape's
/// split_tokens, rounded up to a multiple of `align` (it must fit the buffer).
DecodePlan make_plan(const DecodeShape& s, int64_t max_tokens, int64_t align) {
  const int nq = s.q_heads / s.kv_heads;
  const int64_t cap = kScoreFloats / nq / align * align;
  if (cap < 1)
    bad("group " + std::to_string(align) + " exceeds the " + std::to_string(kScoreFloats / nq) +
        " tokens a split holds at GQA ratio " + std::to_string(nq));
  if (s.split_tokens < 0)
    bad("split_tokens " + std::to_string(s.split_tokens) + " is negative (0: automatic)");
  int64_t split = 0;
  if (s.split_tokens > 0) {
    split = (s.split_tokens + align - 1) / align * align;
    if (split > cap)
      bad("split_tokens " + std::to_string(s.split_tokens) + " (" + std::to_string(split) +
          " as a multiple of group " + std::to_string(align) + ") exceeds the " +
          std::to_string(cap) + " tokens a split holds at GQA ratio " + std::to_string(nq));
  } else {
    const int64_t per_split = static_cast<int64_t>(s.batch) * s.kv_heads;
    const int64_t want = std::max<int64_t>(1, (kTargetBlocks + per_split - 1) / per_split);
    split = std::max<int64_t>((max_tokens + want - 1) / want, kMinSplit);
    split = std::min((split + align - 1) / align * align, cap);
  }
  DecodePlan plan;
  plan.split_tokens = split;
  const int64_t splits = (max_tokens + split - 1) / split;
  if (splits > std::numeric_limits<int>::max())
    bad("context " + std::to_string(max_tokens) + " needs more splits than a grid holds");
  plan.splits = static_cast<int>(splits);
  plan.workspace_bytes = static_cast<size_t>(s.batch) * static_cast<size_t>(s.q_heads) *
                         static_cast<size_t>(splits) * static_cast<size_t>(s.head_dim + 2) *
                         sizeof(float);
  return plan;
}

template <class Policy, int D>
cudaError_t launch(const DecodeShape& s, const DecodePlan& plan,
                   std::span<const typename Policy::View> k,
                   std::span<const typename Policy::View> v, const float* q, float* out,
                   void* workspace, size_t workspace_bytes, cudaStream_t stream,
                   DecodeKernel kernel) {
  if (kernel != DecodeKernel::Baseline && kernel != DecodeKernel::Tiled &&
      kernel != DecodeKernel::Mma)
    bad("unknown DecodeKernel value " + std::to_string(static_cast<int>(kernel)));
  if (q == nullptr) bad("q is null");
  if (out == nullptr) bad("out is null");
  if (workspace == nullptr || workspace_bytes < plan.workspace_bytes)
    bad("workspace of " + std::to_string(workspace_bytes) + " bytes" +
        (workspace == nullptr ? std::string(" (null)") : std::string()) + " but the plan needs " +
        std::to_string(plan.workspace_bytes));
  static_assert(sizeof(SplitParams<typename Policy::View>) <= 32764, "kernel parameter limit");
  if (sizeof(SplitParams<typename Policy::View>) > 4096) {
    static const int driver = [] {
      int v = 0;
      return cudaDriverGetVersion(&v) == cudaSuccess ? v : 0;
    }();
    if (driver > 0 && driver < kMinDriver)  // (no driver: the launch reports it)
      bad("the kernels' " + std::to_string(sizeof(SplitParams<typename Policy::View>)) +
          "-byte parameters need a CUDA 12.1+ driver; this one is " +
          std::to_string(driver / 1000) + "." + std::to_string(driver % 1000 / 10));
  }
  const int nq = s.q_heads / s.kv_heads;
  // Mma (attention_mma.cu) covers bf16 caches, FP8 with any scale granularity and the 2- / 4-bit
  // KIVI int layouts (detail::mma_fp8_supported / mma_int_supported say which); on every other
  // cache it runs the tiled kernel.
  bool mma = false;
  if constexpr (std::is_same_v<Policy, Bf16Policy>)
    mma = kernel == DecodeKernel::Mma && detail::mma_bf16_supported(D, nq, plan.split_tokens);
  if constexpr (std::is_same_v<typename Policy::View, IntSideView>)
    mma = kernel == DecodeKernel::Mma &&
          detail::mma_int_supported(k[0].bits, D, nq, plan.split_tokens, k, v);
  if constexpr (std::is_same_v<typename Policy::View, Fp8SideView>)
    mma = kernel == DecodeKernel::Mma && detail::mma_fp8_supported(D, nq, plan.split_tokens, k, v);
  if (kernel == DecodeKernel::Mma && !mma) kernel = DecodeKernel::Tiled;
  SplitParams<typename Policy::View> sp{};
  MergeParams mp{};
  for (int b = 0; b < s.batch; ++b) {
    sp.k[b] = k[static_cast<size_t>(b)];
    sp.v[b] = v[static_cast<size_t>(b)];
    mp.tokens[b] = k[static_cast<size_t>(b)].tokens;
  }
  float* part_o = static_cast<float*>(workspace);
  float* part_ml = part_o + static_cast<size_t>(s.batch) * s.q_heads * plan.splits * D;
  sp.q = q;
  sp.part_o = part_o;
  sp.part_ml = part_ml;
  sp.split_tokens = plan.split_tokens;
  sp.splits = plan.splits;
  sp.kv_heads = s.kv_heads;
  sp.nq = nq;
  sp.inv_sqrt_d = 1.0f / std::sqrt(static_cast<float>(D));
  // q_s, scratch and scores (Block), then the tiled int kernels' stage
  const int stage = kernel == DecodeKernel::Tiled ? TiledOf<Policy>::type::kStageWords : 0;
  const size_t smem =
      (static_cast<size_t>(stage_offset(nq, D, plan.split_tokens)) + kWarps * stage) *
      sizeof(float);
  const dim3 grid(static_cast<unsigned>(plan.splits), static_cast<unsigned>(s.kv_heads),
                  static_cast<unsigned>(s.batch));
  // Above 48 KB of dynamic shared memory a kernel must opt in (tiled int kernels at GQA 5-8 with
  // a full split: q, scratch, scores and the stage).
  auto run = [&](auto kern) -> cudaError_t {
    if (smem > 48 * 1024)
      KVQ_CUDA_CALL(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(smem)));
    kern<<<grid, kThreads, smem, stream>>>(sp);
    return cudaGetLastError();
  };
  static_assert(kMaxGqa == 8, "the tiled kernels pad the GQA group to at most 8");
  if constexpr (std::is_same_v<Policy, Bf16Policy>) {
    if (mma) KVQ_CUDA_CALL(detail::launch_mma_bf16(D, sp, grid, stream));
  }
  if constexpr (std::is_same_v<typename Policy::View, IntSideView>) {
    if (mma) KVQ_CUDA_CALL(detail::launch_mma_int(k[0].bits, D, sp, grid, stream));
  }
  if constexpr (std::is_same_v<typename Policy::View, Fp8SideView>) {
    if (mma) KVQ_CUDA_CALL(detail::launch_mma_fp8(k[0].format, D, sp, grid, stream));
  }
  if (mma) {
    // (launched above)
  } else if (kernel == DecodeKernel::Baseline)
    KVQ_CUDA_CALL(run(split_kernel<D, Policy, false, 0>));
  else if (nq == 1)  // tiled: the GQA group padded to 1, 2, 4 or 8 query heads
    KVQ_CUDA_CALL(run(split_kernel<D, Policy, true, 1>));
  else if (nq == 2)
    KVQ_CUDA_CALL(run(split_kernel<D, Policy, true, 2>));
  else if (nq <= 4)
    KVQ_CUDA_CALL(run(split_kernel<D, Policy, true, 4>));
  else
    KVQ_CUDA_CALL(run(split_kernel<D, Policy, true, 8>));
  mp.part_o = part_o;
  mp.part_ml = part_ml;
  mp.out = out;
  mp.split_tokens = plan.split_tokens;
  mp.splits = plan.splits;
  mp.q_heads = s.q_heads;
  mp.dim = D;
  merge_kernel<<<dim3(static_cast<unsigned>(s.q_heads), static_cast<unsigned>(s.batch)), D, 0,
                 stream>>>(mp);
  return cudaGetLastError();
}

Fp8Format common_format(std::span<const Fp8SideView> k, std::span<const Fp8SideView> v) {
  const Fp8Format f = k[0].format;
  for (size_t b = 0; b < k.size(); ++b) {
    if (k[b].format != f || v[b].format != f)
      bad(seq_side(b, "K/V") + "fp8 format " +
          std::to_string(static_cast<int>(k[b].format != f ? k[b].format : v[b].format)) +
          " differs from sequence 0's K format " + std::to_string(static_cast<int>(f)) +
          " (one format per launch)");
  }
  return f;
}

int common_bits(std::span<const IntSideView> k, std::span<const IntSideView> v) {
  const int bits = k[0].bits;
  for (size_t b = 0; b < k.size(); ++b)
    if (k[b].bits != bits || v[b].bits != bits)
      bad(seq_side(b, "K/V") + "bits " + std::to_string(k[b].bits != bits ? k[b].bits : v[b].bits) +
          " differ from sequence 0's K bits " + std::to_string(bits) + " (one width per launch)");
  return bits;
}

/// lcm of the groups of the per-channel sides: splits must hold whole token groups.
int64_t channel_align(std::span<const IntSideView> k, std::span<const IntSideView> v) {
  int64_t a = 1;
  for (auto side : {k, v})
    for (const IntSideView& x : side)
      if (x.axis == Axis::Channel && x.group > 0) a = std::lcm(a, static_cast<int64_t>(x.group));
  return a;
}

}  // namespace

// ---- public entry points
// -------------------------------------------------------------------------

DecodePlan plan_decode(const DecodeShape& shape, std::span<const Bf16SideView> k,
                       std::span<const Bf16SideView> v) {
  return make_plan(shape, check_common(shape, k, v), 1);
}

DecodePlan plan_decode(const DecodeShape& shape, std::span<const Fp8SideView> k,
                       std::span<const Fp8SideView> v) {
  return make_plan(shape, check_common(shape, k, v), 1);
}

DecodePlan plan_decode(const DecodeShape& shape, std::span<const IntSideView> k,
                       std::span<const IntSideView> v) {
  const int64_t max_tokens = check_common(shape, k, v);
  for (size_t b = 0; b < k.size(); ++b) {
    check_view(k[b], b, "K", shape.head_dim);
    check_view(v[b], b, "V", shape.head_dim);
  }
  return make_plan(shape, max_tokens, channel_align(k, v));
}

cudaError_t decode_attention(const DecodeShape& shape, std::span<const Bf16SideView> k,
                             std::span<const Bf16SideView> v, const float* q, float* out,
                             void* workspace, size_t workspace_bytes, cudaStream_t stream,
                             DecodeKernel kernel) {
  const DecodePlan plan = plan_decode(shape, k, v);
  for (size_t b = 0; b < k.size(); ++b) {
    check_view(k[b], b, "K");
    check_view(v[b], b, "V");
  }
  return dispatch_head_dim(kFn, shape.head_dim, [&](auto dc) {
    return launch<Bf16Policy, decltype(dc)::value>(shape, plan, k, v, q, out, workspace,
                                                   workspace_bytes, stream, kernel);
  });
}

cudaError_t decode_attention(const DecodeShape& shape, std::span<const Fp8SideView> k,
                             std::span<const Fp8SideView> v, const float* q, float* out,
                             void* workspace, size_t workspace_bytes, cudaStream_t stream,
                             DecodeKernel kernel) {
  const DecodePlan plan = plan_decode(shape, k, v);
  for (size_t b = 0; b < k.size(); ++b) {
    check_view(k[b], b, "K");
    check_view(v[b], b, "V");
  }
  return dispatch_fp8_format(kFn, common_format(k, v), [&](auto fc) {
    return dispatch_head_dim(kFn, shape.head_dim, [&](auto dc) {
      return launch<Fp8Policy<decltype(fc)::value>, decltype(dc)::value>(
          shape, plan, k, v, q, out, workspace, workspace_bytes, stream, kernel);
    });
  });
}

cudaError_t decode_attention(const DecodeShape& shape, std::span<const IntSideView> k,
                             std::span<const IntSideView> v, const float* q, float* out,
                             void* workspace, size_t workspace_bytes, cudaStream_t stream,
                             DecodeKernel kernel) {
  const DecodePlan plan = plan_decode(shape, k, v);
  return dispatch_bits(kFn, common_bits(k, v), [&](auto bc) {
    return dispatch_head_dim(kFn, shape.head_dim, [&](auto dc) {
      return launch<IntPolicy<decltype(bc)::value>, decltype(dc)::value>(
          shape, plan, k, v, q, out, workspace, workspace_bytes, stream, kernel);
    });
  });
}

}  // namespace kvq::cuda
