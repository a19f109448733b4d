// The int family's cache storage (cache/schemes.h): the streaming KIVI cache (kivi/cache.h),
// codes outside the residual window (layout: kivi/layout.h). Its reads over the packed codes:
// schemes/int/reads.cpp.

#include <fmt/format.h>

#include <algorithm>
#include <string>
#include <vector>

#include "cache/schemes.h"
#include "core/error.h"
#include "kivi/cache.h"
#include "kivi/layout.h"
#include "kivi/minmax.h"
#include "kivi/tensor_quant.h"

namespace kvq {
namespace {

using kivi::ChannelLayout;
using kivi::TokenLayout;

class IntSide final : public SideStore {
 public:
  IntSide(const SchemeSpec& spec, Role role, int64_t H, int64_t D, const kivi::GroupQuantizers& q)
      : spec_(spec), role_(role), cache_(spec.q(), role, H, D, q) {}

  void append(const float* x, int64_t n) override { cache_.append(x, n); }
  int64_t tokens() const override { return cache_.tokens(); }
  int64_t heads() const override { return cache_.heads(); }
  int64_t dim() const override { return cache_.head_dim(); }
  int64_t quantized_tokens_at(int64_t t) const override {
    return kvq::quantized_tokens(spec_.q(), cache_.axis(), t);
  }
  Tensor3 dequantize() const override { return cache_.dequantize(); }
  void exact_tail(std::vector<float>& out) const override {
    const auto r = cache_.residual();
    out.insert(out.end(), r.begin(), r.end());
  }
  Footprint footprint() const override { return cache_.footprint(); }
  StoredSide stored() const override {
    StoredSide s{SchemeKind::Int, tokens(), heads(), dim()};
    s.words = cache_.words().data();
    s.scales = cache_.scales().data();
    s.mins = cache_.sym() ? nullptr : cache_.mins().data();
    s.residual = cache_.residual().data();
    s.quantized_tokens = cache_.quantized_tokens();
    s.group = cache_.group();
    s.bits = cache_.bits();
    s.axis = cache_.axis();
    s.sym = cache_.sym();
    return s;
  }

 private:
  SchemeSpec spec_;
  Role role_;
  kivi::SideCache cache_;
};

std::unique_ptr<SideStore> make(const SchemeSpec& spec, Role role, int64_t heads, int64_t dim, int,
                                const SideKernels& kernels) {
  return std::make_unique<IntSide>(spec, role, heads, dim, kernels.kivi);
}

Tensor3 round_trip(const SchemeSpec& spec, Role role, const Tensor3& x, int) {
  return kivi::round_trip(spec.q(), role, x);
}

// The packed words, fp16 scales and minima of the first `qt` tokens (kivi/layout.h), the layout
// spelled out in the metadata.
int64_t stored_bytes(const StoredSide& s, int64_t qt, StoredBytes& out) {
  const int64_t H = s.heads, D = s.dim;
  int64_t nw = 0, np = 0;
  if (s.axis == Axis::Channel) {
    const ChannelLayout lay{H, D, s.group, s.bits};
    nw = lay.words_for_tokens(qt);
    np = lay.params_for_tokens(qt);
    out.meta["layout"] = fmt::format(
        "per-channel: token group g = t / {0} of (head h, channel d) has scale/min index "
        "(g * {1} + h) * {2} + d and its {3} words start at that index times {3}; code i = t % "
        "{0} sits at bit {4} * (i % {5}) of the group's word i / {5}",
        s.group, H, D, lay.words_per_group(), s.bits, kivi::codes_per_word(s.bits));
  } else {
    const TokenLayout lay{H, D, s.group, s.bits};
    nw = lay.words_for_tokens(qt);
    np = lay.params_for_tokens(qt);
    out.meta["layout"] = fmt::format(
        "per-token: (token t, head h, channel group c = d / {0}) has scale/min index (t * {1} "
        "+ "
        "h) * {2} + c and its words start at (t * {1} + h) * {3} + c * {4}; code i = d % {0} "
        "sits at bit {5} * (i % {6}) of the group's word i / {6}",
        s.group, H, lay.channel_groups(), lay.words_per_token_head(),
        kivi::words_for(s.group, s.bits), s.bits, kivi::codes_per_word(s.bits));
  }
  out.add("words", "U32", {nw}, s.words, nw * 4);
  out.add("scales", "F16", {np}, s.scales, np * 2);
  if (!s.sym) out.add("mins", "F16", {np}, s.mins, np * 2);
  out.meta["bits"] = std::to_string(s.bits);
  out.meta["group"] = std::to_string(s.group);
  out.meta["axis"] = std::string(to_string(s.axis));
  out.meta["value"] = s.sym ? fmt::format("scale * (code - {})", kivi::sym_offset(s.bits))
                            : std::string("min + scale * code");
  return qt;
}

}  // namespace

extern const SchemeStorage kIntStorage;
const SchemeStorage kIntStorage{"int", make, round_trip, stored_bytes};

}  // namespace kvq
