#include "core/spec.h"

#include <algorithm>
#include <charconv>
#include <set>
#include <vector>

#include "core/error.h"
#include "core/schemes.h"

namespace kvq {

int scheme_parse::integer(std::string_view text, std::string_view v, std::string_view key) {
  int x = 0;
  auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
  if (ec != std::errc() || p != v.data() + v.size())
    fail("bad scheme spec '{}': {}={} is not an integer", text, key, v);
  return x;
}

std::vector<std::string_view> scheme_parse::split(std::string_view s, char sep) {
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

std::string_view to_string(Role r) { return r == Role::Key ? "key" : "value"; }

void SchemeSpec::wrong_family(std::string_view family) const {
  fail("scheme '{}' is not {} scheme", canonical(), family);
}

namespace {

using scheme_parse::split;

// The alias `name` of some family, or null.
const SchemeAlias* find_alias(std::string_view name) {
  for (const SchemeTraits* t : scheme_families())
    for (const SchemeAlias& a : t->aliases)
      if (a.name == name) return &a;
  return nullptr;
}

// The family that claims `name`, or null.
const SchemeTraits* find_family(std::string_view name) {
  for (const SchemeTraits* t : scheme_families())
    if (t->claims(name)) return t;
  return nullptr;
}

// Whether `s` starts with a scheme name (what may follow "v=" in a split spec, unlike the int
// parameters v=channel / v=token).
bool names_scheme(std::string_view s) {
  const std::string_view name = s.substr(0, s.find_first_of(":,;"));
  return find_alias(name) != nullptr || find_family(name) != nullptr;
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
  if (text.empty()) fail("empty scheme spec (allowed schemes: {})", scheme_names());
  if (text.find('@') != std::string_view::npos) return parse_layered(text);
  if (text.starts_with("k=")) return parse_split(text);
  if (text.starts_with("v="))
    fail("bad scheme spec '{}': a split spec names the keys first: k=KEY_SPEC;v=VALUE_SPEC", text);
  const size_t colon = text.find(':');
  std::string_view name = text.substr(0, colon);
  if (const size_t comma = name.find(','); comma != std::string_view::npos)  // kivi2,rot=...
    fail("bad scheme spec '{}': parameters follow a ':' after the name ({}:{})", text,
         name.substr(0, comma), text.substr(comma + 1));
  const std::string_view params = colon == std::string_view::npos ? "" : text.substr(colon + 1);
  if (const SchemeAlias* a = find_alias(name)) {
    if (a->rewrite) return parse_spec(a->rewrite(text, params));  // hf: a spec of its own
    name = a->means;
  }
  if (colon != std::string_view::npos && params.empty())
    fail("bad scheme spec '{}': nothing after ':' (write NAME or NAME:key=value,...)", text);

  const SchemeTraits* family = find_family(name);
  if (!family)
    fail("bad scheme spec '{}': unknown scheme '{}' (allowed: {})", text, name, scheme_names());
  SchemeSpec s;
  s.params = family->make(text, name);
  // Every scheme's own keys, and rot= / sink= (on fp32 they change nothing but rounding: a check
  // that they are invisible without quantization).
  const std::span<const SchemeKey> own = family->keys(s);
  std::set<std::string> allowed{"rot", "sink"};
  for (const SchemeKey& k : own) allowed.emplace(k.name);
  auto is_flag = [&](std::string_view key) {
    return std::any_of(own.begin(), own.end(),
                       [&](const SchemeKey& k) { return k.flag && k.name == key; });
  };

  std::set<std::string> seen;
  if (!params.empty()) {
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
      if (is_flag(key)) {
        if (eq != std::string_view::npos)
          fail("bad scheme spec '{}': '{}' takes no value", text, key);
        family->set(s, text, key, "");
        continue;
      }
      if (eq == std::string_view::npos || val.empty())
        fail("bad scheme spec '{}': parameter '{}' needs a value ({}=...)", text, key, key);
      if (key == "rot") {
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
        const int n = scheme_parse::integer(text, val, key);
        if (n < 0 || n > 4096)
          fail("bad scheme spec '{}': sink={} (allowed: 0 .. 4096 tokens)", text, val);
        s.sink = n;
      } else {
        family->set(s, text, key, val);
      }
    }
  }
  family->check(s, text, name, seen);
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
  const std::string name = scheme_traits(*this).canonical(*this);
  // A name without keys (fp32) takes them after a ':'.
  if (!extra.empty() && name.find(':') == std::string::npos) extra[0] = ':';
  return name + extra;
}

}  // namespace kvq
