// A read-only view of the bytes one side (K or V) of one layer's KV cache stores, in any scheme:
// what every backend's attention reads. The owner (cache/side.h's SideStore, or a device cache)
// keeps the bytes; a view is valid until its next append.
//
//   fp32 / bf16 / fp16  `f32` or `half16` (bf16 / fp16 bits), [tokens, heads, dim]; a view for
//                       one causal position may read tokens from `quantized_tokens` on from an
//                       exact `residual` instead (null: every token from the side)
//   fp8                 `codes` [tokens, heads, dim] and float32 `fp8_scales` laid out as
//                       fp8/scale.h says for `gran` (a constant scale is gran = tensor)
//   int / KIVI          kivi/layout.h: `words`, fp16 `scales` / `mins` (null for sym) of the
//                       first `quantized_tokens` tokens on `axis`, then the exact float32
//                       `residual` [tokens - quantized_tokens, heads, dim]
//   sink=S              `sink` [sink_tokens, heads, dim] float32 holds tokens [0, sink_tokens)
//                       exact; every other field then describes the tokens from sink_tokens on,
//                       indexed from 0 there (`tokens` counts both). A reader that does not take
//                       sinks checks sink_tokens == 0.
#pragma once

#include <cstdint>

#include "core/spec.h"

namespace kvq {

/// \brief The stored bytes of one cache side (see the file comment for which fields a kind uses).
struct StoredSide {
  SchemeKind kind = SchemeKind::Fp32;
  int64_t tokens = 0, heads = 0, dim = 0;
  const float* f32 = nullptr;        ///< fp32 values
  const uint16_t* half16 = nullptr;  ///< bf16 or fp16 bits
  // fp8
  const uint8_t* codes = nullptr;
  const float* fp8_scales = nullptr;
  Fp8Format format = Fp8Format::E4M3;
  Granularity gran = Granularity::Tensor;
  /// Some code may be a NaN code of the format; false only where the producer checked every code
  /// (the cpu kernels then skip e4m3's NaN decode).
  bool fp8_nan = true;
  // int / KIVI
  const uint32_t* words = nullptr;
  const uint16_t* scales = nullptr;
  const uint16_t* mins = nullptr;
  const float* residual = nullptr;
  int64_t quantized_tokens = 0;
  int group = 0;  ///< G, resolved (never kGroupWholeDim)
  int bits = 0;
  Axis axis = Axis::Channel;
  bool sym = false;
  // sink=S
  const float* sink = nullptr;
  int64_t sink_tokens = 0;
};

/// \brief Exact (unquantized) values of the most recent tokens [begin, end) of one side,
/// [end - begin, heads, dim] C order: what causal attention reads above a position's window.
struct ExactTail {
  const float* data = nullptr;
  int64_t begin = 0;
};

}  // namespace kvq
