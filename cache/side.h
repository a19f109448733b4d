// One side (K or V) of one layer's KV cache in any scheme: the storage every backend shares.
// A side appends, counts its tokens, says which of them its window keeps exact, reports its
// footprint and exposes its stored bytes (core/stored_side.h's StoredSide) and exact tail; it does
// not read. The reads are each backend's over the stored view: the reference's in
// reference_cpu/reads.h (the scalar definition), backend cpu's and cuda's in kernels/.
// Each scheme family's side is in its folder, schemes/<family>/storage.cpp (schemes.h):
//
//   float  fp32 / bf16 / fp16 values as stored (bf16/fp16 as 16-bit patterns)
//   fp8    one code per element + scales (token scales grow per token; tensor/head/channel
//          dynamic scales are computed from the first append - the prefill - and then frozen,
//          as vLLM's calculate-kv-scales; constant and calib scales are fixed)
//   int    the streaming KIVI cache (kivi/cache.h): codes outside the residual window
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/footprint.h"
#include "core/rotation.h"
#include "core/spec.h"
#include "core/stored_side.h"
#include "core/tensor.h"
#include "kivi/cache.h"

namespace kvq {

/// \brief One side of one layer's cache: its bytes and what it knows of them (no reads).
class SideStore {
 public:
  virtual ~SideStore() = default;

  /// \brief Appends n tokens, x = [n, heads, dim] in C order.
  virtual void append(const float* x, int64_t n) = 0;
  virtual int64_t tokens() const = 0;
  /// \brief Room for `tokens` tokens without reallocating (a growing cache otherwise copies itself
  /// on each doubling, and the allocator keeps the freed copies: +50% resident memory). Only
  /// address space until written. Sides whose storage is small may ignore it.
  virtual void reserve(int64_t tokens) { (void)tokens; }
  virtual int64_t heads() const = 0;
  virtual int64_t dim() const = 0;
  /// \brief How many of the first `t` tokens a cache holding exactly t tokens keeps quantized
  /// (t for schemes without a residual window). Causal prefill uses it.
  virtual int64_t quantized_tokens_at(int64_t t) const = 0;

  /// \brief Appends the exact values of the tokens not yet quantized, [quantized_tokens_at(T), T)
  /// ([n, heads, dim]); nothing for schemes without a residual window.
  virtual void exact_tail(std::vector<float>& out) const = 0;
  /// \brief exact_tail as stored: a rot= side's rows still rotated (others: exact_tail).
  virtual void stored_exact_tail(std::vector<float>& out) const { exact_tail(out); }

  /// \brief The values the cache reads back, [tokens, heads, dim] (tests and metrics only).
  virtual Tensor3 dequantize() const = 0;
  /// \brief Bytes stored (the one accounting formula).
  virtual Footprint footprint() const = 0;
  /// \brief A view of the stored bytes, what every backend's attention reads (valid until the
  /// next append); the default throws kvq::Error (a side that keeps its bytes elsewhere).
  virtual StoredSide stored() const;
  /// \brief rot=: the rotation the side stores its vectors under (null: none). A reader of
  /// stored() rotates q by it and un-rotates the output (reference_cpu/reads.h's side_dot and
  /// side_accumulate; kernels/backend.h's cpu_causal_input and unrotate_output).
  virtual const Rotation* rotation() const { return nullptr; }
};

/// \brief What a causal call over an append of n tokens reads exactly: the side's exact tail from
/// before the append (SideStore::exact_tail) followed by the chunk x ([n, heads, dim]), into
/// `tail` (replaced). Returns the first token it covers (ExactTail::begin). Call before appending.
/// The space the tail is wanted in (it differs only for rot= sides):
///   kModel   the model's own vectors, as the side gives them back (R^T R x; the chunk's rows
///            through the rotation and back too): what backend ref's attention reads;
///   kStored  as the side stores them (R x, the chunk rotated alike): what backend cpu's kernels
///            read beside the stored codes (cpu_causal_input, kernels/backend.h).
enum class TailSpace { kModel, kStored };
int64_t gather_exact_tail(const SideStore& s, const float* x, int64_t n, std::vector<float>& tail,
                          TailSpace space);

/// \brief Quantize kernels a backend lends the cache sides for their streaming appends, in place of
/// the schemes' own (fp8/scale.h, kivi/cache.cpp). Each must produce the same bytes; backend
/// cpu's (kernels/cpu/) are tested bit for bit. Null members: the schemes' own.
struct SideKernels {
  kivi::GroupQuantizers kivi;
  /// fp8::compute_scales' contract.
  std::vector<float> (*fp8_scales)(const Fp8Spec& spec, Role role, const Tensor3& x,
                                   int layer) = nullptr;
  /// fp8::quantize's contract.
  void (*fp8_quantize)(const Fp8Spec& spec, const std::vector<float>& scales, const Tensor3& x,
                       std::vector<uint8_t>& codes) = nullptr;
};

/// \brief A cache side for `spec` in `role`; `layer` selects calib scales; `kernels` quantize its
/// appends (the schemes' own when empty). sink=S keeps the first S tokens exact in front of the
/// scheme's own side (which starts at token S; StoredSide::sink holds them); rot= stores rotated
/// vectors (rotation() says so) and undoes it in exact_tail and dequantize (readers of stored()
/// undo it themselves).
std::unique_ptr<SideStore> make_side(const SchemeSpec& spec, Role role, int64_t heads, int64_t dim,
                                     int layer = 0, const SideKernels& kernels = {});

/// \brief A cache side preloaded with `x` in one append (the whole prompt at once).
std::unique_ptr<SideStore> make_side(const SchemeSpec& spec, Role role, const Tensor3& x,
                                     int layer = 0);

/// \brief A read-only fp32 side holding `values` ([tokens, heads, dim] of `base`) that keeps
/// `base`'s window rule (quantized_tokens_at): attention over keys rotated after reading.
std::unique_ptr<SideStore> make_view(const SideStore& base, Tensor3 values);

}  // namespace kvq
