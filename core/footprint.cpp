#include "core/footprint.h"

#include <algorithm>

#include "core/error.h"
#include "core/schemes.h"
#include "core/stored_side.h"

namespace kvq {

Footprint footprint(const SchemeSpec& whole, Role role, Shape3 s) {
  KVQ_CHECK(!whole.layered(),
            "footprint: '{}' has a scheme per layer; take one layer's (SchemeSpec::for_layer)",
            whole.canonical());
  const SchemeSpec& spec = whole.side(role);
  if (spec.sink > 0) {  // the first S tokens exact, the rest as the scheme without sinks stores them
    const int64_t sinks = std::min<int64_t>(spec.sink, s.tokens);
    Footprint f = footprint(spec.base(), role, {s.tokens - sinks, s.heads, s.dim});
    add_exact(f, sinks * s.heads * s.dim);
    return f;
  }
  return scheme_traits(spec).footprint(spec, role, s);
}

Footprint footprint(const StoredSide& side) {
  // A view's sinks are its first sink_tokens tokens, exact; its other fields describe the rest.
  const Shape3 s{side.tokens - side.sink_tokens, side.heads, side.dim};
  Footprint f = scheme_traits(side.kind).stored_footprint(side, s);
  add_exact(f, side.sink_tokens * side.heads * side.dim);
  return f;
}

}  // namespace kvq
