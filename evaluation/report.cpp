#include "evaluation/report.h"

#include <fmt/format.h>

#include <cmath>
#include <sstream>

#include "core/error.h"
#include "core/io.h"
#include "core/schemes.h"
#include "reference_cpu/metrics.h"

namespace kvq::cli {

nlohmann::json error_report(const SchemeSpec& spec, Role role, const Tensor3& x,
                            const RoundTrip& r) {
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

// Each family's rule (core/schemes.h's scale_origin).
bool scales_from_prefix(const SchemeSpec& spec, Role role, int64_t tokens) {
  const SchemeSpec& side = spec.side(role);
  return scheme_traits(side).scale_origin(side, role, tokens).prefix;
}

std::string scales_from(const SchemeSpec& spec, Role role, int64_t tokens) {
  const SchemeSpec& side = spec.side(role);
  return scheme_traits(side).scale_origin(side, role, tokens).text;
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
