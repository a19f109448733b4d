// FP8 calibration JSON on arbitrary text (fp8/scale.h parse_calibration): a file that is
// accepted has positive finite amax values, the same head count in every layer.
#include <cmath>

#include "fp8/scale.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvq;
  fuzz::accept_errors([&] {
    const fp8::Calibration c = fp8::parse_calibration(fuzz::bytes(data, size), "fuzz.json");
    fuzz::require(c.k_amax.size() == c.v_amax.size());
    for (const auto* table : {&c.k_amax, &c.v_amax})
      for (const auto& layer : *table) {
        fuzz::require(layer.size() == c.k_amax[0].size());
        for (float a : layer) fuzz::require(std::isfinite(a) && a > 0);
      }
  });
  return 0;
}
