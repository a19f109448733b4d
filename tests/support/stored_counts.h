// How many FP8 codes and scales, and integer words and group parameters, a stored side holds for
// its first `qt` quantized tokens (the layouts of fp8/scale.h and kivi/layout.h): what a bit for
// bit comparison of two sides' bytes must cover. Shared by the tests and the fuzz targets.
#pragma once

#include <cstdint>

#include "core/stored_side.h"
#include "fp8/scale.h"
#include "kivi/layout.h"

namespace kvq::testing {

struct StoredCounts {
  int64_t codes = 0, scales = 0;  ///< fp8
  int64_t words = 0, params = 0;  ///< int: packed words, scales (and minima)
};

inline StoredCounts stored_counts(const StoredSide& s, int64_t qt) {
  StoredCounts c;
  if (s.kind == SchemeKind::Fp8) {
    c.codes = qt * s.heads * s.dim;
    c.scales = qt > 0 ? fp8::scale_count(s.gran, Shape3{qt, s.heads, s.dim}) : 0;
  } else if (s.kind == SchemeKind::Int) {
    if (s.axis == Axis::Channel) {
      const kivi::ChannelLayout lay{s.heads, s.dim, s.group, s.bits};
      c.words = lay.words_for_tokens(qt);
      c.params = lay.params_for_tokens(qt);
    } else {
      const kivi::TokenLayout lay{s.heads, s.dim, s.group, s.bits};
      c.words = lay.words_for_tokens(qt);
      c.params = lay.params_for_tokens(qt);
    }
  }
  return c;
}

}  // namespace kvq::testing
