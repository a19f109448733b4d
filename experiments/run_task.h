// `kvq run`'s tasks ([synthetic], [model], [needle], [throughput], [ruler], ...): the interface
// every task implements, and what tasks share (config reading, result tables, shards, the model).
// A task is one file in experiments/tasks/ plus one line in experiments/run_tasks.cpp; cmd_run.cpp
// drives every task through this interface and names none.
#pragma once

#include <fmt/format.h>
#include <toml++/toml.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <initializer_list>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/spec.h"
#include "evaluation/model_eval.h"
#include "kernels/backend.h"
#include "model/llama.h"

namespace kvq::cli::run {

using json = nlohmann::ordered_json;

/// \brief Where a key lives, for messages: "FILE:LINE: [model].ctx must be ...".
struct Where {
  std::string file, table;  // table "" for the top level
  std::string key(std::string_view k) const {
    return table.empty() ? std::string(k) : fmt::format("[{}].{}", table, k);
  }
  std::string at(const toml::node& n) const {
    return n.source().begin.line > 0 ? fmt::format("{}:{}", file, n.source().begin.line) : file;
  }
};

/// \brief "an integer", "a string", ...: a TOML node's type for messages.
const char* type_of(const toml::node& n);

/// \brief t[key] as T (string, int64_t, double or bool), else def; a wrong type is one error line.
template <typename T>
T get_or(const toml::table& t, const Where& w, std::string_view key, T def) {
  const auto* n = t.get(key);
  if (!n) return def;
  const char* want = "a string";
  if constexpr (std::is_same_v<T, double>) {
    want = "a number";
    if (n->is_number()) return *n->value<double>();
  } else if constexpr (std::is_same_v<T, int64_t>) {
    want = "an integer";
    if (auto v = n->value_exact<int64_t>()) return *v;
  } else if constexpr (std::is_same_v<T, bool>) {
    want = "true or false";
    if (auto v = n->value_exact<bool>()) return *v;
  } else {
    if (auto v = n->value_exact<std::string>()) return *v;
  }
  fail("{}: {} must be {} (got {})", w.at(*n), w.key(key), want, type_of(*n));
}

/// \brief A case's settings (its rows' key with the scheme): the task's shared `settings` with the
/// case's own fields set in order (a field already there keeps its place and takes the new value).
json with_fields(json settings, std::initializer_list<std::pair<const char*, json>> fields);

/// \brief Every key of t must be in `allowed` (sweep placeholders are checked by the sweep).
void check_keys(const toml::table& t, const Where& w, const std::vector<std::string>& allowed);

/// \brief t[key] as an array of strings (empty when absent).
std::vector<std::string> string_list(const toml::table& t, const Where& w, std::string_view key);

/// \brief `backend = "..."` of a model task ([model], [needle], [ruler]): a backend of
/// kernels/backend.h's one list that runs the model (require_model); errors name FILE and key.
AttentionBackend check_model_backend(const std::string& backend, const Where& w);

/// \brief Refuses, in one line, a backend that cannot run on this machine (cuda without a device
/// or a CUDA build: "FILE: [TABLE].KEY \"cuda\": " + cuda_unavailable()): the plans' check_machine.
void require_available_here(const Where& w, std::string_view key, const std::string& backend);

/// \brief One scheme of a task with where it came from (a sweep's bad combinations are skipped
/// with a line; an explicit spec that does not fit is an error).
struct Row {
  SchemeSpec spec;
  std::string text;  // as written in the config
  bool from_sweep = false;
};

/// \brief Keeps the rows that fit [heads, dim] (`layers`: the model's layer count, or 0 for a task
/// that measures one tensor); a sweep row that does not is skipped with a line, an explicit one is
/// added to `errors`.
/// `also`: a further reason a row does not fit (a model task's backend, model_unsupported).
std::vector<SchemeSpec> fitting(const std::vector<Row>& rows, const std::string& task,
                                int64_t heads, int64_t dim, std::vector<std::string>& errors,
                                int layers = 0,
                                const std::function<std::string(const SchemeSpec&)>& also = {});

/// \brief --check's line for a task's schemes: "TASK rows (N): a, b".
void list_rows(const char* task, const std::vector<SchemeSpec>& specs);

/// \brief --shard I/N: row j of a task (its own order; some tasks shard whole cases) belongs to
/// shard j % N + 1.
struct Shard {
  int i = 1, n = 1;
  bool take(size_t j) const { return static_cast<int>(j % static_cast<size_t>(n)) == i - 1; }
};

/// \brief A run killed inside a write leaves NAME.tmp.PID beside NAME (core/io.cpp writes, then
/// renames). Removes those in dir whose NAME this run writes (`ours(NAME)`) once process PID is
/// gone: never while another kvq on the same folder may still be writing one.
void remove_stale_temporaries(const std::filesystem::path& dir,
                              const std::function<bool(const std::string&)>& ours);

/// \brief One results table: rows keyed by "key" and "settings", persisted as DIR/TASK.jsonl and
/// DIR/TASK.csv (both rewritten atomically) after every row.
class ResultTable {
 public:
  ResultTable(std::filesystem::path dir, std::string task);
  const std::vector<json>& rows() const { return rows_; }
  /// \brief The stored row with this key and these settings, if any.
  const json* find(const std::string& key, const json& settings) const;
  void add(json row);

