#include "core/footprint.h"

#include <algorithm>

#include "core/error.h"
#include "core/stored_side.h"

namespace kvq {
namespace {

// 32-bit words holding n codes of b bits, 32/b codes per word (10 for b=3).
int64_t packed_words(int64_t n, int bits) {
  const int per_word = 32 / bits;
  return (n + per_word - 1) / per_word;
}

// An int scheme's codes, scales and minima for its tq quantized tokens of s (group g, resolved), the
// other tokens exact.
Footprint int_footprint(int bits, int g, bool sym, Axis axis, int64_t tq, Shape3 s) {
  Footprint f;
  int64_t groups = 0, words = 0;
  if (axis == Axis::Channel) {
    // Per (head, channel): tq / G token groups of G codes each.
    groups = s.heads * s.dim * (tq / g);
    words = groups * packed_words(g, bits);
  } else {
    // Per (token, head): ceil(D / G) channel groups, the last one possibly shorter.
    const int64_t full = s.dim / g, tail = s.dim % g;
    groups = tq * s.heads * (full + (tail ? 1 : 0));
    words = tq * s.heads * (full * packed_words(g, bits) + (tail ? packed_words(tail, bits) : 0));
  }
  f.code_bytes = 4.0 * static_cast<double>(words);
  f.scale_bytes = 2.0 * static_cast<double>(groups);
  f.zero_bytes = sym ? 0.0 : 2.0 * static_cast<double>(groups);
  f.quantized_elements = tq * s.heads * s.dim;
  add_exact(f, s.numel() - f.quantized_elements);
  return f;
}

// FP8 codes and fp32 scales of s, one scale a gran unit (one in all for a constant scale).
Footprint fp8_footprint(Granularity gran, bool constant, Shape3 s) {
  Footprint f;
  f.code_bytes = 1.0 * static_cast<double>(s.numel());
  f.quantized_elements = s.numel();
  int64_t scales = 1;  // a constant scale, or Granularity::Tensor
  if (!constant) {
    if (gran == Granularity::Head)
      scales = s.heads;
    else if (gran == Granularity::Token)
      scales = s.tokens * s.heads;
    else if (gran == Granularity::Channel)
      scales = s.heads * s.dim;
  }
  f.scale_bytes = 4.0 * static_cast<double>(scales);
  return f;
}

// Dense values of `bytes` each.
Footprint dense_footprint(double bytes, Shape3 s) {
  Footprint f;
  f.code_bytes = bytes * static_cast<double>(s.numel());
  f.quantized_elements = s.numel();
  return f;
}

}  // namespace

int64_t quantized_tokens(const IntSpec& q, Axis axis, int64_t tokens) {
  if (axis == Axis::Channel) {
    const int64_t block = q.residual > 0 ? q.residual : q.group;
    return tokens / block * block;
  }
  return std::max<int64_t>(tokens - q.residual, 0);
}

Footprint footprint(const SchemeSpec& whole, Role role, Shape3 s) {
  KVQ_CHECK(!whole.layered(),
            "footprint: '{}' has a scheme per layer; take one layer's (SchemeSpec::for_layer)",
            whole.canonical());
  const SchemeSpec& spec = whole.side(role);
  if (spec.sink > 0) {  // the first S tokens exact, the rest as the scheme without sinks stores them
    const int64_t sinks = std::min<int64_t>(spec.sink, s.tokens);
    Footprint f = footprint(spec.base(), role, {s.tokens - sinks, s.heads, s.dim});
    add_exact(f, sinks * s.heads * s.dim);
    return f;
  }
  switch (spec.kind) {
    case SchemeKind::Fp32:
      return dense_footprint(4.0, s);
    case SchemeKind::Bf16:
    case SchemeKind::Fp16:
      return dense_footprint(2.0, s);
    case SchemeKind::Fp8:
      return fp8_footprint(spec.fp8.gran, spec.fp8.source == ScaleSource::Constant, s);
    case SchemeKind::Int: {
      const IntSpec& q = spec.q;
      const Axis axis = q.axis(role);
      return int_footprint(q.bits, q.group_for(s.dim), q.sym, axis,
                           quantized_tokens(q, axis, s.tokens), s);
    }
  }
  return {};
}

Footprint footprint(const StoredSide& side) {
  // A view's sinks are its first sink_tokens tokens, exact; its other fields describe the rest.
  const Shape3 s{side.tokens - side.sink_tokens, side.heads, side.dim};
  Footprint f;
  switch (side.kind) {
    case SchemeKind::Fp32:
      f = dense_footprint(4.0, s);
      break;
    case SchemeKind::Bf16:
    case SchemeKind::Fp16:
      f = dense_footprint(2.0, s);
      break;
    case SchemeKind::Fp8:  // a constant scale is a view of gran tensor
      f = fp8_footprint(side.gran, false, s);
      break;
    case SchemeKind::Int:
      f = int_footprint(side.bits, side.group, side.sym, side.axis, side.quantized_tokens, s);
      break;
  }
  add_exact(f, side.sink_tokens * side.heads * side.dim);
  return f;
}

}  // namespace kvq
