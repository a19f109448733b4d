#include "evaluation/planner.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>

#include "core/error.h"

namespace kvq::planner {
namespace {

// Largest element count a double counts exactly (2^53): beyond it byte totals would round.
constexpr double kMaxElements = 9007199254740992.0;

template <typename T>
std::string name_list(const std::vector<T>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x.name;
  return s;
}

// "8.03", "55", "85.9": up to 4 significant digits, no trailing zeros.
std::string short_num(double v) { return fmt::format("{:.4g}", v); }

// KV read and step times: one decimal as the design note prints them (16.8 GB, 9.8 ms), three
// significant digits below 1 so small models do not print 0.0.
std::string amount(double v) {
  return v >= 1.0 ? fmt::format("{:.1f}", v) : fmt::format("{:.3g}", v);
}

void check_positive(int64_t v, std::string_view flag) {
  KVQ_CHECK(v > 0, "{} {} must be a positive integer", flag, v);
}

// Left-aligned first column, right-aligned others, two spaces between columns.
std::string render_table(const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> w(rows.front().size(), 0);
  for (const auto& r : rows)
    for (size_t i = 0; i < r.size(); ++i) w[i] = std::max(w[i], r[i].size());
  std::string out;
  for (const auto& r : rows) {
    std::string line;
    for (size_t i = 0; i < r.size(); ++i) {
      if (i) line += "  ";
      line += i == 0 ? fmt::format("{:<{}}", r[i], w[i]) : fmt::format("{:>{}}", r[i], w[i]);
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
  }
  return out;
}

}  // namespace

const std::vector<ModelDims>& model_presets() {
  static const std::vector<ModelDims> presets = {
      {"llama-3.1-8b", 32, 8, 128, 8.03e9}, {"llama-3.1-70b", 80, 8, 128, 70.6e9},
      {"llama-2-7b", 32, 32, 128, 6.74e9},  {"mistral-7b", 32, 8, 128, 7.24e9},
      {"qwen2.5-7b", 28, 4, 128, 7.62e9},   {"smollm2-135m", 30, 3, 64, 0.135e9},
  };
  return presets;
}

const std::vector<Gpu>& gpu_presets() {
  static const std::vector<Gpu> presets = {
      {"h100-sxm", 80e9, 3.35e12},
      {"h200", 141e9, 4.8e12},
      {"a100-80gb", 80e9, 2.0e12},
      {"l4", 24e9, 0.3e12},
  };
  return presets;
}

const ModelDims& model_preset(std::string_view name) {
  for (const auto& m : model_presets())
    if (m.name == name) return m;
  fail("unknown model preset '{}' (allowed: {})", name, name_list(model_presets()));
}

const Gpu& gpu_preset(std::string_view name) {
  for (const auto& g : gpu_presets())
    if (g.name == name) return g;
  fail("unknown gpu preset '{}' (allowed: {})", name, name_list(gpu_presets()));
}

ModelDims resolve_model(const ModelArgs& a, bool have_weight_bytes) {
  const bool any_custom = a.layers || a.kv_heads || a.head_dim || a.params_billions;
  if (a.preset) {
    KVQ_CHECK(!any_custom,
              "--model {} cannot be combined with --layers/--kv-heads/--head-dim/--params "
              "(give a preset or a custom model)",
              *a.preset);
    return model_preset(*a.preset);
  }
  if (!any_custom) return model_preset("llama-3.1-8b");
  std::string missing;
  auto need = [&](bool have, const char* flag) {
    if (!have) missing += (missing.empty() ? "" : ", ") + std::string(flag);
  };
  need(a.layers.has_value(), "--layers");
  need(a.kv_heads.has_value(), "--kv-heads");
  need(a.head_dim.has_value(), "--head-dim");
  need(a.params_billions || have_weight_bytes, "--params (or --weights-bytes)");
  KVQ_CHECK(missing.empty(),
            "incomplete custom model: missing {} (give --layers, --kv-heads, --head-dim and "
            "--params, or --model PRESET)",
            missing);
  ModelDims m{"custom", *a.layers, *a.kv_heads, *a.head_dim, 0.0};
  check_positive(m.layers, "--layers");
  check_positive(m.kv_heads, "--kv-heads");
  check_positive(m.head_dim, "--head-dim");
  if (a.params_billions) {
    const double p = *a.params_billions;
    KVQ_CHECK(std::isfinite(p) && p > 0, "--params {} must be a positive number of billions", p);
    m.params = p * 1e9;
  }
  return m;
}

Gpu resolve_gpu(const std::optional<std::string>& preset, const std::optional<double>& tb_per_s) {
  KVQ_CHECK(!(preset && tb_per_s), "give --gpu or --bandwidth, not both (--gpu {}, --bandwidth {})",
            preset.value_or(""), tb_per_s.value_or(0.0));
  if (tb_per_s) {
    KVQ_CHECK(std::isfinite(*tb_per_s) && *tb_per_s > 0, "--bandwidth {} must be a positive TB/s",
              *tb_per_s);
    return Gpu{"custom", 0.0, *tb_per_s * 1e12};
  }
  return gpu_preset(preset.value_or("h100-sxm"));
}

SchemeSpec parse_kv(std::string_view text) {
  try {
    return parse_spec(text);  // fp8 and bare int<B> are spec aliases everywhere
  } catch (const Error& e) {
    fail("--kv: {}", e.what());
  }
}

double parse_gb(std::string_view text, std::string_view flag, bool allow_zero) {
  std::string t(text);
  t.erase(std::remove_if(t.begin(), t.end(), [](unsigned char c) { return std::isspace(c); }),
          t.end());
  size_t unit_at = t.size();
  while (unit_at > 0 && std::isalpha(static_cast<unsigned char>(t[unit_at - 1]))) --unit_at;
  std::string unit = t.substr(unit_at);
  std::transform(unit.begin(), unit.end(), unit.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  const std::string num = t.substr(0, unit_at);
  double mult = 0;
  if (unit.empty() || unit == "gb" || unit == "g")
    mult = 1e9;
  else if (unit == "gib")
    mult = 1073741824.0;
  else if (unit == "tb")
    mult = 1e12;
  else if (unit == "mb")
    mult = 1e6;
  else if (unit == "b")
    mult = 1;
  char* end = nullptr;
  const double v = num.empty() ? NAN : std::strtod(num.c_str(), &end);
  KVQ_CHECK(mult > 0 && !num.empty() && end == num.c_str() + num.size() && std::isfinite(v),
            "{} '{}' is not a size (a number of GB: 55, 55GB, 80GiB, 500MB)", flag, text);
  KVQ_CHECK(allow_zero ? v >= 0 : v > 0, "{} '{}' must be {}", flag, text,
            allow_zero ? "zero or more" : "more than zero");
  return v * mult;
}

std::optional<double> RequestFootprint::effective_bits() const {
  const int64_t n = key.quantized_elements + value.quantized_elements;
  if (n == 0) return std::nullopt;
  const double bytes = key.code_bytes + key.scale_bytes + key.zero_bytes + value.code_bytes +
                       value.scale_bytes + value.zero_bytes;
  return 8.0 * bytes / static_cast<double>(n);
}

RequestFootprint request_footprint(const ModelDims& m, const SchemeSpec& spec, int64_t tokens) {
  check_positive(tokens, "tokens");
  const double elements = 2.0 * static_cast<double>(m.layers) * static_cast<double>(tokens) *
                          static_cast<double>(m.kv_heads) * static_cast<double>(m.head_dim);
  KVQ_CHECK(elements <= kMaxElements,
            "a request of {} tokens x {} layers x {} kv heads x {} head dim is too large to plan",
            tokens, m.layers, m.kv_heads, m.head_dim);
  const SchemeSpec whole = resolve_layers(spec, m.layers, m.name);
  const Shape3 shape{tokens, m.kv_heads, m.head_dim};
  RequestFootprint r;
  for (int l = 0; l < m.layers; ++l) {
    const SchemeSpec one = whole.for_layer(l);
    r.key += footprint(one, Role::Key, shape);
    r.value += footprint(one, Role::Value, shape);
  }
  return r;
}

double weight_bytes_per_param(std::string_view dtype) {
  if (dtype == "bf16" || dtype == "fp16") return 2.0;
  if (dtype == "fp8") return 1.0;
  if (dtype == "int4") return 0.5 + 2.0 / 128;  // 4-bit codes and a bf16 scale per 128 (AWQ/GPTQ)
  fail("--weights-dtype '{}' (allowed: bf16, fp16, fp8, int4)", dtype);
}

Plan make_plan(const PlanInput& in) {
  check_positive(in.model.layers, "--layers");
  check_positive(in.model.kv_heads, "--kv-heads");
  check_positive(in.model.head_dim, "--head-dim");
  check_positive(in.ctx, "--ctx");
  check_positive(in.batch, "--batch");
  check_positive(in.decode_ctx, "--decode-ctx");
  KVQ_CHECK(std::isfinite(in.gpu.bandwidth) && in.gpu.bandwidth > 0,
            "bandwidth {} bytes/s must be positive", in.gpu.bandwidth);
  KVQ_CHECK(!in.kv.empty(), "--kv needs at least one KV format (e.g. --kv bf16 fp8 kivi2)");
  Plan p{in, 0.0, 0.0, "", {}, {}};
  const double per_param = weight_bytes_per_param(in.weights_dtype);
  if (in.weight_bytes) {
    KVQ_CHECK(std::isfinite(*in.weight_bytes) && *in.weight_bytes >= 0,
              "--weights-bytes {} bytes must be zero or more", *in.weight_bytes);
    p.weight_bytes = *in.weight_bytes;
  } else {
    KVQ_CHECK(in.model.params > 0,
              "model {} has no parameter count: give --params or --weights-bytes", in.model.name);
    p.weight_bytes = per_param * in.model.params;
  }
  if (in.mem_bytes) {
    p.mem_bytes = *in.mem_bytes;
    p.mem_source = in.mem_source;
  } else {
    KVQ_CHECK(in.gpu.mem_bytes > 0,
              "no GPU memory to derive the KV memory from (--bandwidth gives none): give --mem");
    p.mem_bytes = kKvMemFraction * in.gpu.mem_bytes - p.weight_bytes;
    KVQ_CHECK(p.mem_bytes > 0,
              "{} GB of weights do not fit in {:g}% of the {}'s {} GB: give --mem, a smaller "
              "--weights-dtype or a larger --gpu",
              short_num(p.weight_bytes / 1e9), kKvMemFraction * 100, in.gpu.name,
              short_num(in.gpu.mem_bytes / 1e9));
    p.mem_source =
        fmt::format("{:g}% of the {}'s {} GB - {} GB of weights", kKvMemFraction * 100, in.gpu.name,
                    short_num(in.gpu.mem_bytes / 1e9), short_num(p.weight_bytes / 1e9));
  }
  KVQ_CHECK(std::isfinite(p.mem_bytes) && p.mem_bytes > 0, "--mem {} bytes must be positive",
            p.mem_bytes);
  std::vector<SchemeSpec> specs;
  for (const auto& kv : in.kv) specs.push_back(parse_kv(kv));  // fail before any work

  const double mem = p.mem_bytes, mem_gb = mem / 1e9;
  // The decode step of `spec`: the batch capped by the requests that fit, its KV bytes and time.
  auto decode = [&](const SchemeSpec& spec, PlanRow& r) {
    const double one = request_footprint(in.model, spec, in.decode_ctx).total_bytes();
    const auto fit = static_cast<int64_t>(std::floor(mem / one));
    r.decode_batch = std::min(in.batch, fit);
    r.decode_kv_bytes = static_cast<double>(r.decode_batch) * one;
    r.step_seconds = decode_step_seconds(p.weight_bytes, r.decode_kv_bytes, in.gpu.bandwidth);
    r.tokens_per_s = static_cast<double>(r.decode_batch) / r.step_seconds;
  };
  PlanRow bf16;  // the speed-up's baseline, whatever --kv lists
  decode(parse_kv("bf16"), bf16);
  for (size_t i = 0; i < specs.size(); ++i) {
    PlanRow r;
    r.kv = in.kv[i];
    r.spec = specs[i].canonical();
    const RequestFootprint req = request_footprint(in.model, specs[i], in.ctx);
    r.request_bytes = req.total_bytes();
    r.bytes_per_token = r.request_bytes / static_cast<double>(in.ctx);
    r.effective_bits = req.effective_bits();
    r.tokens_in_mem = mem / r.bytes_per_token;
    r.requests = static_cast<int64_t>(std::floor(mem / r.request_bytes));
    decode(specs[i], r);
    r.speedup =
        bf16.tokens_per_s > 0 && r.tokens_per_s > 0 ? r.tokens_per_s / bf16.tokens_per_s : 0;
    if (r.requests == 0)
      p.notes.push_back(fmt::format("{}: one {}-token request ({} GB) does not fit in {} GB", r.kv,
                                    group_thousands(in.ctx), short_num(r.request_bytes / 1e9),
                                    short_num(mem_gb)));
    if (r.decode_batch < in.batch)
      p.notes.push_back(fmt::format(
          "{}: only {} requests of {} tokens fit in {} GB of KV memory: its decode batch is {}, "
          "not --batch {}",
          r.kv, group_thousands(r.decode_batch), group_thousands(in.decode_ctx), short_num(mem_gb),
          group_thousands(r.decode_batch), group_thousands(in.batch)));
    p.rows.push_back(std::move(r));
  }
  const bool bf16_listed =
      std::any_of(p.rows.begin(), p.rows.end(), [](const PlanRow& r) { return r.spec == "bf16"; });
  if (bf16.decode_batch < in.batch && !bf16_listed)
    p.notes.push_back(
        fmt::format("the bf16 baseline of the speed-up runs a decode batch of {}, "
                    "what fits in {} GB",
                    group_thousands(bf16.decode_batch), short_num(mem_gb)));
  if (in.gpu.mem_bytes > 0 && p.weight_bytes + mem > in.gpu.mem_bytes)
    p.notes.push_back(
        fmt::format("{} GB of weights + {} GB of KV memory is more than the {}'s {} GB",
                    short_num(p.weight_bytes / 1e9), short_num(mem_gb), in.gpu.name,
                    short_num(in.gpu.mem_bytes / 1e9)));
  return p;
}

std::string group_thousands(int64_t v) {
  const std::string digits = std::to_string(v < 0 ? -v : v);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return v < 0 ? "-" + out : out;
}

std::string format_plan(const Plan& p) {
  const PlanInput& in = p.in;
  const ModelDims& m = in.model;
  std::string out;
  out += fmt::format("model      {}: {} layers, {} kv heads, head dim {}", m.name, m.layers,
                     m.kv_heads, m.head_dim);
  out += m.params > 0 ? fmt::format(", {} B params\n", short_num(m.params / 1e9)) : "\n";
  out += in.weight_bytes
             ? fmt::format("weights    {} GB (--weights-bytes)\n", short_num(p.weight_bytes / 1e9))
             : fmt::format("weights    {} GB ({} B params x {:g} bytes, {})\n",
                           short_num(p.weight_bytes / 1e9), short_num(m.params / 1e9),
                           weight_bytes_per_param(in.weights_dtype), in.weights_dtype);
  out += fmt::format("KV memory  {} GB ({}; 1 GB = 10^9 bytes)\n", short_num(p.mem_bytes / 1e9),
                     p.mem_source);
  out += fmt::format("requests   {} tokens each\n", group_thousands(in.ctx));
  out += fmt::format("decode     batch {} x {} tokens of context\n", group_thousands(in.batch),
                     group_thousands(in.decode_ctx));
  out +=
      in.gpu.mem_bytes > 0
          ? fmt::format("gpu        {}: {} GB, {} TB/s\n", in.gpu.name,
                        short_num(in.gpu.mem_bytes / 1e9), short_num(in.gpu.bandwidth / 1e12))
          : fmt::format("gpu        {} TB/s (--bandwidth)\n", short_num(in.gpu.bandwidth / 1e12));
  out += "\n";

  const std::string mem = short_num(p.mem_bytes / 1e9);
  std::vector<std::vector<std::string>> t;
  t.push_back({"KV format", "KiB/token", "bits/elem", fmt::format("tokens in {} GB", mem),
               fmt::format("{}-token reqs", group_thousands(in.ctx)), "batch", "KV read GB",
               "min step ms", "tokens/s", "speedup"});
  for (const auto& r : p.rows)
    t.push_back({r.kv, fmt::format("{:.2f}", r.bytes_per_token / 1024.0),
                 r.effective_bits ? fmt::format("{:.2f}", *r.effective_bits) : "n/a",
                 group_thousands(std::llround(r.tokens_in_mem)), group_thousands(r.requests),
                 group_thousands(r.decode_batch), amount(r.decode_kv_bytes / 1e9),
                 amount(r.step_seconds * 1e3), group_thousands(std::llround(r.tokens_per_s)),
                 fmt::format("{:.2f}x", r.speedup)});
  out += render_table(t);

  const std::string ctx = group_thousands(in.ctx);
  out += "\n";
  out += fmt::format(
      "KiB/token    bytes of one {0}-token request / {0}: layers x kvq::footprint of K and V,\n"
      "             so scale/zero bytes and the full-precision recent window (r=R) are included\n",
      ctx);
  out += "bits/elem    codes + scales + zeros per quantized element (recent window not counted)\n";
  out += fmt::format(
      "tokens       KV memory / bytes per token, rounded; reqs: floor(KV memory / bytes of one "
      "request)\n");
  out += fmt::format(
      "batch        --batch {}, or the {}-token requests that fit in the KV memory if fewer\n",
      group_thousands(in.batch), group_thousands(in.decode_ctx));
  out += "KV read      batch x bytes of one request; min step = (weights + KV read) / bandwidth\n";
  out +=
      "tokens/s     batch / min step; speedup: tokens/s / bf16's (decode bound by memory reads)\n";
  size_t w = 12;  // the legend's label column: as wide as the footnotes' or the longest label
  for (const auto& r : p.rows)
    if (r.kv != r.spec) w = std::max(w, r.kv.size() + 1);
  for (const auto& r : p.rows)
    if (r.kv != r.spec) out += fmt::format("{:<{}}= {}\n", r.kv, w + 1, r.spec);
  for (const auto& n : p.notes) out += "note: " + n + "\n";
  return out;
}

void set_mem(PlanInput& in, const std::optional<std::string>& mem, const ModelArgs& model,
             bool gpu_given) {
  const bool scenario = !model.preset && !model.layers && !model.kv_heads && !model.head_dim &&
                        !model.params_billions && !gpu_given;
  if (mem)
    in.mem_bytes = parse_gb(*mem, "--mem");
  else if (scenario)
    in.mem_bytes = 55e9, in.mem_source = "the design note's scenario";
  else
    in.mem_bytes = std::nullopt;
}

nlohmann::json plan_json(const Plan& p) {
  const PlanInput& in = p.in;
  nlohmann::json j;
  j["model"] = {{"name", in.model.name},
                {"layers", in.model.layers},
                {"kv_heads", in.model.kv_heads},
                {"head_dim", in.model.head_dim},
                {"params", in.model.params > 0 ? nlohmann::json(in.model.params) : nullptr}};
  j["gpu"] = {{"name", in.gpu.name},
              {"mem_bytes", in.gpu.mem_bytes > 0 ? nlohmann::json(in.gpu.mem_bytes) : nullptr},
              {"bandwidth_bytes_per_s", in.gpu.bandwidth}};
  j["weight_bytes"] = p.weight_bytes;
  j["weight_source"] =
      in.weight_bytes ? std::string("--weights-bytes")
                      : fmt::format("params x {:g} bytes ({})",
                                    weight_bytes_per_param(in.weights_dtype), in.weights_dtype);
  j["mem_bytes"] = p.mem_bytes;
  j["mem_source"] = p.mem_source;
  j["ctx"] = in.ctx;
  j["batch"] = in.batch;
  j["decode_ctx"] = in.decode_ctx;
  j["bytes_per_token_basis"] =
      "bytes of one ctx-token request / ctx (scales and residual included)";
  j["rows"] = nlohmann::json::array();
  for (const auto& r : p.rows)
    j["rows"].push_back(
        {{"kv", r.kv},
         {"spec", r.spec},
         {"request_bytes", r.request_bytes},
         {"bytes_per_token", r.bytes_per_token},
         {"effective_bits", r.effective_bits ? nlohmann::json(*r.effective_bits) : nullptr},
         {"tokens_in_mem", r.tokens_in_mem},
         {"tokens_in_mem_rounded", std::llround(r.tokens_in_mem)},
         {"requests", r.requests},
         {"decode_batch", r.decode_batch},
         {"decode_kv_bytes", r.decode_kv_bytes},
         {"step_ms", r.step_seconds * 1e3},
         {"tokens_per_s", r.tokens_per_s},
         {"speedup_vs_bf16", r.speedup}});
  j["notes"] = p.notes;
  return j;
}

}  // namespace kvq::planner
