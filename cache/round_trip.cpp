#include "cache/round_trip.h"

#include <algorithm>
#include <optional>

#include "cache/schemes.h"
#include "core/error.h"
#include "core/rotation.h"

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
  return {scheme_storage(spec.kind()).round_trip(spec, role, x, layer),
          footprint(spec, role, x.shape)};
}

}  // namespace kvq
