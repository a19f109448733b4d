// What `kvq run`'s tasks share (experiments/run_task.h): config reading, result tables, stale
// temporaries, the model source.
#include "experiments/run_task.h"

#include <fmt/format.h>
#include <signal.h>

#include <algorithm>
#include <cerrno>
#include <fstream>
#include <set>

#include "cache/side.h"
#include "core/io.h"
#include "evaluation/model_files.h"
#include "evaluation/report.h"
#include "experiments/commands.h"

namespace kvq::cli::run {
namespace {

// Whether PID is a live kvq process: running (a killed writer whose parent died first stays a
// zombie until init reaps it, and kill(PID, 0) still succeeds then - CI saw it), a process
// rather than a thread (PIDs wrap at 32768 here), and kvq.
bool kvq_process_alive(long pid) {
  if (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) return false;
  std::ifstream status(fmt::format("/proc/{}/status", pid));
  std::string line, name, state;
  long tgid = -1;
  while (std::getline(status, line)) {
    const auto value = [&] {
      const size_t at = line.find_first_not_of(" \t", line.find(':') + 1);
      return at == std::string::npos ? std::string() : line.substr(at);
    };
    if (line.rfind("Name:", 0) == 0) name = value();
    if (line.rfind("State:", 0) == 0) state = value();
    if (line.rfind("Tgid:", 0) == 0) tgid = std::strtol(value().c_str(), nullptr, 10);
  }
  if (tgid < 0) return !status.eof();  // no /proc to ask: assume alive and keep the file
  return tgid == pid && name.rfind("kvq", 0) == 0 && !state.empty() && state[0] != 'Z' &&
         state[0] != 'X';
}

}  // namespace

void remove_stale_temporaries(const std::filesystem::path& dir,
                              const std::function<bool(const std::string&)>& ours) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) return;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    const size_t at = name.rfind(".tmp.");
    if (at == std::string::npos || !ours(name.substr(0, at))) continue;
    char* end = nullptr;
    const long pid = std::strtol(name.c_str() + at + 5, &end, 10);
    if (pid > 0 && *end == 0 && !kvq_process_alive(pid)) std::filesystem::remove(e.path(), ec);
  }
}

ResultTable::ResultTable(std::filesystem::path dir, std::string task)
    : dir_(std::move(dir)), task_(std::move(task)) {
  remove_stale_temporaries(dir_, [&](const std::string& name) {
    return name == task_ + ".jsonl" || name == task_ + ".csv";
  });
  const auto p = dir_ / (task_ + ".jsonl");
  if (std::filesystem::exists(p))
    for (auto& l : read_jsonl(p.string(), "; delete the file or the line to rerun")) {
      // find() and --merge read "key" and "settings" of every row: a hand-edited row of another
      // shape is named here, before any work, instead of failing later in nlohmann's words.
      const json& r = l.value;
      KVQ_CHECK(r.is_object() && (!r.contains("key") || r["key"].is_string()),
                "{}:{}: not a kvq run row (an object whose \"key\" is a string); delete the file "
                "or the line to rerun",
                p.string(), l.line);
      rows_.push_back(std::move(l.value));
    }
}

const json* ResultTable::find(const std::string& key, const json& settings) const {
  for (const auto& r : rows_)
    if (r.value("key", "") == key && r.value("settings", json()) == settings) return &r;
  return nullptr;
}

void ResultTable::add(json row) {
  // The record of how the row was made: the binary's version and commit, and the machine.
  if (!row.contains("kvq") && !build_version().empty()) row["kvq"] = build_version();
  if (!row.contains("machine")) row["machine"] = machine_name();
  rows_.push_back(std::move(row));
  std::string jl;
  for (const auto& r : rows_) jl += r.dump() + "\n";
  write_file_atomic((dir_ / (task_ + ".jsonl")).string(), jl);
  // CSV: the union of scalar columns, in first-seen order, then the settings the row was made
  // with (so rows of different settings stay apart in a spreadsheet too).
  std::vector<std::string> cols, set_cols;
  std::set<std::string> seen, set_seen;
  for (const auto& r : rows_)
    for (const auto& [k, v] : r.items()) {
      if (!v.is_structured() && seen.insert(k).second) cols.push_back(k);
      if (k == "settings" && v.is_object())
        for (const auto& [sk, sv] : v.items())
          if (!sv.is_structured() && set_seen.insert(sk).second) set_cols.push_back(sk);
    }
  auto cell = [](const json& v) {  // a string quoted, its quotes doubled (RFC 4180)
    if (!v.is_string()) return v.dump();
    std::string q = "\"";
    for (char c : v.get<std::string>()) q += c == '"' ? std::string("\"\"") : std::string(1, c);
    return q + "\"";
  };
  std::string csv;
  for (size_t i = 0; i < cols.size(); ++i) csv += (i ? "," : "") + cols[i];
  for (const auto& k : set_cols) csv += ",settings." + k;
  csv += "\n";
  for (const auto& r : rows_) {
    for (size_t i = 0; i < cols.size(); ++i) {
      if (i) csv += ",";
      if (r.contains(cols[i])) csv += cell(r[cols[i]]);
    }
    const json st = r.value("settings", json::object());
    for (const auto& k : set_cols) {
      csv += ",";
      if (st.is_object() && st.contains(k)) csv += cell(st[k]);
    }
    csv += "\n";
  }
  write_file_atomic((dir_ / (task_ + ".csv")).string(), csv);
}

const char* type_of(const toml::node& n) {
  switch (n.type()) {
    case toml::node_type::string:
      return "a string";
    case toml::node_type::integer:
      return "an integer";
    case toml::node_type::floating_point:
      return "a number";
    case toml::node_type::boolean:
      return "a boolean";
    case toml::node_type::array:
      return "an array";
    case toml::node_type::table:
      return "a table";
    default:
      return "a date or time";
  }
}

