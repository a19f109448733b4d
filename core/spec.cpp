#include "core/spec.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <set>
#include <vector>

#include "core/error.h"

namespace kvq {
namespace {

constexpr const char* kSchemes =
    "fp32, bf16, fp16, fp8_e4m3 (alias fp8), fp8_e4m3fnuz, fp8_e5m2, int2|int3|int4|int8, "
    "kivi2|kivi3|kivi4|kivi8, hf (HF QuantizedCache's names), k=SPEC;v=SPEC";

std::vector<std::string_view> split(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  size_t b = 0;
  for (size_t i = 0; i <= s.size(); ++i) {
    if (i == s.size() || s[i] == sep) {
      out.push_back(s.substr(b, i - b));
      b = i + 1;
    }
  }
  return out;
}

int parse_int(std::string_view text, std::string_view v, std::string_view key) {
  int x = 0;
  auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
  if (ec != std::errc() || p != v.data() + v.size())
    fail("bad scheme spec '{}': {}={} is not an integer", text, key, v);
  return x;
}

Axis parse_axis(std::string_view text, std::string_view key, std::string_view v) {
  if (v == "channel") return Axis::Channel;
  if (v == "token") return Axis::Token;
  fail("bad scheme spec '{}': {}={} (allowed: channel, token)", text, key, v);
}

}  // namespace

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
std::string_view to_string(Axis a) { return a == Axis::Channel ? "channel" : "token"; }
std::string_view to_string(Role r) { return r == Role::Key ? "key" : "value"; }

namespace {

// Whether `s` starts with a scheme name (what may follow "v=" in a split spec, unlike the int
// parameters v=channel / v=token).
bool names_scheme(std::string_view s) {
  const std::string_view name = s.substr(0, s.find_first_of(":,;"));
  return name == "fp32" || name == "bf16" || name == "fp16" || name == "fp8" || name == "hf" ||
         name.starts_with("fp8_") || name.starts_with("int") || name.starts_with("kivi");
}

// hf[:nbits=B,q_group_size=G,residual_length=R,axis_key=0,axis_value=0]: HF transformers'
// QuantizedCacheConfig names (its defaults: 4 bits, groups of 64, 128 recent tokens, axis 0). Axis
// 0 (quanto's, the recommended setting) groups consecutive head_dim channels of one token: kvq's
// int<B>:k=token,v=token. HF's window differs: it keeps up to R tokens exact, then quantizes all
// of them at once; kvq's r=R keeps the latest R exact at every step (README, "Concepts").
SchemeSpec parse_hf(std::string_view text, std::string_view params) {
  int bits = 4, group = 64, residual = 128;
  std::set<std::string> seen;
  if (!params.empty())
    for (std::string_view kv : split(params, ',')) {
      const size_t eq = kv.find('=');
      const std::string key(kv.substr(0, eq));
      const std::string_view val = eq == std::string_view::npos ? "" : kv.substr(eq + 1);
      if (eq == std::string_view::npos || val.empty())
        fail("bad scheme spec '{}': parameter '{}' needs a value", text, key);
      if (!seen.insert(key).second)
        fail("bad scheme spec '{}': parameter '{}' given twice", text, key);
      const int x = parse_int(text, val, key);
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
  return parse_spec(fmt::format("int{}:k=token,v=token,g={},r={}", bits, group, residual));
}

// k=KEY;v=VALUE or k=KEY,v=VALUE.
SchemeSpec parse_split(std::string_view text) {
  for (size_t i = 2; i + 3 <= text.size(); ++i) {
    if ((text[i] != ';' && text[i] != ',') || text.substr(i + 1, 2) != "v=" ||
        !names_scheme(text.substr(i + 3)))
      continue;
    const std::string_view kt = text.substr(2, i - 2), vt = text.substr(i + 3);
    if (kt.starts_with("k=") || vt.starts_with("k="))
      fail("bad scheme spec '{}': each side of k=...;v=... is one scheme", text);
    SchemeSpec k = parse_spec(kt), v = parse_spec(vt);
    if (k.sink != v.sink)
      fail(
          "bad scheme spec '{}': sink= is {} for keys and {} for values; give both sides the "
          "same (attention reads the first S keys and values exact together)",
          text, k.sink, v.sink);
    if (k.canonical() == v.canonical()) return k;  // the same scheme on both sides
    SchemeSpec s = k;
    s.key_side = std::make_shared<const SchemeSpec>(std::move(k));
    s.value_side = std::make_shared<const SchemeSpec>(std::move(v));
    return s;
  }
  fail(
      "bad scheme spec '{}': keys and values in different schemes are written "
      "k=KEY_SPEC;v=VALUE_SPEC "
      "(e.g. k=kivi2;v=fp8_e4m3:gran=token)",
      text);
}

}  // namespace

namespace {

// "0-1,29" -> {0, 1, 29}.
std::vector<int> parse_layers(std::string_view text, std::string_view list) {
  std::vector<int> out;
  for (std::string_view item : split(list, ',')) {
    const size_t dash = item.find('-');
    auto num = [&](std::string_view v) {
      int x = -1;
      auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
      if (v.empty() || ec != std::errc() || p != v.data() + v.size() || x < 0 || x > 4095)
        fail(
            "bad scheme spec '{}': layer list '{}': '{}' is not a layer index (write e.g. "
            "0-1,29=kivi4)",
            text, list, item);
      return x;
    };
    const int a = num(item.substr(0, dash));
    const int b = dash == std::string_view::npos ? a : num(item.substr(dash + 1));
    if (b < a) fail("bad scheme spec '{}': layer range '{}' runs backwards", text, item);
    for (int l = a; l <= b; ++l) out.push_back(l);
  }
  return out;
}

// "0-1,29" from {0, 1, 29}.
std::string format_layers(const std::vector<int>& ls) {
  std::string out;
  for (size_t i = 0; i < ls.size();) {
    size_t j = i;
    while (j + 1 < ls.size() && ls[j + 1] == ls[j] + 1) ++j;
    if (!out.empty()) out += ',';
    out += j == i ? fmt::format("{}", ls[i]) : fmt::format("{}-{}", ls[i], ls[j]);
    i = j + 1;
  }
  return out;
}

// SPEC@LAYERS=SPEC...: overrides grouped by scheme, layers that take the first spec dropped.
SchemeSpec parse_layered(std::string_view text) {
  const std::vector<std::string_view> parts = split(text, '@');
  SchemeSpec s = parse_spec(parts[0]);
  const std::string first = s.canonical();
  std::vector<std::pair<int, SchemeSpec>> by_layer;
  std::set<int> seen;
  for (size_t i = 1; i < parts.size(); ++i) {
    if (parts[i].starts_with("first=") || parts[i].starts_with("last=")) {  // the edges preset
      for (std::string_view item : split(parts[i], ',')) {
        const bool first_item = item.starts_with("first=");
        if (!first_item && !item.starts_with("last="))
          fail("bad scheme spec '{}': '@{}': a layer preset is first=N[,last=N]", text, parts[i]);
        const std::string_view v = item.substr(item.find('=') + 1);
        int n = 0;
        auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
        if (v.empty() || ec != std::errc() || p != v.data() + v.size() || n < 1 || n > 4095)
          fail(
              "bad scheme spec '{}': '{}' takes a layer count 1-4095 (the kept layers take the "
              "exact fp32 cache; for another scheme name the layers: @0-1=SPEC)",
              text, item);
        int& slot = first_item ? s.keep_first : s.keep_last;
        if (slot != 0)
          fail("bad scheme spec '{}': {} is given twice", text, first_item ? "first=" : "last=");
        slot = n;
      }
      continue;
    }
    const size_t eq = parts[i].find('=');
    if (eq == std::string_view::npos || eq == 0 || eq + 1 == parts[i].size())
      fail("bad scheme spec '{}': '@{}' should be @LAYERS=SPEC (e.g. kivi2@0-1,29=kivi4)", text,
           parts[i]);
    const SchemeSpec o = parse_spec(parts[i].substr(eq + 1));
    for (int l : parse_layers(text, parts[i].substr(0, eq))) {
      if (!seen.insert(l).second) fail("bad scheme spec '{}': layer {} is given twice", text, l);
      by_layer.push_back({l, o});
    }
  }
  // An override that repeats the first spec says nothing, unless a preset would keep that layer
  // exact (explicit overrides win over first=/last=).
  if (s.keep_first == 0 && s.keep_last == 0)
    std::erase_if(by_layer, [&](const auto& lo) { return lo.second.canonical() == first; });
  std::sort(by_layer.begin(), by_layer.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  for (const auto& lo : by_layer) {  // (no structured binding: clang 14 cannot capture one)
    const std::string c = lo.second.canonical();
    auto it = std::find_if(s.layers.begin(), s.layers.end(),
                           [&](const LayerOverride& x) { return x.spec->canonical() == c; });
    if (it == s.layers.end())
      s.layers.push_back({{lo.first}, std::make_shared<const SchemeSpec>(lo.second)});
    else
      it->layers.push_back(lo.first);
  }
  return s;
}

}  // namespace

SchemeSpec SchemeSpec::for_layer(int l) const {
  for (const LayerOverride& o : layers)
    if (std::binary_search(o.layers.begin(), o.layers.end(), l)) return *o.spec;
  if (l >= 0 && l < keep_first) return SchemeSpec{};  // the exact fp32 cache
  if (l >= 0 && keep_last > 0) {
    KVQ_CHECK(model_layers >= 0,
              "--kv '{}' keeps the last {} layers exact: which layers those are depends on the "
              "model's layer count (use it with a model, or name the layers: @L=fp32)",
              canonical(), keep_last);
    if (l >= model_layers - keep_last) return SchemeSpec{};
  }
  SchemeSpec s = *this;
  s.layers.clear();
  s.keep_first = s.keep_last = 0;
  s.model_layers = -1;
  return s;
}

std::vector<SchemeSpec> SchemeSpec::distinct_layer_specs() const {
  std::vector<SchemeSpec> out{for_layer(-1)};
  for (const LayerOverride& o : layers) out.push_back(*o.spec);
  if (keep_first > 0 || keep_last > 0) out.push_back(SchemeSpec{});
  return out;
}

int SchemeSpec::max_layer() const {
  int m = -1;
  for (const LayerOverride& o : layers) m = std::max(m, o.layers.back());
  return m;
}

SchemeSpec parse_spec(std::string_view text) {
  if (text.empty()) fail("empty scheme spec (allowed schemes: {})", kSchemes);
  if (text.find('@') != std::string_view::npos) return parse_layered(text);
  if (text.starts_with("k=")) return parse_split(text);
  if (text.starts_with("v="))
    fail("bad scheme spec '{}': a split spec names the keys first: k=KEY_SPEC;v=VALUE_SPEC", text);
  const size_t colon = text.find(':');
  std::string_view name = text.substr(0, colon);
  if (const size_t comma = name.find(','); comma != std::string_view::npos)  // kivi2,rot=...
    fail("bad scheme spec '{}': parameters follow a ':' after the name ({}:{})", text,
         name.substr(0, comma), text.substr(comma + 1));
  if (name == "fp8") name = "fp8_e4m3";  // vLLM's --kv-cache-dtype fp8 is E4M3
  const std::string_view params = colon == std::string_view::npos ? "" : text.substr(colon + 1);
  if (name == "hf") return parse_hf(text, params);
  if (colon != std::string_view::npos && params.empty())
    fail("bad scheme spec '{}': nothing after ':' (write NAME or NAME:key=value,...)", text);

  SchemeSpec s;
  std::set<std::string> allowed;
  if (name == "fp32")
    s.kind = SchemeKind::Fp32;
  else if (name == "bf16")
    s.kind = SchemeKind::Bf16;
  else if (name == "fp16")
    s.kind = SchemeKind::Fp16;
  else if (name.starts_with("fp8_")) {
    s.kind = SchemeKind::Fp8;
    if (name == "fp8_e4m3")
      s.fp8.format = Fp8Format::E4M3;
    else if (name == "fp8_e4m3fnuz")
      s.fp8.format = Fp8Format::E4M3FNUZ;
    else if (name == "fp8_e5m2")
      s.fp8.format = Fp8Format::E5M2;
    else
      fail(
          "bad scheme spec '{}': unknown FP8 format '{}' (allowed: fp8_e4m3, fp8_e4m3fnuz, "
          "fp8_e5m2)",
          text, name);
    allowed = {"gran", "scale", "first"};
  } else if (name.starts_with("int") || name.starts_with("kivi")) {
    s.kind = SchemeKind::Int;
    s.q.kivi = name.starts_with("kivi");
    const std::string_view b = name.substr(s.q.kivi ? 4 : 3);
    if (b != "2" && b != "3" && b != "4" && b != "8")
      fail("bad scheme spec '{}': {} bits not supported (allowed: 2, 3, 4, 8)", text,
           b.empty() ? "missing" : b);
    s.q.bits = b[0] - '0';
    s.q.residual = s.q.kivi ? 128 : 0;
    allowed = s.q.kivi ? std::set<std::string>{"g", "r", "sym", "arith"}
                       : std::set<std::string>{"k", "v", "g", "r", "sym", "arith"};
  } else {
    fail("bad scheme spec '{}': unknown scheme '{}' (allowed: {})", text, name, kSchemes);
  }
  // On fp32 they change nothing but rounding: a check that they are invisible without quantization.
  allowed.insert({"rot", "sink"});

  std::set<std::string> seen;
  if (!params.empty()) {
    if (allowed.empty()) fail("bad scheme spec '{}': {} takes no parameters", text, name);
    for (std::string_view kv : split(params, ',')) {
      const size_t eq = kv.find('=');
      const std::string key(kv.substr(0, eq));
      const std::string_view val = eq == std::string_view::npos ? "" : kv.substr(eq + 1);
      std::string list;
      for (const auto& a : allowed) list += (list.empty() ? "" : ", ") + a;
      if (key.empty()) fail("bad scheme spec '{}': empty parameter (allowed: {})", text, list);
      if (!allowed.count(key))
        fail("bad scheme spec '{}': unknown parameter '{}' for {} (allowed: {})", text, key, name,
             list);
      if (!seen.insert(key).second)
        fail("bad scheme spec '{}': parameter '{}' given twice", text, key);
      if (key == "sym") {
        if (eq != std::string_view::npos) fail("bad scheme spec '{}': 'sym' takes no value", text);
        s.q.sym = true;
        continue;
      }
      if (eq == std::string_view::npos || val.empty())
        fail("bad scheme spec '{}': parameter '{}' needs a value ({}=...)", text, key, key);
      if (key == "gran") {
        if (val == "tensor")
          s.fp8.gran = Granularity::Tensor;
        else if (val == "head")
          s.fp8.gran = Granularity::Head;
        else if (val == "token")
          s.fp8.gran = Granularity::Token;
        else if (val == "channel")
          s.fp8.gran = Granularity::Channel;
        else
          fail("bad scheme spec '{}': gran={} (allowed: tensor, head, token, channel)", text, val);
      } else if (key == "scale") {
        if (val == "dynamic") {
          s.fp8.source = ScaleSource::Dynamic;
        } else if (val.starts_with("calib:")) {
          s.fp8.source = ScaleSource::Calib;
          s.fp8.calib_path = std::string(val.substr(6));
          if (s.fp8.calib_path.empty())
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
          s.fp8.source = ScaleSource::Constant;
          s.fp8.constant = static_cast<float>(x);
        }
      } else if (key == "first") {
        const int n = parse_int(text, val, key);
        if (n < 1 || n > (1 << 24))
          fail("bad scheme spec '{}': first={} (allowed: 1 .. 16777216 tokens)", text, val);
        s.fp8.first = n;
      } else if (key == "k") {
        s.q.key_axis = parse_axis(text, key, val);
      } else if (key == "v") {
        s.q.value_axis = parse_axis(text, key, val);
      } else if (key == "g") {
        if (val == "dim") {
          s.q.group = kGroupWholeDim;
        } else {
          const int g = parse_int(text, val, key);
          if (g < 8 || g > 256 || (g & (g - 1)) != 0)
            fail("bad scheme spec '{}': g={} (allowed: a power of two from 8 to 256, or g=dim)",
                 text, val);
          s.q.group = g;
        }
      } else if (key == "arith") {
        if (val == "exact")
          s.q.arith = Arith::Exact;
        else if (val == "fp16")
          s.q.arith = Arith::Fp16;
        else
          fail("bad scheme spec '{}': arith={} (allowed: exact, fp16)", text, val);
      } else if (key == "rot") {
        const std::string_view kind = val.substr(0, val.find(':'));
        if (kind != "hadamard")
          fail("bad scheme spec '{}': rot={} (allowed: hadamard, hadamard:SEED)", text, val);
        s.rot.on = true;
        if (kind.size() < val.size()) {
          const std::string_view sv = val.substr(kind.size() + 1);
          auto [p, ec] = std::from_chars(sv.data(), sv.data() + sv.size(), s.rot.seed);
          if (sv.empty() || ec != std::errc() || p != sv.data() + sv.size())
            fail(
                "bad scheme spec '{}': rot={}: the seed is a non-negative integer (rot=hadamard:7)",
                text, val);
          s.rot.seeded = true;
        }
      } else if (key == "sink") {
        const int n = parse_int(text, val, key);
        if (n < 0 || n > 4096)
          fail("bad scheme spec '{}': sink={} (allowed: 0 .. 4096 tokens)", text, val);
        s.sink = n;
      } else if (key == "r") {
        const int r = parse_int(text, val, key);
        if (r < 0) fail("bad scheme spec '{}': r={} must be >= 0", text, val);
        s.q.residual = r;
      }
    }
  }
  if (s.kind == SchemeKind::Fp8 && seen.count("first") &&
      (s.fp8.source != ScaleSource::Dynamic || s.fp8.gran == Granularity::Token))
    fail(
        "bad scheme spec '{}': first= sets where dynamic tensor/head/channel scales come from; it "
        "has no "
        "effect with {}",
        text, s.fp8.source != ScaleSource::Dynamic ? "a fixed scale" : "gran=token");
  if (s.kind == SchemeKind::Fp8 && s.rot.on && s.fp8.source == ScaleSource::Calib)
    fail(
        "bad scheme spec '{}': scale=calib: scales were measured on unrotated channels; with "
        "rot= use scale=dynamic or a number",
        text);
  if (s.kind == SchemeKind::Int) {
    // A bare int<B> takes KIVI's axes (keys per channel, values per token; `kvq plan`'s old
    // shorthand); with parameters both axes must be named.
    if (!s.q.kivi && !params.empty() && (!seen.count("k") || !seen.count("v")))
      fail("bad scheme spec '{}': {} needs both axes, e.g. {}:k=channel,v=token (or use kivi{})",
           text, name, name, s.q.bits);
    const bool channel_side = s.q.key_axis == Axis::Channel || s.q.value_axis == Axis::Channel;
    if (channel_side && s.q.group == kGroupWholeDim)
      fail(
          "bad scheme spec '{}': g=dim groups channels, but a per-channel side groups tokens; give "
          "g=G",
          text);
    if (s.q.sym && s.q.arith == Arith::Fp16)
      fail(
          "bad scheme spec '{}': arith=fp16 is KIVI's asymmetric (min-max) arithmetic; it has no "
          "sym form",
          text);
    if (channel_side && s.q.residual % s.q.group != 0)
      fail("bad scheme spec '{}': r={} must be a multiple of g={} on a per-channel side", text,
           s.q.residual, s.q.group);
  }
  return s;
}

void check_layers(const SchemeSpec& s, int64_t layers, std::string_view model) {
  KVQ_CHECK(s.max_layer() < layers, "--kv '{}' names layer {}, but {} has {} layers (0-{})",
            s.canonical(), s.max_layer(), model, layers, layers - 1);
  KVQ_CHECK(s.keep_first + s.keep_last < layers,
            "--kv '{}' keeps the first {} and last {} layers exact, but {} has {} layers: none "
            "would be quantized (keep at most {} together)",
            s.canonical(), s.keep_first, s.keep_last, model, layers, layers - 1);
}

SchemeSpec resolve_layers(const SchemeSpec& s, int64_t layers, std::string_view model) {
  check_layers(s, layers, model);
  SchemeSpec r = s;
  r.model_layers = layers;
  return r;
}

SchemeSpec with_rotation(const SchemeSpec& s, const RotSpec& r) {
  if (s.layered()) {  // every layer's scheme
    SchemeSpec o = with_rotation(s.for_layer(-1), r);
    for (const LayerOverride& l : s.layers)
      o.layers.push_back({l.layers, std::make_shared<const SchemeSpec>(with_rotation(*l.spec, r))});
    o.keep_first = s.keep_first;  // the kept layers stay the plain exact cache
    o.keep_last = s.keep_last;
    o.model_layers = s.model_layers;
    return o;
  }
  if (s.split()) {
    // Through the parser, so a split that becomes one scheme on both sides collapses as usual.
    return parse_spec("k=" + with_rotation(*s.key_side, r).canonical() +
                      ";v=" + with_rotation(*s.value_side, r).canonical());
  }
  SchemeSpec o = s;
  if (!o.rot.on) o.rot = r;
  return o;
}

SchemeSpec SchemeSpec::base() const {
  SchemeSpec b = *this;
  b.rot = {};
  b.sink = 0;
  return b;
}

std::string SchemeSpec::canonical() const {
  if (layered()) {
    std::string c = for_layer(-1).canonical();
    if (keep_first > 0 || keep_last > 0)
      c += keep_first == 0  ? fmt::format("@last={}", keep_last)
           : keep_last == 0 ? fmt::format("@first={}", keep_first)
                            : fmt::format("@first={},last={}", keep_first, keep_last);
    for (const LayerOverride& o : layers)
      c += fmt::format("@{}={}", format_layers(o.layers), o.spec->canonical());
    return c;
  }
  if (split()) return "k=" + key_side->canonical() + ";v=" + value_side->canonical();
  // rot= and sink= only when set, so the common specs keep their names (result keys).
  std::string extra;
  if (rot.on) extra += rot.seeded ? fmt::format(",rot=hadamard:{}", rot.seed) : ",rot=hadamard";
  if (sink > 0) extra += fmt::format(",sink={}", sink);
  if (!extra.empty() &&
      (kind == SchemeKind::Fp32 || kind == SchemeKind::Bf16 || kind == SchemeKind::Fp16))
    extra[0] = ':';
  if (!extra.empty()) return base().canonical() + extra;
  switch (kind) {
    case SchemeKind::Fp32:
      return "fp32";
    case SchemeKind::Bf16:
      return "bf16";
    case SchemeKind::Fp16:
      return "fp16";
    case SchemeKind::Fp8: {
      std::string sc = fp8.source == ScaleSource::Dynamic ? "dynamic"
                       : fp8.source == ScaleSource::Calib ? "calib:" + fp8.calib_path
                                                          : fmt::format("{}", fp8.constant);
      // first=N only when it is not the default, so the common specs keep their short names.
      const bool first = fp8.source == ScaleSource::Dynamic && fp8.gran != Granularity::Token &&
                         fp8.first != Fp8Spec::kFp8FirstDefault;
      return fmt::format("{}:gran={},scale={}{}", to_string(fp8.format), to_string(fp8.gran), sc,
                         first ? fmt::format(",first={}", fp8.first) : "");
    }
    case SchemeKind::Int: {
      const std::string g = q.group == kGroupWholeDim ? "dim" : std::to_string(q.group);
      // arith=fp16 only when set, so the common specs keep their names (result keys).
      const std::string flags =
          std::string(q.sym ? ",sym" : "") + (q.arith == Arith::Fp16 ? ",arith=fp16" : "");
      if (q.kivi) return fmt::format("kivi{}:g={},r={}{}", q.bits, g, q.residual, flags);
      return fmt::format("int{}:k={},v={},g={},r={}{}", q.bits, to_string(q.key_axis),
                         to_string(q.value_axis), g, q.residual, flags);
    }
  }
  return "?";
}

}  // namespace kvq
