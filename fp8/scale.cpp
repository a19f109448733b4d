#include "fp8/scale.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/io.h"

namespace kvq::fp8 {

int64_t scale_count(Granularity g, Shape3 s) {
  switch (g) {
    case Granularity::Tensor:
      return 1;
    case Granularity::Head:
      return s.heads;
    case Granularity::Token:
      return s.tokens * s.heads;
    case Granularity::Channel:
      return s.heads * s.dim;
  }
  return 1;
}

namespace {

/// The scales of one (t, h) row r = t * H + h: element d uses scales[base + d * step].
/// Derived from scale_index (the one definition), which is affine in d for every granularity
/// (step 0 for tensor/head/token, 1 for channel); looping by rows avoids a per-element switch.
struct RowScales {
  int64_t base;
  int64_t step;
};
RowScales row_scales(Granularity g, int64_t r, Shape3 s) {
  const int64_t t = r / s.heads, h = r % s.heads;
  const int64_t base = scale_index(g, t, h, 0, s.heads, s.dim);
  const int64_t step = scale_index(g, t, h, 1, s.heads, s.dim) - base;
  if (step != 0 && step != 1)
    fail("fp8: scale_index step {} along head_dim (expected 0 or 1)", step);
  return {base, step};
}

/// A constant scale is one scale for the whole tensor, whatever `gran` says.
Granularity effective_granularity(const Fp8Spec& spec) {
  return spec.source == ScaleSource::Constant ? Granularity::Tensor : spec.gran;
}

void check_scale_count(Granularity g, Shape3 s, const std::vector<float>& sc) {
  const int64_t want = scale_count(g, s);
  KVQ_CHECK(static_cast<int64_t>(sc.size()) == want,
            "fp8: {} scales given, gran={} needs {} for shape [{}, {}, {}]", sc.size(),
            to_string(g), want, s.tokens, s.heads, s.dim);
}

}  // namespace

Calibration read_calibration(const std::string& path) {
  return parse_calibration(read_file(path), path);
}

Calibration parse_calibration(const std::string& text, const std::string& path) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {  // parse_error, or out_of_range for 1e999
    fail("{}: not valid JSON ({})", path, e.what());
  }
  if (!j.is_object() || !j.contains("kvq_calibration"))
    fail(
        "{}: not a kvq calibration file (no \"kvq_calibration\" key; `kvq model calibrate` writes "
        "one)",
        path);
  if (j["kvq_calibration"] != 1)
    fail("{}: unsupported calibration version {} (expected 1)", path, j["kvq_calibration"].dump());
  if (!j.contains("layers") || !j["layers"].is_array() || j["layers"].empty())
    fail("{}: \"layers\" must be a non-empty array", path);
  Calibration c;
  for (const char* key : {"model", "source"})
    if (j.contains(key) && !j[key].is_string())
      fail("{}: \"{}\" must be a string, not {}", path, key, j[key].dump());
  c.model = j.value("model", "");
  c.source = j.value("source", "");
  size_t heads = 0;
  for (size_t l = 0; l < j["layers"].size(); ++l) {
    const auto& L = j["layers"][l];
    for (const char* key : {"k_amax", "v_amax"}) {
      // vLLM's names: k_scale / v_scale, the E4M3 scale (amax / 448), one per layer or per head.
      const std::string vllm = std::string(1, key[0]) + "_scale";
      const bool scale = L.is_object() && !L.contains(key) && L.contains(vllm);
      const nlohmann::json entry =
          !scale               ? (L.is_object() && L.contains(key) ? L[key] : nlohmann::json())
          : L[vllm].is_array() ? L[vllm]
                               : nlohmann::json::array({L[vllm]});
      if (!entry.is_array() || entry.empty())
        fail("{}: layers[{}].{} must be a non-empty array of numbers (or {}: vLLM's scale)", path,
             l, key, vllm);
      std::vector<float> v;
      for (size_t h = 0; h < entry.size(); ++h) {
        const auto& x = entry[h];
        // Checked as the float32 it is stored as: 1e300 or 1e-300 would become inf or 0.
        const double d = x.is_number()
                             ? x.get<double>() * (scale ? fp8::max_finite(Fp8Format::E4M3) : 1.0)
                             : 0.0;
        const float a =
            d > 0 && d <= std::numeric_limits<float>::max() ? static_cast<float>(d) : 0.0f;
        if (!x.is_number() || !(a > 0.0f))
          fail("{}: layers[{}].{}[{}] = {} is not a positive finite float32", path, l,
               scale ? vllm : std::string(key), h, x.dump());
        v.push_back(a);
      }
      const bool per_layer = scale && v.size() == 1;  // vLLM's one scale for the whole layer
      if (heads == 0 && !per_layer) heads = v.size();
      if (!per_layer && v.size() != heads)
        fail("{}: layers[{}].{} has {} heads, earlier layers have {}", path, l, key, v.size(),
             heads);
      (key[0] == 'k' ? c.k_amax : c.v_amax).push_back(std::move(v));
    }
  }
  return c;
}

