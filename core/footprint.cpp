#include "core/footprint.h"

#include <algorithm>

#include "core/error.h"

namespace kvq {
namespace {

// 32-bit words holding n codes of b bits, 32/b codes per word (10 for b=3).
int64_t packed_words(int64_t n, int bits) {
  const int per_word = 32 / bits;
  return (n + per_word - 1) / per_word;
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
  Footprint f;
  const int64_t n = s.numel();
  switch (spec.kind) {
    case SchemeKind::Fp32:
      f.code_bytes = 4.0 * n;
      f.quantized_elements = n;
      return f;
    case SchemeKind::Bf16:
    case SchemeKind::Fp16:
      f.code_bytes = 2.0 * n;
      f.quantized_elements = n;
      return f;
    case SchemeKind::Fp8: {
      f.code_bytes = 1.0 * n;
      f.quantized_elements = n;
      int64_t scales = 1;
      if (spec.fp8.source == ScaleSource::Constant) scales = 1;
      else if (spec.fp8.gran == Granularity::Head) scales = s.heads;
      else if (spec.fp8.gran == Granularity::Token) scales = s.tokens * s.heads;
      else if (spec.fp8.gran == Granularity::Channel) scales = s.heads * s.dim;
      f.scale_bytes = 4.0 * static_cast<double>(scales);
      return f;
    }
    case SchemeKind::Int: {
      const IntSpec& q = spec.q;
      const Axis axis = q.axis(role);
      const int64_t tq = quantized_tokens(q, axis, s.tokens);
      const int g = q.group_for(s.dim);
      int64_t groups = 0, words = 0;
      if (axis == Axis::Channel) {
        // Per (head, channel): tq / G token groups of G codes each.
        groups = s.heads * s.dim * (tq / g);
        words = groups * packed_words(g, q.bits);
      } else {
        // Per (token, head): ceil(D / G) channel groups, the last one possibly shorter.
        const int64_t full = s.dim / g, tail = s.dim % g;
        groups = tq * s.heads * (full + (tail ? 1 : 0));
        words = tq * s.heads * (full * packed_words(g, q.bits) + (tail ? packed_words(tail, q.bits) : 0));
      }
      f.code_bytes = 4.0 * static_cast<double>(words);
      f.scale_bytes = 2.0 * static_cast<double>(groups);
      f.zero_bytes = q.sym ? 0.0 : 2.0 * static_cast<double>(groups);
      f.quantized_elements = tq * s.heads * s.dim;
      f.residual_elements = n - f.quantized_elements;
      f.residual_bytes = kResidualBytesPerElement * static_cast<double>(f.residual_elements);
      return f;
    }
  }
  return f;
}

}  // namespace kvq
