#include "fp8/scale.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/io.h"

namespace kvq::fp8 {

int64_t scale_count(Granularity g, Shape3 s) {
  switch (g) {
    case Granularity::Tensor: return 1;
    case Granularity::Head: return s.heads;
    case Granularity::Token: return s.tokens * s.heads;
    case Granularity::Channel: return s.heads * s.dim;
  }
  return 1;
}

Calibration read_calibration(const std::string& path) {
  const std::string text = read_file(path);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    fail("{}: not valid JSON ({})", path, e.what());
  }
  if (!j.is_object() || !j.contains("kvq_calibration"))
    fail("{}: not a kvq calibration file (no \"kvq_calibration\" key; `kvq model calibrate` writes one)", path);
  if (j["kvq_calibration"] != 1)
    fail("{}: unsupported calibration version {} (expected 1)", path, j["kvq_calibration"].dump());
  if (!j.contains("layers") || !j["layers"].is_array() || j["layers"].empty())
    fail("{}: \"layers\" must be a non-empty array", path);
  Calibration c;
  c.model = j.value("model", "");
  c.source = j.value("source", "");
  size_t heads = 0;
  for (size_t l = 0; l < j["layers"].size(); ++l) {
    const auto& L = j["layers"][l];
    for (const char* key : {"k_amax", "v_amax"}) {
      if (!L.is_object() || !L.contains(key) || !L[key].is_array() || L[key].empty())
        fail("{}: layers[{}].{} must be a non-empty array of numbers", path, l, key);
      std::vector<float> v;
      for (size_t h = 0; h < L[key].size(); ++h) {
        const auto& x = L[key][h];
        if (!x.is_number() || !std::isfinite(x.get<double>()) || x.get<double>() <= 0)
          fail("{}: layers[{}].{}[{}] = {} is not a positive finite number", path, l, key, h, x.dump());
        v.push_back(x.get<float>());
      }
      if (heads == 0) heads = v.size();
      if (v.size() != heads)
        fail("{}: layers[{}].{} has {} heads, earlier layers have {}", path, l, key, v.size(), heads);
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
    const auto& amax = table[static_cast<size_t>(layer)];
    if (static_cast<int64_t>(amax.size()) != s.heads)
      fail("{}: layer {} has {} heads but the tensor has {}", spec.calib_path, layer, amax.size(), s.heads);
    if (spec.gran == Granularity::Tensor)
      return {scale_from_amax(*std::max_element(amax.begin(), amax.end()), spec.format)};
    std::vector<float> out;
    for (float a : amax) out.push_back(scale_from_amax(a, spec.format));
    return out;
  }
  std::vector<float> amax(static_cast<size_t>(scale_count(spec.gran, s)), 0.0f);
  for (int64_t t = 0; t < s.tokens; ++t)
    for (int64_t h = 0; h < s.heads; ++h)
      for (int64_t d = 0; d < s.dim; ++d) {
        float& a = amax[static_cast<size_t>(scale_index(spec.gran, t, h, d, s.heads, s.dim))];
        const float v = std::fabs(x.at(t, h, d));
        if (!(v <= a)) a = v;  // NaN propagates into the scale: visible, never silently finite
      }
  for (float& a : amax) a = scale_from_amax(a, spec.format);
  return amax;
}

namespace {

template <Fp8Format F>
void quantize_t(const Fp8Spec& spec, const std::vector<float>& sc, const Tensor3& x,
                std::vector<uint8_t>& codes) {
  const Shape3 s = x.shape;
  const Granularity g = spec.source == ScaleSource::Constant ? Granularity::Tensor : spec.gran;
  codes.resize(x.data.size());
  size_t i = 0;
  for (int64_t t = 0; t < s.tokens; ++t)
    for (int64_t h = 0; h < s.heads; ++h)
      for (int64_t d = 0; d < s.dim; ++d, ++i)
        codes[i] = quantize_value<F>(x.data[i], sc[static_cast<size_t>(scale_index(g, t, h, d, s.heads, s.dim))]);
}

template <Fp8Format F>
void dequantize_t(const Fp8Spec& spec, const std::vector<float>& sc, const std::vector<uint8_t>& codes,
                  Tensor3& y) {
  const Shape3 s = y.shape;
  const Granularity g = spec.source == ScaleSource::Constant ? Granularity::Tensor : spec.gran;
  size_t i = 0;
  for (int64_t t = 0; t < s.tokens; ++t)
    for (int64_t h = 0; h < s.heads; ++h)
      for (int64_t d = 0; d < s.dim; ++d, ++i)
        y.data[i] = dequantize_value<F>(codes[i], sc[static_cast<size_t>(scale_index(g, t, h, d, s.heads, s.dim))]);
}

}  // namespace

void quantize(const Fp8Spec& spec, const std::vector<float>& scales, const Tensor3& x,
              std::vector<uint8_t>& codes) {
  switch (spec.format) {
    case Fp8Format::E4M3: return quantize_t<Fp8Format::E4M3>(spec, scales, x, codes);
    case Fp8Format::E4M3FNUZ: return quantize_t<Fp8Format::E4M3FNUZ>(spec, scales, x, codes);
    case Fp8Format::E5M2: return quantize_t<Fp8Format::E5M2>(spec, scales, x, codes);
  }
}

void dequantize(const Fp8Spec& spec, const std::vector<float>& scales,
                const std::vector<uint8_t>& codes, Tensor3& y) {
  switch (spec.format) {
    case Fp8Format::E4M3: return dequantize_t<Fp8Format::E4M3>(spec, scales, codes, y);
    case Fp8Format::E4M3FNUZ: return dequantize_t<Fp8Format::E4M3FNUZ>(spec, scales, codes, y);
    case Fp8Format::E5M2: return dequantize_t<Fp8Format::E5M2>(spec, scales, codes, y);
  }
}

}  // namespace kvq::fp8
