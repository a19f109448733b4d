#include "evaluation/report.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <sstream>

#include "core/error.h"
#include "core/io.h"
#include "reference_cpu/metrics.h"

namespace kvq::cli {

nlohmann::json error_report(const SchemeSpec& spec, Role role, const Tensor3& x, const RoundTrip& r) {
  const ReconMetrics m = recon_metrics(x.data, r.values.data);
  nlohmann::json j;
  j["scheme"] = spec.canonical();
  j["role"] = std::string(to_string(role));
  j["shape"] = {x.shape.tokens, x.shape.heads, x.shape.dim};
  j["effective_bits"] = r.footprint.effective_bits();
  j["overall_bits"] = r.footprint.overall_bits();
  j["residual_tokens"] = r.footprint.residual_elements / (x.shape.heads * x.shape.dim);
  j["mse"] = m.mse;
  j["nmse"] = m.nmse;
  j["snr_db"] = std::isfinite(m.snr_db) ? nlohmann::json(m.snr_db) : nlohmann::json(nullptr);
  j["max_abs_err"] = m.max_abs_err;
  j["cosine"] = m.cosine;
  j["scales_from"] = scales_from(spec, role, x.shape.tokens);
  return j;
}

namespace {
// The tokens a dynamic FP8 tensor/head/channel scale reads: [sink, sink + n).
int64_t prefix_tokens(const SchemeSpec& side, int64_t tokens) {
  return std::clamp<int64_t>(std::min<int64_t>(side.fp8().first, tokens - side.sink), 0, tokens);
}
bool dynamic_prefix_rule(const SchemeSpec& side) {
  return side.kind() == SchemeKind::Fp8 && side.fp8().source == ScaleSource::Dynamic &&
         side.fp8().gran != Granularity::Token;
}
}  // namespace

bool scales_from_prefix(const SchemeSpec& spec, Role role, int64_t tokens) {
  const SchemeSpec& side = spec.side(role);
  return dynamic_prefix_rule(side) && prefix_tokens(side, tokens) < tokens - side.sink;
}

std::string scales_from(const SchemeSpec& spec, Role role, int64_t tokens) {
  const SchemeSpec& side = spec.side(role);
  switch (side.kind()) {
    case SchemeKind::Fp32:
    case SchemeKind::Bf16:
    case SchemeKind::Fp16:
      return "-";
    case SchemeKind::Fp8: {
      const Fp8Spec& f = side.fp8();
      if (f.source == ScaleSource::Constant) return fmt::format("fixed {:g}", f.constant);
      if (f.source == ScaleSource::Calib)
        return "calib " + std::filesystem::path(f.calib_path).filename().string();
      if (f.gran == Granularity::Token) return "each token";
      const int64_t n = prefix_tokens(side, tokens);
      if (n <= 0) return fmt::format("none of {} (all exact)", tokens);
      if (side.sink == 0 && n == tokens) return fmt::format("all {} tokens", tokens);
      return fmt::format("tokens {}-{} of {}", side.sink, side.sink + n - 1, tokens);
    }
    case SchemeKind::Int:
      if (side.q().axis(role) == Axis::Token) return "each token";
      return side.q().group == kGroupWholeDim ? std::string("each head_dim tokens")
                                              : fmt::format("each {} tokens", side.q().group);
  }
  return "-";
}

std::vector<JsonLine> read_jsonl(const std::string& path, std::string_view hint) {
  std::istringstream in(read_file(path));
  std::vector<JsonLine> out;
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (line.empty()) continue;
    try {
      out.push_back({n, nlohmann::ordered_json::parse(line)});
    } catch (const nlohmann::json::exception&) {
      fail("{}:{}: not a JSON line{}", path, n, hint);
    }
  }
  return out;
}

}  // namespace kvq::cli
