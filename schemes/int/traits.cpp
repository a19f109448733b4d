// The int family: int<B> with both axes named, kivi<B> (KIVI's axes and window), and HF
// QuantizedCache's names (hf) (core/schemes.h's traits record). Quantizer, packing and the
// streaming cache: kivi/.
#include <algorithm>
#include <array>
#include <set>

#include "core/error.h"
#include "core/schemes.h"
#include "schemes/int/params.h"

namespace kvq {

std::string_view to_string(Axis a) { return a == Axis::Channel ? "channel" : "token"; }

int64_t quantized_tokens(const IntSpec& q, Axis axis, int64_t tokens) {
  if (axis == Axis::Channel) {
    const int64_t block = q.residual > 0 ? q.residual : q.group;
    return tokens / block * block;
  }
  return std::max<int64_t>(tokens - q.residual, 0);
}

namespace {

// hf[:nbits=B,q_group_size=G,residual_length=R,axis_key=0,axis_value=0]: HF transformers'
// QuantizedCacheConfig names (its defaults: 4 bits, groups of 64, 128 recent tokens, axis 0). Axis
// 0 (quanto's, the recommended setting) groups consecutive head_dim channels of one token: kvq's
// int<B>:k=token,v=token. HF's window differs: it keeps up to R tokens exact, then quantizes all
// of them at once; kvq's r=R keeps the latest R exact at every step (README, "Concepts").
std::string rewrite_hf(std::string_view text, std::string_view params) {
  int bits = 4, group = 64, residual = 128;
  std::set<std::string> seen;
  if (!params.empty())
    for (std::string_view kv : scheme_parse::split(params, ',')) {
      const size_t eq = kv.find('=');
      const std::string key(kv.substr(0, eq));
      const std::string_view val = eq == std::string_view::npos ? "" : kv.substr(eq + 1);
      if (eq == std::string_view::npos || val.empty())
        fail("bad scheme spec '{}': parameter '{}' needs a value", text, key);
      if (!seen.insert(key).second)
        fail("bad scheme spec '{}': parameter '{}' given twice", text, key);
      const int x = scheme_parse::integer(text, val, key);
      if (key == "nbits")
        bits = x;
      else if (key == "q_group_size")
        group = x;
      else if (key == "residual_length")
        residual = x;
      else if (key == "axis_key" || key == "axis_value") {
        if (x != 0)
          fail(
              "bad scheme spec '{}': {}={}: kvq maps HF's axis 0 (groups along head_dim, per "
              "token); for KIVI's per-channel keys use kivi<B> or int<B>:k=channel,v=token",
              text, key, x);
      } else {
        fail(
            "bad scheme spec '{}': unknown parameter '{}' for hf (allowed: nbits, q_group_size, "
            "residual_length, axis_key, axis_value)",
            text, key);
      }
    }
  return fmt::format("int{}:k=token,v=token,g={},r={}", bits, group, residual);
}

constexpr std::array<SchemeKindName, 1> kKinds{{{SchemeKind::Int, "int/kivi"}}};
constexpr std::array<SchemeAlias, 1> kAliases{
    {{"hf",
      "HF QuantizedCache's names: nbits=4, q_group_size=64, residual_length=128, "
      "axis_key=0, axis_value=0 = int<B>:k=token,v=token,g=G,r=R",
      rewrite_hf}}};
// A bare int<B> takes k=channel,v=token; with keys both axes must be written.
constexpr std::array<SchemeKey, 6> kIntKeys{{{"k", false, "channel"},
                                             {"v", false, "token"},
                                             {"g", false, "32"},
                                             {"r", false, "0"},
                                             {"sym", true},
                                             {"arith", false, "exact"}}};
constexpr std::array<SchemeKey, 4> kKiviKeys{
    {{"g", false, "32"}, {"r", false, "128"}, {"sym", true}, {"arith", false, "exact"}}};
constexpr std::array<std::string_view, 10> kExamples{"kivi2:g=32,r=128",
                                                     "kivi4:g=32,r=128,arith=fp16",
                                                     "kivi3:g=16,r=64,sym",
                                                     "int8:k=token,v=token,g=dim,r=0",
                                                     "int4:k=token,v=token,g=64,r=128",
                                                     "int2:k=token,v=channel,g=32,r=32",
                                                     "int4:k=channel,v=channel,g=8,r=0,sym",
                                                     "int4:k=channel,v=token,g=32,r=0,arith=fp16",
                                                     "kivi2:g=32,r=128,rot=hadamard",
                                                     "kivi2:g=32,r=32,sink=4"};

bool claims(std::string_view name) { return name.starts_with("int") || name.starts_with("kivi"); }

SchemeParams make(std::string_view text, std::string_view name) {
  IntSpec q;
  q.kivi = name.starts_with("kivi");
  const std::string_view b = name.substr(q.kivi ? 4 : 3);
  if (b != "2" && b != "3" && b != "4" && b != "8")
    fail("bad scheme spec '{}': {} bits not supported (allowed: 2, 3, 4, 8)", text,
         b.empty() ? "missing" : b);
  q.bits = b[0] - '0';
  q.residual = q.kivi ? 128 : 0;
  return q;
}

std::span<const SchemeKey> keys(const SchemeSpec& s) {
  if (s.q().kivi) return kKiviKeys;
  return kIntKeys;
}

Axis parse_axis(std::string_view text, std::string_view key, std::string_view v) {
  if (v == "channel") return Axis::Channel;
  if (v == "token") return Axis::Token;
  fail("bad scheme spec '{}': {}={} (allowed: channel, token)", text, key, v);
}

void set(SchemeSpec& s, std::string_view text, std::string_view key, std::string_view val) {
  IntSpec& q = s.q();
  if (key == "sym") {
    q.sym = true;
  } else if (key == "k") {
    q.key_axis = parse_axis(text, key, val);
  } else if (key == "v") {
    q.value_axis = parse_axis(text, key, val);
  } else if (key == "g") {
    if (val == "dim") {
      q.group = kGroupWholeDim;
    } else {
      const int g = scheme_parse::integer(text, val, key);
      if (g < 8 || g > 256 || (g & (g - 1)) != 0)
        fail("bad scheme spec '{}': g={} (allowed: a power of two from 8 to 256, or g=dim)", text,
             val);
      q.group = g;
    }
  } else if (key == "arith") {
    if (val == "exact")
      q.arith = Arith::Exact;
    else if (val == "fp16")
      q.arith = Arith::Fp16;
    else
      fail("bad scheme spec '{}': arith={} (allowed: exact, fp16)", text, val);
  } else if (key == "r") {
    const int r = scheme_parse::integer(text, val, key);
    if (r < 0) fail("bad scheme spec '{}': r={} must be >= 0", text, val);
    q.residual = r;
  }
}

void check(const SchemeSpec& s, std::string_view text, std::string_view name,
           const std::set<std::string>& seen) {
  const IntSpec& q = s.q();
  // A bare int<B> takes KIVI's axes (keys per channel, values per token; `kvq plan`'s old
  // shorthand); with parameters both axes must be named.
  if (!q.kivi && !seen.empty() && (!seen.count("k") || !seen.count("v")))
    fail("bad scheme spec '{}': {} needs both axes, e.g. {}:k=channel,v=token (or use kivi{})",
         text, name, name, q.bits);
  const bool channel_side = q.key_axis == Axis::Channel || q.value_axis == Axis::Channel;
  if (channel_side && q.group == kGroupWholeDim)
    fail(
        "bad scheme spec '{}': g=dim groups channels, but a per-channel side groups tokens; give "
        "g=G",
        text);
  if (q.sym && q.arith == Arith::Fp16)
    fail(
        "bad scheme spec '{}': arith=fp16 is KIVI's asymmetric (min-max) arithmetic; it has no "
        "sym form",
        text);
  if (channel_side && q.residual % q.group != 0)
    fail("bad scheme spec '{}': r={} must be a multiple of g={} on a per-channel side", text,
         q.residual, q.group);
}

std::string canonical(const SchemeSpec& s) {
  const IntSpec& q = s.q();
  const std::string g = q.group == kGroupWholeDim ? "dim" : std::to_string(q.group);
  // arith=fp16 only when set, so the common specs keep their names (result keys).
  const std::string flags =
      std::string(q.sym ? ",sym" : "") + (q.arith == Arith::Fp16 ? ",arith=fp16" : "");
  if (q.kivi) return fmt::format("kivi{}:g={},r={}{}", q.bits, g, q.residual, flags);
  return fmt::format("int{}:k={},v={},g={},r={}{}", q.bits, to_string(q.key_axis),
                     to_string(q.value_axis), g, q.residual, flags);
}

// 32-bit words holding n codes of b bits, 32/b codes per word (10 for b=3).
int64_t packed_words(int64_t n, int bits) {
  const int per_word = 32 / bits;
  return (n + per_word - 1) / per_word;
}

// Codes, scales and minima for the tq quantized tokens of s (group g, resolved), the other tokens
// exact.
Footprint codes_and_groups(int bits, int g, bool sym, Axis axis, int64_t tq, Shape3 s) {
  Footprint f;
  int64_t groups = 0, words = 0;
  if (axis == Axis::Channel) {
    // Per (head, channel): tq / G token groups of G codes each.
    groups = s.heads * s.dim * (tq / g);
    words = groups * packed_words(g, bits);
  } else {
    // Per (token, head): ceil(D / G) channel groups, the last one possibly shorter.
    const int64_t full = s.dim / g, tail = s.dim % g;
    groups = tq * s.heads * (full + (tail ? 1 : 0));
    words = tq * s.heads * (full * packed_words(g, bits) + (tail ? packed_words(tail, bits) : 0));
  }
  f.code_bytes = 4.0 * static_cast<double>(words);
  f.scale_bytes = 2.0 * static_cast<double>(groups);
  f.zero_bytes = sym ? 0.0 : 2.0 * static_cast<double>(groups);
  f.quantized_elements = tq * s.heads * s.dim;
  add_exact(f, s.numel() - f.quantized_elements);
  return f;
}

Footprint spec_footprint(const SchemeSpec& s, Role role, Shape3 shape) {
  const IntSpec& q = s.q();
  const Axis axis = q.axis(role);
  return codes_and_groups(q.bits, q.group_for(shape.dim), q.sym, axis,
                          quantized_tokens(q, axis, shape.tokens), shape);
}

Footprint stored_footprint(const StoredSide& side, Shape3 shape) {
  return codes_and_groups(side.bits, side.group, side.sym, side.axis, side.quantized_tokens, shape);
}

// (g=dim groups channels: only a per-token side has it.)
int64_t coded_tokens(const SchemeSpec& s, Role role, int64_t tokens, bool) {
  return quantized_tokens(s.q(), s.q().axis(role), tokens);
}

// kivi/minmax.h: a group's step is (max - min) / (2^B - 1) <= 2 amax / (2^B - 1) (asymmetric) or
// max|x| / (2^(B-1) - 1) (sym), and a code is the nearest level: half a step, at most
// amax / (2^B - 2). The fp16 scale and minimum the cache keeps (and arith=fp16's fp16 quotient)
// move the levels by a few fp16 ulps of amax: 2^-8 amax covers them. Window tokens are exact.
double max_error(const SchemeSpec& s, double amax) {
  const int bits = s.q().bits;
  return amax * (1.0 / ((1 << bits) - 2) + 0x1p-8);
}

std::vector<SchemeField> fields(const SchemeSpec& s) {
  const IntSpec& q = s.q();
  using Value = decltype(SchemeField::value);
  const Value group =
      q.group == kGroupWholeDim ? Value{std::string("dim")} : Value{int64_t{q.group}};
  return {{"kind", std::string("int")},
          {"bits", int64_t{q.bits}},
          {"key_axis", std::string(to_string(q.key_axis))},
          {"value_axis", std::string(to_string(q.value_axis))},
          {"group", group},
          {"residual", int64_t{q.residual}},
          {"sym", q.sym},
          {"arith", std::string(q.arith == Arith::Fp16 ? "fp16" : "exact")},
          {"kivi", q.kivi}};
}

// Each group's own min and max: per token, or per group of G tokens on a per-channel side.
ScaleOrigin scale_origin(const SchemeSpec& s, Role role, int64_t) {
  const IntSpec& q = s.q();
  if (q.axis(role) == Axis::Token) return {"each token"};
  return {q.group == kGroupWholeDim ? std::string("each head_dim tokens")
                                    : fmt::format("each {} tokens", q.group)};
}

// A per-channel side quantizes its exact window each time a block of B = R (or G without a
// window) tokens completes, counted after the sinks (the scheme's own side starts at token S); a
// per-token side only grows.
FootprintDrops footprint_drops(const SchemeSpec& s, Role role, int64_t dim) {
  const IntSpec& q = s.q();
  if (q.axis(role) != Axis::Channel) return {};
  return {.period = q.residual > 0 ? q.residual : q.group_for(dim), .after = s.sink};
}

}  // namespace

extern const SchemeTraits kIntScheme;
const SchemeTraits kIntScheme{
    .family = "int",
    .kinds = kKinds,
    .names = "int2|int3|int4|int8, kivi2|kivi3|kivi4|kivi8, hf (HF QuantizedCache's names)",
    .keys_help =
        "int<B>: k=channel|token,v=channel|token [g=G|dim] [r=R] [sym] [arith=exact|fp16] "
        "(g=32, r=0; a bare int<B> is k=channel,v=token); kivi<B>: [g=G] [r=R] [sym] "
        "[arith=exact|fp16] (g=32, r=128); hf[:nbits=B,q_group_size=G,residual_length=R]",
    .description =
        "B-bit group quantization (KIVI): groups of G tokens per channel or G channels per "
        "token, fp16 scales and minima, the R most recent tokens exact",
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
