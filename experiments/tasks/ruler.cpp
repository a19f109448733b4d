// [ruler]: the RULER-style suite (evaluation/ruler.h), length x task x sample, every scheme
// against the fp32 cache on the same prompt and the same greedy decoding. Rows: length, then
// task, then sample, every scheme of a case together; shards take whole cases.
#include "evaluation/ruler.h"

#include <fmt/format.h>

#include <chrono>

#include "evaluation/model_eval.h"
#include "evaluation/model_files.h"
#include "experiments/commands.h"
#include "experiments/run_task.h"

namespace kvq::cli::run {
namespace {

struct RulerPlan final : TaskPlan {
  std::vector<std::string> tasks;
  std::vector<int> lengths{1024, 2048, 4096};
  int samples = 5;
  uint64_t seed = 1;
  std::string haystack, backend;
  int max_new = 0;  // --smoke: at most this many generated tokens (0: each task's budget)
  json settings;
  struct Case {
    int length;
    std::string task;
    int sample;
  };
  // Row order (and shards): length, then task, then sample; every scheme of a case together.
  std::vector<Case> cases() const {
    std::vector<Case> out;
    for (int l : lengths)
      for (const auto& t : tasks)
        for (int i = 0; i < samples; ++i) out.push_back({l, t, i});
    return out;
  }
  json case_settings(const Case& c) const {
    return with_fields(settings, {{"length", c.length}, {"task", c.task}, {"sample", c.sample}});
  }
  std::vector<json> case_settings() const override {
    std::vector<json> out;
    for (const auto& c : cases()) out.push_back(case_settings(c));
    return out;
  }
  void list() const override {
    list_rows("ruler", specs);
    fmt::print("ruler rows repeat for each length ({}) x task ({}) x sample ({}): {} rows\n",
               fmt::join(lengths, ", "), fmt::join(tasks, ", "), samples,
               specs.size() * cases().size());
  }
  void check_machine(const std::string& config) const override {
    require_available_here(Where{config, "ruler"}, "backend", backend);  // cuda: a device
  }
  void run(const std::filesystem::path& out, const Shard& shard,
           ModelSource& source) const override;
  std::vector<std::string> plots() const override { return {"plot_ruler.py"}; }
};

RulerPlan read_table(const toml::table& rt, const Where& w, const std::string& model_flag,
                     int context) {
  check_keys(rt, w, {"tasks", "lengths", "samples", "seed", "haystack", "backend", "schemes"});
  RulerPlan p;
  if (rt.get("tasks")) {
    p.tasks = string_list(rt, w, "tasks");
    KVQ_CHECK(!p.tasks.empty(), "{}: {} is an empty array; give task names", w.file,
              w.key("tasks"));
    for (const auto& t : p.tasks) {
      try {
        (void)eval::ruler_task(t);
      } catch (const Error& e) {
        fail("{}: {}: {}", w.at(*rt.get("tasks")), w.key("tasks"), e.what());
      }
    }
  } else {
    for (const auto& t : eval::ruler_tasks()) p.tasks.emplace_back(t.name);
  }
  if (const auto* n = rt.get("lengths")) {
    const auto* a = n->as_array();
    KVQ_CHECK(a && !a->empty(), "{}: {} must be a non-empty array of integers", w.at(*n),
              w.key("lengths"));
    p.lengths.clear();
    for (const auto& e : *a) {
      const auto v = e.value_exact<int64_t>();
      KVQ_CHECK(v.has_value(), "{}: {} must hold integers (an element is {})", w.at(e),
                w.key("lengths"), type_of(e));
      KVQ_CHECK(*v >= 1024 && *v <= context,
                "{}: {} {} is outside [1024, {}] (the model's context)", w.at(e), w.key("lengths"),
                *v, context);
      p.lengths.push_back(static_cast<int>(*v));
    }
  }
  for (int l : p.lengths)
    KVQ_CHECK(l <= context, "{}: {} {} exceeds the model's context {}", w.file, w.key("lengths"), l,
              context);
  const int64_t samples = get_or<int64_t>(rt, w, "samples", 5),
                seed = get_or<int64_t>(rt, w, "seed", 1);
  KVQ_CHECK(samples >= 1 && samples <= 10000, "{}: {} must be between 1 and 10000, got {}", w.file,
            w.key("samples"), samples);
  KVQ_CHECK(seed >= 0, "{}: {} must be >= 0, got {}", w.file, w.key("seed"), seed);
  p.samples = static_cast<int>(samples);
  p.seed = static_cast<uint64_t>(seed);
  p.haystack = get_or<std::string>(rt, w, "haystack", "kjv");
  p.backend = get_or<std::string>(rt, w, "backend", "cpu");
  check_model_backend(p.backend, w);  // cuda: the model on the GPU
  if (p.haystack != "noise") {
    try {
      (void)read_text(p.haystack);  // "kjv" or a text file, before any work starts
    } catch (const Error& e) {
      fail("{}: {} (\"kjv\", \"noise\" or a text file): {}", w.file, w.key("haystack"), e.what());
    }
  }
  (void)model_path(model_flag);
  p.settings = {{"haystack", p.haystack}, {"seed", p.seed}, {"backend", p.backend}};
  return p;
}

std::unique_ptr<TaskPlan> plan(const toml::table& t, const TaskContext& c) {
  auto p = std::make_unique<RulerPlan>(
      read_table(t, Where{c.config, "ruler"}, c.model_flag, c.model_config().context));
  if (c.smoke) {  // the first task, one sample at 1,024 tokens, 4 generated tokens
    p->tasks.resize(1);
    p->lengths = {1024};
    p->samples = 1;
    p->max_new = 4;
    p->settings["smoke"] = true;
  }
  p->specs = c.model_rows(t, "ruler", parse_backend(p->backend));
  return p;
}

void RulerPlan::run(const std::filesystem::path& out, const Shard& shard,
                    ModelSource& source) const {
  const RulerPlan& p = *this;
  ResultTable table(out, "ruler");
  const eval::LoadedModel* L = nullptr;
  eval::RulerHaystack hay;
  CacheOptions ref;  // the unquantized cache: fp32 (bf16 on backend cuda, reference_spec)
  ref.spec = reference_spec(parse_backend(p.backend));
  const std::string reference = eval::reference_field(parse_backend(p.backend));
  const auto cases = p.cases();
  size_t j = 0;
  for (const auto& k : cases) {
    if (!shard.take(j++)) continue;
    const json settings = p.case_settings(k);
    std::vector<const SchemeSpec*> todo;
    for (const auto& s : p.specs)
      if (!table.find(s.canonical(), settings)) todo.push_back(&s);
    if (todo.empty()) continue;
    check_stop();
    if (!L) {  // at the first case that needs it
      L = &source.get(parse_backend(p.backend));
      const bool noise = p.haystack == "noise";
      hay = eval::ruler_haystack(L->tok, noise ? std::string() : read_text(p.haystack), noise);
    }
    const eval::RulerCase c = eval::ruler_case(L->tok, hay, k.task, k.length, p.seed, k.sample);
    const eval::RulerOutput a =
        eval::ruler_trial(L->model, L->tok, ref, c, p.max_new, 0, check_stop);
    std::string answers, scores;
    for (const auto& x : c.answers) answers += (answers.empty() ? "" : ", ") + x;
    for (const SchemeSpec* s : todo) {
      CacheOptions co;
      co.spec = *s;
      const auto t0 = std::chrono::steady_clock::now();
      const eval::RulerOutput b =
          eval::ruler_trial(L->model, L->tok, co, c, p.max_new, 0, check_stop);
      json row = {{"key", s->canonical()},
                  {"scheme", s->canonical()},
                  {"settings", settings},
                  {"score", b.score},
                  {"fp32_score", a.score},
                  {"answers", answers},
                  {"output", b.text},
                  {"fp32_output", a.text},
                  {"prompt_tokens", c.prompt.size()},
                  {"generated", b.tokens},
                  {"seconds",
                   std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()}};
      if (!reference.empty()) row["reference"] = reference;  // the fp32_* fields' cache
      table.add(std::move(row));
      scores += fmt::format(", {} {:.2f}", s->canonical(), b.score);
      check_stop();
    }
    fmt::print(stderr, "[ruler {}/{}] {} at {} sample {}: fp32 {:.2f}{}\n", j, cases.size(), k.task,
               k.length, k.sample, a.score, scores);
  }
}

}  // namespace

Task ruler_task() {
  return {"ruler", &plan,
          "the RULER-style long-context suite, length x task x sample (needles, variable tracking, "
          "word extraction): recall of each greedy answer against the fp32 cache"};
}

}  // namespace kvq::cli::run
