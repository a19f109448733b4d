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
/// Per-channel: one thread per (token group, head, channel) runs kivi::quantize_group down its
/// column (neighbouring threads read neighbouring columns: coalesced). Per-token: each lane owns
/// whole packed words of a channel group (b=2, G=32: 2 lanes per group, 16 groups per warp), the
/// group min / max is a warp-shuffle reduction over the group's lanes, and each lane encodes and
/// packs its own words (neighbouring lanes read neighbouring channels, float4 where aligned).
cudaError_t kivi_quantize(Axis axis, int bits, bool sym, int group, Shape3 shape, const float* x,
                          uint32_t* words, uint16_t* scales, uint16_t* mins,
                          cudaStream_t stream = nullptr);

}  // namespace kvq::cuda
