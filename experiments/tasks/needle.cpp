// [needle]: passkey retrieval, ctx x depth x trials, every scheme against the fp32 cache on the
// same prompt (kvq model needle's prompts and keys). Rows: ctx, then depth, then trial, every
// scheme of a case together; shards take whole cases.
#include <fmt/format.h>

#include <chrono>

#include "evaluation/model_eval.h"
#include "evaluation/model_files.h"
#include "experiments/commands.h"
#include "experiments/run_task.h"

namespace kvq::cli::run {
namespace {

struct NeedlePlan final : TaskPlan {
  std::vector<int> ctxs;
  std::vector<double> depths;
  int trials = 5;
  uint64_t seed = 1;
  std::string text, backend;
  json settings;

  json case_settings(int ctx, double depth, int trial) const {
    return with_fields(settings, {{"ctx", ctx}, {"depth", depth}, {"trial", trial}});
  }
  std::vector<json> case_settings() const override {
    std::vector<json> out;
    for (int ctx : ctxs)
      for (double depth : depths)
        for (int trial = 0; trial < trials; ++trial)
          out.push_back(case_settings(ctx, depth, trial));
    return out;
  }
  void list() const override {
    list_rows("needle", specs);
    fmt::print("needle rows repeat for each ctx ({}) x depth ({}) x trial ({}): {} rows\n",
               fmt::join(ctxs, ", "), fmt::join(depths, ", "), trials,
               specs.size() * ctxs.size() * depths.size() * static_cast<size_t>(trials));
  }
  void check_machine(const std::string& config) const override {
    require_available_here(Where{config, "needle"}, "backend", backend);  // cuda: a device
  }
  void run(const std::filesystem::path& out, const Shard& shard,
           ModelSource& source) const override;
  std::vector<std::string> plots() const override { return {"plot_needle.py"}; }
};

NeedlePlan read_table(const toml::table& nt, const Where& w, const std::string& model_flag,
                      int context) {
  check_keys(nt, w, {"text", "ctx", "depth", "trials", "seed", "backend", "schemes"});
  NeedlePlan p;
  auto numbers = [&](const char* key, auto def) {
    std::vector<decltype(def)> out;
    const auto* n = nt.get(key);
    if (!n) return std::vector<decltype(def)>{def};
    const auto* a = n->as_array();
    KVQ_CHECK(a && !a->empty(), "{}: {} must be a non-empty array of numbers", w.at(*n),
              w.key(key));
    for (const auto& e : *a) {
      if constexpr (std::is_same_v<decltype(def), int>) {
        const auto v = e.value_exact<int64_t>();
        KVQ_CHECK(v.has_value(), "{}: {} must hold integers (an element is {})", w.at(e),
                  w.key(key), type_of(e));
        out.push_back(static_cast<int>(*v));
      } else {
        KVQ_CHECK(e.is_number(), "{}: {} must hold numbers (an element is {})", w.at(e), w.key(key),
                  type_of(e));
        out.push_back(*e.value<double>());
      }
    }
    return out;
  };
  p.ctxs = numbers("ctx", 2048);
  p.depths = numbers("depth", 0.5);
  const int64_t trials = get_or<int64_t>(nt, w, "trials", 5),
                seed = get_or<int64_t>(nt, w, "seed", 1);
  for (int c : p.ctxs)
    KVQ_CHECK(c >= 256 && c <= context, "{}: {} {} is outside [256, {}] (the model's context)",
              w.file, w.key("ctx"), c, context);
  for (double d : p.depths)
    KVQ_CHECK(d >= 0 && d <= 1, "{}: {} {} is outside [0, 1]", w.file, w.key("depth"), d);
  KVQ_CHECK(trials >= 1 && trials <= 10000, "{}: {} must be between 1 and 10000, got {}", w.file,
            w.key("trials"), trials);
  KVQ_CHECK(seed >= 0, "{}: {} must be >= 0, got {}", w.file, w.key("seed"), seed);
  p.trials = static_cast<int>(trials);
  p.seed = static_cast<uint64_t>(seed);
  p.text = get_or<std::string>(nt, w, "text", "kjv");
  p.backend = get_or<std::string>(nt, w, "backend", "cpu");
  check_model_backend(p.backend, w);  // cuda: the model on the GPU
  (void)read_text(p.text);
  (void)model_path(model_flag);  // the model file exists before any work starts
  p.settings = {{"text", p.text}, {"seed", p.seed}, {"backend", p.backend}};
  return p;
}

std::unique_ptr<TaskPlan> plan(const toml::table& t, const TaskContext& c) {
  auto p = std::make_unique<NeedlePlan>(
      read_table(t, Where{c.config, "needle"}, c.model_flag, c.model_config().context));
  if (c.smoke) {  // one short trial per depth
    p->ctxs = {256};
    p->trials = 1;
    p->settings["smoke"] = true;
  }
  p->specs = c.model_rows(t, "needle", parse_backend(p->backend));
  return p;
}

void NeedlePlan::run(const std::filesystem::path& out, const Shard& shard,
                     ModelSource& source) const {
  const NeedlePlan& p = *this;
  ResultTable table(out, "needle");
  const eval::LoadedModel* L = nullptr;
  eval::NeedleText text;
  CacheOptions ref;  // the unquantized cache: fp32 (bf16 on backend cuda, reference_spec)
  ref.spec = reference_spec(parse_backend(p.backend));
  const std::string reference = eval::reference_field(parse_backend(p.backend));
  uint64_t st = eval::needle_seed(p.seed);
  size_t j = 0, done = 0, total = p.ctxs.size() * p.depths.size() * static_cast<size_t>(p.trials);
  for (int ctx : p.ctxs)
    for (double depth : p.depths)
      for (int trial = 0; trial < p.trials; ++trial, ++j) {
        const int key =
            eval::needle_key(st);  // drawn for every case, so keys never depend on what is done
        if (!shard.take(j)) continue;
        const json settings = p.case_settings(ctx, depth, trial);
        std::vector<const SchemeSpec*> todo;
        for (const auto& s : p.specs)
          if (!table.find(s.canonical(), settings)) todo.push_back(&s);
        ++done;
        if (todo.empty()) continue;
        check_stop();
        if (!L) {  // at the first case that needs it
          L = &source.get(parse_backend(p.backend));
          text = eval::needle_text(L->tok, read_text(p.text));
        }
        const LlamaModel& m = L->model;
        const eval::NeedleCase c = eval::needle_case(L->tok, text, ctx, depth, key);
        const eval::NeedleResult a = eval::needle_trial(m, ref, c.prompt, c.answer);
        for (const SchemeSpec* s : todo) {
          CacheOptions co;
          co.spec = *s;
          const auto t0 = std::chrono::steady_clock::now();
          const eval::NeedleResult b = eval::needle_trial(m, co, c.prompt, c.answer);
          json row = {
              {"key", s->canonical()},
              {"scheme", s->canonical()},
              {"settings", settings},
              {"passkey", key},
              {"correct", b.correct},
              {"logprob", b.logprob},
              {"fp32_correct", a.correct},
              {"fp32_logprob", a.logprob},
              {"seconds",
               std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()}};
          if (!reference.empty()) row["reference"] = reference;  // the fp32_* fields' cache
          table.add(std::move(row));
          check_stop();
        }
        fmt::print(stderr, "[needle {}/{}] ctx {} depth {} trial {}: fp32 {}\n", done, total, ctx,
                   depth, trial, a.correct ? "found" : "missed");
      }
}

}  // namespace

Task needle_task() {
  return {"needle", &plan, "passkey retrieval, ctx x depth x trials, each against the fp32 cache"};
}

}  // namespace kvq::cli::run
