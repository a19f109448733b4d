// Synthetic KV tensors with KIVI's structure: keys with a few outlier channels, values without.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace kvq {

struct SyntheticSpec {
  Shape3 shape{512, 4, 64};
  int outlier_channels = 2;     ///< channels per head scaled by outlier_scale (keys' outliers)
  float outlier_scale = 20.0f;  ///< magnitude multiplier of those channels
  uint64_t seed = 0;
};

/// \brief Deterministic tensor: N(0, 1) per element (own Box-Muller over splitmix64, identical on
/// every platform), plus a per-channel mean drift, with `outlier_channels` channels per head
/// (channel indices 7, 7 + D/2, ... modulo D) multiplied by outlier_scale.
Tensor3 synthetic_kv(const SyntheticSpec& s);

}  // namespace kvq
