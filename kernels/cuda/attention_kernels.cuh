// Fused decode attention over a quantized KV cache (CUDA), flash-decoding style: one query token
// per sequence, a batch of sequences of different lengths, GQA. The port of
// reference_cpu/attention.cpp's decode_attention (and of the reference's reads in
// schemes/<family>/reads.cpp): o = softmax(q K^T / sqrt(D)) V for every query head.
//
// Work split: the context of each sequence is cut into splits of `split_tokens` tokens (a multiple
// of every per-channel group G); one thread block takes one (split, kv head, sequence) and all
// nq = q_heads / kv_heads query heads of that kv head, so every code is loaded and unpacked once
// for the whole GQA group. A block writes an unnormalized partial (max m, sum l, sum p v) to the
// workspace; a merge kernel combines the splits of each (sequence, query head):
//   M = max m_s,  o = sum_s e^(m_s - M) o_s / sum_s e^(m_s - M) l_s.
// Codes are read straight from the cache and dequantized in registers; no dequantized copy of
// the cache exists anywhere.
//
// Cache kinds (K and V of one launch are the same kind), layouts as the CPU stores them:
//   bf16  [T, H, D] bf16 bits (the baseline)
//   fp8   [T, H, D] codes + float32 scales in fp8/scale.h's layout (tensor [1], head [H],
//         token [T*H], channel [H*D]); per-channel scales fold into q (keys) or multiply the
//         partial output (values); tensor/head/token scales multiply the score / the value.
//   int   kivi/layout.h: per-channel sides (codes packed along tokens) fold each group's scale
//         into q and add sum_d q_d * min_d; per-token sides dequantize code * scale + min per
//         channel group; sym codes read as (code - 2^(b-1)) * scale. Tokens at and after
//         `quantized_tokens` come from the exact float32 residual window.
//
// Errors (STYLE 9): bad configuration throws kvq::Error naming the value (kernels/cuda/dispatch.h
// has the supported lists); CUDA failures come back as cudaError_t. Launches are asynchronous on
// `stream`; views hold device pointers, the view structs themselves are host values.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <span>

#include "core/hostdev.h"
#include "core/spec.h"
#include "kernels/cuda/dispatch.h"

