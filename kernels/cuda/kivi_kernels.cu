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
#include "kernels/cuda/quant_index.h"
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

/// The jobs of one launch (kernel parameters, read in place: grid y indexes them). vec_mask bit j:
/// job j's per-token runs may be loaded as float4 (see quantize_token_kernel).
struct JobTable {
  KiviQuantizeJob job[kKiviJobsPerLaunch];
  uint64_t vec_mask = 0;
};
static_assert(kKiviJobsPerLaunch <= 64, "vec_mask has a bit per job");
static_assert(sizeof(JobTable) <= 4096, "kernel parameters of any CUDA 12 version");

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
    quantize_channel_kernel(const __grid_constant__ JobTable t, ChannelLayout lay, bool sym) {
  const KiviQuantizeJob job = t.job[blockIdx.y];
  const float* x = job.x;
  uint32_t* words = job.words;
  uint16_t *scales = job.scales, *mins = job.mins;
  const int64_t groups = job.tokens / lay.group;
  const int64_t cols = lay.heads * lay.dim, n = groups * cols, wpg = lay.words_per_group();
  for (int64_t j = static_cast<int64_t>(blockIdx.x) * kBlock + threadIdx.x; j < n;
       j += static_cast<int64_t>(gridDim.x) * kBlock) {
    const int64_t g = j / cols, c = j - g * cols;
    kivi::quantize_group(x + g * lay.group * cols + c, cols, lay.group, B, sym, words + j * wpg,
                         scales + j, sym ? nullptr : mins + j);
  }
}

