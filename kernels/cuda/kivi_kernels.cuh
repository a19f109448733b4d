// KIVI quantize-and-pack kernels: one layer's tensor [T, H, D] (float32, C order, device memory)
// quantized along either axis, bits 2/3/4/8, asymmetric or symmetric, any group G.
//
// The bytes are exactly kivi::SideCache's (kivi/cache.cpp, the spec): every group goes through
// kivi/minmax.h (GroupRange, minmax_params, encode), its codes are packed as kivi/pack.h says
// (shift_of, words_for) and stored where kivi/layout.h says (ChannelLayout, TokenLayout). NaN/inf
// groups get fp16 NaN parameters and zero codes, as on the CPU.
//
// Errors (STYLE 9): a bad configuration (bits outside {2, 3, 4, 8}, a bad group or shape, a null
// pointer) throws kvq::Error naming the value; CUDA failures are returned as cudaError_t.
// Launches are asynchronous on `stream`. The streaming cache is kernels/cuda/kivi_cache_device.cuh.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <span>

#include "core/spec.h"
#include "core/tensor.h"

namespace kvq::cuda {

/// \brief Quantizes x [shape.tokens, shape.heads, shape.dim] (device) as the `axis` side of a KIVI
/// cache with `bits` bits, G = `group` (resolved: g=dim is passed as head_dim) and `sym`:
/// - Axis::Channel (statistics per (head, channel) over G consecutive tokens): shape.tokens must
///   be a multiple of G; writes the T / G token groups as kivi::ChannelLayout{H, D, G, bits} lays
///   out tokens [0, T): words_for_tokens(T) words, params_for_tokens(T) scales and mins.
/// - Axis::Token (statistics per (token, head) over G consecutive channels, G <= D; the last
///   channel group may be shorter): every token, as kivi::TokenLayout{H, D, G, bits} lays out
///   tokens [0, T).
/// To append after q tokens already stored, offset the outputs by layout.words_for_tokens(q) and
/// layout.params_for_tokens(q). `mins` is not touched (and may be null) when sym.
/// Per-channel: one thread per (token group, head, channel) quantizes its column (neighbouring
/// threads read neighbouring columns: coalesced); for G = 32 and 64 in one pass, the G values in
/// registers (all loads in flight at once) and the words written by 16- or 8-byte stores, for
/// other G by kivi::quantize_group. Per-token: each lane owns whole packed words of a channel
/// group (b=2, G=32: 2 lanes per group, 16 groups per warp), the group min / max is a
/// warp-shuffle reduction over the group's lanes, and each lane encodes and packs its own words
/// (neighbouring lanes read neighbouring channels, float4 where aligned); in one pass (values
/// kept in registers) whenever a lane owns one word (G <= 32 words: every G in use).
cudaError_t kivi_quantize(Axis axis, int bits, bool sym, int group, Shape3 shape, const float* x,
                          uint32_t* words, uint16_t* scales, uint16_t* mins,
                          cudaStream_t stream = nullptr);

/// \brief One tensor of a batched quantize: `x` [tokens, heads, dim] (device) and where its codes
/// and parameters go, offset as kivi_quantize's outputs are (`mins` unused when sym).
struct KiviQuantizeJob {
  const float* x = nullptr;
  int64_t tokens = 0;
  uint32_t* words = nullptr;
  uint16_t* scales = nullptr;
  uint16_t* mins = nullptr;
};

/// \brief Jobs that one launch of kivi_quantize_batch takes; more are launched in chunks.
inline constexpr int kKiviJobsPerLaunch = 64;

/// \brief kivi_quantize of every job (all of [job.tokens, heads, dim] with the same axis, bits,
/// sym and group) in one launch per kKiviJobsPerLaunch jobs: grid y is the job, grid x covers the
/// largest job's work (blocks past a smaller job's end do nothing). Each job is checked as
/// kivi_quantize checks its arguments, before anything is launched; jobs must not write to the
/// same words or parameters. kivi_quantize is this with one job.
cudaError_t kivi_quantize_batch(Axis axis, int bits, bool sym, int group, int64_t heads,
                                int64_t dim, std::span<const KiviQuantizeJob> jobs,
                                cudaStream_t stream = nullptr);

/// \brief One copy of `count` floats from src to dst (device memory; the two do not overlap).
struct FloatCopy {
  const float* src = nullptr;
  float* dst = nullptr;
  int64_t count = 0;
};

/// \brief Copies per launch of copy_floats_batch; more are launched in chunks.
inline constexpr int kCopiesPerLaunch = 128;

/// \brief Every copy of `copies` (no two touching the same bytes) in one launch per
/// kCopiesPerLaunch copies: grid y is the copy, 16-byte loads where both ends are aligned. The
/// residual rows of a batched KiviSideCache append go this way, many requests' in one launch.
cudaError_t copy_floats_batch(std::span<const FloatCopy> copies, cudaStream_t stream = nullptr);

}  // namespace kvq::cuda