void write_calibration(const std::string& path, const Calibration& c) {
  nlohmann::json j;
  j["kvq_calibration"] = 1;
  j["model"] = c.model;
  j["source"] = c.source;
  j["layers"] = nlohmann::json::array();
  for (size_t l = 0; l < c.k_amax.size(); ++l)
    j["layers"].push_back({{"k_amax", c.k_amax[l]}, {"v_amax", c.v_amax[l]}});
  write_file_atomic(path, j.dump(1) + "\n");
}

std::vector<float> compute_scales(const Fp8Spec& spec, Role role, const Tensor3& x, int layer) {
  const Shape3 s = x.shape;
  if (spec.source == ScaleSource::Constant) return {spec.constant};
  if (spec.source == ScaleSource::Calib) {
    if (spec.gran != Granularity::Tensor && spec.gran != Granularity::Head)
      fail("scale=calib:{} holds per-layer, per-head amax; use gran=tensor or gran=head (not {})",
           spec.calib_path, to_string(spec.gran));
    const Calibration c = read_calibration(spec.calib_path);
    const auto& table = role == Role::Key ? c.k_amax : c.v_amax;
    if (layer < 0 || layer >= static_cast<int>(table.size()))
      fail("{}: has {} layers, layer {} requested", spec.calib_path, table.size(), layer);
    auto amax = table[static_cast<size_t>(layer)];
    if (amax.size() == 1) amax.assign(static_cast<size_t>(s.heads), amax[0]);  // one per layer
    if (static_cast<int64_t>(amax.size()) != s.heads)
      fail("{}: layer {} has {} heads but the tensor has {}", spec.calib_path, layer, amax.size(),
           s.heads);
    if (spec.gran == Granularity::Tensor)
      return {scale_from_amax(*std::max_element(amax.begin(), amax.end()), spec.format)};
    std::vector<float> out;
    for (float a : amax) out.push_back(scale_from_amax(a, spec.format));
    return out;
  }
  std::vector<float> amax(static_cast<size_t>(scale_count(spec.gran, s)), 0.0f);
  // NaN sticks and reaches the scale: visible, never silently finite.
  const auto take = [](float& a, float x) {
    const float v = std::fabs(x);
    if (v > a || std::isnan(v)) a = v;
  };
  for (int64_t r = 0; r < s.tokens * s.heads; ++r) {
    const RowScales rs = row_scales(spec.gran, r, s);
    const float* xr = x.data.data() + r * s.dim;
    if (rs.step == 0) {
      float& a = amax[static_cast<size_t>(rs.base)];
      for (int64_t d = 0; d < s.dim; ++d) take(a, xr[d]);
    } else {
      float* ar = amax.data() + rs.base;
      for (int64_t d = 0; d < s.dim; ++d) take(ar[d], xr[d]);
    }
  }
  for (float& a : amax) a = scale_from_amax(a, spec.format);
  return amax;
}