/// The same groups for a compile-time G (32 or 64, KIVI's usual sizes), in one pass: thread j
/// loads its column's kG values into registers, all kG loads issued before the first is used
/// (kG * 4 bytes in flight a thread, coalesced across the warp; streaming loads, read once), takes
/// the range in kivi::quantize_group's order (GroupRange::of(v[0]), then add(v[1..])), and
/// encodes and packs from the registers: quantize_group's arithmetic on the same values, so the
/// same bytes. Its words_per_group() words go out as quant_index::store_words(wpg)-word stores
/// (16 bytes for b=3/4/8, 8 for b=2 at G=32) when the job's words are aligned to that, else
/// word by word; neighbouring threads write neighbouring runs (coalesced).
template <int B, int kG>
__global__ void __launch_bounds__(kBlock)
    quantize_channel_reg_kernel(const __grid_constant__ JobTable t, ChannelLayout lay, bool sym) {
  constexpr int kCpw = kivi::codes_per_word(B);
  constexpr int kWpg = static_cast<int>(kivi::words_for(kG, B));
  constexpr int kVec = quant_index::store_words(kWpg);
  const KiviQuantizeJob job = t.job[blockIdx.y];
  const float* x = job.x;
  uint32_t* words = job.words;
  uint16_t *scales = job.scales, *mins = job.mins;
  const int64_t cols = lay.heads * lay.dim, n = job.tokens / kG * cols;
  const bool vec_store = reinterpret_cast<uintptr_t>(words) % (kVec * sizeof(uint32_t)) == 0;
  for (int64_t j = static_cast<int64_t>(blockIdx.x) * kBlock + threadIdx.x; j < n;
       j += static_cast<int64_t>(gridDim.x) * kBlock) {
    const int64_t g = j / cols, c = j - g * cols;
    const float* xc = x + g * kG * cols + c;
    float v[kG];
#pragma unroll
    for (int i = 0; i < kG; ++i) v[i] = __ldcs(xc + i * cols);
    kivi::GroupRange r = kivi::GroupRange::of(v[0]);
#pragma unroll
    for (int i = 1; i < kG; ++i) r.add(v[i]);
    const kivi::GroupParams p = kivi::minmax_params(r, B, sym);
    scales[j] = p.scale_h;
    if (!sym) mins[j] = p.min_h;
    uint32_t w[kWpg];
#pragma unroll
    for (int k = 0; k < kWpg; ++k) {
      uint32_t word = 0;  // unused high codes stay zero, as kivi::pack leaves them
#pragma unroll
      for (int i = k * kCpw; i < kG && i < (k + 1) * kCpw; ++i)
        word |= kivi::encode(v[i], p, B, sym) << kivi::shift_of(i, B);
      w[k] = word;
    }
    uint32_t* out = words + j * kWpg;  // == lay.word_index(g, h, d)
    if (vec_store) {
#pragma unroll
      for (int k = 0; k < kWpg; k += kVec) {
        if constexpr (kVec == 4)
          *reinterpret_cast<uint4*>(out + k) = make_uint4(w[k], w[k + 1], w[k + 2], w[k + 3]);
        else if constexpr (kVec == 2)
          *reinterpret_cast<uint2*>(out + k) = make_uint2(w[k], w[k + 1]);
        else
          out[k] = w[k];
      }
    } else {
#pragma unroll
      for (int k = 0; k < kWpg; ++k) out[k] = w[k];
    }
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

/// The range of no values: min +inf, max -inf (the identities of min_step / max_step), finite.
__device__ __forceinline__ kivi::GroupRange empty_range() {
  kivi::GroupRange r;
  r.mn = bits_float(0x7f800000u);
  r.mx = bits_float(0xff800000u);
  r.finite = true;
  return r;
}

/// Combines the ranges of the `span` lanes (a power of two, aligned) that share a group: a
/// segmented xor-shuffle reduction, after which each of them holds the group's range. Every lane
/// of the warp calls it (full mask).
__device__ __forceinline__ void reduce_range(kivi::GroupRange& r, int span) {
  for (int off = span / 2; off > 0; off /= 2) {
    r.mn = kivi::min_step(__shfl_xor_sync(kFullMask, r.mn, off), r.mn);
    r.mx = kivi::max_step(__shfl_xor_sync(kFullMask, r.mx, off), r.mx);
    r.finite = (__shfl_xor_sync(kFullMask, static_cast<int>(r.finite), off) != 0) && r.finite;
  }
}

/// What both per-token kernels take from their job and their thread: the job's arrays, and the
/// place of this lane in the flat list of rows * n_cg channel groups (32 / span groups a warp:
/// group gi of the warp, part `part` of the group's span lanes).
struct TokenLane {
  const float* x;
  uint32_t* words;
  uint16_t *scales, *mins;
  bool vec;
  int warp, per_warp, gi, part;
  int64_t ncg, total;
  __device__ TokenLane(const JobTable& t, int64_t heads, const TokenLayout& lay, int span) {
    const KiviQuantizeJob& job = t.job[blockIdx.y];
    x = job.x;
    words = job.words;
    scales = job.scales;
    mins = job.mins;
    vec = (t.vec_mask >> blockIdx.y) & 1u;
    warp = static_cast<int>(threadIdx.x) / 32;
    const int lane = static_cast<int>(threadIdx.x) % 32;
    per_warp = 32 / span;
    gi = lane / span;
    part = lane % span;
    ncg = lay.channel_groups();
    total = job.tokens * heads * ncg;
  }
  /// The warp's first group and the step between its iterations (a grid-stride loop).
  __device__ int64_t first() const {
    return (static_cast<int64_t>(blockIdx.x) * kWarps + warp) * per_warp;
  }
  __device__ int64_t step() const { return static_cast<int64_t>(gridDim.x) * kWarps * per_warp; }
  /// This lane's group f of the iteration at f0: its row, channel group and length (0: past the
  /// last group).
  __device__ void group(const TokenLayout& lay, int64_t f0, int64_t& f, int64_t& row, int64_t& c,
                        int& len) const {
    f = f0 + gi;
    row = f < total ? f / ncg : 0;
    c = f < total ? f - row * ncg : 0;
    len = f < total ? lay.group_len(c) : 0;
  }
};

/// The flat list of rows * ceil(D / G) channel groups (row r = (token, head); `lay` has heads = 1,
/// so row r is its token r and group f = r * n_cg + c has parameters at index f), 32 / span
/// groups per warp. Lane i of a group owns words [i*K, i*K + K) of it: it folds their values into
/// a GroupRange (identities +inf / -inf where it has none), a segmented xor-shuffle reduction over
/// the span lanes gives each lane the group's range, minmax_params, then the lane encodes and
/// packs its words itself (kivi::encode, kivi::shift_of): the CPU's quantize_row, split by words.
/// Neighbouring lanes read neighbouring runs of the row (coalesced) and write neighbouring words.
template <int B>
__global__ void __launch_bounds__(kBlock)
    quantize_token_kernel(const __grid_constant__ JobTable t, int64_t heads, TokenLayout lay,
                          TokenSplit split, bool sym) {
  const TokenLane tl(t, heads, lay, split.span);
  const float* x = tl.x;
  uint32_t* words = tl.words;
  uint16_t *scales = tl.scales, *mins = tl.mins;
  const bool vec = tl.vec;
  constexpr int kCpw = kivi::codes_per_word(B);
  const int span = split.span, K = split.words_per_lane, i0 = tl.part;

  for (int64_t f0 = tl.first(); f0 < tl.total; f0 += tl.step()) {
    int64_t f, row, c;
    int len;
    tl.group(lay, f0, f, row, c, len);
    const float* xg = x + row * lay.dim + c * lay.group;
    const int w_end = min(i0 * K + K, static_cast<int>(kivi::words_for(len, B)));

    kivi::GroupRange r = empty_range();
    for (int w = i0 * K; w < w_end; ++w) {
      const int n = min(kCpw, len - w * kCpw);
      float v[kCpw];
      load_run<kCpw>(xg + w * kCpw, n, vec, v);
#pragma unroll
      for (int j = 0; j < kCpw; ++j)
        if (j < n) r.add(v[j]);
    }
    reduce_range(r, span);
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

/// quantize_token_kernel when every lane owns one word (split.words_per_lane == 1: G <= 32 words,
/// every KIVI configuration in use), in one pass: the lane loads its word's kCpw values once
/// (float4 where `vec`), keeps them in registers through the warp-shuffle reduction of the group's
/// range, and encodes and packs them from there. The same flat list of groups, the same lanes,
/// the same arithmetic as quantize_token_kernel, so the same bytes; neighbouring lanes write
/// neighbouring words (a warp stores 32 consecutive words when the groups fill it).
template <int B>
__global__ void __launch_bounds__(kBlock)
    quantize_token_word_kernel(const __grid_constant__ JobTable t, int64_t heads, TokenLayout lay,
                               int span, bool sym) {
  const TokenLane tl(t, heads, lay, span);
  const float* x = tl.x;
  uint32_t* words = tl.words;
  uint16_t *scales = tl.scales, *mins = tl.mins;
  const bool vec = tl.vec;
  constexpr int kCpw = kivi::codes_per_word(B);
  const int w = tl.part;  // this lane's word of its group

  for (int64_t f0 = tl.first(); f0 < tl.total; f0 += tl.step()) {
    int64_t f, row, c;
    int len;
    tl.group(lay, f0, f, row, c, len);
    const int n = max(0, min(kCpw, len - w * kCpw));  // this lane's values (0: none)
    const float* xw = x + row * lay.dim + c * lay.group + w * kCpw;
    float v[kCpw];
    load_run<kCpw>(xw, n, vec, v);
    kivi::GroupRange r = empty_range();
#pragma unroll
    for (int j = 0; j < kCpw; ++j)
      if (j < n) r.add(v[j]);
    reduce_range(r, span);
    if (len == 0) continue;
    const kivi::GroupParams p = kivi::minmax_params(r, B, sym);
    if (w == 0) {
      scales[f] = p.scale_h;  // == lay.param_index(row, 0, c)
      if (!sym) mins[f] = p.min_h;
    }
    if (n == 0) continue;  // a lane past the group's last word
    uint32_t word = 0;     // unused high codes stay zero, as kivi::pack leaves them
#pragma unroll
    for (int j = 0; j < kCpw; ++j)
      if (j < n) word |= kivi::encode(v[j], p, B, sym) << kivi::shift_of(j, B);
    words[lay.word_index(row, 0, c) + w] = word;
  }
}

// ---- batched copies (the residual rows of KiviSideCache::append_batch) --------------------------

constexpr int64_t kMaxCopyBlocks = 1024;  // per copy; grid-stride loops cover the rest

struct CopyTable {
  FloatCopy copy[kCopiesPerLaunch];
};
static_assert(sizeof(CopyTable) <= 4096, "kernel parameters of any CUDA 12 version");

/// Grid y is the copy; its floats move by a grid-stride loop, 16 bytes a thread where both ends
/// are 16-byte aligned (rows of H * D floats: whenever the request's x is and H * D % 4 == 0).
__global__ void __launch_bounds__(kBlock) copy_kernel(const __grid_constant__ CopyTable t) {
  const FloatCopy& c = t.copy[blockIdx.y];
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kBlock;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kBlock + threadIdx.x;
  int64_t done = 0;
  if (reinterpret_cast<uintptr_t>(c.src) % 16 == 0 &&
      reinterpret_cast<uintptr_t>(c.dst) % 16 == 0) {
    const int64_t n4 = c.count / 4;
    const float4* src = reinterpret_cast<const float4*>(c.src);
    float4* dst = reinterpret_cast<float4*>(c.dst);
    for (int64_t i = first; i < n4; i += stride) dst[i] = src[i];
    done = n4 * 4;
  }
  for (int64_t i = done + first; i < c.count; i += stride) c.dst[i] = c.src[i];
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
                          uint32_t* words, uint16_t* scales, uint16_t* mins, cudaStream_t stream) {
  if (shape.tokens < 0 || shape.heads < 0 || shape.dim < 0)
    bad_config("shape [T=" + std::to_string(shape.tokens) + ", H=" + std::to_string(shape.heads) +
               ", D=" + std::to_string(shape.dim) + "] has a negative size");
  const KiviQuantizeJob job{x, shape.tokens, words, scales, mins};
  return kivi_quantize_batch(axis, bits, sym, group, shape.heads, shape.dim,
                             std::span<const KiviQuantizeJob>(&job, 1), stream);
}

cudaError_t kivi_quantize_batch(Axis axis, int bits, bool sym, int group, int64_t heads,
                                int64_t dim, std::span<const KiviQuantizeJob> jobs,
                                cudaStream_t stream) {
  if (bits != 2 && bits != 3 && bits != 4 && bits != 8)
    bad_config("kivi: " + std::to_string(bits) + " bits not supported (allowed: 2, 3, 4, 8)");
  if (group < 1) bad_config("group g=" + std::to_string(group) + " must be >= 1");
  if (heads < 0 || dim < 0)
    bad_config("heads " + std::to_string(heads) + " or head_dim " + std::to_string(dim) +
               " is negative");
  if (axis == Axis::Token && group > dim)
    bad_config("per-token: group g=" + std::to_string(group) + " is larger than head_dim " +
               std::to_string(dim));
  if (axis != Axis::Channel && axis != Axis::Token)
    bad_config("unknown Axis value " + std::to_string(static_cast<int>(axis)));
  for (size_t i = 0; i < jobs.size(); ++i) {
    const KiviQuantizeJob& j = jobs[i];
    const std::string at = jobs.size() > 1 ? "job " + std::to_string(i) + ": " : "";
    if (j.tokens < 0) bad_config(at + "T=" + std::to_string(j.tokens) + " tokens is negative");
    int64_t word_count = 0, param_count = 0;
    if (axis == Axis::Channel) {
      if (j.tokens % group != 0)
        bad_config(at + "per-channel: T=" + std::to_string(j.tokens) +
                   " tokens is not a multiple of g=" + std::to_string(group));
      const ChannelLayout lay{heads, dim, group, bits};
      word_count = lay.words_for_tokens(j.tokens);
      param_count = lay.params_for_tokens(j.tokens);
    } else {
      const TokenLayout lay{heads, dim, group, bits};
      word_count = lay.words_for_tokens(j.tokens);
      param_count = lay.params_for_tokens(j.tokens);
    }
    check_ptr(j.x, (at + "x").c_str(), j.tokens * heads * dim);
    check_ptr(j.words, (at + "words").c_str(), word_count);
    check_ptr(j.scales, (at + "scales").c_str(), param_count);
    if (!sym) check_ptr(j.mins, (at + "mins").c_str(), param_count);
  }

  return with_bits(bits, [&](auto bc) -> cudaError_t {
    constexpr int B = decltype(bc)::value;
    const TokenLayout row_lay{1, dim, group, B};
    const TokenSplit split = TokenSplit::of(group, B);
    const int64_t per_block =
        axis == Axis::Channel ? int64_t{kBlock} : static_cast<int64_t>(kWarps) * (32 / split.span);
    for (size_t first = 0; first < jobs.size(); first += kKiviJobsPerLaunch) {
      JobTable t;
      int n = 0;
      int64_t most = 0;  // the largest job's work items (threads or channel groups)
      for (size_t i = first; i < std::min(jobs.size(), first + kKiviJobsPerLaunch); ++i) {
        const KiviQuantizeJob& j = jobs[i];
        if (j.tokens == 0 || heads == 0 || dim == 0) continue;  // nothing to store
        const int64_t work = axis == Axis::Channel ? j.tokens / group * heads * dim
                                                   : j.tokens * heads * row_lay.channel_groups();
        most = std::max(most, work);
        // float4 loads need every word's run 16-byte aligned: x aligned, D and G multiples of 4.
        const bool vec = kivi::codes_per_word(B) % 4 == 0 &&
                         reinterpret_cast<uintptr_t>(j.x) % 16 == 0 && dim % 4 == 0 &&
                         group % 4 == 0;
        if (vec) t.vec_mask |= uint64_t{1} << n;
        t.job[n++] = j;
      }
      if (n == 0) continue;
      const dim3 grid(static_cast<unsigned>(grid_for(most, per_block)), static_cast<unsigned>(n));
      const ChannelLayout ch_lay{heads, dim, group, B};
      if (axis == Axis::Channel && group == 32)
        quantize_channel_reg_kernel<B, 32><<<grid, kBlock, 0, stream>>>(t, ch_lay, sym);
      else if (axis == Axis::Channel && group == 64)
        quantize_channel_reg_kernel<B, 64><<<grid, kBlock, 0, stream>>>(t, ch_lay, sym);
      else if (axis == Axis::Channel)
        quantize_channel_kernel<B><<<grid, kBlock, 0, stream>>>(t, ch_lay, sym);
      else if (split.words_per_lane == 1)
        quantize_token_word_kernel<B>
            <<<grid, kBlock, 0, stream>>>(t, heads, row_lay, split.span, sym);
      else
        quantize_token_kernel<B><<<grid, kBlock, 0, stream>>>(t, heads, row_lay, split, sym);
      KVQ_CUDA_CALL(cudaGetLastError());
    }
    return cudaSuccess;
  });
}

cudaError_t copy_floats_batch(std::span<const FloatCopy> copies, cudaStream_t stream) {
  for (size_t i = 0; i < copies.size(); ++i)
    if (copies[i].count < 0 || (copies[i].count > 0 && (!copies[i].src || !copies[i].dst)))
      bad_config("copy " + std::to_string(i) + " of " + std::to_string(copies[i].count) +
                 " floats has a negative count or a null pointer");
  for (size_t first = 0; first < copies.size(); first += kCopiesPerLaunch) {
    CopyTable t;
    int n = 0;
    int64_t most = 0;
    for (size_t i = first; i < std::min(copies.size(), first + kCopiesPerLaunch); ++i) {
      if (copies[i].count == 0) continue;
      t.copy[n++] = copies[i];
      most = std::max(most, copies[i].count);
    }
    if (n == 0) continue;
    const int64_t blocks = std::clamp<int64_t>((most / 4 + kBlock - 1) / kBlock, 1, kMaxCopyBlocks);
    copy_kernel<<<dim3(static_cast<unsigned>(blocks), static_cast<unsigned>(n)), kBlock, 0,
                  stream>>>(t);
    KVQ_CUDA_CALL(cudaGetLastError());
  }
  return cudaSuccess;
}

}  // namespace kvq::cuda
