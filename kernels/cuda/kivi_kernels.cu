// KIVI quantize-and-pack kernels: ports of kivi/cache.cpp's quantize_columns (per-channel) and
// quantize_row (per-token), i.e. of kivi/group.h's quantize_group over each group.
//
// Both call the shared header functions (kivi/minmax.h GroupRange / minmax_params / encode,
// kivi/pack.h shift_of / words_for, kivi/layout.h for every index), so the device stores exactly
// the CPU's bytes. The min / max of a finite group does not depend on the order its values are
// seen in (min_step / max_step are exact, minmax_params takes zeros as +0), so the warp reduction
// may combine them in any order; a NaN or inf anywhere clears `finite` and gives NaN parameters.
#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>

#include "core/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/kivi_kernels.cuh"
#include "kivi/group.h"
#include "kivi/layout.h"
#include "kivi/minmax.h"
#include "kivi/pack.h"

namespace kvq::cuda {
namespace {

using kivi::ChannelLayout;
using kivi::TokenLayout;

constexpr int kBlock = 256;              // threads per block
constexpr int kWarps = kBlock / 32;      // per-token: 32 / span channel groups per warp
constexpr int64_t kMaxBlocks = 1 << 16;  // grid-stride loops cover the rest
constexpr unsigned kFullMask = 0xffffffffu;

int grid_for(int64_t work, int64_t per_block) {
  return static_cast<int>(std::clamp<int64_t>((work + per_block - 1) / per_block, 1, kMaxBlocks));
}

// ---- per-channel (KIVI keys) ------------------------------------------------------------------

/// Thread j = (token group g, column c = h * D + d) quantizes its G values x[(g*G + i) * H*D + c]
/// with kivi::quantize_group, the CPU's definition of one group. j is also the group's
/// ChannelLayout::param_index(g, h, d), and its words start at j * words_per_group(). The min /
/// max needs no cross-thread reduction: a column's G values are one thread's, which is what makes
/// the loads coalesced (a warp reads 32 neighbouring columns of one token row per step).
template <int B>
__global__ void __launch_bounds__(kBlock)
    quantize_channel_kernel(const float* x, ChannelLayout lay, int64_t groups, bool sym,
                            uint32_t* words, uint16_t* scales, uint16_t* mins) {
  const int64_t cols = lay.heads * lay.dim, n = groups * cols, wpg = lay.words_per_group();
  for (int64_t j = static_cast<int64_t>(blockIdx.x) * kBlock + threadIdx.x; j < n;
       j += static_cast<int64_t>(gridDim.x) * kBlock) {
    const int64_t g = j / cols, c = j - g * cols;
    kivi::quantize_group(x + g * lay.group * cols + c, cols, lay.group, B, sym, words + j * wpg,
                         scales + j, sym ? nullptr : mins + j);
  }
}

// ---- per-token (KIVI values) ------------------------------------------------------------------

/// How the per-token kernel splits a group of G channels over lanes: each lane packs K whole
/// words (K * codes_per_word codes), `span` lanes (a power of two) share a group and 32 / span
/// groups share a warp. E.g. b=2, G=32: 2 words per group, span 2, 16 groups per warp.
struct TokenSplit {
  int words_per_lane = 1;  ///< K
  int span = 1;            ///< lanes per group
  static TokenSplit of(int group, int bits) {
    const int wpg = static_cast<int>(kivi::words_for(group, bits));
    TokenSplit s;
    s.words_per_lane = (wpg + 31) / 32;
    const int lanes = (wpg + s.words_per_lane - 1) / s.words_per_lane;
    while (s.span < lanes) s.span *= 2;
    return s;
  }
};

/// Loads the n <= kCpw values of one word's run starting at p (zero past n): kCpw / 4 float4 loads
/// when `vec` (p 16-byte aligned, kCpw a multiple of 4, a whole word), else scalar loads.
template <int kCpw>
__device__ __forceinline__ void load_run(const float* p, int n, bool vec, float (&v)[kCpw]) {
  if constexpr (kCpw % 4 == 0) {
    if (vec && n == kCpw) {
#pragma unroll
      for (int j = 0; j < kCpw / 4; ++j) {
        const float4 q = reinterpret_cast<const float4*>(p)[j];
        v[4 * j] = q.x;
        v[4 * j + 1] = q.y;
        v[4 * j + 2] = q.z;
        v[4 * j + 3] = q.w;
      }
      return;
    }
  }
#pragma unroll
  for (int j = 0; j < kCpw; ++j) v[j] = j < n ? p[j] : 0.0f;
}

/// The flat list of rows * ceil(D / G) channel groups (row r = (token, head); `lay` has heads = 1,
/// so row r is its token r and group f = r * n_cg + c has parameters at index f), 32 / span
/// groups per warp. Lane i of a group owns words [i*K, i*K + K) of it: it folds their values into
/// a GroupRange (identities +inf / -inf where it has none), a segmented xor-shuffle reduction over
/// the span lanes gives each lane the group's range, minmax_params, then the lane encodes and
/// packs its words itself (kivi::encode, kivi::shift_of): the CPU's quantize_row, split by words.
/// Neighbouring lanes read neighbouring runs of the row (coalesced) and write neighbouring words.
template <int B>
__global__ void __launch_bounds__(kBlock)
    quantize_token_kernel(const float* x, int64_t rows, TokenLayout lay, TokenSplit split,
                          bool vec, bool sym, uint32_t* words, uint16_t* scales, uint16_t* mins) {
  constexpr int kCpw = kivi::codes_per_word(B);
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int span = split.span, per_warp = 32 / span, K = split.words_per_lane;
  const int64_t ncg = lay.channel_groups(), total = rows * ncg;
  const int gi = lane / span, i0 = lane % span;  // this lane's group in the warp, its part
  const float kPosInf = bits_float(0x7f800000u), kNegInf = bits_float(0xff800000u);

  for (int64_t f0 = (static_cast<int64_t>(blockIdx.x) * kWarps + warp) * per_warp; f0 < total;
       f0 += static_cast<int64_t>(gridDim.x) * kWarps * per_warp) {
    const int64_t f = f0 + gi;
    const int64_t row = f < total ? f / ncg : 0, c = f < total ? f - row * ncg : 0;
    const int len = f < total ? lay.group_len(c) : 0;  // 0: past the last group
    const float* xg = x + row * lay.dim + c * lay.group;
    const int w_end = min(i0 * K + K, static_cast<int>(kivi::words_for(len, B)));

    kivi::GroupRange r;
    r.mn = kPosInf;
    r.mx = kNegInf;
    r.finite = true;
    for (int w = i0 * K; w < w_end; ++w) {
      const int n = min(kCpw, len - w * kCpw);
      float v[kCpw];
      load_run<kCpw>(xg + w * kCpw, n, vec, v);
#pragma unroll
      for (int j = 0; j < kCpw; ++j)
        if (j < n) r.add(v[j]);
    }
    for (int off = span / 2; off > 0; off /= 2) {
      r.mn = kivi::min_step(__shfl_xor_sync(kFullMask, r.mn, off), r.mn);
      r.mx = kivi::max_step(__shfl_xor_sync(kFullMask, r.mx, off), r.mx);
      r.finite = (__shfl_xor_sync(kFullMask, static_cast<int>(r.finite), off) != 0) && r.finite;
    }
    if (len == 0) continue;
    const kivi::GroupParams p = kivi::minmax_params(r, B, sym);
    if (i0 == 0) {
      scales[f] = p.scale_h;  // == lay.param_index(row, 0, c)
      if (!sym) mins[f] = p.min_h;
    }
    uint32_t* wg = words + lay.word_index(row, 0, c);
    for (int w = i0 * K; w < w_end; ++w) {
      const int n = min(kCpw, len - w * kCpw);
      float v[kCpw];
      load_run<kCpw>(xg + w * kCpw, n, vec, v);  // again: an L1 hit
      uint32_t word = 0;  // unused high codes stay zero, as kivi::pack leaves them
#pragma unroll
      for (int j = 0; j < kCpw; ++j)
        if (j < n) word |= kivi::encode(v[j], p, B, sym) << kivi::shift_of(j, B);
      wg[w] = word;
    }
  }
}

// ---- configuration checks and dispatch --------------------------------------------------------

[[noreturn]] void bad_config(const std::string& what) {
  throw Error("kvq::cuda::kivi_quantize: " + what);
}

/// Turns the runtime bit width into a template argument (STYLE 8); the default names the value.
template <typename Fn>
cudaError_t with_bits(int bits, Fn&& body) {
  switch (bits) {
    case 2:
      return body(std::integral_constant<int, 2>{});
    case 3:
      return body(std::integral_constant<int, 3>{});
    case 4:
      return body(std::integral_constant<int, 4>{});
    case 8:
      return body(std::integral_constant<int, 8>{});
    default:
      bad_config("kivi: " + std::to_string(bits) + " bits not supported (allowed: 2, 3, 4, 8)");
  }
}

void check_ptr(const void* p, const char* name, int64_t count) {
  if (count > 0 && p == nullptr)
    bad_config(std::string(name) + " is null but must hold " + std::to_string(count) + " values");
}

}  // namespace

cudaError_t kivi_quantize(Axis axis, int bits, bool sym, int group, Shape3 shape, const float* x,
                          uint32_t* words, uint16_t* scales, uint16_t* mins,
                          cudaStream_t stream) {
  if (bits != 2 && bits != 3 && bits != 4 && bits != 8)
    bad_config("kivi: " + std::to_string(bits) + " bits not supported (allowed: 2, 3, 4, 8)");
  if (group < 1) bad_config("group g=" + std::to_string(group) + " must be >= 1");
  if (shape.tokens < 0 || shape.heads < 0 || shape.dim < 0)
    bad_config("shape [T=" + std::to_string(shape.tokens) + ", H=" + std::to_string(shape.heads) +
               ", D=" + std::to_string(shape.dim) + "] has a negative size");
  int64_t word_count = 0, param_count = 0;
  if (axis == Axis::Channel) {
    if (shape.tokens % group != 0)
      bad_config("per-channel: T=" + std::to_string(shape.tokens) +
                 " tokens is not a multiple of g=" + std::to_string(group));
    const ChannelLayout lay{shape.heads, shape.dim, group, bits};
    word_count = lay.words_for_tokens(shape.tokens);
    param_count = lay.params_for_tokens(shape.tokens);
  } else if (axis == Axis::Token) {
    if (group > shape.dim)
      bad_config("per-token: group g=" + std::to_string(group) + " is larger than head_dim " +
                 std::to_string(shape.dim));
    const TokenLayout lay{shape.heads, shape.dim, group, bits};
    word_count = lay.words_for_tokens(shape.tokens);
    param_count = lay.params_for_tokens(shape.tokens);
  } else {
    bad_config("unknown Axis value " + std::to_string(static_cast<int>(axis)));
  }
  check_ptr(x, "x", shape.numel());
  check_ptr(words, "words", word_count);
  check_ptr(scales, "scales", param_count);
  if (!sym) check_ptr(mins, "mins", param_count);
  if (param_count == 0) return cudaSuccess;

  return with_bits(bits, [&](auto bc) -> cudaError_t {
    constexpr int B = decltype(bc)::value;
    if (axis == Axis::Channel) {
      const int64_t groups = shape.tokens / group;
      quantize_channel_kernel<B>
          <<<grid_for(groups * shape.heads * shape.dim, kBlock), kBlock, 0, stream>>>(
              x, ChannelLayout{shape.heads, shape.dim, group, B}, groups, sym, words, scales,
              mins);
    } else {
      const int64_t rows = shape.tokens * shape.heads;
      const TokenLayout lay{1, shape.dim, group, B};
      const TokenSplit split = TokenSplit::of(group, B);
      // float4 loads need every word's run 16-byte aligned: x aligned, D and G multiples of 4.
      const bool vec = kivi::codes_per_word(B) % 4 == 0 &&
                       reinterpret_cast<uintptr_t>(x) % 16 == 0 && shape.dim % 4 == 0 &&
                       group % 4 == 0;
      const int64_t groups = rows * lay.channel_groups();
      quantize_token_kernel<B>
          <<<grid_for(groups, static_cast<int64_t>(kWarps) * (32 / split.span)), kBlock, 0,
              stream>>>(x, rows, lay, split, vec, sym, words, scales, mins);
    }
    return cudaGetLastError();
  });
}

}  // namespace kvq::cuda