namespace {

template <Fp8Format F>
void quantize_t(const Fp8Spec& spec, const std::vector<float>& sc, const Tensor3& x,
                std::vector<uint8_t>& codes) {
  const Shape3 s = x.shape;
  const Granularity g = effective_granularity(spec);
  check_scale_count(g, s, sc);
  codes.resize(x.data.size());
  for (int64_t r = 0; r < s.tokens * s.heads; ++r) {
    const RowScales rs = row_scales(g, r, s);
    const float* xr = x.data.data() + r * s.dim;
    uint8_t* cr = codes.data() + r * s.dim;
    const float* sr = sc.data() + rs.base;
    if (rs.step == 0) {
      for (int64_t d = 0; d < s.dim; ++d) cr[d] = quantize_value<F>(xr[d], sr[0]);
    } else {
      for (int64_t d = 0; d < s.dim; ++d) cr[d] = quantize_value<F>(xr[d], sr[d]);
    }
  }
}

/// decode<F> of all 256 codes: s * table[c] is dequantize_value<F>(c, s) bit for bit (decode is
/// exact and the one multiply is the same), without decode's branches in the loop.
template <Fp8Format F>
const std::array<float, 256>& decode_table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int c = 0; c < 256; ++c) t[static_cast<size_t>(c)] = decode<F>(static_cast<uint8_t>(c));
    return t;
  }();
  return table;
}

template <Fp8Format F>
void dequantize_t(const Fp8Spec& spec, const std::vector<float>& sc,
                  const std::vector<uint8_t>& codes, Tensor3& y) {
  const Shape3 s = y.shape;
  const Granularity g = effective_granularity(spec);
  check_scale_count(g, s, sc);
  KVQ_CHECK(codes.size() == y.data.size(), "fp8::dequantize: {} codes for a tensor of {} values",
            codes.size(), y.data.size());
  for (int64_t r = 0; r < s.tokens * s.heads; ++r) {
    const RowScales rs = row_scales(g, r, s);
    const uint8_t* cr = codes.data() + r * s.dim;
    float* yr = y.data.data() + r * s.dim;
    const float* sr = sc.data() + rs.base;
    const float* table = decode_table<F>().data();
    if (rs.step == 0) {
      for (int64_t d = 0; d < s.dim; ++d) yr[d] = sr[0] * table[cr[d]];
    } else {
      for (int64_t d = 0; d < s.dim; ++d) yr[d] = sr[d] * table[cr[d]];
    }
  }
}

}  // namespace

void quantize(const Fp8Spec& spec, const std::vector<float>& scales, const Tensor3& x,
              std::vector<uint8_t>& codes) {
  switch (spec.format) {
    case Fp8Format::E4M3:
      return quantize_t<Fp8Format::E4M3>(spec, scales, x, codes);
    case Fp8Format::E4M3FNUZ:
      return quantize_t<Fp8Format::E4M3FNUZ>(spec, scales, x, codes);
    case Fp8Format::E5M2:
      return quantize_t<Fp8Format::E5M2>(spec, scales, x, codes);
  }
}

void dequantize(const Fp8Spec& spec, const std::vector<float>& scales,
                const std::vector<uint8_t>& codes, Tensor3& y) {
  switch (spec.format) {
    case Fp8Format::E4M3:
      return dequantize_t<Fp8Format::E4M3>(spec, scales, codes, y);
    case Fp8Format::E4M3FNUZ:
      return dequantize_t<Fp8Format::E4M3FNUZ>(spec, scales, codes, y);
    case Fp8Format::E5M2:
      return dequantize_t<Fp8Format::E5M2>(spec, scales, codes, y);
  }
}

std::vector<float> prefill_scales(const Fp8Spec& spec, Role role, const Tensor3& x, int layer) {
  const bool head_only = spec.source == ScaleSource::Dynamic && spec.gran != Granularity::Token &&
                         x.shape.tokens > spec.first;
  if (!head_only) return compute_scales(spec, role, x, layer);
  Tensor3 head({spec.first, x.shape.heads, x.shape.dim});
  std::copy(x.data.begin(), x.data.begin() + static_cast<std::ptrdiff_t>(head.data.size()),
            head.data.begin());
  return compute_scales(spec, role, head, layer);
}

}  // namespace kvq::fp8