 private:
  std::filesystem::path dir_;
  std::string task_;
  std::vector<json> rows_;
};

/// \brief The real model, loaded at most once per `kvq run` (by the first task that has rows to
/// run) and shared by the tasks that run it.
struct ModelSource {
  std::string flag;  // --model-file (empty: the fetched model); resolved when a task needs it
  WeightStore store = WeightStore::kMapped;  // --weights, else the config's `weights`
  std::unique_ptr<eval::LoadedModel> loaded;
  eval::LoadedModel& get(AttentionBackend backend);
};

/// \brief What a task's plan reads besides its own table.
struct TaskContext {
  std::string config;      // the config file, for messages
  std::string model_flag;  // --model / model_file (empty: the fetched model)
  bool smoke = false;      // --smoke: the same rows at a tiny size
  std::function<const LlamaConfig&()> model_config;  // the model's shape (read once, on demand)
  // The task's own `schemes`, else the config's top-level rows (and [sweep]).
  std::function<std::vector<Row>(const toml::table&, const char* task)> rows;
  std::vector<std::string>* errors = nullptr;  // rows that do not fit, reported together

  /// \brief The rows of a task of the model's cache (`table` named `task`) that fit the model and
  /// that `backend` runs the model with (kernels/backend.h's model_unsupported, `pre_rope` keys);
  /// a model shape the backend does not take, or its reference cache (reference_spec), is one
  /// error. All static: no device is asked (check_machine does that).
  std::vector<SchemeSpec> model_rows(const toml::table& table, const char* task,
                                     AttentionBackend backend = AttentionBackend::kCpu,
                                     bool pre_rope = false) const;
};

/// \brief One task's rows for one config, checked: what `kvq run` lists, runs and merges.
class TaskPlan {
 public:
  virtual ~TaskPlan() = default;
  /// \brief The settings of each case (one row per scheme), in the config's order.
  virtual std::vector<json> case_settings() const = 0;
  /// \brief Whether any scheme survived the checks (a task with none runs nothing).
  bool has_rows() const { return !specs.empty(); }
  /// \brief Every row, keyed by (scheme, settings): case by case, each case's schemes together.
  /// The row count, and what --merge gathers in which order.
  std::vector<std::pair<std::string, json>> keys() const;
  /// \brief --check: the rows, one line or a few.
  virtual void list() const = 0;
  /// \brief Refuses, in one line, what cannot run on this machine (never under --check).
  virtual void check_machine(const std::string& /*config*/) const {}
  /// \brief Runs this shard's rows not yet in OUT/TASK.jsonl.
  virtual void run(const std::filesystem::path& out, const Shard& shard,
                   ModelSource& source) const = 0;
  /// \brief The scripts in experiments/plots/ that draw its rows.
  virtual std::vector<std::string> plots() const = 0;

  std::vector<SchemeSpec> specs;  // its schemes that survived the checks, in the config's order
};

/// \brief A task: its config table and --only name (also OUT/NAME.{jsonl,csv}), and how a table
/// becomes a plan (keys, types, ranges, --smoke's shrinking, every row against its shapes).
struct Task {
  const char* name;
  std::unique_ptr<TaskPlan> (*plan)(const toml::table& table, const TaskContext& context);
  const char* help;  ///< what its rows measure, one sentence for `kvq run --help`
};

/// \brief Every task, in the order they are checked, run, merged and listed
/// (experiments/run_tasks.cpp).
const std::vector<Task>& run_tasks();

}  // namespace kvq::cli::run
