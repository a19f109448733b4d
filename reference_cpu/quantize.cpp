#include "reference_cpu/quantize.h"

#include "core/error.h"
#include "core/half.h"
#include "fp8/scale.h"
#include "kivi/tensor_quant.h"

namespace kvq {

RoundTrip round_trip(const SchemeSpec& whole, Role role, const Tensor3& x, int layer) {
  const SchemeSpec& spec = whole.side(role);
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
