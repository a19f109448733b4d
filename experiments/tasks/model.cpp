// [model]: every scheme on the real model's cache (evaluation/model_eval.h): perplexity, KLD and
// top-1 against the fp32 cache over windows of a text, each statistic with its 95% interval.
// Rows: window length by window length (`ctx = [512, 2048]`), the schemes in config order.
#include <fmt/format.h>

#include <algorithm>

#include "evaluation/defaults.h"
#include "evaluation/model_eval.h"
#include "evaluation/model_files.h"
#include "evaluation/planner.h"
#include "evaluation/report.h"
#include "experiments/commands.h"
#include "experiments/run_task.h"

namespace kvq::cli::run {
namespace {

struct ModelPlan final : TaskPlan {
  eval::PplOptions o;     // o.ctx: the first of ctxs
  std::vector<int> ctxs;  // one set of rows per window length (`ctx = [512, 2048]`)
  std::string text, backend;
  bool pre = false, rot = false;
  json settings;

  json ctx_settings(int ctx) const { return with_fields(settings, {{"ctx", ctx}}); }
  std::vector<json> case_settings() const override {
    std::vector<json> out;
    for (int ctx : ctxs) out.push_back(ctx_settings(ctx));
    return out;
  }
  void list() const override {
    list_rows("model", specs);
    if (ctxs.size() > 1)
      fmt::print("model rows repeat for each ctx: {} ({} rows)\n", fmt::join(ctxs, ", "),
                 specs.size() * ctxs.size());
  }
  void check_machine(const std::string& config) const override {
    require_available_here(Where{config, "model"}, "backend", backend);  // cuda: a device
  }
  void run(const std::filesystem::path& out, const Shard& shard,
           ModelSource& source) const override;
  std::vector<std::string> plots() const override {
    if (ctxs.size() > 1) return {"plot_results.py", "plot_context.py"};
    return {"plot_results.py"};
  }
};

ModelPlan read_table(const toml::table& mt, const Where& w, const std::string& model_flag) {
  check_keys(mt, w,
             {"text", "ctx", "stride", "chunk", "max_tokens", "score_from", "pre_rope", "hadamard",
              "backend", "schemes"});
  ModelPlan p;
  // ctx: one window length, or a list of them (rows per length: quality against context).
  std::vector<int64_t> ctx_list;
  if (const auto* n = mt.get("ctx"); n && n->as_array()) {
    for (const auto& e : *n->as_array()) {
      const auto v = e.value_exact<int64_t>();
      KVQ_CHECK(v.has_value(),
                "{}: {} must be an integer or an array of integers (an element is {})", w.at(e),
                w.key("ctx"), type_of(e));
      ctx_list.push_back(*v);
    }
    KVQ_CHECK(!ctx_list.empty(), "{}: {} is an empty array; give one or more window lengths",
              w.at(*n), w.key("ctx"));
  } else {
    ctx_list.push_back(get_or<int64_t>(mt, w, "ctx", 512));
  }
  const int64_t ctx = *std::min_element(ctx_list.begin(), ctx_list.end()),
                ctx_max = *std::max_element(ctx_list.begin(), ctx_list.end()),
                stride = get_or<int64_t>(mt, w, "stride", 0),
                chunk = get_or<int64_t>(mt, w, "chunk", 256);
  p.o.max_tokens = get_or<int64_t>(mt, w, "max_tokens", kDefaultMaxTokens);
  // llama-perplexity's convention is score_from = ctx / 2 (the second half of each window).
  const int64_t score_from = get_or<int64_t>(mt, w, "score_from", 0);
  KVQ_CHECK(ctx >= 2 && ctx_max <= 1 << 20, "{}: {} must be between 2 and 1048576, got {}", w.file,
            w.key("ctx"), ctx >= 2 ? ctx_max : ctx);
  KVQ_CHECK(p.o.max_tokens >= ctx_max, "{}: {} {} is shorter than the longest window, {} = {}",
            w.file, w.key("max_tokens"), p.o.max_tokens, w.key("ctx"), ctx_max);
  for (int64_t c : ctx_list) p.ctxs.push_back(static_cast<int>(c));
  KVQ_CHECK(stride >= 0 && stride <= ctx, "{}: {} must be between 0 (= ctx) and ctx {}, got {}",
            w.file, w.key("stride"), ctx, stride);
  KVQ_CHECK(chunk >= 1 && chunk <= 1 << 20, "{}: {} must be between 1 and 1048576, got {}", w.file,
            w.key("chunk"), chunk);
  KVQ_CHECK(p.o.max_tokens >= 2, "{}: {} must be at least 2, got {}", w.file, w.key("max_tokens"),
            p.o.max_tokens);
  KVQ_CHECK(score_from >= 0 && score_from < ctx - 1,
            "{}: {} must be between 0 and ctx - 2 = {}, got {}", w.file, w.key("score_from"),
            ctx - 2, score_from);
  p.o.score_from = static_cast<int>(score_from);
  p.o.ctx = p.ctxs.front();
  p.o.stride = static_cast<int>(stride);
  p.o.chunk = static_cast<int>(chunk);
  p.text = get_or<std::string>(mt, w, "text", "kjv");
  p.pre = get_or<bool>(mt, w, "pre_rope", false);
  p.rot = get_or<bool>(mt, w, "hadamard", false);
  p.backend = get_or<std::string>(mt, w, "backend", "cpu");
  check_model_backend(p.backend, w);  // cuda: the model on the GPU
  (void)read_text(p.text);            // the files exist and are text before any work starts
  (void)model_path(model_flag);       // the model file exists before any work starts
  p.settings = {{"text", p.text},       {"ctx", p.o.ctx},
                {"stride", p.o.stride}, {"max_tokens", p.o.max_tokens},
                {"pre_rope", p.pre},    {"backend", p.backend}};
  if (p.rot) p.settings["hadamard"] = true;  // only when set, so rows of earlier runs still match
  if (p.o.score_from > 0) p.settings["score_from"] = p.o.score_from;
  if (!model_flag.empty()) p.settings["model"] = model_flag;  // not the default SmolLM2: say which
  return p;
}

// --smoke: the same code path at a tiny size: windows of <= 64 tokens over 128.
void shrink(ModelPlan& p) {
  for (int& c : p.ctxs) c = std::min(c, 64);
  std::sort(p.ctxs.begin(), p.ctxs.end());
  p.ctxs.erase(std::unique(p.ctxs.begin(), p.ctxs.end()), p.ctxs.end());
  p.o.ctx = p.ctxs.front();
  p.o.max_tokens = 128;
  p.o.stride = std::min(p.o.stride, p.o.ctx);
  p.o.score_from = std::min(p.o.score_from, p.o.ctx / 2);
  p.settings["max_tokens"] = p.o.max_tokens;
  p.settings["stride"] = p.o.stride;
  if (p.o.score_from > 0) p.settings["score_from"] = p.o.score_from;
  p.settings["smoke"] = true;
}

std::unique_ptr<TaskPlan> plan(const toml::table& t, const TaskContext& c) {
  auto p = std::make_unique<ModelPlan>(read_table(t, Where{c.config, "model"}, c.model_flag));
  if (c.smoke) shrink(*p);
  for (int ctx : p->ctxs) {  // against the model's context, before the model loads
    eval::PplOptions po = p->o;
    po.ctx = ctx;
    try {
      eval::check_ppl_options(po, c.model_config().context);
    } catch (const Error& e) {
      fail("{}: [model]: {}", c.config, e.what());
    }
  }
  p->specs = c.model_rows(t, "model", parse_backend(p->backend), p->pre);
  return p;
}

// One finished row: its footprint, statistics and where its scales come from, on disk and in a
// line.
void add_row(ResultTable& table, const LlamaModel& m, const SchemeSpec& spec,
             const eval::PplResult& r, const json& settings, const std::string& tag, int ctx) {
  const SchemeSpec* s = &spec;
  // K and V of a ctx-token window summed over the layers (each layer's own scheme)
  const planner::RequestFootprint f = planner::request_footprint(
      planner::ModelDims{"model", m.config().layers, m.config().kv_heads, m.config().head_dim, 0.0},
      *s, ctx);
  // Each statistic with its 95% interval (x_lo, x_hi: null when it could not be estimated) and
  // the fraction of the attended K/V that was quantized (eval::result_fields).
  json row = {{"key", s->canonical()},
              {"scheme", s->canonical()},
              {"settings", settings},
              {"bits", (f.key.effective_bits() + f.value.effective_bits()) / 2},
              {"bytes_per_token", f.total_bytes() / ctx}};
  for (const auto& [name, value] : eval::result_fields(r)) row[name] = value;
  // the *_fp32 fields' cache when it is not fp32 (backend cuda: bf16)
  if (const std::string ref = eval::reference_field(m.backend()); !ref.empty())
    row["reference"] = ref;
  // which tokens of each window set the scales (the first layer's scheme; issue 50 item 3)
  const SchemeSpec first_layer = resolve_layers(*s, m.config().layers, "the model").for_layer(0);
  const std::string key_from = scales_from(first_layer, Role::Key, ctx),
                    value_from = scales_from(first_layer, Role::Value, ctx);
  const bool key_prefix = scales_from_prefix(first_layer, Role::Key, ctx),
             value_prefix = scales_from_prefix(first_layer, Role::Value, ctx);
  row["key_scales_from"] = key_from;
  row["value_scales_from"] = value_from;
  row["scored"] = r.scored;
  row["ci_blocks"] = r.ci_blocks;
  row["seconds"] = r.seconds;
  table.add(std::move(row));
  fmt::print(stderr, "[{}] {}: {}{}\n", tag, s->canonical(), eval::format_result(r),
             key_prefix || value_prefix ? fmt::format(", scales from {} of each window",
                                                      key_prefix ? key_from : value_from)
                                        : "");
  if (!eval::exact_by_design(*s) && r.quantized < eval::kMinQuantizedFraction)
    fmt::print(stderr, "kvq run: warning: {}\n",
               eval::little_quantized(s->canonical(), ctx, r.quantized));
}

void ModelPlan::run(const std::filesystem::path& out, const Shard& shard,
                    ModelSource& source) const {
  const ModelPlan& p = *this;
  const std::vector<SchemeSpec>& specs = p.specs;
  const bool pre = p.pre, rot = p.rot;
  const AttentionBackend attn = parse_backend(p.backend);
  ResultTable table(out, "model");
  // The rows still to run, per window length (ctx is a setting of every row).
  std::vector<std::pair<int, std::vector<const SchemeSpec*>>> todo;
  size_t n_todo = 0;
  size_t j = 0;
  for (int ctx : p.ctxs) {
    const json settings = p.ctx_settings(ctx);
    std::vector<const SchemeSpec*> t;
    for (const auto& s : specs)
      if (shard.take(j++) && !table.find(s.canonical(), settings)) t.push_back(&s);
    n_todo += t.size();
    if (!t.empty()) todo.emplace_back(ctx, std::move(t));
  }
  if (n_todo == 0) {
    fmt::print(stderr, "[model] all {} rows done already\n",
               (specs.size() * p.ctxs.size() + static_cast<size_t>(shard.n - shard.i)) /
                   static_cast<size_t>(shard.n));
    return;
  }
  const eval::LoadedModel& L = source.get(attn);
  const LlamaModel& m = L.model;
  const std::vector<int32_t> ids = L.tok.encode_first(read_text(p.text), p.o.max_tokens);
  for (const auto& entry : todo) {  // not a structured binding: a lambda below captures rows
    const auto& ctx = entry.first;
    const auto& rows = entry.second;
    eval::PplOptions o = p.o;
    o.ctx = ctx;
    o.poll = check_stop;
    const json settings = p.ctx_settings(ctx);
    std::vector<CacheOptions> caches;
    for (const SchemeSpec* s : rows) {
      CacheOptions co;
      // hadamard = true: rot=hadamard on every scheme (its rows say so in settings.hadamard)
      co.spec = rot ? with_rotation(*s, RotSpec{true}) : *s;
      co.pre_rope = pre;
      caches.push_back(co);
    }
    // All schemes in one pass: the fp32 reference of each window is computed once.
    const std::string tag =
        p.ctxs.size() > 1 ? fmt::format("model, ctx {}", ctx) : std::string("model");
    const auto results = eval::perplexity(m, caches, ids, o, [&](const std::string& msg) {
      fmt::print(stderr, "[{}, {} schemes] {}\n", tag, rows.size(), msg);
    });
    for (size_t i = 0; i < rows.size(); ++i)
      add_row(table, m, *rows[i], results[i], settings, tag, ctx);
  }
}

}  // namespace

Task model_task() {
  return {"model", &plan,
          "the model (SmolLM2 by default): perplexity, KLD and top-1 against the fp32 cache"};
}

}  // namespace kvq::cli::run
