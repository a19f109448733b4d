#include "evaluation/advisor.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/io.h"
#include "core/spec.h"
#include "evaluation/model_eval.h"
#include "evaluation/report.h"

namespace kvq::advisor {

std::vector<Quality> read_quality(const std::vector<std::string>& dirs) {
  KVQ_CHECK(!dirs.empty(), "give --results DIR: a `kvq run` output with model rows (kld, ppl)");
  std::vector<Quality> out;
  for (const std::string& d : dirs) {
    const std::string path = (std::filesystem::path(d) / "model.jsonl").string();
    KVQ_CHECK(std::filesystem::is_regular_file(path),
              "{}: no model rows (model.jsonl); run a config with a [model] table into it first "
              "(e.g. kvq run experiments/configs/default.toml)",
              d);
    for (const cli::JsonLine& l : cli::read_jsonl(path)) {
      const nlohmann::ordered_json& j = l.value;
      try {
        const nlohmann::ordered_json& st = j.at("settings");
        // Pre-RoPE keys are another cache than the scheme's name says: not a serving choice here.
        if (st.value("pre_rope", false)) continue;
        SchemeSpec spec = parse_spec(j.at("scheme").get<std::string>());
        // kvq run's hadamard = true rows keep the plain name; the rotation is part of the scheme.
        if (st.value("hadamard", false)) spec = with_rotation(spec, RotSpec{true});
        Quality q;
        q.scheme = spec.canonical();
        q.ctx = st.at("ctx").get<int64_t>();
        q.kld = j.at("kld").get<double>();
        q.delta_ppl = j.at("delta_ppl").get<double>();
        q.top1 = j.value("top1", 0.0);
        if (j.contains("quantized") && j["quantized"].is_number()) {
          q.quantized = j["quantized"].get<double>();
        } else if (!spec.layered()) {
          // An older row: the fraction from its settings (the windows kvq run scored; the text
          // is assumed to hold settings.max_tokens tokens; one layer stands for all, the spec
          // being the same in each). Without max_tokens it stays unknown.
          eval::PplOptions o;
          o.ctx = static_cast<int>(q.ctx);
          o.stride = st.value("stride", 0);
          o.score_from = st.value("score_from", 0);
          const int64_t n = st.value("max_tokens", int64_t{0});
          if (o.ctx >= 2 && n >= o.ctx) q.quantized = eval::quantized_fraction(spec, o, n, 1);
        }
        q.source = path;
        q.line = l.line;
        out.push_back(q);
      } catch (const nlohmann::json::exception& e) {
        fail("{}:{}: not a kvq run model row ({})", path, l.line, e.what());
      } catch (const Error& e) {
        fail("{}:{}: {}", path, l.line, e.what());
      }
    }
  }
  KVQ_CHECK(!out.empty(), "no model rows in {}", fmt::join(dirs, ", "));
  return out;
}

namespace {

// The row of `scheme` measured at the context nearest `ctx` (log distance); of several there, the
// one with the highest KLD (the conservative reading).
std::optional<Quality> nearest(const std::vector<Quality>& rows, const std::string& scheme,
                               int64_t ctx) {
  std::optional<Quality> best;
  double dist = 0;
  for (const Quality& q : rows) {
    if (q.scheme != scheme) continue;
    const double d = std::fabs(std::log(static_cast<double>(q.ctx) / static_cast<double>(ctx)));
    if (!best || d < dist - 1e-12 || (std::fabs(d - dist) <= 1e-12 && q.kld > best->kld)) {
      best = q;
      dist = d;
    }
  }
  return best;
}

}  // namespace

Advice advise(planner::PlanInput in, const std::vector<Quality>& rows, const Budget& b,
              double min_gain) {
  KVQ_CHECK(b.max_kld || b.max_dppl,
            "give a quality budget: --max-kld (nats per token against the fp32 cache) and/or "
            "--max-dppl (perplexity increase)");
  const std::string bf16 = parse_spec("bf16").canonical();
  Advice a;
  // Rows that quantized too little of what their positions read measure the exact window, not the
  // scheme: left out, each with its reason (an all-fp32 row quantizes nothing by design).
  std::vector<Quality> kept;
  for (const Quality& q : rows) {
    if (q.quantized && *q.quantized < eval::kMinQuantizedFraction &&
        !eval::exact_by_design(parse_spec(q.scheme))) {
      a.skipped.push_back(fmt::format("{}:{}: {}", q.source, q.line,
                                      eval::little_quantized(q.scheme, q.ctx, *q.quantized)));
      continue;
    }
    kept.push_back(q);
  }
  std::vector<std::string> schemes{bf16};
  // Per-layer specs (SPEC@L=SPEC) are a study of one model's layers, not a serving choice for
  // another model: left out.
  for (const Quality& q : kept)
    if (std::find(schemes.begin(), schemes.end(), q.scheme) == schemes.end() &&
        !parse_spec(q.scheme).layered())
      schemes.push_back(q.scheme);
  in.kv = schemes;
  a.plan = planner::make_plan(in);
  for (size_t i = 0; i < schemes.size(); ++i) {
    Candidate c;
    c.scheme = schemes[i];
    c.plan = a.plan.rows[i];
    c.quality = nearest(kept, c.scheme, in.decode_ctx);
    if (c.scheme == bf16) {
      c.eligible = true;  // the baseline: what a serving engine stores without quantization
      c.why = "-";
    } else if (b.max_kld && c.quality->kld > *b.max_kld) {
      c.why = fmt::format("KLD {:.3g} > {:.3g}", c.quality->kld, *b.max_kld);
    } else if (b.max_dppl && c.quality->delta_ppl > *b.max_dppl) {
      c.why = fmt::format("dppl {:.3g} > {:.3g}", c.quality->delta_ppl, *b.max_dppl);
    } else {
      c.eligible = true;
      c.why = "-";
    }
    a.table.push_back(std::move(c));
  }
  std::stable_sort(a.table.begin() + 1, a.table.end(), [](const Candidate& x, const Candidate& y) {
    return x.plan.tokens_per_s > y.plan.tokens_per_s;
  });
  const Candidate& base = a.table[0];
  const Candidate* best = nullptr;
  for (const Candidate& c : a.table) {
    if (!c.eligible || c.scheme == bf16) continue;
    if (!best || c.plan.tokens_per_s > best->plan.tokens_per_s * (1 + 1e-12) ||
        (c.plan.tokens_per_s >= best->plan.tokens_per_s * (1 - 1e-12) && c.quality &&
         best->quality && c.quality->kld < best->quality->kld))
      best = &c;
  }
  const bool bf16_fits = base.plan.decode_batch >= in.batch;
  a.reasons.push_back(
      bf16_fits
          ? fmt::format("bf16 holds the whole batch: {} request{} of {} tokens fit{} in {:.1f} GB",
                        in.batch, in.batch == 1 ? "" : "s", in.decode_ctx, in.batch == 1 ? "s" : "",
                        a.plan.mem_bytes / 1e9)
          : fmt::format("bf16 holds only {} of the {} requests of {} tokens in {:.1f} GB",
                        base.plan.decode_batch, in.batch, in.decode_ctx, a.plan.mem_bytes / 1e9));
  if (!best) {
    a.choice = bf16;
    a.reasons.push_back("no measured quantized scheme meets the quality budget: do not quantize" +
                        std::string(bf16_fits ? ""
                                              : " (or relax the budget: bf16 serves a smaller "
                                                "batch)"));
    return a;
  }
  const double gain = best->plan.tokens_per_s / base.plan.tokens_per_s;
  const std::string measured =
      best->quality
          ? fmt::format("KLD {:.3g}, dppl {:+.3g} measured at ctx {} ({})", best->quality->kld,
                        best->quality->delta_ppl, best->quality->ctx, best->quality->source)
          : std::string();
  if (bf16_fits && gain < min_gain) {
    a.choice = bf16;
    a.reasons.push_back(fmt::format(
        "the fastest scheme within the budget, {}, would decode {:.2f}x bf16's tokens/s, below "
        "the {:.2f}x worth its error: the step is bound by the weights (short contexts or small "
        "batches); do not quantize",
        best->scheme, gain, min_gain));
    return a;
  }
  a.choice = best->scheme;
  a.quantize = true;
  const bool fits = best->plan.decode_batch >= in.batch;
  a.reasons.push_back(
      fmt::format("{}: {:.2f}x bf16's decode tokens/s, step {:.2f} ms with {}; {}", best->scheme,
                  gain, best->plan.step_seconds * 1e3,
                  fits ? fmt::format("the whole batch of {} in memory", in.batch)
                       : fmt::format("{} of the {} requests in memory (the rest wait)",
                                     best->plan.decode_batch, in.batch),
                  measured));
  if (best->quality &&
      (best->quality->ctx > 2 * in.decode_ctx || 2 * best->quality->ctx < in.decode_ctx))
    a.reasons.push_back(fmt::format(
        "caution: its quality was measured at {} tokens, the workload runs {}; damage grows with "
        "context (docs/results.md, \"Quality against context length\"): measure at the workload's "
        "length (kvq run with [model] ctx = {}) before trusting the budget",
        best->quality->ctx, in.decode_ctx, in.decode_ctx));
  return a;
}

std::string format_advice(const Advice& a, const Budget& b) {
  const planner::PlanInput& in = a.plan.in;
  std::string s = fmt::format(
      "workload   {}: {} layers, {} kv heads, head dim {}; batch {} x {} tokens; {} at {:.2f} "
      "TB/s\n"
      "memory     {:.1f} GB for the KV cache ({}); weights {:.1f} GB read per step\n"
      "budget     {}{}\n\n",
      in.model.name, in.model.layers, in.model.kv_heads, in.model.head_dim, in.batch, in.decode_ctx,
      in.gpu.name, in.gpu.bandwidth / 1e12, a.plan.mem_bytes / 1e9, a.plan.mem_source,
      a.plan.weight_bytes / 1e9,
      b.max_kld ? fmt::format("KLD <= {:.3g} nats/token", *b.max_kld) : std::string(),
      b.max_dppl
          ? fmt::format("{}perplexity increase <= {:.3g}", b.max_kld ? ", " : "", *b.max_dppl)
          : std::string());
  s += fmt::format("{:<40} {:>9} {:>6} {:>9} {:>8} {:>7} {:>9} {:>8}  {}\n", "scheme", "KLD", "ctx",
                   "dppl", "KiB/tok", "batch", "tokens/s", "vs bf16", "eligible");
  for (const Candidate& c : a.table) {
    const std::string kld = c.quality ? fmt::format("{:.3g}", c.quality->kld) : "-";
    const std::string ctx = c.quality ? std::to_string(c.quality->ctx) : "-";
    const std::string dppl = c.quality ? fmt::format("{:+.3g}", c.quality->delta_ppl) : "-";
    s +=
        fmt::format("{:<40} {:>9} {:>6} {:>9} {:>8.1f} {:>7} {:>9.0f} {:>7.2f}x  {}{}\n",
                    c.scheme.size() > 40 ? c.scheme.substr(0, 37) + "..." : c.scheme, kld, ctx,
                    dppl, c.plan.bytes_per_token / 1024.0, c.plan.decode_batch, c.plan.tokens_per_s,
                    c.plan.speedup, c.eligible ? "yes" : "no: ", c.eligible ? "" : c.why);
  }
  if (!a.skipped.empty()) {
    s += fmt::format("\nskipped    {} row{} (under {:.0f}% of the attended K/V quantized):\n",
                     a.skipped.size(), a.skipped.size() == 1 ? "" : "s",
                     100.0 * eval::kMinQuantizedFraction);
    for (const std::string& k : a.skipped) s += "  - " + k + "\n";
  }
  s += fmt::format("\nanswer     {}\n", a.quantize ? a.choice : "do not quantize (bf16)");
  for (const std::string& r : a.reasons) s += "  - " + r + "\n";
  s += "\nQuality is what the results directories measured (on their model and text: KLD and "
       "perplexity\nagainst the fp32 cache); capacity and speed are the planner's bound for the "
       "model above.\n";
  return s;
}

}  // namespace kvq::advisor