namespace kvq::cuda {

/// \brief Shape of one decode-attention launch. q and out are [batch, q_heads, head_dim]
/// float32 (device); query head j of a sequence reads kv head j / (q_heads / kv_heads).
struct DecodeShape {
  int batch = 1;     ///< sequences, 1 .. kMaxBatch
  int kv_heads = 0;  ///< H
  int q_heads = 0;   ///< a multiple of kv_heads, at most kMaxGqa times it
  int head_dim = 0;  ///< D, one of HeadDims
  /// Tokens per split: 0 (the default) lets the plan choose (about 1024 blocks a launch, at least
  /// 64 tokens a split); a positive value is rounded up to a multiple of every per-channel group
  /// and must fit the split's shared score buffer (4096 / GQA ratio tokens), or plan_decode
  /// throws naming the limit. For measuring how the split size moves a kernel (wave tails).
  int64_t split_tokens = 0;
};

/// \brief One side (K or V) of one sequence's bf16 cache: [tokens, H, D] bf16 bits.
struct Bf16SideView {
  const uint16_t* data = nullptr;
  int64_t tokens = 0;
};

/// \brief One side of one sequence's FP8 cache: codes [tokens, H, D] and float32 scales laid out
/// as fp8/scale.h says for `gran` (token: [tokens * H]). K and V must share the format.
struct Fp8SideView {
  const uint8_t* codes = nullptr;
  const float* scales = nullptr;
  int64_t tokens = 0;
  Fp8Format format = Fp8Format::E4M3;
  Granularity gran = Granularity::Tensor;
};

/// \brief One side of one sequence's int / KIVI cache, the device image of kivi::SideCache:
/// packed words, fp16 scales / minima (kivi/layout.h, indexed by `axis`), and the exact float32
/// residual window [tokens - quantized_tokens, H, D], oldest first. Filled from a host upload of
/// a kivi::SideCache (tests) or from a device cache (int_side_view below). `bits` is a template
/// parameter of the kernel, so K and V of every sequence of a launch share it; group, axis and
/// sym are read per view.
struct IntSideView {
  const uint32_t* words = nullptr;   ///< packed codes of the quantized tokens
  const uint16_t* scales = nullptr;  ///< fp16 bits, one per group
  const uint16_t* mins = nullptr;    ///< fp16 bits, one per group; null (unused) when sym
  const float* residual = nullptr;   ///< [tokens - quantized_tokens, H, D]
  int64_t quantized_tokens = 0;      ///< per-channel: a multiple of group
  int64_t tokens = 0;
  int group = 0;  ///< G (resolved: never kGroupWholeDim)
  int bits = 0;   ///< one of BitWidths
  Axis axis = Axis::Channel;
  bool sym = false;
};

/// \brief The view of a device-resident cache side exposing kivi::SideCache's accessors as
/// device pointers: words(), scales(), mins() (null for sym), residual(), quantized_tokens(),
/// tokens(), group(), bits(), axis(), sym() - e.g. kernels/cuda/kivi_cache_device.cuh's
/// KiviSideCache (valid until its next append or reserve).
template <class DeviceCache>
IntSideView int_side_view(const DeviceCache& c) {
  IntSideView v;
  v.words = c.words();
  v.scales = c.scales();
  v.mins = c.sym() ? nullptr : c.mins();
  v.residual = c.residual();
  v.quantized_tokens = c.quantized_tokens();
  v.tokens = c.tokens();
  v.group = c.group();
  v.bits = c.bits();
  v.axis = c.axis();
  v.sym = c.sym();
  return v;
}

/// \brief How a launch splits its contexts, and the workspace it needs. Deterministic in the
/// shape, the longest context and the group alignment only (not in the device), so results do
/// not depend on the GPU they ran on.
struct DecodePlan {
  int64_t split_tokens = 0;    ///< tokens per split (a multiple of the per-channel group)
  int splits = 0;              ///< splits of the longest sequence (grid x)
  size_t workspace_bytes = 0;  ///< batch * q_heads * splits * (head_dim + 2) floats
};

/// \brief The plan of a launch over these views (throws kvq::Error on a bad configuration).
DecodePlan plan_decode(const DecodeShape& shape, std::span<const Bf16SideView> k,
                       std::span<const Bf16SideView> v);
DecodePlan plan_decode(const DecodeShape& shape, std::span<const Fp8SideView> k,
                       std::span<const Fp8SideView> v);
DecodePlan plan_decode(const DecodeShape& shape, std::span<const IntSideView> k,
                       std::span<const IntSideView> v);

/// \brief Which split kernel a launch runs (the plan, the workspace and the merge are the same).
/// Baseline: one thread per token row for the scores, D / 4 lanes per value row (the kernels
/// as first written). Tiled (issue 12): token-major rows read a warp at a time, eight channels
/// per lane (16-byte bf16 / 8-byte fp8 loads, whole rows per warp step, two steps in flight), q
/// and the output sums in registers sized by the GQA group (padded to 1, 2, 4 or 8), fp8 and 4-bit
/// value codes unpacked in pairs (unpack.h), each per-channel key group staged in shared memory
/// by coalesced 16-byte loads; per-token int keys, per-channel int values, 3-bit values and
/// groups that are not whole words take the baseline's phases. Baseline stays the
/// default until a GPU run has compared the two (docs/benchmarks.md, CUDA).
/// Mma (issue 46; kernels/cuda/attention_mma.cu): tensor cores for both products, mma.sync
/// m16n8k16 with the GQA group as M (q and p as bf16 high and low parts, fp32 accumulation),
/// K and V tiles brought to shared memory by a two-stage cp.async pipeline of 16-byte copies and
/// read by ldmatrix; bf16 caches, head_dim 64 / 128. KIVI 2- and 4-bit int caches (per-channel
/// keys, per-token values, asymmetric, groups a multiple of 32): codes unpacked straight into
/// bf16 B fragments (mma_int.h), key scales folded into q and value scales into p, the float32
/// residual window by plain loops. FP8 caches (every format, every scale granularity): codes
/// converted two at a time into fp16 B fragments (mma_fp8.h), q and p as fp16 high and low
/// parts; tensor / head scales applied once to the scores and the outputs, token scales to each
/// score (keys) or folded into p (values), channel scales folded into q (keys) or applied once to
/// each output channel (values). On every other cache (FP8 codes not 16-byte aligned, 3- and
/// 8-bit, sym, other layouts: detail::mma_fp8_supported and mma_int_supported in
/// attention_split.cuh are the one list) it runs the tiled kernel.
enum class DecodeKernel : int { Baseline = 0, Tiled = 1, Mma = 2 };

/// \brief "baseline" / "tiled" / "mma" (test names, bench rows).
constexpr const char* to_string(DecodeKernel k) {
  return k == DecodeKernel::Mma ? "mma" : k == DecodeKernel::Tiled ? "tiled" : "baseline";
}

/// \brief out = decode attention of q over each sequence's (k[b], v[b]). `workspace` holds at
/// least plan_decode(...).workspace_bytes bytes of device memory (contents are scratch).
/// k and v hold shape.batch views each; every sequence holds >= 1 token and the same number of
/// tokens on both sides.
cudaError_t decode_attention(const DecodeShape& shape, std::span<const Bf16SideView> k,
                             std::span<const Bf16SideView> v, const float* q, float* out,
                             void* workspace, size_t workspace_bytes, cudaStream_t stream = nullptr,
                             DecodeKernel kernel = DecodeKernel::Baseline);
cudaError_t decode_attention(const DecodeShape& shape, std::span<const Fp8SideView> k,
                             std::span<const Fp8SideView> v, const float* q, float* out,
                             void* workspace, size_t workspace_bytes, cudaStream_t stream = nullptr,
                             DecodeKernel kernel = DecodeKernel::Baseline);
cudaError_t decode_attention(const DecodeShape& shape, std::span<const IntSideView> k,
                             std::span<const IntSideView> v, const float* q, float* out,
                             void* workspace, size_t workspace_bytes, cudaStream_t stream = nullptr,
                             DecodeKernel kernel = DecodeKernel::Baseline);

// ---- register-level helpers (host and device; the host copies are what the tests check) -----

/// \brief A code of at most 23 bits as float32 without an int -> float conversion instruction
/// (a quarter-rate op on recent GPUs): the float 2^23 + c, minus 2^23 (both exact).
KVQ_HD float code_to_float(uint32_t c) { return bits_float(c | 0x4b000000u) - 8388608.0f; }

}  // namespace kvq::cuda