void check_keys(const toml::table& t, const Where& w, const std::vector<std::string>& allowed) {
  for (const auto& [k, v] : t) {
    if (std::find(allowed.begin(), allowed.end(), k.str()) != allowed.end()) continue;
    std::string list;
    for (const auto& a : allowed) list += (list.empty() ? "" : ", ") + a;
    fail("{}: unknown key {} (allowed: {})", w.at(v), w.key(k.str()), list);
  }
}

json with_fields(json settings, std::initializer_list<std::pair<const char*, json>> fields) {
  for (const auto& [key, value] : fields) settings[key] = value;
  return settings;
}

std::vector<std::string> string_list(const toml::table& t, const Where& w, std::string_view key) {
  std::vector<std::string> out;
  const auto* n = t.get(key);
  if (!n) return out;
  const auto* a = n->as_array();
  KVQ_CHECK(a, "{}: {} must be an array of strings (got {})", w.at(*n), w.key(key), type_of(*n));
  for (const auto& e : *a) {
    auto s = e.value_exact<std::string>();
    KVQ_CHECK(s.has_value(), "{}: {} must be an array of strings (an element is {})", w.at(e),
              w.key(key), type_of(e));
    out.push_back(*s);
  }
  return out;
}

AttentionBackend check_model_backend(const std::string& backend, const Where& w) {
  try {
    const AttentionBackend b = parse_backend(backend);  // kernels/backend.h: the one list
    require_model(b);
    return b;
  } catch (const Error& e) {
    fail("{}: {}: {}", w.file, w.key("backend"), e.what());
  }
}

void require_available_here(const Where& w, std::string_view key, const std::string& backend) {
  try {
    require_available(parse_backend(backend));
  } catch (const Error& e) {
    fail("{}: {} \"{}\": {}", w.file, w.key(key), backend, e.what());
  }
}

namespace {

// Whether spec can hold heads x head_dim for both roles; the reason when not. `layers`: the
// model's layer count, or 0 for a task that measures one tensor (no per-layer specs there).
std::string misfit(const SchemeSpec& spec, int64_t heads, int64_t dim, int layers,
                   const std::function<std::string(const SchemeSpec&)>& also) {
  if (spec.layered() && layers == 0)
    return "a per-layer spec (SPEC@LAYERS=SPEC) is for the model's cache; this task measures one "
           "tensor (give it in [model] schemes)";
  try {
    if (spec.layered()) check_layers(spec, layers, "the model");
    for (const SchemeSpec& one : spec.distinct_layer_specs())  // every layer's scheme
      for (Role role : {Role::Key, Role::Value}) (void)make_side(one, role, heads, dim);
  } catch (const Error& e) {
    return e.what();
  }
  return also ? also(spec) : "";
}

}  // namespace

std::vector<SchemeSpec> fitting(const std::vector<Row>& rows, const std::string& task,
                                int64_t heads, int64_t dim, std::vector<std::string>& errors,
                                int layers,
                                const std::function<std::string(const SchemeSpec&)>& also) {
  std::vector<SchemeSpec> out;
  for (const Row& r : rows) {
    const std::string why = misfit(r.spec, heads, dim, layers, also);
    if (why.empty()) {
      out.push_back(r.spec);
    } else if (r.from_sweep) {
      fmt::print(stderr, "kvq run: [sweep] {} skipped for {} (heads {}, head_dim {}): {}\n", r.text,
                 task, heads, dim, why);
    } else {
      errors.push_back(
          fmt::format("{} ({} rows: heads {}, head_dim {}): {}", r.text, task, heads, dim, why));
    }
  }
  return out;
}

void list_rows(const char* task, const std::vector<SchemeSpec>& specs) {
  std::string names;
  for (const auto& s : specs) names += (names.empty() ? "" : ", ") + s.canonical();
  fmt::print("{} rows ({}): {}\n", task, specs.size(), names.empty() ? "-" : names);
}

std::vector<std::pair<std::string, json>> TaskPlan::keys() const {
  std::vector<std::pair<std::string, json>> out;
  for (const json& settings : case_settings())
    for (const SchemeSpec& s : specs) out.emplace_back(s.canonical(), settings);
  return out;
}

std::vector<SchemeSpec> TaskContext::model_rows(const toml::table& table, const char* task,
                                                AttentionBackend backend, bool pre_rope) const {
  const LlamaConfig& m = model_config();
  // the backend over this model's shape and its reference cache: one error for the task
  const std::string shape = unsupported_shape(backend, m.kv_heads, m.head_dim, m.heads);
  const std::string ref = model_unsupported(backend, reference_spec(backend));
  if (!shape.empty() || !ref.empty())
    errors->push_back(fmt::format("[{}] backend {} cannot run this model: it does not run {}", task,
                                  to_string(backend), shape.empty() ? ref : shape));
  return fitting(rows(table, task), task, m.kv_heads, m.head_dim, *errors, m.layers,
                 [&](const SchemeSpec& s) {
                   const std::string why = model_unsupported(backend, s, pre_rope);
                   return why.empty() ? why
                                      : fmt::format("backend {} does not run {} in the model",
                                                    to_string(backend), why);
                 });
}

eval::LoadedModel& ModelSource::get(AttentionBackend backend) {
  if (!loaded)
    loaded = std::make_unique<eval::LoadedModel>(eval::load_model(model_path(flag), store));
  loaded->model.set_backend(backend);
  return *loaded;
}

}  // namespace kvq::cli::run
