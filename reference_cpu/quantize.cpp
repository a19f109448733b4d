#include "reference_cpu/quantize.h"

#include <algorithm>
#include <optional>

#include "core/error.h"
#include "core/half.h"
#include "core/rotation.h"
#include "fp8/scale.h"
#include "kivi/tensor_quant.h"

namespace kvq {

RoundTrip round_trip(const SchemeSpec& whole, Role role, const Tensor3& x, int layer) {
  if (whole.layered()) return round_trip(whole.for_layer(layer), role, x, layer);
  const SchemeSpec& spec = whole.side(role);
  if (spec.rot.on || spec.sink > 0) {
    // As make_side stores it: rows rotated, the first S tokens exact, the rest through the scheme
    // without rot/sink, rotated back.
    const int64_t row = x.shape.heads * x.shape.dim, rows = x.shape.tokens * x.shape.heads;
    const int64_t S = std::min<int64_t>(spec.sink, x.shape.tokens);
    Tensor3 y = x;
    std::optional<Rotation> rot;
    if (spec.rot.on) {
      rot.emplace(spec.rot, x.shape.dim);
      rot->rotate(y.data.data(), rows);
    }
    if (S < x.shape.tokens) {
      Tensor3 own({x.shape.tokens - S, x.shape.heads, x.shape.dim});
      std::copy(y.data.begin() + S * row, y.data.end(), own.data.begin());
      const RoundTrip r = round_trip(spec.base(), role, own, layer);
      std::copy(r.values.data.begin(), r.values.data.end(), y.data.begin() + S * row);
    }
    if (rot) rot->unrotate(y.data.data(), rows);
    return {std::move(y), footprint(spec, role, x.shape)};
  }
  RoundTrip r;
  r.footprint = footprint(spec, role, x.shape);
  r.values = Tensor3(x.shape);
  switch (spec.kind) {
    case SchemeKind::Fp32:
      r.values.data = x.data;
      break;
    case SchemeKind::Bf16:
      for (size_t i = 0; i < x.data.size(); ++i) r.values.data[i] = round_to_bf16(x.data[i]);
      break;
    case SchemeKind::Fp16:
      for (size_t i = 0; i < x.data.size(); ++i) r.values.data[i] = round_to_half(x.data[i]);
      break;
    case SchemeKind::Fp8: {
      const std::vector<float> scales = fp8::prefill_scales(spec.fp8, role, x, layer);
      std::vector<uint8_t> codes;
      fp8::quantize(spec.fp8, scales, x, codes);
      fp8::dequantize(spec.fp8, scales, codes, r.values);
      break;
    }
    case SchemeKind::Int:
      r.values = kivi::round_trip(spec.q, role, x);
      break;
  }
  return r;
}

}  // namespace kvq
