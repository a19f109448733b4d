// The int family's parameters: int<B> k=channel|token,v=channel|token [g=G] [r=R] [sym]
// [arith=exact|fp16], kivi<B> (KIVI's axes, r=128), and HF QuantizedCache's names (hf). The
// quantizer, packing and streaming cache are kivi/.
#pragma once

#include <cstdint>
#include <string_view>

#include "schemes/kinds.h"

namespace kvq {

/// \brief Statistics axis of integer group quantization: `Channel` groups G consecutive tokens
/// of one (head, channel) (KIVI keys); `Token` groups G consecutive channels of one (token, head)
/// (KIVI values).
enum class Axis { Channel, Token };
/// \brief How integer codes are computed: `Exact` is kvq's definition (kivi/minmax.h), `Fp16`
/// KIVI's reference code's fp16 arithmetic (minmax_params_fp16), for code-for-code comparisons.
enum class Arith { Exact, Fp16 };

/// \brief `g=dim` in a spec: the group is the whole head_dim (resolved when the shape is known).
inline constexpr int kGroupWholeDim = 0;

struct IntSpec {
  static constexpr std::string_view kFamily = "an int / kivi";
  int bits = 2;
  Axis key_axis = Axis::Channel;
  Axis value_axis = Axis::Token;
  int group = 32;    ///< G, or kGroupWholeDim
  int residual = 0;  ///< R full-precision recent tokens
  bool sym = false;  ///< symmetric (scale only, no zero point)
  Arith arith = Arith::Exact;
  bool kivi = false;  ///< spelled kivi<B> (only changes the canonical name)
  Axis axis(Role r) const { return r == Role::Key ? key_axis : value_axis; }
  /// \brief G for a tensor with head_dim `dim`.
  int group_for(int64_t dim) const {
    return group == kGroupWholeDim ? static_cast<int>(dim) : group;
  }
  SchemeKind kind() const { return SchemeKind::Int; }
  bool operator==(const IntSpec&) const = default;
};

std::string_view to_string(Axis a);

/// \brief Tokens of T that an int scheme's `axis` side keeps quantized (REFERENCE.md section 3):
/// per-channel: floor(T / B) * B with B = R if R > 0 else G; per-token: max(T - R, 0).
int64_t quantized_tokens(const IntSpec& q, Axis axis, int64_t tokens);

}  // namespace kvq
