// [serve]: serving-style batches on the real model, as `kvq model serve-bench` (issue 47 items 3
// and 4): the same requests (eval::serve_requests) admitted first come first served while their
// caches fit the `mem` cap (evaluation/serve.h), run on the model (evaluation/serve_run.h). One row
// per (mem, max_batch, scheme): decode and prefill tokens/s, requests held at most, the caches'
// peak bytes measured beside the schedule's prediction, and on backend cuda the device memory and
// the planner's decode tokens/s bound. Rows: mem, then max_batch, the schemes of a case together.
#include "evaluation/serve.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>

#include "evaluation/model_files.h"
#include "evaluation/planner.h"
#include "evaluation/serve_run.h"
#include "experiments/commands.h"
#include "experiments/run_task.h"

namespace kvq::cli::run {
namespace {

struct ServePlan final : TaskPlan {
  std::vector<double> mems{0.02};       // the KV memory caps, GB (decimal)
  std::vector<int64_t> max_batches{0};  // most requests held at once (0: only the cap limits)
  int64_t requests = 8, prompt = 64, gen = 16;
  std::string text, backend;
  planner::ModelDims dims;
  json settings;  // shared by every row; each case adds its mem and max_batch

  json case_settings(double mem, int64_t max_batch) const {
    return with_fields(settings, {{"mem", mem}, {"max_batch", max_batch}});
  }
  std::vector<json> case_settings() const override {
    std::vector<json> out;
    for (double m : mems)
      for (int64_t b : max_batches) out.push_back(case_settings(m, b));
    return out;
  }
  void list() const override {
    list_rows("serve", specs);
    fmt::print("serve rows repeat for each mem ({} GB) x max_batch ({}): {} rows of {} requests\n",
               fmt::join(mems, ", "), fmt::join(max_batches, ", "),
               specs.size() * mems.size() * max_batches.size(), requests);
  }
  void check_machine(const std::string& config) const override {
    require_available_here(Where{config, "serve"}, "backend", backend);  // cuda: a device
  }
  void run(const std::filesystem::path& out, const Shard& shard,
           ModelSource& source) const override;
  std::vector<std::string> plots() const override { return {"plot_serve.py"}; }
};

ServePlan read_table(const toml::table& st, const Where& w, const std::string& model_flag) {
  check_keys(
      st, w,
      {"mem", "max_batch", "requests", "prompt_tokens", "gen", "backend", "text", "schemes"});
  ServePlan p;
  // A number or an array of numbers (integers for `ints`): a sweep over the key.
  auto list = [&](const char* key, auto def, bool ints) {
    using T = decltype(def);
    const auto* n = st.get(key);
    if (!n) return std::vector<T>{def};
    std::vector<const toml::node*> items;
    if (const auto* a = n->as_array()) {
      KVQ_CHECK(!a->empty(), "{}: {} is an empty array; give one value or more", w.at(*n),
                w.key(key));
      for (const auto& e : *a) items.push_back(&e);
    } else {
      items.push_back(n);
    }
    std::vector<T> out;
    for (const toml::node* e : items) {
      if (ints) {
        const auto v = e->value_exact<int64_t>();
        KVQ_CHECK(v.has_value(), "{}: {} must be an integer or an array of integers (got {})",
                  w.at(*e), w.key(key), type_of(*e));
        out.push_back(static_cast<T>(*v));
      } else {
        KVQ_CHECK(e->is_number(), "{}: {} must be a number or an array of numbers (got {})",
                  w.at(*e), w.key(key), type_of(*e));
        out.push_back(static_cast<T>(*e->value<double>()));
      }
    }
    return out;
  };
  p.mems = list("mem", 0.02, false);
  p.max_batches = list("max_batch", int64_t{0}, true);
  for (double m : p.mems)
    KVQ_CHECK(m > 0 && m <= 1e6, "{}: {} {} GB is outside (0, 1000000]", w.file, w.key("mem"), m);
  for (int64_t b : p.max_batches)
    KVQ_CHECK(b >= 0 && b <= 4096, "{}: {} {} is outside [0, 4096] (0: only mem limits)", w.file,
              w.key("max_batch"), b);
  p.requests = get_or<int64_t>(st, w, "requests", 8);
  p.prompt = get_or<int64_t>(st, w, "prompt_tokens", 64);
  p.gen = get_or<int64_t>(st, w, "gen", 16);
  KVQ_CHECK(p.requests >= 1 && p.requests <= 100000, "{}: {} must be between 1 and 100000, got {}",
            w.file, w.key("requests"), p.requests);
  KVQ_CHECK(p.prompt >= 2 && p.prompt <= 1 << 20, "{}: {} must be between 2 and 1048576, got {}",
            w.file, w.key("prompt_tokens"), p.prompt);
  KVQ_CHECK(p.gen >= 2 && p.gen <= 1 << 20, "{}: {} must be between 2 and 1048576, got {}", w.file,
            w.key("gen"), p.gen);
  p.text = get_or<std::string>(st, w, "text", "kjv");
  p.backend = get_or<std::string>(st, w, "backend", "cpu");
  check_model_backend(p.backend, w);  // cuda: the model on the GPU
  (void)read_text(p.text);            // the files exist and are text before any work starts
  (void)model_path(model_flag);
  p.settings = {{"text", p.text},
                {"requests", p.requests},
                {"prompt_tokens", p.prompt},
                {"gen", p.gen},
                {"backend", p.backend}};
  if (!model_flag.empty()) p.settings["model"] = model_flag;  // not the default SmolLM2: say which
  return p;
}

// --smoke: the same code path at a tiny size: 3 requests of <= 16 prompt and <= 4 output tokens
// under the largest cap and the first batch limit.
void shrink(ServePlan& p) {
  p.requests = std::min<int64_t>(p.requests, 3);
  p.prompt = std::min<int64_t>(p.prompt, 16);
  p.gen = std::min<int64_t>(p.gen, 4);
  p.mems = {*std::max_element(p.mems.begin(), p.mems.end())};
  p.max_batches = {p.max_batches.front()};
  p.settings["requests"] = p.requests;
  p.settings["prompt_tokens"] = p.prompt;
  p.settings["gen"] = p.gen;
  p.settings["smoke"] = true;
}

std::unique_ptr<TaskPlan> plan(const toml::table& t, const TaskContext& c) {
  const Where w{c.config, "serve"};
  auto p = std::make_unique<ServePlan>(read_table(t, w, c.model_flag));
  if (c.smoke) shrink(*p);
  const LlamaConfig& m = c.model_config();
  KVQ_CHECK(p->prompt + p->gen <= m.context, "{}: {} {} + {} {} exceed the model's context {}",
            c.config, w.key("prompt_tokens"), p->prompt, w.key("gen"), p->gen, m.context);
  p->dims = planner::ModelDims{"model", m.layers, m.kv_heads, m.head_dim, 0};
  p->specs = c.model_rows(t, "serve", parse_backend(p->backend));
  // Every cap holds every request alone (evaluation/serve.h refuses one that could never be
  // admitted): checked here, before the model loads, one error per scheme and cap.
  const auto reqs = eval::serve_requests(p->requests, p->prompt, p->gen);
  for (const SchemeSpec& s : p->specs)
    for (double mem : p->mems) try {
        (void)eval::schedule_serve(p->dims, s, reqs, {mem * 1e9, 0});
      } catch (const Error& e) {
        c.errors->push_back(fmt::format("[serve] mem {} GB, {}: {}", mem, s.canonical(), e.what()));
      }
  return p;
}

void ServePlan::run(const std::filesystem::path& out, const Shard& shard,
                    ModelSource& source) const {
  const ServePlan& p = *this;
  ResultTable table(out, "serve");
  const AttentionBackend be = parse_backend(p.backend);
  const auto reqs = eval::serve_requests(p.requests, p.prompt, p.gen);
  const size_t total = p.mems.size() * p.max_batches.size() * p.specs.size();
  const eval::LoadedModel* L = nullptr;
  std::vector<int32_t> ids;
  size_t j = 0;
  for (double mem : p.mems)
    for (int64_t max_batch : p.max_batches) {
      const json settings = p.case_settings(mem, max_batch);
      for (const SchemeSpec& spec : p.specs) {
        const size_t index = j++;
        const std::string key = spec.canonical();
        if (!shard.take(index) || table.find(key, settings)) continue;
        check_stop();
        if (!L) {  // at the first row that needs it
          L = &source.get(be);
          ids = L->tok.encode_first(read_text(p.text), p.prompt);
          KVQ_CHECK(static_cast<int64_t>(ids.size()) >= p.prompt,
                    "[serve]: the text {} has {} tokens, prompt_tokens = {} needed", p.text,
                    ids.size(), p.prompt);
        }
        const LlamaModel& m = L->model;
        CacheOptions co;
        co.spec = spec;
        const eval::ServeSchedule plan =
            eval::schedule_serve(p.dims, spec, reqs, {mem * 1e9, max_batch});
        const auto calls = eval::serve_calls(p.dims, spec, reqs, plan);
        const auto t0 = std::chrono::steady_clock::now();
        const eval::ServeRunResult r = eval::run_serve(m, ids, reqs, co, calls);
        const double seconds =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        json row = {{"key", key},
                    {"scheme", key},
                    {"settings", settings},
                    {"backend", p.backend},
                    {"max_batch", max_batch}};
        const json fields = eval::serve_fields(m, mem * 1e9, plan, calls, r);
        for (const auto& [k, v] : fields.items()) row[k] = v;
        row["seconds"] = seconds;
        fmt::print(stderr,
                   "[serve {}/{}] {} mem {} GB max_batch {}: {:.1f} decode tokens/s, {:.1f} "
                   "prefill tokens/s, {} held at most over {} steps, cache peak {:.0f} bytes "
                   "({:.0f} predicted)\n",
                   index + 1, total, key, mem, max_batch, row["decode_tokens_per_s"].get<double>(),
                   row["prefill_tokens_per_s"].get<double>(), plan.max_held, plan.steps.size(),
                   r.peak_cache_bytes, plan.peak_live_bytes);
        table.add(std::move(row));
      }
    }
}

}  // namespace

Task serve_task() {
  return {
      "serve", &plan,
      "serving-style batches, requests admitted first come first served under a KV memory cap x "
      "batch limit: decode tokens/s, requests held, the cache's peak bytes beside the schedule's"};
}

}  // namespace kvq::cli::run
