// [synthetic]: every scheme on synthetic K/V (evaluation/synthetic.h): reconstruction SNR, NMSE
// and max error per side, attention KL, output NMSE and top-32 overlap over random queries, each
// against the fp32 cache. Rows: the schemes in config order.
#include "evaluation/synthetic.h"

#include <fmt/format.h>

#include <cmath>
#include <random>

#include "cache/round_trip.h"
#include "cache/side.h"
#include "evaluation/model_eval.h"
#include "evaluation/report.h"
#include "experiments/commands.h"
#include "experiments/run_task.h"
#include "reference_cpu/attention.h"
#include "reference_cpu/metrics.h"

namespace kvq::cli::run {
namespace {

struct SyntheticPlan final : TaskPlan {
  SyntheticSpec ks;
  int64_t gqa = 4, queries = 4;
  json settings;

  std::vector<json> case_settings() const override { return {settings}; }
  void list() const override { list_rows("synthetic", specs); }
  void run(const std::filesystem::path& out, const Shard& shard, ModelSource&) const override;
  std::vector<std::string> plots() const override { return {"plot_results.py"}; }
};

SyntheticPlan read_table(const toml::table& syn, const Where& w) {
  check_keys(
      syn, w,
      {"tokens", "heads", "head_dim", "outliers", "outlier_scale", "gqa", "queries", "seed"});
  SyntheticPlan p;
  p.ks.shape = {get_or<int64_t>(syn, w, "tokens", 2048), get_or<int64_t>(syn, w, "heads", 8),
                get_or<int64_t>(syn, w, "head_dim", 128)};
  const int64_t outliers = get_or<int64_t>(syn, w, "outliers", 2);
  p.ks.outlier_scale = static_cast<float>(get_or<double>(syn, w, "outlier_scale", 12.0));
  const int64_t seed = get_or<int64_t>(syn, w, "seed", 0);
  p.gqa = get_or<int64_t>(syn, w, "gqa", 4);
  p.queries = get_or<int64_t>(syn, w, "queries", 4);
  for (const auto& [k, v] :
       std::initializer_list<std::pair<const char*, int64_t>>{{"tokens", p.ks.shape.tokens},
                                                              {"heads", p.ks.shape.heads},
                                                              {"head_dim", p.ks.shape.dim},
                                                              {"gqa", p.gqa},
                                                              {"queries", p.queries}})
    KVQ_CHECK(v >= 1 && v <= (int64_t{1} << 24), "{}: {} must be between 1 and 16777216, got {}",
              w.file, w.key(k), v);
  KVQ_CHECK(outliers >= 0 && outliers <= p.ks.shape.dim,
            "{}: {} must be between 0 and head_dim {}, got {}", w.file, w.key("outliers"),
            p.ks.shape.dim, outliers);
  KVQ_CHECK(seed >= 0, "{}: {} must be >= 0, got {}", w.file, w.key("seed"), seed);
  KVQ_CHECK(std::isfinite(p.ks.outlier_scale) && p.ks.outlier_scale > 0,
            "{}: {} must be a positive number", w.file, w.key("outlier_scale"));
  KVQ_CHECK(
      p.ks.shape.tokens * p.ks.shape.heads * p.ks.shape.dim <= (int64_t{1} << 28),
      "{}: [synthetic] tokens x heads x head_dim = {} values; at most 2^28 (1 GiB of float32)",
      w.file, p.ks.shape.tokens * p.ks.shape.heads * p.ks.shape.dim);
  p.ks.outlier_channels = static_cast<int>(outliers);
  p.ks.seed = static_cast<uint64_t>(seed);
  p.settings = {{"tokens", p.ks.shape.tokens},
                {"heads", p.ks.shape.heads},
                {"head_dim", p.ks.shape.dim},
                {"outliers", p.ks.outlier_channels},
                {"outlier_scale", p.ks.outlier_scale},
                {"seed", p.ks.seed},
                {"gqa", p.gqa},
                {"queries", p.queries}};
  return p;
}

// --smoke: at most 256 tokens.
void shrink(SyntheticPlan& p) {
  p.ks.shape.tokens = std::min<int64_t>(p.ks.shape.tokens, 256);
  p.settings["tokens"] = p.ks.shape.tokens;
  p.settings["smoke"] = true;
}

// The model rows' rule (eval::quantized_tokens_of) on one tensor quantized at once: a scheme that
// quantizes nothing of the tokens is named.
void warn_unquantized(const SyntheticPlan& p) {
  for (const SchemeSpec& s : p.specs) {
    const auto nothing = [&](Role r) {
      return eval::quantized_tokens_of(s, r, p.ks.shape.tokens, 0, false) == 0;
    };
    if (!eval::exact_by_design(s) && nothing(Role::Key) && nothing(Role::Value))
      fmt::print(stderr,
                 "kvq run: warning: {} quantizes nothing of [synthetic] tokens = {} (all "
                 "within its window or sinks, or short of a key group); its rows will read "
                 "exact values\n",
                 s.canonical(), p.ks.shape.tokens);
  }
}

std::unique_ptr<TaskPlan> plan(const toml::table& t, const TaskContext& c) {
  auto p = std::make_unique<SyntheticPlan>(read_table(t, Where{c.config, "synthetic"}));
  p->specs =
      fitting(c.rows(t, "synthetic"), "synthetic", p->ks.shape.heads, p->ks.shape.dim, *c.errors);
  if (c.smoke) shrink(*p);
  warn_unquantized(*p);
  return p;
}

void SyntheticPlan::run(const std::filesystem::path& out, const Shard& shard, ModelSource&) const {
  const SyntheticPlan& p = *this;
  const SyntheticSpec& ks = p.ks;
  const std::vector<SchemeSpec>& specs = p.specs;
  const int64_t gqa = p.gqa, nqueries = p.queries;
  SyntheticSpec vs = ks;
  vs.outlier_channels = 0;
  vs.seed = ks.seed + 1;
  const Tensor3 k = synthetic_kv(ks), v = synthetic_kv(vs);
  std::mt19937_64 rng(ks.seed + 2);
  std::normal_distribution<float> nd;
  std::vector<std::vector<float>> qs(
      static_cast<size_t>(nqueries),
      std::vector<float>(static_cast<size_t>(ks.shape.heads * gqa * ks.shape.dim)));
  for (auto& q : qs)
    for (float& x : q) x = nd(rng);
  const json& settings = p.settings;
  ResultTable table(out, "synthetic");
  const SchemeSpec f32 = parse_spec("fp32");
  const auto kr = make_side(f32, Role::Key, k), vr = make_side(f32, Role::Value, v);
  int i = 0;
  for (const auto& spec : specs) {
    ++i;
    if (!shard.take(static_cast<size_t>(i - 1))) continue;
    check_stop();
    const std::string key = spec.canonical();
    if (table.find(key, settings)) {
      fmt::print(stderr, "[synthetic {}/{}] {}: done already\n", i, specs.size(), key);
      continue;
    }
    const auto rk = round_trip(spec, Role::Key, k), rv = round_trip(spec, Role::Value, v);
    const auto mk = recon_metrics(k.data, rk.values.data),
               mv = recon_metrics(v.data, rv.values.data);
    const auto ksd = make_side(spec, Role::Key, k), vsd = make_side(spec, Role::Value, v);
    AttentionMetrics am;
    for (const auto& q : qs) {
      const auto m = attention_metrics(q.data(), ks.shape.heads * gqa, *kr, *vr, *ksd, *vsd, 32);
      am.kl += m.kl / static_cast<double>(nqueries);
      am.output_nmse += m.output_nmse / static_cast<double>(nqueries);
      am.topk_overlap += m.topk_overlap / static_cast<double>(nqueries);
    }
    auto snr = [](double s) { return std::isfinite(s) ? json(s) : json(nullptr); };
    json row = {
        {"key", key},
        {"scheme", key},
        {"settings", settings},
        {"key_bits", rk.footprint.effective_bits()},
        {"value_bits", rv.footprint.effective_bits()},
        {"key_bytes_per_token", rk.footprint.total_bytes() / static_cast<double>(ks.shape.tokens)},
        {"value_bytes_per_token",
         rv.footprint.total_bytes() / static_cast<double>(ks.shape.tokens)},
        {"key_snr_db", snr(mk.snr_db)},
        {"value_snr_db", snr(mv.snr_db)},
        {"key_nmse", mk.nmse},
        {"value_nmse", mv.nmse},
        {"key_max_abs_err", mk.max_abs_err},
        {"value_max_abs_err", mv.max_abs_err},
        {"attn_kl", am.kl},
        {"attn_output_nmse", am.output_nmse},
        {"attn_top32_overlap", am.topk_overlap},
        {"key_scales_from", scales_from(spec, Role::Key, ks.shape.tokens)},
        {"value_scales_from", scales_from(spec, Role::Value, ks.shape.tokens)}};
    const bool kp = scales_from_prefix(spec, Role::Key, ks.shape.tokens),
               vp = scales_from_prefix(spec, Role::Value, ks.shape.tokens);
    fmt::print(
        stderr,
        "[synthetic {}/{}] {}: key SNR {:.2f} dB, value SNR {:.2f} dB, attention KL {:.3g}{}\n", i,
        specs.size(), key, mk.snr_db, mv.snr_db, am.kl,
        kp || vp ? fmt::format(" (scales from {})",
                               row[kp ? "key_scales_from" : "value_scales_from"].get<std::string>())
                 : "");
    table.add(std::move(row));
  }
}

}  // namespace

Task synthetic_task() {
  return {"synthetic", &plan,
          "every scheme on synthetic K/V: reconstruction SNR, attention KL, top-32 overlap"};
}

}  // namespace kvq::cli::run
