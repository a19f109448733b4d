// kvq run CONFIG.toml: an experiment sweep. Every scheme in the config (plus any [sweep]
// expansion) is measured by each task the config has a table for ([synthetic], [model], [needle],
// [throughput], [ruler]: experiments/tasks/, listed once in run_tasks.cpp). Each finished row is
// appended to OUT/<task>.jsonl and OUT/<task>.csv, both rewritten atomically, so an interrupted run
// loses nothing and a rerun resumes where it stopped (rows whose key and settings match are
// skipped). This file reads the config and drives the tasks through run_task.h; it names none.
#include <fmt/format.h>
#include <toml++/toml.h>

#include <algorithm>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "core/io.h"
#include "evaluation/model_files.h"
#include "experiments/commands.h"
#include "experiments/run_task.h"
#include "kernels/backend.h"
#include "model/llama.h"

namespace kvq::cli {
namespace {

using run::check_keys;
using run::get_or;
using run::json;
using run::Row;
using run::Shard;
using run::string_list;
using run::type_of;
using run::TaskPlan;
using run::Where;

// Ctrl-C (StopOnCtrlC): the first stops the run between rows (synthetic) or chunks (model), after
// which every finished row is on disk and a rerun resumes; a second one kills at once.

struct RunFlags {
  std::string config, out, model_file, only, weights;
  bool append = false, check = false, smoke = false, merge = false;
  std::string shard;
};

// --shard I/N.
Shard parse_shard(const RunFlags& o) {
  Shard shard;
  if (o.shard.empty()) return shard;
  const size_t slash = o.shard.find('/');
  char* e1 = nullptr;
  char* e2 = nullptr;
  const std::string a = o.shard.substr(0, slash),
                    b = slash == std::string::npos ? "" : o.shard.substr(slash + 1);
  const long i = std::strtol(a.c_str(), &e1, 10), n = std::strtol(b.c_str(), &e2, 10);
  KVQ_CHECK(slash != std::string::npos && !a.empty() && !b.empty() && *e1 == 0 && *e2 == 0 &&
                n >= 1 && n <= 100000 && i >= 1 && i <= n,
            "--shard {}: give I/N with 1 <= I <= N, e.g. --shard 2/8", o.shard);
  shard = {static_cast<int>(i), static_cast<int>(n)};
  KVQ_CHECK(!o.merge,
            "--shard and --merge: run the shards first, then --merge once without --shard");
  return shard;
}

// [sweep] template = "int{b}:k={k},v=token,g={g}" with b = [2, 4], g = [32, 128], ...; the
// combinations listed in exclude = [...] are left out.
std::vector<std::string> expand_sweep(const toml::table& sw, const Where& w) {
  const std::string tmpl = get_or<std::string>(sw, w, "template", "");
  KVQ_CHECK(!tmpl.empty(), "{}: [sweep] needs a template, e.g. template = \"kivi{{b}}:g={{g}}\"",
            w.file);
  std::vector<std::string> out{tmpl};
  for (const auto& [k, v] : sw) {
    if (k.str() == "template" || k.str() == "exclude") continue;
    const auto* a = v.as_array();
    KVQ_CHECK(a && !a->empty(), "{}: {} must be a non-empty array", w.at(v), w.key(k.str()));
    const std::string ph = "{" + std::string(k.str()) + "}";
    KVQ_CHECK(tmpl.find(ph) != std::string::npos, "{}: {} does not appear in the template as {}",
              w.at(v), w.key(k.str()), ph);
    std::vector<std::string> next;
    for (const auto& s : out)
      for (const auto& e : *a) {
        std::string val;
        if (auto i = e.value_exact<int64_t>())
          val = std::to_string(*i);
        else if (auto st = e.value_exact<std::string>())
          val = *st;
        else
          fail("{}: {} values must be integers or strings (got {})", w.at(e), w.key(k.str()),
               type_of(e));
        std::string r = s;
        for (size_t p; (p = r.find(ph)) != std::string::npos;) r.replace(p, ph.size(), val);
        next.push_back(r);
      }
    out = std::move(next);
  }
  const auto excluded = string_list(sw, w, "exclude");
  std::erase_if(out, [&](const std::string& s) {
    return std::find(excluded.begin(), excluded.end(), s) != excluded.end();
  });
  return out;
}

// A task the config runs, with its checked plan.
struct Planned {
  const run::Task* task;
  std::unique_ptr<TaskPlan> plan;
};

// The config, read and checked: every task it runs (in run_tasks() order), planned.
struct CheckedConfig {
  std::string text;  // as read, saved beside the results
  toml::table cfg;
  WeightStore store = WeightStore::kMapped;
  std::vector<Planned> plans;
};

toml::table parse_config(const std::string& config, const std::string& text) {
  try {
    return toml::parse(text, config);
  } catch (const toml::parse_error& e) {
    fail("{}:{}:{}: {}", config, e.source().begin.line, e.source().begin.column, e.description());
  }
}

// Every task's name, for --only.
std::vector<std::string> task_names() {
  std::vector<std::string> names;
  for (const auto& t : run::run_tasks()) names.emplace_back(t.name);
  return names;
}

// The top-level keys: the config's own, then one table per task, then [sweep].
std::vector<std::string> top_keys() {
  std::vector<std::string> keys{"name", "out", "model_file", "weights", "schemes"};
  for (const auto& t : task_names()) keys.push_back(t);
  keys.emplace_back("sweep");
  return keys;
}

// "[synthetic], [model] or [ruler]": every task's table, for messages.
std::string task_tables() {
  const auto& tasks = run::run_tasks();
  std::string s;
  for (size_t i = 0; i < tasks.size(); ++i)
    s += fmt::format("{}[{}]", i == 0 ? "" : i + 1 == tasks.size() ? " or " : ", ", tasks[i].name);
  return s;
}

// Every task's table and what its rows measure, one paragraph each wrapped at 100 columns, for
// `kvq run --help`: the task table says it, so a new task needs no edit here.
std::string task_help() {
  std::string s;
  for (const run::Task& t : run::run_tasks()) {
    std::string line = fmt::format("  [{}]", t.name);
    std::string_view rest = t.help;
    while (!rest.empty()) {
      const size_t sp = rest.find(' ');
      const std::string_view word = rest.substr(0, sp);
      if (line.size() + 1 + word.size() > 100) {
        s += line + "\n";
        line = "    ";
      } else {
        line += ' ';
      }
      line += word;
      rest = sp == std::string_view::npos ? std::string_view{} : rest.substr(sp + 1);
    }
    s += line + "\n";
  }
  return s;
}

const toml::table* table_of(const toml::table& cfg, const Where& top, const char* name) {
  const auto* n = cfg.get(name);
  if (!n) return nullptr;
  KVQ_CHECK(n->is_table(), "{}: {} must be a table ([{}]), got {}", top.at(*n), name, name,
            type_of(*n));
  return n->as_table();
}

// Rows: explicit specs, then the sweep's combinations; a combination whose spec does not parse is
// skipped with a line, an explicit spec that does not parse is an error.
void add_rows(const std::vector<std::string>& names, bool from_sweep, std::vector<Row>& to,
              std::vector<std::string>& errors) {
  for (const auto& n : names) {
    try {
      to.push_back({parse_spec(n), n, from_sweep});
    } catch (const Error& e) {
      if (from_sweep)
        fmt::print(stderr, "kvq run: [sweep] {} skipped: {}\n", n, e.what());
      else
        errors.push_back(fmt::format("{}: {}", n, e.what()));
    }
  }
}

// The config's top-level rows: `schemes` and the [sweep]'s combinations.
std::vector<Row> top_rows(const toml::table& cfg, const RunFlags& o, const toml::table* sw,
                          std::vector<std::string>& errors) {
  std::vector<Row> rows;
  add_rows(string_list(cfg, Where{o.config, ""}, "schemes"), false, rows, errors);
  size_t swept = 0;
  if (sw) {
    const auto names = expand_sweep(*sw, Where{o.config, "sweep"});
    swept = names.size();
    add_rows(names, true, rows, errors);
  }
  KVQ_CHECK(!rows.empty() || !errors.empty() || swept > 0,
            "{}: no schemes (give schemes = [...] or a [sweep])", o.config);
  return rows;
}

// The tables of the tasks to run (--only: that one), each with its task.
std::vector<std::pair<const run::Task*, const toml::table*>> wanted_tasks(
    const std::vector<const toml::table*>& tables, const RunFlags& o) {
  std::vector<std::pair<const run::Task*, const toml::table*>> wanted;
  bool any = false;
  for (size_t i = 0; i < tables.size(); ++i) {
    if (!tables[i]) continue;
    any = true;
    const run::Task& t = run::run_tasks()[i];
    if (o.only.empty() || o.only == t.name) wanted.emplace_back(&t, tables[i]);
  }
  KVQ_CHECK(any, "{}: nothing to run: give a {} table", o.config, task_tables());
  KVQ_CHECK(!wanted.empty(), "{}: --only {} but the config has no [{}] table", o.config, o.only,
            o.only);
  return wanted;
}

// Reads and checks the config and plans every task it runs; nothing is written.
CheckedConfig check_config(RunFlags& o) {
  CheckedConfig c;
  c.text = read_file(o.config);
  c.cfg = parse_config(o.config, c.text);
  const Where top{o.config, ""};
  check_keys(c.cfg, top, top_keys());
  // The model: --model, else the config's model_file (a GGUF or a Hugging Face checkpoint folder),
  // else the fetched SmolLM2.
  if (o.model_file.empty()) o.model_file = get_or<std::string>(c.cfg, top, "model_file", "");
  // How a checkpoint folder's weights are held (results do not depend on it: the same logits).
  if (o.weights.empty()) o.weights = get_or<std::string>(c.cfg, top, "weights", "mapped");
  try {
    c.store = parse_weight_store(o.weights);
  } catch (const Error& e) {
    fail("{}: {} (the top-level key `weights`)", o.config, e.what());
  }
  std::vector<const toml::table*> tables;
  for (const auto& t : run::run_tasks()) tables.push_back(table_of(c.cfg, top, t.name));
  const toml::table* sw = table_of(c.cfg, top, "sweep");
  std::vector<std::string> errors;
  const std::vector<Row> rows = top_rows(c.cfg, o, sw, errors);
  const auto wanted = wanted_tasks(tables, o);
  // The model's shape from the GGUF's metadata alone, read once for the tasks that need it.
  std::optional<LlamaConfig> lc;
  run::TaskContext context;
  context.config = o.config;
  context.model_flag = o.model_file;
  context.smoke = o.smoke;
  context.errors = &errors;
  context.model_config = [&]() -> const LlamaConfig& {
    if (!lc) lc = LlamaModel::read_config(model_path(o.model_file));
    return *lc;
  };
  context.rows = [&](const toml::table& t,
                     const char* task) {  // its own `schemes`, else the config's
    if (!t.get("schemes")) return rows;
    std::vector<Row> own;
    add_rows(string_list(t, Where{o.config, task}, "schemes"), false, own, errors);
    return own;
  };
  for (const auto& [task, table] : wanted) c.plans.push_back({task, task->plan(*table, context)});
  if (errors.size() == 1) fail("{}: {}; nothing was run", o.config, errors[0]);
  if (!errors.empty()) {
    for (const auto& e : errors) fmt::print(stderr, "kvq run: {}\n", e);
    fail("{}: {} invalid row{} (listed above); nothing was run", o.config, errors.size(),
         errors.size() == 1 ? "" : "s");
  }
  KVQ_CHECK(std::any_of(c.plans.begin(), c.plans.end(),
                        [](const Planned& p) { return p.plan->has_rows(); }),
            "{}: every scheme was skipped (lines above); nothing to run", o.config);
  return c;
}

// The results folder (a shard's inside it), made, with the config saved in it: a different config
// only with --append (saved beside as config-N.toml). Returns {base, out}.
std::pair<std::string, std::string> prepare_out(const RunFlags& o, const CheckedConfig& c,
                                                const Shard& shard) {
  const Where top{o.config, ""};
  const std::string name = get_or<std::string>(c.cfg, top, "name", "run");
  const std::string base =
      !o.out.empty()
          ? o.out
          : get_or<std::string>(c.cfg, top, "out", "results/" + name) + (o.smoke ? "-smoke" : "");
  const std::string out =
      shard.n > 1
          ? (std::filesystem::path(base) / fmt::format("shard-{}-of-{}", shard.i, shard.n)).string()
          : base;
  const std::filesystem::path saved = std::filesystem::path(out) / "config.toml";
  run::remove_stale_temporaries(out, [](const std::string& name) {  // config.toml, config-N.toml
    return name == "config.toml" ||
           (name.rfind("config-", 0) == 0 && name.size() > 12 && name.ends_with(".toml"));
  });
  if (std::filesystem::exists(saved) && read_file(saved.string()) != c.text) {
    KVQ_CHECK(
        o.append,
        "{} holds results of a different config ({} differs from {}); give --out DIR for a new "
        "directory, or --append to add these rows to it",
        out, saved.string(), o.config);
    int n = 2;
    std::filesystem::path extra;
    do extra = std::filesystem::path(out) / fmt::format("config-{}.toml", n++);
    while (std::filesystem::exists(extra) && read_file(extra.string()) != c.text);
    write_file_atomic(extra.string(), c.text);
    fmt::print(stderr, "kvq run: --append: this config saved as {}\n", extra.string());
  } else {
    std::error_code ec;
    std::filesystem::create_directories(out, ec);
    KVQ_CHECK(!ec,
              "{}: cannot create the results directory ({}); give --out DIR somewhere writable",
              out, ec.message());
    write_file_atomic(saved.string(), c.text);
  }
  return {base, out};
}

// One task's rows of every shard folder into OUT, in the config's row order (`plan`); rows a shard
// holds that the config no longer names come after them. Nothing already in OUT is lost.
void merge_task(const std::string& task, const std::vector<std::pair<std::string, json>>& plan,
                const std::vector<std::filesystem::path>& shards,
                const std::filesystem::path& out) {
  std::vector<json> found;
  for (const auto& d : shards)
    if (std::filesystem::exists(d / (task + ".jsonl"))) {
      const run::ResultTable shard_rows(d, task);
      for (const auto& r : shard_rows.rows()) found.push_back(r);
    }
  run::ResultTable target(out, task);
  size_t added = 0, missing = 0;
  std::vector<bool> used(found.size(), false);
  for (const auto& [key, settings] : plan) {
    if (target.find(key, settings)) continue;
    bool hit = false;
    for (size_t i = 0; i < found.size() && !hit; ++i)
      if (!used[i] && found[i].value("key", "") == key &&
          found[i].value("settings", json()) == settings) {
        target.add(found[i]);
        used[i] = hit = true;
        ++added;
      }
    missing += !hit;
  }
  for (size_t i = 0; i < found.size(); ++i)
    if (!used[i] && !target.find(found[i].value("key", ""), found[i].value("settings", json()))) {
      target.add(found[i]);
      ++added;
    }
  fmt::print(stderr, "kvq run --merge: {} {} rows from {} shard folders into {}{}\n", added, task,
             shards.size(), out.string(),
             missing ? fmt::format("; {} rows of the config are in no shard yet", missing) : "");
}

// "synthetic.csv, model.csv": the tables the config's tasks write.
std::string tables_of(const std::vector<Planned>& plans) {
  std::string tables;
  for (const auto& p : plans)
    tables += fmt::format("{}{}.csv", tables.empty() ? "" : ", ", p.task->name);
  return tables;
}

// --merge: every task's rows of every OUT/shard-I-of-N/ folder into OUT (merge_task).
void merge_shards(const std::vector<Planned>& plans, const std::filesystem::path& out) {
  std::vector<std::filesystem::path> shards;
  if (std::filesystem::is_directory(out))
    for (const auto& e : std::filesystem::directory_iterator(out))
      if (e.is_directory() && e.path().filename().string().rfind("shard-", 0) == 0)
        shards.push_back(e.path());
  std::sort(shards.begin(), shards.end());
  KVQ_CHECK(!shards.empty(), "{}: no shard-I-of-N folders to merge (run with --shard I/N first)",
            out.string());
  for (const auto& p : plans) merge_task(p.task->name, p.plan->keys(), shards, out);
}

// Runs every task's rows of this shard, then says where the results are and how to plot them.
void run_plans(const RunFlags& o, const CheckedConfig& c, const Shard& shard,
               const std::string& base, const std::string& out) {
  std::string counts;
  for (const auto& t : run::run_tasks()) {
    size_t n = 0;
    for (const auto& p : c.plans)
      if (p.task == &t) n = p.plan->keys().size();
    counts += fmt::format("{}{} {}", counts.empty() ? "" : " + ", n, t.name);
  }
  fmt::print(stderr, "kvq run: {} rows{} -> {}\n", counts,
             shard.n > 1
                 ? fmt::format(" (shard {} of {}: every {}th row)", shard.i, shard.n, shard.n)
                 : "",
             out);
  std::optional<StopOnCtrlC> stop(std::in_place);
  try {
    run::ModelSource source{o.model_file, c.store, nullptr};
    for (const auto& p : c.plans)
      if (p.plan->has_rows()) p.plan->run(out, shard, source);
  } catch (const Interrupted&) {
    throw Interrupted(fmt::format(
        "interrupted (Ctrl-C): every finished row is in {}/; run the same command again to resume",
        out));
  }
  stop.reset();
  // The tables written and, per task, the scripts that draw them (each writes its figures beside
  // the results); a shard's rows are plotted after --merge, from the merged folder.
  std::vector<std::string> scripts;
  for (const auto& p : c.plans)
    for (const auto& sc : p.plan->plots())
      if (std::find(scripts.begin(), scripts.end(), sc) == scripts.end()) scripts.push_back(sc);
  std::string plots;
  for (const auto& sc : scripts)
    plots += fmt::format("{}.venv/bin/python experiments/plots/{} {}", plots.empty() ? "" : "; ",
                         sc, base);
  if (shard.n > 1)
    fmt::print(
        "results in {}/ ({}; when every shard is done: kvq run {}{} --merge, then plot: {})\n", out,
        tables_of(c.plans), o.config, o.out.empty() ? "" : " --out " + base, plots);
  else
    fmt::print("results in {}/ ({}; plot: {})\n", out, tables_of(c.plans), plots);
}

void run_config(RunFlags& o) {
  const Shard shard = parse_shard(o);
  const CheckedConfig c = check_config(o);
  if (o.check) {
    for (const auto& p : c.plans) p.plan->list();
    fmt::print("{}: ok, nothing run (--check)\n", o.config);
    return;
  }
  for (const auto& p : c.plans) p.plan->check_machine(o.config);
  // Only now is anything written.
  const auto [base, out] = prepare_out(o, c, shard);
  if (o.merge) {
    merge_shards(c.plans, out);
    fmt::print("results in {}/ ({})\n", out, tables_of(c.plans));
    return;
  }
  run_plans(o, c, shard, base, out);
}

}  // namespace

void register_run(CLI::App& app) {
  auto o = std::make_shared<RunFlags>();
  auto* c = app.add_subcommand(
      "run",
      "Run an experiment config (TOML): each task table it has runs its rows (run_tasks.cpp):\n" +
          task_help() +
      "Rows go to OUT/<task>.{jsonl,csv} as each finishes; rerunning resumes.\n"
      "Everything is checked before the first row runs: unknown keys, types and ranges "
      "(FILE:LINE:\n"
      "[table].key), every scheme against the shapes it will meet (a [sweep] combination that does "
      "not\n"
      "fit is skipped with a line; an explicit one is an error), the model and text files.\n"
      "Example: kvq run experiments/configs/default.toml   (see that file for every key)");
  c->add_option("config", o->config, "TOML config")->required();
  // kernels/backend.h's table: what [model].backend and [throughput].backends can name
  c->footer("Backends ([model].backend, [throughput].backends; kernels/backend.h):\n" +
            support_help());
  c->add_option("--out", o->out, "results directory (default: the config's `out`)");
  c->add_option("--model-file,--model", o->model_file,
                "GGUF file or Hugging Face checkpoint folder (default: the fetched SmolLM2)");
  c->add_option("--weights", o->weights,
                std::string(kWeightsHelp) + " (default: the config's `weights`, else mapped)")
      ->check(CLI::IsMember({"mapped", "packed", "fp32"}));
  c->add_option("--only", o->only, "run one task")->check(CLI::IsMember(task_names()));
  c->add_flag(
      "--append", o->append,
      "add rows to an OUT made by a different config (its config is kept; this one is saved\n"
      "beside it as config-N.toml); without it a changed config into an existing OUT is refused");
  c->add_flag("--check,--dry-run", o->check,
              "check the config and every row against its shapes, list the rows, run nothing");
  c->add_option(
      "--shard", o->shard,
      "I/N: run a deterministic 1/N of the rows (row j of each task goes to shard j % N + 1)\n"
      "into OUT/shard-I-of-N/; e.g. in a Slurm array --array=1-8: --shard $SLURM_ARRAY_TASK_ID/8");
  c->add_flag("--merge", o->merge,
              "merge the rows of every OUT/shard-I-of-N/ into OUT/, in the config's row order; "
              "runs nothing");
  c->add_flag(
      "--smoke", o->smoke,
      "the same rows at a tiny size, for CI: synthetic tokens <= 256, model windows <= 64\n"
      "tokens over 128 tokens of text, ruler its first task once at 1,024 tokens (4 generated),\n"
      "serve 3 requests of <= 16 prompt and <= 4 output tokens under the largest cap;\n"
      "results go to OUT-smoke unless --out is given");
  c->callback([o] { run_config(*o); });
}

}  // namespace kvq::cli
