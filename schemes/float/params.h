// The float family's parameters: fp32 | bf16 | fp16, dense values as stored (no keys of its own).
#pragma once

#include <string_view>

#include "schemes/kinds.h"

namespace kvq {

/// \brief fp32, bf16 or fp16: which one is the whole spec.
struct FloatSpec {
  static constexpr std::string_view kFamily = "a float";
  SchemeKind format = SchemeKind::Fp32;  ///< Fp32, Bf16 or Fp16
  SchemeKind kind() const { return format; }
  bool operator==(const FloatSpec&) const = default;
};

}  // namespace kvq
