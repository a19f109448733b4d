// The fp8 family's parameters: fp8_e4m3 | fp8_e4m3fnuz | fp8_e5m2 [gran=tensor|head|token|channel]
// [scale=dynamic|<num>|calib:<file>] [first=N]. The codecs are fp8/ (format.h, scale.h).
#pragma once

#include <string>
#include <string_view>

#include "schemes/kinds.h"

namespace kvq {

enum class Fp8Format { E4M3, E4M3FNUZ, E5M2 };
/// \brief Scale granularity for a [tokens, heads, dim] tensor: one scale per layer, per head,
/// per (token, head) or per (head, channel).
enum class Granularity { Tensor, Head, Token, Channel };
enum class ScaleSource { Dynamic, Constant, Calib };

struct Fp8Spec {
  static constexpr std::string_view kFamily = "an fp8";
  Fp8Format format = Fp8Format::E4M3;
  Granularity gran = Granularity::Tensor;
  ScaleSource source = ScaleSource::Dynamic;
  float constant = 1.0f;   ///< the scale when source == Constant
  std::string calib_path;  ///< the calibration JSON when source == Calib
  /// Dynamic tensor / head / channel scales are the amax of the first `first` tokens of the
  /// sequence, whatever the chunking; a streaming cache keeps those tokens exact until the N-th
  /// arrives, then quantizes everything with the frozen scale (vLLM's prefill-computed scales,
  /// made independent of the prefill's length). Per-token scales ignore it.
  int first = kFp8FirstDefault;
  static constexpr int kFp8FirstDefault = 128;
  SchemeKind kind() const { return SchemeKind::Fp8; }
  bool operator==(const Fp8Spec&) const = default;
};

/// \brief "fp8_e4m3" / "fp8_e4m3fnuz" / "fp8_e5m2": the format's scheme name.
std::string_view to_string(Fp8Format f);
std::string_view to_string(Granularity g);

}  // namespace kvq
