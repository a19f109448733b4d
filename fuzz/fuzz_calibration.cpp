// FP8 calibration JSON on arbitrary text (fp8/scale.h parse_calibration): a file that is
// accepted has positive finite amax values, one per head (the same count in every layer) or one
// for the whole layer.
#include <algorithm>
#include <cmath>

#include "fp8/scale.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvq;
  fuzz::accept_errors([&] {
    const fp8::Calibration c = fp8::parse_calibration(fuzz::bytes(data, size), "fuzz.json");
    fuzz::require(c.k_amax.size() == c.v_amax.size());
    size_t heads = 1;  // a layer holds one amax per head, or one for the whole layer (vLLM)
    for (const auto* table : {&c.k_amax, &c.v_amax})
      for (const auto& layer : *table) heads = std::max(heads, layer.size());
    for (const auto* table : {&c.k_amax, &c.v_amax})
      for (const auto& layer : *table) {
        fuzz::require(layer.size() == heads || layer.size() == 1);
        for (float a : layer) fuzz::require(std::isfinite(a) && a > 0);
      }
  });
  return 0;
}
