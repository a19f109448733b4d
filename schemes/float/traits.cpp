// The float family: fp32 | bf16 | fp16, dense values (core/schemes.h's traits record).
#include <array>

#include "core/error.h"
#include "core/schemes.h"
#include "schemes/float/params.h"

namespace kvq {
namespace {

constexpr std::array<SchemeKindName, 3> kKinds{
    {{SchemeKind::Fp32, "fp32"}, {SchemeKind::Bf16, "bf16"}, {SchemeKind::Fp16, "fp16"}}};
constexpr std::array<std::string_view, 3> kExamples{"fp32", "bf16", "fp16"};

bool claims(std::string_view name) { return name == "fp32" || name == "bf16" || name == "fp16"; }

SchemeParams make(std::string_view, std::string_view name) {
  for (const SchemeKindName& k : kKinds)
    if (k.label == name) return FloatSpec{k.kind};
  fail("float scheme '{}' is not one of fp32, bf16, fp16", name);
}

std::span<const SchemeKey> keys(const SchemeSpec&) { return {}; }

void set(SchemeSpec&, std::string_view, std::string_view, std::string_view) {}

void check(const SchemeSpec&, std::string_view, std::string_view, const std::set<std::string>&) {}

std::string_view label(SchemeKind k) {
  for (const SchemeKindName& n : kKinds)
    if (n.kind == k) return n.label;
  return "?";
}

std::string canonical(const SchemeSpec& s) { return std::string(label(s.kind())); }

double bytes(SchemeKind k) { return k == SchemeKind::Fp32 ? 4.0 : 2.0; }

// Dense values of `b` bytes each.
Footprint dense(double b, Shape3 s) {
  Footprint f;
  f.code_bytes = b * static_cast<double>(s.numel());
  f.quantized_elements = s.numel();
  return f;
}

Footprint spec_footprint(const SchemeSpec& s, Role, Shape3 shape) {
  return dense(bytes(s.kind()), shape);
}

Footprint stored_footprint(const StoredSide& side, Shape3 shape) {
  return dense(bytes(side.kind), shape);
}

int64_t coded_tokens(const SchemeSpec& s, Role, int64_t tokens, bool) {
  return s.kind() == SchemeKind::Fp32 ? 0 : tokens;
}

// Round to nearest: half an ulp of amax (bf16 8 significant bits, fp16 11; fp16 assumes no
// overflow, |x| < 65504).
double max_error(const SchemeSpec& s, double amax) {
  switch (s.kind()) {
    case SchemeKind::Bf16:
      return amax * 0x1p-8;
    case SchemeKind::Fp16:
      return amax * 0x1p-11;
    default:
      return 0.0;
  }
}

std::vector<SchemeField> fields(const SchemeSpec& s) {
  return {{"kind", std::string(label(s.kind()))}};
}

// Values are stored as they are: no scales.
ScaleOrigin scale_origin(const SchemeSpec&, Role, int64_t) { return {"-"}; }

// Dense values only grow.
FootprintDrops footprint_drops(const SchemeSpec&, Role, int64_t) { return {}; }

}  // namespace

extern const SchemeTraits kFloatScheme;
const SchemeTraits kFloatScheme{
    .family = "float",
    .kinds = kKinds,
    .names = "fp32, bf16, fp16",
    .keys_help = "(no keys)",
    .description = "dense values as stored: the exact reference (fp32), and 16-bit caches",
    .aliases = {},
    .examples = kExamples,
    .claims = claims,
    .make = make,
    .keys = keys,
    .set = set,
    .check = check,
    .canonical = canonical,
    .footprint = spec_footprint,
    .stored_footprint = stored_footprint,
    .coded_tokens = coded_tokens,
    .max_error = max_error,
    .fields = fields,
    .scale_origin = scale_origin,
    .footprint_drops = footprint_drops,
};

}  // namespace kvq
