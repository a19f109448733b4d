// The fp8 family: fp8_e4m3 (alias fp8) | fp8_e4m3fnuz | fp8_e5m2 with a scale granularity and
// source (core/schemes.h's traits record). Codecs and scales: fp8/.
#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <limits>

#include "core/error.h"
#include "core/schemes.h"
#include "schemes/fp8/params.h"

namespace kvq {

std::string_view to_string(Fp8Format f) {
  switch (f) {
    case Fp8Format::E4M3:
      return "fp8_e4m3";
    case Fp8Format::E4M3FNUZ:
      return "fp8_e4m3fnuz";
    case Fp8Format::E5M2:
      return "fp8_e5m2";
  }
  return "?";
}

std::string_view to_string(Granularity g) {
  switch (g) {
    case Granularity::Tensor:
      return "tensor";
    case Granularity::Head:
      return "head";
    case Granularity::Token:
      return "token";
    case Granularity::Channel:
      return "channel";
  }
  return "?";
}

namespace {

constexpr std::array<SchemeKindName, 1> kKinds{{{SchemeKind::Fp8, "fp8"}}};
// vLLM's --kv-cache-dtype fp8 is E4M3.
constexpr std::array<SchemeAlias, 1> kAliases{{{"fp8", "fp8_e4m3"}}};
constexpr std::array<SchemeKey, 3> kKeys{
    {{"gran", false, "tensor"}, {"scale", false, "dynamic"}, {"first", false, "128"}}};
constexpr std::array<std::string_view, 7> kExamples{
    "fp8_e4m3:gran=tensor,scale=dynamic",      "fp8_e4m3fnuz:gran=head,scale=dynamic",
    "fp8_e5m2:gran=token,scale=dynamic",       "fp8_e4m3:gran=channel,scale=dynamic,first=16",
    "fp8_e4m3:gran=tensor,scale=0.25",         "fp8_e5m2:gran=token,scale=dynamic,rot=hadamard:7",
    "fp8_e4m3:gran=token,scale=dynamic,sink=4"};

bool claims(std::string_view name) { return name.starts_with("fp8_"); }

SchemeParams make(std::string_view text, std::string_view name) {
  for (const Fp8Format f : {Fp8Format::E4M3, Fp8Format::E4M3FNUZ, Fp8Format::E5M2})
    if (name == to_string(f)) {
      Fp8Spec s;
      s.format = f;
      return s;
    }
  fail("bad scheme spec '{}': unknown FP8 format '{}' (allowed: fp8_e4m3, fp8_e4m3fnuz, fp8_e5m2)",
       text, name);
}

std::span<const SchemeKey> keys(const SchemeSpec&) { return kKeys; }

void set(SchemeSpec& s, std::string_view text, std::string_view key, std::string_view val) {
  Fp8Spec& f = s.fp8();
  if (key == "gran") {
    for (const Granularity g :
         {Granularity::Tensor, Granularity::Head, Granularity::Token, Granularity::Channel})
      if (val == to_string(g)) {
        f.gran = g;
        return;
      }
    fail("bad scheme spec '{}': gran={} (allowed: tensor, head, token, channel)", text, val);
  } else if (key == "scale") {
    if (val == "dynamic") {
      f.source = ScaleSource::Dynamic;
    } else if (val.starts_with("calib:")) {
      f.source = ScaleSource::Calib;
      f.calib_path = std::string(val.substr(6));
      if (f.calib_path.empty())
        fail("bad scheme spec '{}': scale=calib: needs a file (scale=calib:scales.json)", text);
    } else {
      const std::string v(val);
      char* end = nullptr;
      const double x = std::strtod(v.c_str(), &end);
      if (end != v.c_str() + v.size() || !std::isfinite(x) || x <= 0 || x > 3.0e38)
        fail(
            "bad scheme spec '{}': scale={} (allowed: dynamic, a positive finite number, "
            "calib:FILE)",
            text, val);
      f.source = ScaleSource::Constant;
      f.constant = static_cast<float>(x);
    }
  } else if (key == "first") {
    const int n = scheme_parse::integer(text, val, key);
    if (n < 1 || n > (1 << 24))
      fail("bad scheme spec '{}': first={} (allowed: 1 .. 16777216 tokens)", text, val);
    f.first = n;
  }
}

void check(const SchemeSpec& s, std::string_view text, std::string_view,
           const std::set<std::string>& seen) {
  const Fp8Spec& f = s.fp8();
  if (seen.count("first") && (f.source != ScaleSource::Dynamic || f.gran == Granularity::Token))
    fail(
        "bad scheme spec '{}': first= sets where dynamic tensor/head/channel scales come from; it "
        "has no "
        "effect with {}",
        text, f.source != ScaleSource::Dynamic ? "a fixed scale" : "gran=token");
  if (s.rot.on && f.source == ScaleSource::Calib)
    fail(
        "bad scheme spec '{}': scale=calib: scales were measured on unrotated channels; with "
        "rot= use scale=dynamic or a number",
        text);
}

std::string canonical(const SchemeSpec& s) {
  const Fp8Spec& f = s.fp8();
  std::string sc = f.source == ScaleSource::Dynamic ? "dynamic"
                   : f.source == ScaleSource::Calib ? "calib:" + f.calib_path
                                                    : fmt::format("{}", f.constant);
  // first=N only when it is not the default, so the common specs keep their short names.
  const bool first = f.source == ScaleSource::Dynamic && f.gran != Granularity::Token &&
                     f.first != Fp8Spec::kFp8FirstDefault;
  return fmt::format("{}:gran={},scale={}{}", to_string(f.format), to_string(f.gran), sc,
                     first ? fmt::format(",first={}", f.first) : "");
}

// FP8 codes and fp32 scales of s, one scale a gran unit (one in all for a constant scale).
Footprint codes_and_scales(Granularity gran, bool constant, Shape3 s) {
  Footprint f;
  f.code_bytes = 1.0 * static_cast<double>(s.numel());
  f.quantized_elements = s.numel();
  int64_t scales = 1;  // a constant scale, or Granularity::Tensor
  if (!constant) {
    if (gran == Granularity::Head)
      scales = s.heads;
    else if (gran == Granularity::Token)
      scales = s.tokens * s.heads;
    else if (gran == Granularity::Channel)
      scales = s.heads * s.dim;
  }
  f.scale_bytes = 4.0 * static_cast<double>(scales);
  return f;
}

Footprint spec_footprint(const SchemeSpec& s, Role, Shape3 shape) {
  return codes_and_scales(s.fp8().gran, s.fp8().source == ScaleSource::Constant, shape);
}

// A constant scale is a view of gran tensor.
Footprint stored_footprint(const StoredSide& side, Shape3 shape) {
  return codes_and_scales(side.gran, false, shape);
}

// A streamed side with dynamic tensor/head/channel scales holds its tokens exact until the N-th.
int64_t coded_tokens(const SchemeSpec& s, Role, int64_t tokens, bool streamed) {
  const Fp8Spec& f = s.fp8();
  const bool waits = streamed && f.source == ScaleSource::Dynamic && f.gran != Granularity::Token;
  return waits && tokens < f.first ? 0 : tokens;
}

// An element is x / scale rounded to nearest in the format: half an ulp, 2^-4 of |x| with 3
// mantissa bits (e4m3, e4m3fnuz), 2^-3 with 2 (e5m2), or half the smallest subnormal times the
// scale near zero. Dynamic scales map each unit's amax to the format's largest value (scale <=
// amax / max); a constant scale keeps that bound while amax / scale stays in range (no saturation);
// calib scales come from a file: no bound. Dynamic tensor/head/channel scales must cover the tensor
// (its tokens <= first).
double max_error(const SchemeSpec& s, double amax) {
  const Fp8Spec& f = s.fp8();
  // Largest finite value and half the smallest subnormal (fp8/format.h's formats).
  const double fmax = f.format == Fp8Format::E4M3       ? 448.0
                      : f.format == Fp8Format::E4M3FNUZ ? 240.0
                                                        : 57344.0;
  const double half_sub = f.format == Fp8Format::E4M3       ? 0x1p-10
                          : f.format == Fp8Format::E4M3FNUZ ? 0x1p-11
                                                            : 0x1p-17;
  const double rel = f.format == Fp8Format::E5M2 ? 0x1p-3 : 0x1p-4;
  double scale = amax / fmax;
  if (f.source == ScaleSource::Calib) return std::numeric_limits<double>::infinity();
  if (f.source == ScaleSource::Constant) {
    if (amax > fmax * f.constant) return std::numeric_limits<double>::infinity();
    scale = f.constant;
  }
  return amax * rel + half_sub * scale;
}

std::vector<SchemeField> fields(const SchemeSpec& s) {
  const Fp8Spec& f = s.fp8();
  std::vector<SchemeField> out{
      {"kind", std::string("fp8")},
      {"format", std::string(to_string(f.format))},
      {"gran", std::string(to_string(f.gran))},
      {"scale", std::string(f.source == ScaleSource::Dynamic    ? "dynamic"
                            : f.source == ScaleSource::Constant ? "constant"
                                                                : "calib")}};
  if (f.source == ScaleSource::Constant) out.push_back({"scale_value", double{f.constant}});
  if (f.source == ScaleSource::Calib) out.push_back({"calib_path", f.calib_path});
  out.push_back({"first", int64_t{f.first}});
  return out;
}

// Dynamic tensor/head/channel scales read the tokens [sink, sink + n) of a side of `tokens`: the
// first `first` after the sinks.
ScaleOrigin scale_origin(const SchemeSpec& s, Role, int64_t tokens) {
  const Fp8Spec& f = s.fp8();
  if (f.source == ScaleSource::Constant) return {fmt::format("fixed {:g}", f.constant)};
  if (f.source == ScaleSource::Calib)
    return {"calib " + std::filesystem::path(f.calib_path).filename().string()};
  if (f.gran == Granularity::Token) return {"each token"};
  const int64_t n = std::clamp<int64_t>(std::min<int64_t>(f.first, tokens - s.sink), 0, tokens);
  const bool prefix = n < tokens - s.sink;
  if (n <= 0) return {fmt::format("none of {} (all exact)", tokens), prefix};
  if (s.sink == 0 && n == tokens) return {fmt::format("all {} tokens", tokens), prefix};
  return {fmt::format("tokens {}-{} of {}", s.sink, s.sink + n - 1, tokens), prefix};
}

// Dynamic tensor/head/channel scales: the tokens after the sinks stay exact until the first-th
// arrives, then are coded (coded_tokens).
FootprintDrops footprint_drops(const SchemeSpec& s, Role, int64_t) {
  const Fp8Spec& f = s.fp8();
  if (f.source != ScaleSource::Dynamic || f.gran == Granularity::Token) return {};
  return {.at = f.first - 1 + s.sink};
}

}  // namespace

extern const SchemeTraits kFp8Scheme;
const SchemeTraits kFp8Scheme{
    .family = "fp8",
    .kinds = kKinds,
    .names = "fp8_e4m3 (alias fp8), fp8_e4m3fnuz, fp8_e5m2",
    .keys_help =
        "[gran=tensor|head|token|channel] [scale=dynamic|<num>|calib:<file>] [first=N]; "
        "defaults gran=tensor, scale=dynamic, first=128",
    .description =
        "one FP8 code per element and fp32 scales per granularity unit (dynamic tensor/head/"
        "channel scales from the first N tokens)",
    .aliases = kAliases,
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
