// kvq run CONFIG.toml: an experiment sweep. Every scheme in the config (plus any [sweep]
// expansion) is measured on synthetic K/V (reconstruction and attention metrics) and, when the
// config has a [model] table, on the real model (perplexity, KLD, top-1 against the fp32 cache).
// Each finished row is appended to OUT/<task>.jsonl and OUT/<task>.csv, both rewritten
// atomically, so an interrupted run loses nothing and a rerun resumes where it stopped (rows whose
// key and settings match are skipped).
#include <fmt/format.h>
#include <signal.h>

#include <cerrno>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>
#include <tuple>
#include <toml++/toml.h>

#include "core/error.h"
#include "core/footprint.h"
#include "core/gguf.h"
#include "core/io.h"
#include "experiments/commands.h"
#include "evaluation/model_eval.h"
#include "evaluation/model_files.h"
#include "evaluation/planner.h"
#include "evaluation/report.h"
#include "evaluation/ruler.h"
#include "evaluation/synthetic.h"
#include "evaluation/throughput.h"
#include "kernels/backend.h"
#include "kernels/cpu/attention.h"
#include "reference_cpu/attention.h"
#include "reference_cpu/metrics.h"
#include "reference_cpu/quantize.h"
#include "model/llama.h"
#include "model/tokenizer.h"

namespace kvq::cli {
namespace {

using json = nlohmann::ordered_json;

// Ctrl-C (StopOnCtrlC): the first stops the run between rows (synthetic) or chunks (model), after
// which every finished row is on disk and a rerun resumes; a second one kills at once.

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

// A run killed inside a write (SIGKILL, power loss) leaves NAME.tmp.PID beside the intact NAME
// (core/io.cpp writes, then renames). Removes those in dir whose NAME this run writes
// (`ours(NAME)`) once process PID is gone: never while another kvq on the same folder may still
// be writing one.
template <class Ours>
void remove_stale_temporaries(const std::filesystem::path& dir, Ours ours) {
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

// One results table: rows keyed by "key", persisted as jsonl + csv after every row.
class ResultTable {
 public:
  ResultTable(std::filesystem::path dir, std::string task) : dir_(std::move(dir)), task_(std::move(task)) {
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
  const std::vector<json>& rows() const { return rows_; }
  // The stored row with this key and these settings, if any.
  const json* find(const std::string& key, const json& settings) const {
    for (const auto& r : rows_)
      if (r.value("key", "") == key && r.value("settings", json()) == settings) return &r;
    return nullptr;
  }
  void add(json row) {
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

 private:
  std::filesystem::path dir_;
  std::string task_;
  std::vector<json> rows_;
};

// Where a key lives, for messages: "FILE:LINE: [model].ctx must be ...".
struct Where {
  std::string file, table;  // table "" for the top level
  std::string key(std::string_view k) const {
    return table.empty() ? std::string(k) : fmt::format("[{}].{}", table, k);
  }
  std::string at(const toml::node& n) const {
    return n.source().begin.line > 0 ? fmt::format("{}:{}", file, n.source().begin.line) : file;
  }
};

const char* type_of(const toml::node& n) {
  switch (n.type()) {
    case toml::node_type::string: return "a string";
    case toml::node_type::integer: return "an integer";
    case toml::node_type::floating_point: return "a number";
    case toml::node_type::boolean: return "a boolean";
    case toml::node_type::array: return "an array";
    case toml::node_type::table: return "a table";
    default: return "a date or time";
  }
}

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

// Every key of t must be in `allowed` (sweep placeholders are checked by expand_sweep).
void check_keys(const toml::table& t, const Where& w, const std::vector<std::string>& allowed) {
  for (const auto& [k, v] : t) {
    if (std::find(allowed.begin(), allowed.end(), k.str()) != allowed.end()) continue;
    std::string list;
    for (const auto& a : allowed) list += (list.empty() ? "" : ", ") + a;
    fail("{}: unknown key {} (allowed: {})", w.at(v), w.key(k.str()), list);
  }
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

// [sweep] template = "int{b}:k={k},v=token,g={g}" with b = [2, 4], g = [32, 128], ...; the
// combinations listed in exclude = [...] are left out.
std::vector<std::string> expand_sweep(const toml::table& sw, const Where& w) {
  const std::string tmpl = get_or<std::string>(sw, w, "template", "");
  KVQ_CHECK(!tmpl.empty(), "{}: [sweep] needs a template, e.g. template = \"kivi{{b}}:g={{g}}\"", w.file);
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
        if (auto i = e.value_exact<int64_t>()) val = std::to_string(*i);
        else if (auto st = e.value_exact<std::string>()) val = *st;
        else fail("{}: {} values must be integers or strings (got {})", w.at(e), w.key(k.str()), type_of(e));
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

// The rows of a task: its specs with where each came from (a sweep's bad combinations are
// skipped with a line; an explicit spec that does not fit is an error).
struct Row {
  SchemeSpec spec;
  std::string text;  // as written in the config
  bool from_sweep = false;
};

// Whether spec can hold heads x head_dim for both roles; the reason when not. `layers`: the
// model's layer count, or 0 for a task that measures one tensor (no per-layer specs there).
std::string misfit(const SchemeSpec& spec, int64_t heads, int64_t dim, int layers) {
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
  return "";
}

// Keeps the rows that fit [heads, dim]; a sweep row that does not is skipped with a line, an
// explicit one is added to `errors`.
std::vector<SchemeSpec> fitting(const std::vector<Row>& rows, const std::string& task, int64_t heads,
                                int64_t dim, std::vector<std::string>& errors, int layers = 0) {
  std::vector<SchemeSpec> out;
  for (const Row& r : rows) {
    const std::string why = misfit(r.spec, heads, dim, layers);
    if (why.empty()) {
      out.push_back(r.spec);
    } else if (r.from_sweep) {
      fmt::print(stderr, "kvq run: [sweep] {} skipped for {} (heads {}, head_dim {}): {}\n", r.text,
                 task, heads, dim, why);
    } else {
      errors.push_back(fmt::format("{} ({} rows: heads {}, head_dim {}): {}", r.text, task, heads, dim, why));
    }
  }
  return out;
}

// --shard I/N: row j of a task (synthetic rows in config order; model rows ctx by ctx, schemes in
// config order within each) belongs to shard j % N + 1.
struct Shard {
  int i = 1, n = 1;
  bool take(size_t j) const { return static_cast<int>(j % static_cast<size_t>(n)) == i - 1; }
};

struct SyntheticPlan {
  SyntheticSpec ks;
  int64_t gqa = 4, queries = 4;
  json settings;
  std::vector<SchemeSpec> specs;
};

SyntheticPlan plan_synthetic(const toml::table& syn, const Where& w) {
  check_keys(syn, w, {"tokens", "heads", "head_dim", "outliers", "outlier_scale", "gqa", "queries", "seed"});
  SyntheticPlan p;
  p.ks.shape = {get_or<int64_t>(syn, w, "tokens", 2048), get_or<int64_t>(syn, w, "heads", 8),
                get_or<int64_t>(syn, w, "head_dim", 128)};
  const int64_t outliers = get_or<int64_t>(syn, w, "outliers", 2);
  p.ks.outlier_scale = static_cast<float>(get_or<double>(syn, w, "outlier_scale", 12.0));
  const int64_t seed = get_or<int64_t>(syn, w, "seed", 0);
  p.gqa = get_or<int64_t>(syn, w, "gqa", 4);
  p.queries = get_or<int64_t>(syn, w, "queries", 4);
  for (const auto& [k, v] : std::initializer_list<std::pair<const char*, int64_t>>{
           {"tokens", p.ks.shape.tokens}, {"heads", p.ks.shape.heads}, {"head_dim", p.ks.shape.dim},
           {"gqa", p.gqa}, {"queries", p.queries}})
    KVQ_CHECK(v >= 1 && v <= (int64_t{1} << 24), "{}: {} must be between 1 and 16777216, got {}", w.file, w.key(k), v);
  KVQ_CHECK(outliers >= 0 && outliers <= p.ks.shape.dim, "{}: {} must be between 0 and head_dim {}, got {}",
            w.file, w.key("outliers"), p.ks.shape.dim, outliers);
  KVQ_CHECK(seed >= 0, "{}: {} must be >= 0, got {}", w.file, w.key("seed"), seed);
  KVQ_CHECK(std::isfinite(p.ks.outlier_scale) && p.ks.outlier_scale > 0, "{}: {} must be a positive number",
            w.file, w.key("outlier_scale"));
  KVQ_CHECK(p.ks.shape.tokens * p.ks.shape.heads * p.ks.shape.dim <= (int64_t{1} << 28),
            "{}: [synthetic] tokens x heads x head_dim = {} values; at most 2^28 (1 GiB of float32)", w.file,
            p.ks.shape.tokens * p.ks.shape.heads * p.ks.shape.dim);
  p.ks.outlier_channels = static_cast<int>(outliers);
  p.ks.seed = static_cast<uint64_t>(seed);
  p.settings = {{"tokens", p.ks.shape.tokens}, {"heads", p.ks.shape.heads}, {"head_dim", p.ks.shape.dim},
                {"outliers", p.ks.outlier_channels}, {"outlier_scale", p.ks.outlier_scale}, {"seed", p.ks.seed},
                {"gqa", p.gqa}, {"queries", p.queries}};
  return p;
}

struct ModelPlan {
  eval::PplOptions o;           // o.ctx: the first of ctxs
  std::vector<int> ctxs;        // one set of rows per window length (`ctx = [512, 2048]`)
  std::string text, backend;
  bool pre = false, rot = false;
  json settings;
  std::vector<SchemeSpec> specs;
};

ModelPlan plan_model(const toml::table& mt, const Where& w, const std::string& model_flag) {
  check_keys(mt, w, {"text", "ctx", "stride", "chunk", "max_tokens", "score_from", "pre_rope", "hadamard", "backend",
                     "schemes"});
  ModelPlan p;
  // ctx: one window length, or a list of them (rows per length: quality against context).
  std::vector<int64_t> ctx_list;
  if (const auto* n = mt.get("ctx"); n && n->as_array()) {
    for (const auto& e : *n->as_array()) {
      const auto v = e.value_exact<int64_t>();
      KVQ_CHECK(v.has_value(), "{}: {} must be an integer or an array of integers (an element is {})", w.at(e),
                w.key("ctx"), type_of(e));
      ctx_list.push_back(*v);
    }
    KVQ_CHECK(!ctx_list.empty(), "{}: {} is an empty array; give one or more window lengths", w.at(*n), w.key("ctx"));
  } else {
    ctx_list.push_back(get_or<int64_t>(mt, w, "ctx", 512));
  }
  const int64_t ctx = *std::min_element(ctx_list.begin(), ctx_list.end()), ctx_max = *std::max_element(ctx_list.begin(), ctx_list.end()),
                stride = get_or<int64_t>(mt, w, "stride", 0), chunk = get_or<int64_t>(mt, w, "chunk", 256);
  p.o.max_tokens = get_or<int64_t>(mt, w, "max_tokens", kDefaultMaxTokens);
  // llama-perplexity's convention is score_from = ctx / 2 (the second half of each window).
  const int64_t score_from = get_or<int64_t>(mt, w, "score_from", 0);
  KVQ_CHECK(ctx >= 2 && ctx_max <= 1 << 20, "{}: {} must be between 2 and 1048576, got {}", w.file, w.key("ctx"),
            ctx >= 2 ? ctx_max : ctx);
  KVQ_CHECK(p.o.max_tokens >= ctx_max, "{}: {} {} is shorter than the longest window, {} = {}", w.file,
            w.key("max_tokens"), p.o.max_tokens, w.key("ctx"), ctx_max);
  for (int64_t c : ctx_list) p.ctxs.push_back(static_cast<int>(c));
  KVQ_CHECK(stride >= 0 && stride <= ctx, "{}: {} must be between 0 (= ctx) and ctx {}, got {}", w.file,
            w.key("stride"), ctx, stride);
  KVQ_CHECK(chunk >= 1 && chunk <= 1 << 20, "{}: {} must be between 1 and 1048576, got {}", w.file, w.key("chunk"), chunk);
  KVQ_CHECK(p.o.max_tokens >= 2, "{}: {} must be at least 2, got {}", w.file, w.key("max_tokens"), p.o.max_tokens);
  KVQ_CHECK(score_from >= 0 && score_from < ctx - 1, "{}: {} must be between 0 and ctx - 2 = {}, got {}", w.file,
            w.key("score_from"), ctx - 2, score_from);
  p.o.score_from = static_cast<int>(score_from);
  p.o.ctx = p.ctxs.front();
  p.o.stride = static_cast<int>(stride);
  p.o.chunk = static_cast<int>(chunk);
  p.text = get_or<std::string>(mt, w, "text", "kjv");
  p.pre = get_or<bool>(mt, w, "pre_rope", false);
  p.rot = get_or<bool>(mt, w, "hadamard", false);
  p.backend = get_or<std::string>(mt, w, "backend", "cpu");
  try {
    require_host(parse_backend(p.backend));  // kernels/backend.h: the one list
  } catch (const Error& e) {
    fail("{}: {}: {}", w.file, w.key("backend"), e.what());
  }
  (void)read_text(p.text);  // the files exist and are text before any work starts
  (void)model_path(model_flag);  // the model file exists before any work starts
  p.settings = {{"text", p.text}, {"ctx", p.o.ctx}, {"stride", p.o.stride}, {"max_tokens", p.o.max_tokens},
                {"pre_rope", p.pre}, {"backend", p.backend}};
  if (p.rot) p.settings["hadamard"] = true;  // only when set, so rows of earlier runs still match
  if (p.o.score_from > 0) p.settings["score_from"] = p.o.score_from;
  if (!model_flag.empty()) p.settings["model"] = model_flag;  // not the default SmolLM2: say which
  return p;
}

void run_synthetic(const SyntheticPlan& p, const std::filesystem::path& out, const Shard& shard) {
  const SyntheticSpec& ks = p.ks;
  const std::vector<SchemeSpec>& specs = p.specs;
  const int64_t gqa = p.gqa, nqueries = p.queries;
  SyntheticSpec vs = ks;
  vs.outlier_channels = 0;
  vs.seed = ks.seed + 1;
  const Tensor3 k = synthetic_kv(ks), v = synthetic_kv(vs);
  std::mt19937_64 rng(ks.seed + 2);
  std::normal_distribution<float> nd;
  std::vector<std::vector<float>> qs(static_cast<size_t>(nqueries), std::vector<float>(static_cast<size_t>(ks.shape.heads * gqa * ks.shape.dim)));
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
    const auto mk = recon_metrics(k.data, rk.values.data), mv = recon_metrics(v.data, rv.values.data);
    const auto ksd = make_side(spec, Role::Key, k), vsd = make_side(spec, Role::Value, v);
    AttentionMetrics am;
    for (const auto& q : qs) {
      const auto m = attention_metrics(q.data(), ks.shape.heads * gqa, *kr, *vr, *ksd, *vsd, 32);
      am.kl += m.kl / static_cast<double>(nqueries);
      am.output_nmse += m.output_nmse / static_cast<double>(nqueries);
      am.topk_overlap += m.topk_overlap / static_cast<double>(nqueries);
    }
    auto snr = [](double s) { return std::isfinite(s) ? json(s) : json(nullptr); };
    json row = {{"key", key}, {"scheme", key}, {"settings", settings},
                {"key_bits", rk.footprint.effective_bits()}, {"value_bits", rv.footprint.effective_bits()},
                {"key_bytes_per_token", rk.footprint.total_bytes() / static_cast<double>(ks.shape.tokens)},
                {"value_bytes_per_token", rv.footprint.total_bytes() / static_cast<double>(ks.shape.tokens)},
                {"key_snr_db", snr(mk.snr_db)}, {"value_snr_db", snr(mv.snr_db)},
                {"key_nmse", mk.nmse}, {"value_nmse", mv.nmse}, {"key_max_abs_err", mk.max_abs_err},
                {"value_max_abs_err", mv.max_abs_err}, {"attn_kl", am.kl}, {"attn_output_nmse", am.output_nmse},
                {"attn_top32_overlap", am.topk_overlap},
                {"key_scales_from", scales_from(spec, Role::Key, ks.shape.tokens)},
                {"value_scales_from", scales_from(spec, Role::Value, ks.shape.tokens)}};
    const bool kp = scales_from_prefix(spec, Role::Key, ks.shape.tokens),
               vp = scales_from_prefix(spec, Role::Value, ks.shape.tokens);
    fmt::print(stderr, "[synthetic {}/{}] {}: key SNR {:.2f} dB, value SNR {:.2f} dB, attention KL {:.3g}{}\n", i,
               specs.size(), key, mk.snr_db, mv.snr_db, am.kl,
               kp || vp ? fmt::format(" (scales from {})", row[kp ? "key_scales_from" : "value_scales_from"].get<std::string>())
                        : "");
    table.add(std::move(row));
  }
}

// The real model, loaded at most once per `kvq run` (by the first task that has rows to run) and
// shared by the [model] and [needle] tasks.
struct ModelSource {
  std::string flag;  // --model-file (empty: the fetched model); resolved when a task needs it
  std::unique_ptr<eval::LoadedModel> loaded;
  eval::LoadedModel& get(AttentionBackend backend) {
    if (!loaded) loaded = std::make_unique<eval::LoadedModel>(eval::load_model(model_path(flag)));
    loaded->model.set_backend(backend);
    return *loaded;
  }
};

void run_model(const ModelPlan& p, const std::filesystem::path& out, const Shard& shard,
               ModelSource& source) {
  const std::vector<SchemeSpec>& specs = p.specs;
  const bool pre = p.pre, rot = p.rot;
  const AttentionBackend attn = parse_backend(p.backend);
  ResultTable table(out, "model");
  // The rows still to run, per window length (ctx is a setting of every row).
  std::vector<std::pair<int, std::vector<const SchemeSpec*>>> todo;
  size_t n_todo = 0;
  size_t j = 0;
  for (int ctx : p.ctxs) {
    json settings = p.settings;
    settings["ctx"] = ctx;
    std::vector<const SchemeSpec*> t;
    for (const auto& s : specs)
      if (shard.take(j++) && !table.find(s.canonical(), settings)) t.push_back(&s);
    n_todo += t.size();
    if (!t.empty()) todo.emplace_back(ctx, std::move(t));
  }
  if (n_todo == 0) {
    fmt::print(stderr, "[model] all {} rows done already\n",
               (specs.size() * p.ctxs.size() + static_cast<size_t>(shard.n - shard.i)) / static_cast<size_t>(shard.n));
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
    json settings = p.settings;
    settings["ctx"] = ctx;
    std::vector<CacheOptions> caches;
    for (const SchemeSpec* s : rows) {
      CacheOptions co;
      // hadamard = true: rot=hadamard on every scheme (its rows say so in settings.hadamard)
      co.spec = rot ? with_rotation(*s, RotSpec{true}) : *s;
      co.pre_rope = pre;
      caches.push_back(co);
    }
    // All schemes in one pass: the fp32 reference of each window is computed once.
    const std::string tag = p.ctxs.size() > 1 ? fmt::format("model, ctx {}", ctx) : std::string("model");
    const auto results = eval::perplexity(m, caches, ids, o, [&](const std::string& msg) {
      fmt::print(stderr, "[{}, {} schemes] {}\n", tag, rows.size(), msg);
    });
    for (size_t i = 0; i < rows.size(); ++i) {
      const SchemeSpec* s = rows[i];
      const eval::PplResult& r = results[i];
      // K and V of a ctx-token window summed over the layers (each layer's own scheme)
      const planner::RequestFootprint f = planner::request_footprint(
          planner::ModelDims{"model", m.config().layers, m.config().kv_heads, m.config().head_dim,
                             0.0},
          *s, o.ctx);
      // Each statistic with its 95% interval (x_lo, x_hi: null when it could not be estimated) and
      // the fraction of the attended K/V that was quantized (eval::result_fields).
      json row = {{"key", s->canonical()},
                  {"scheme", s->canonical()},
                  {"settings", settings},
                  {"bits", (f.key.effective_bits() + f.value.effective_bits()) / 2},
                  {"bytes_per_token", f.total_bytes() / o.ctx}};
      for (const auto& [name, value] : eval::result_fields(r)) row[name] = value;
      // which tokens of each window set the scales (the first layer's scheme; issue 50 item 3)
      const SchemeSpec first_layer =
          resolve_layers(*s, m.config().layers, "the model").for_layer(0);
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
                 key_prefix || value_prefix
                     ? fmt::format(", scales from {} of each window", key_prefix ? key_from : value_from)
                     : "");
      if (!eval::exact_by_design(*s) && r.quantized < eval::kMinQuantizedFraction)
        fmt::print(stderr, "kvq run: warning: {}\n",
                   eval::little_quantized(s->canonical(), ctx, r.quantized));
    }
  }
}

// [needle]: passkey retrieval, ctx x depth x trials, every scheme against the fp32 cache on the same
// prompt (kvq model needle's prompts and keys).
struct NeedlePlan {
  std::vector<int> ctxs;
  std::vector<double> depths;
  int trials = 5;
  uint64_t seed = 1;
  std::string text, backend;
  json settings;
  std::vector<SchemeSpec> specs;
};

NeedlePlan plan_needle(const toml::table& nt, const Where& w, const std::string& model_flag, int context) {
  check_keys(nt, w, {"text", "ctx", "depth", "trials", "seed", "backend", "schemes"});
  NeedlePlan p;
  auto numbers = [&](const char* key, auto def) {
    std::vector<decltype(def)> out;
    const auto* n = nt.get(key);
    if (!n) return std::vector<decltype(def)>{def};
    const auto* a = n->as_array();
    KVQ_CHECK(a && !a->empty(), "{}: {} must be a non-empty array of numbers", w.at(*n), w.key(key));
    for (const auto& e : *a) {
      if constexpr (std::is_same_v<decltype(def), int>) {
        const auto v = e.value_exact<int64_t>();
        KVQ_CHECK(v.has_value(), "{}: {} must hold integers (an element is {})", w.at(e), w.key(key), type_of(e));
        out.push_back(static_cast<int>(*v));
      } else {
        KVQ_CHECK(e.is_number(), "{}: {} must hold numbers (an element is {})", w.at(e), w.key(key), type_of(e));
        out.push_back(*e.value<double>());
      }
    }
    return out;
  };
  p.ctxs = numbers("ctx", 2048);
  p.depths = numbers("depth", 0.5);
  const int64_t trials = get_or<int64_t>(nt, w, "trials", 5), seed = get_or<int64_t>(nt, w, "seed", 1);
  for (int c : p.ctxs)
    KVQ_CHECK(c >= 256 && c <= context, "{}: {} {} is outside [256, {}] (the model's context)", w.file, w.key("ctx"), c,
              context);
  for (double d : p.depths)
    KVQ_CHECK(d >= 0 && d <= 1, "{}: {} {} is outside [0, 1]", w.file, w.key("depth"), d);
  KVQ_CHECK(trials >= 1 && trials <= 10000, "{}: {} must be between 1 and 10000, got {}", w.file, w.key("trials"), trials);
  KVQ_CHECK(seed >= 0, "{}: {} must be >= 0, got {}", w.file, w.key("seed"), seed);
  p.trials = static_cast<int>(trials);
  p.seed = static_cast<uint64_t>(seed);
  p.text = get_or<std::string>(nt, w, "text", "kjv");
  p.backend = get_or<std::string>(nt, w, "backend", "cpu");
  try {
    require_host(parse_backend(p.backend));  // kernels/backend.h: the one list
  } catch (const Error& e) {
    fail("{}: {}: {}", w.file, w.key("backend"), e.what());
  }
  (void)read_text(p.text);
  (void)model_path(model_flag);  // the model file exists before any work starts
  p.settings = {{"text", p.text}, {"seed", p.seed}, {"backend", p.backend}};
  return p;
}

void run_needle(const NeedlePlan& p, const std::filesystem::path& out, const Shard& shard,
                ModelSource& source) {
  ResultTable table(out, "needle");
  const eval::LoadedModel* L = nullptr;
  eval::NeedleText text;
  CacheOptions ref;
  ref.spec = parse_spec("fp32");
  uint64_t st = eval::needle_seed(p.seed);
  size_t j = 0, done = 0, total = p.ctxs.size() * p.depths.size() * static_cast<size_t>(p.trials);
  for (int ctx : p.ctxs)
    for (double depth : p.depths)
      for (int trial = 0; trial < p.trials; ++trial, ++j) {
        const int key = eval::needle_key(st);  // drawn for every case, so keys never depend on what is done
        if (!shard.take(j)) continue;
        json settings = p.settings;
        settings["ctx"] = ctx;
        settings["depth"] = depth;
        settings["trial"] = trial;
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
          table.add({{"key", s->canonical()}, {"scheme", s->canonical()}, {"settings", settings}, {"passkey", key},
                     {"correct", b.correct}, {"logprob", b.logprob}, {"fp32_correct", a.correct},
                     {"fp32_logprob", a.logprob},
                     {"seconds", std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()}});
          check_stop();
        }
        fmt::print(stderr, "[needle {}/{}] ctx {} depth {} trial {}: fp32 {}\n", done, total, ctx, depth, trial,
                   a.correct ? "found" : "missed");
      }
}

// [ruler]: the RULER-style suite (evaluation/ruler.h), length x task x sample, every scheme
// against the fp32 cache on the same prompt and the same greedy decoding.
struct RulerPlan {
  std::vector<std::string> tasks;
  std::vector<int> lengths{1024, 2048, 4096};
  int samples = 5;
  uint64_t seed = 1;
  std::string haystack, backend;
  int max_new = 0;  // --smoke: at most this many generated tokens (0: each task's budget)
  json settings;
  std::vector<SchemeSpec> specs;
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
    json st = settings;
    st["length"] = c.length;
    st["task"] = c.task;
    st["sample"] = c.sample;
    return st;
  }
};

RulerPlan plan_ruler(const toml::table& rt, const Where& w, const std::string& model_flag, int context) {
  check_keys(rt, w, {"tasks", "lengths", "samples", "seed", "haystack", "backend", "schemes"});
  RulerPlan p;
  if (rt.get("tasks")) {
    p.tasks = string_list(rt, w, "tasks");
    KVQ_CHECK(!p.tasks.empty(), "{}: {} is an empty array; give task names", w.file, w.key("tasks"));
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
    KVQ_CHECK(a && !a->empty(), "{}: {} must be a non-empty array of integers", w.at(*n), w.key("lengths"));
    p.lengths.clear();
    for (const auto& e : *a) {
      const auto v = e.value_exact<int64_t>();
      KVQ_CHECK(v.has_value(), "{}: {} must hold integers (an element is {})", w.at(e), w.key("lengths"), type_of(e));
      KVQ_CHECK(*v >= 1024 && *v <= context, "{}: {} {} is outside [1024, {}] (the model's context)", w.at(e),
                w.key("lengths"), *v, context);
      p.lengths.push_back(static_cast<int>(*v));
    }
  }
  for (int l : p.lengths)
    KVQ_CHECK(l <= context, "{}: {} {} exceeds the model's context {}", w.file, w.key("lengths"), l, context);
  const int64_t samples = get_or<int64_t>(rt, w, "samples", 5), seed = get_or<int64_t>(rt, w, "seed", 1);
  KVQ_CHECK(samples >= 1 && samples <= 10000, "{}: {} must be between 1 and 10000, got {}", w.file, w.key("samples"),
            samples);
  KVQ_CHECK(seed >= 0, "{}: {} must be >= 0, got {}", w.file, w.key("seed"), seed);
  p.samples = static_cast<int>(samples);
  p.seed = static_cast<uint64_t>(seed);
  p.haystack = get_or<std::string>(rt, w, "haystack", "kjv");
  p.backend = get_or<std::string>(rt, w, "backend", "cpu");
  try {
    require_host(parse_backend(p.backend));  // kernels/backend.h: the one list
  } catch (const Error& e) {
    fail("{}: {}: {}", w.file, w.key("backend"), e.what());
  }
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

void run_ruler(const RulerPlan& p, const std::filesystem::path& out, const Shard& shard, ModelSource& source) {
  ResultTable table(out, "ruler");
  const eval::LoadedModel* L = nullptr;
  eval::RulerHaystack hay;
  CacheOptions ref;
  ref.spec = parse_spec("fp32");
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
    const eval::RulerOutput a = eval::ruler_trial(L->model, L->tok, ref, c, p.max_new, 0, check_stop);
    std::string answers, scores;
    for (const auto& x : c.answers) answers += (answers.empty() ? "" : ", ") + x;
    for (const SchemeSpec* s : todo) {
      CacheOptions co;
      co.spec = *s;
      const auto t0 = std::chrono::steady_clock::now();
      const eval::RulerOutput b = eval::ruler_trial(L->model, L->tok, co, c, p.max_new, 0, check_stop);
      table.add({{"key", s->canonical()}, {"scheme", s->canonical()}, {"settings", settings}, {"score", b.score},
                 {"fp32_score", a.score}, {"answers", answers}, {"output", b.text}, {"fp32_output", a.text},
                 {"prompt_tokens", c.prompt.size()}, {"generated", b.tokens},
                 {"seconds", std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()}});
      scores += fmt::format(", {} {:.2f}", s->canonical(), b.score);
      check_stop();
    }
    fmt::print(stderr, "[ruler {}/{}] {} at {} sample {}: fp32 {:.2f}{}\n", j, cases.size(), k.task, k.length,
               k.sample, a.score, scores);
  }
}

// [throughput]: decode attention and prefill quantization per op x backend x context x batch x
// scheme (evaluation/throughput.h), with bf16 timed in every group as the speed-up's baseline.
struct ThroughputPlan {
  std::vector<int64_t> contexts{1024, 4096, 16384}, batches{1, 16};
  std::vector<std::string> backends{"ref", "cpu"}, ops{"decode", "quantize"};
  eval::ThroughputShape shape;
  eval::ThroughputOptions opt;
  std::string int_mode = "exact";
  json settings;  // shared by every row; the row's own op, backend, context and batch are added
  std::vector<SchemeSpec> specs;  // bf16 first
  struct Case {
    std::string op, backend;
    int64_t context, batch;
  };
  // Context outermost: run_throughput builds each context's K/V (a gigabyte at 128k) once.
  std::vector<Case> cases() const {
    std::vector<Case> out;
    for (int64_t c : contexts)
      for (const auto& op : ops)
        for (const auto& b : backends)
          // quantize rows: the host backends' (backend cuda's quantize kernels have their benches)
          if (op == "decode" || backend_info(parse_backend(b)).host)
            for (int64_t n : op == "quantize" ? std::vector<int64_t>{1} : batches) out.push_back({op, b, c, n});
    return out;
  }
  json case_settings(const Case& c) const {
    json st = settings;
    st["op"] = c.op;
    st["backend"] = c.backend;
    st["context"] = c.context;
    st["batch"] = c.batch;
    return st;
  }
};

ThroughputPlan plan_throughput(const toml::table& tt, const Where& w) {
  check_keys(tt, w, {"contexts", "batch", "backends", "ops", "heads", "head_dim", "gqa", "threads", "repeats",
                     "int_mode", "schemes"});
  ThroughputPlan p;
  auto ints = [&](const char* key, std::vector<int64_t> def, int64_t lo, int64_t hi) {
    const auto* n = tt.get(key);
    if (!n) return def;
    const auto* a = n->as_array();
    KVQ_CHECK(a && !a->empty(), "{}: {} must be a non-empty array of integers", w.at(*n), w.key(key));
    std::vector<int64_t> out;
    for (const auto& e : *a) {
      const auto v = e.value_exact<int64_t>();
      KVQ_CHECK(v.has_value(), "{}: {} must hold integers (an element is {})", w.at(e), w.key(key), type_of(e));
      KVQ_CHECK(*v >= lo && *v <= hi, "{}: {} {} is outside [{}, {}]", w.at(e), w.key(key), *v, lo, hi);
      out.push_back(*v);
    }
    return out;
  };
  auto words = [&](const char* key, std::vector<std::string> def, const std::vector<std::string>& allowed) {
    if (!tt.get(key)) return def;
    auto out = string_list(tt, w, key);
    KVQ_CHECK(!out.empty(), "{}: {} must be a non-empty array", w.file, w.key(key));
    for (const auto& x : out) {
      if (std::string_view(key) == "backends") {  // kernels/backend.h: the one list
        try {
          const BackendInfo& b = backend_info(parse_backend(x));
          KVQ_CHECK(b.id != AttentionBackend::kCpuInt8,
                    "backend {} is backend cpu with int_mode = \"int8\" here (the task's "
                    "int_mode key sets it for every backend cpu row)",
                    b.name);
        } catch (const Error& e) {
          fail("{}: {} \"{}\": {}", w.file, w.key(key), x, e.what());
        }
        continue;
      }
      KVQ_CHECK(std::find(allowed.begin(), allowed.end(), x) != allowed.end(), "{}: {} \"{}\" is not one of: {}",
                w.file, w.key(key), x, fmt::join(allowed, ", "));
    }
    return out;
  };
  p.contexts = ints("contexts", p.contexts, 1, int64_t{1} << 20);
  p.batches = ints("batch", p.batches, 1, 4096);
  p.backends = words("backends", p.backends, {});
  p.ops = words("ops", p.ops, {"decode", "quantize"});
  p.shape.heads = get_or<int64_t>(tt, w, "heads", 8);
  p.shape.head_dim = get_or<int64_t>(tt, w, "head_dim", 128);
  p.shape.gqa = get_or<int64_t>(tt, w, "gqa", 4);
  const int64_t threads = get_or<int64_t>(tt, w, "threads", 1), repeats = get_or<int64_t>(tt, w, "repeats", 5);
  for (const auto& [k, v] : std::initializer_list<std::pair<const char*, int64_t>>{
           {"heads", p.shape.heads}, {"head_dim", p.shape.head_dim}, {"gqa", p.shape.gqa}})
    KVQ_CHECK(v >= 1 && v <= 1024, "{}: {} must be between 1 and 1024, got {}", w.file, w.key(k), v);
  KVQ_CHECK(threads >= 1 && threads <= 256, "{}: {} must be between 1 and 256, got {}", w.file, w.key("threads"),
            threads);
  KVQ_CHECK(repeats >= 1 && repeats <= 1000, "{}: {} must be between 1 and 1000, got {}", w.file, w.key("repeats"),
            repeats);
  p.opt.threads = static_cast<int>(threads);
  p.opt.repeats = static_cast<int>(repeats);
  // int_mode = "int8": every backend cpu row runs backend cpu-int8 (kernels/backend.h)
  p.int_mode = get_or<std::string>(tt, w, "int_mode", "exact");
  KVQ_CHECK(p.int_mode == "exact" || p.int_mode == "int8", "{}: {} \"{}\" is not one of: exact, int8", w.file,
            w.key("int_mode"), p.int_mode);
  // The largest context's float32 K and V are held while its caches are built.
  const int64_t biggest = *std::max_element(p.contexts.begin(), p.contexts.end());
  KVQ_CHECK(biggest * p.shape.heads * p.shape.head_dim <= (int64_t{1} << 30),
            "{}: {} x heads x head_dim = {} values per tensor; at most 2^30 (4 GiB of float32 for K, as much for V)",
            w.file, w.key("contexts"), biggest * p.shape.heads * p.shape.head_dim);
  p.settings = {{"heads", p.shape.heads}, {"head_dim", p.shape.head_dim}, {"gqa", p.shape.gqa},
                {"threads", p.opt.threads}, {"repeats", p.opt.repeats}, {"int_mode", p.int_mode}};
  return p;
}

void run_throughput(const ThroughputPlan& p, const std::filesystem::path& out, const Shard& shard) {
  ResultTable table(out, "throughput");
  const auto cases = p.cases();
  const size_t total = cases.size() * p.specs.size();
  // The limits, each measured once per run before its first row, so every ratio is in-run: the
  // host's memcpy for the host backends, a device-to-device cudaMemcpy for backend cuda.
  double copy_gbps = 0, device_copy_gbps = 0;
  std::optional<DeviceReport> dev;  // backend cuda's GPU (name, driver, peak bandwidth)
  std::optional<eval::ThroughputInput> in;
  size_t j = 0, ci = 0;
  for (const auto& c : cases) {
    // Shards take whole cases (every scheme of one op, backend, context and batch), so the bf16
    // row each speed-up divides by is measured in the same shard.
    if (!shard.take(ci++)) {
      j += p.specs.size();
      continue;
    }
    const json settings = p.case_settings(c);
    double bf16_us = 0;
    if (const json* r = table.find("bf16", settings)) bf16_us = r->value("time_us", 0.0);
    for (const auto& spec : p.specs) {
      const size_t row = j++;
      const std::string key = spec.canonical();
      if (table.find(key, settings)) continue;
      check_stop();
      // int_mode = "int8": backend cpu's rows run backend cpu-int8 (kernels/backend.h)
      const AttentionBackend be = parse_backend(c.backend == "cpu" && p.int_mode == "int8" ? "cpu-int8" : c.backend);
      const bool device = !backend_info(be).host;
      if (device && !dev) {
        dev = device_report(be);
        device_copy_gbps = ::kvq::device_copy_gbps(be, p.opt.pool_bytes, std::max(p.opt.repeats, 5));
        fmt::print(stderr,
                   "[throughput] {} (driver {}, runtime {}), peak {:.0f} GB/s ({}); device-to-device "
                   "cudaMemcpy of {} MiB: {:.2f} GB/s\n",
                   dev->name, dev->driver_version, dev->runtime_version, dev->peak_gbps, dev->peak_formula,
                   p.opt.pool_bytes / (1 << 20), device_copy_gbps);
      }
      if (!device && copy_gbps == 0) {
        copy_gbps = eval::memcpy_gbps(p.opt.pool_bytes, p.opt);
        fmt::print(stderr, "[throughput] memcpy of {} MiB: {:.2f} GB/s\n", p.opt.pool_bytes / (1 << 20), copy_gbps);
      }
      const double limit = device ? device_copy_gbps : copy_gbps;
      if (!in || in->context != c.context) {
        in.reset();
        in = eval::throughput_input(p.shape, c.context, 0);
      }
      const eval::Timing t = c.op == "decode" ? eval::time_decode(spec, *in, c.batch, be, p.opt)
                                              : eval::time_quantize(spec, *in, be, p.opt);
      const double gbps = t.bytes / (t.us * 1e-6) / 1e9;
      if (key == "bf16") bf16_us = t.us;
      json r = {{"key", key}, {"scheme", key}, {"settings", settings}, {"op", c.op}, {"backend", c.backend},
                {"context", c.context}, {"batch", c.batch}, {"time_us", t.us}, {"bytes", t.bytes},
                {"gb_per_s", gbps}, {"memcpy_gb_per_s", limit}, {"of_memcpy", gbps / limit},
                {"stored_bytes_per_token", t.stored_bytes_per_token}, {"page_faults", t.page_faults},
                {"clock", t.clock}};
      if (device) {  // the GPU, its driver and its peak, and the copy the limit is
        r["device"] = dev->name;
        r["driver_version"] = dev->driver_version;
        r["runtime_version"] = dev->runtime_version;
        r["peak_gb_per_s"] = dev->peak_gbps;
        r["peak_formula"] = dev->peak_formula;
        r["of_peak"] = gbps / dev->peak_gbps;
        r["memcpy"] = "device-to-device cudaMemcpy (bytes copied per second; DRAM moves twice that)";
      }
      r["speedup_vs_bf16"] = bf16_us > 0 ? json(bf16_us / t.us) : json(nullptr);
      if (c.op == "decode") r["distinct_caches"] = t.distinct_caches;
      fmt::print(stderr, "[throughput {}/{}] {} {} ctx {} batch {} {}: {:.1f} us, {:.2f} GB/s ({:.0f}% of memcpy){}\n",
                 row + 1, total, c.op, c.backend, c.context, c.batch, key, t.us, gbps, 100 * gbps / limit,
                 bf16_us > 0 ? fmt::format(", {:.2f}x bf16", bf16_us / t.us) : "");
      table.add(std::move(r));
    }
  }
}

// --merge: the rows of every OUT/shard-I-of-N/ folder into OUT, in the config's row order; rows a
// shard holds that the config no longer names come after them. Nothing already in OUT is lost.
// Returns the tables it wrote ("model.csv, needle.csv"): the config's tasks, not every name.
std::string merge_shards(const std::optional<SyntheticPlan>& sp, const std::optional<ModelPlan>& mp,
                         const std::optional<NeedlePlan>& np, const std::optional<ThroughputPlan>& tp,
                         const std::optional<RulerPlan>& rp, const std::filesystem::path& out) {
  std::vector<std::filesystem::path> shards;
  if (std::filesystem::is_directory(out))
    for (const auto& e : std::filesystem::directory_iterator(out))
      if (e.is_directory() && e.path().filename().string().rfind("shard-", 0) == 0) shards.push_back(e.path());
  std::sort(shards.begin(), shards.end());
  KVQ_CHECK(!shards.empty(), "{}: no shard-I-of-N folders to merge (run with --shard I/N first)", out.string());
  std::string tables;
  auto merge = [&](const char* task, const std::vector<std::pair<std::string, json>>& plan) {
    tables += fmt::format("{}{}.csv", tables.empty() ? "" : ", ", task);
    std::vector<json> found;
    for (const auto& d : shards)
      if (std::filesystem::exists(d / (std::string(task) + ".jsonl"))) {
        const ResultTable shard_rows(d, task);
        for (const auto& r : shard_rows.rows()) found.push_back(r);
      }
    ResultTable target(out, task);
    size_t added = 0, missing = 0;
    std::vector<bool> used(found.size(), false);
    for (const auto& [key, settings] : plan) {
      if (target.find(key, settings)) continue;
      bool hit = false;
      for (size_t i = 0; i < found.size() && !hit; ++i)
        if (!used[i] && found[i].value("key", "") == key && found[i].value("settings", json()) == settings) {
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
    fmt::print(stderr, "kvq run --merge: {} {} rows from {} shard folders into {}{}\n", added, task, shards.size(),
               out.string(), missing ? fmt::format("; {} rows of the config are in no shard yet", missing) : "");
  };
  if (sp) {
    std::vector<std::pair<std::string, json>> plan;
    for (const auto& s : sp->specs) plan.emplace_back(s.canonical(), sp->settings);
    merge("synthetic", plan);
  }
  if (mp) {
    std::vector<std::pair<std::string, json>> plan;
    for (int ctx : mp->ctxs) {
      json st = mp->settings;
      st["ctx"] = ctx;
      for (const auto& s : mp->specs) plan.emplace_back(s.canonical(), st);
    }
    merge("model", plan);
  }
  if (np) {
    std::vector<std::pair<std::string, json>> plan;
    for (int ctx : np->ctxs)
      for (double depth : np->depths)
        for (int trial = 0; trial < np->trials; ++trial) {
          json st = np->settings;
          st["ctx"] = ctx;
          st["depth"] = depth;
          st["trial"] = trial;
          for (const auto& s : np->specs) plan.emplace_back(s.canonical(), st);
        }
    merge("needle", plan);
  }
  if (tp) {
    std::vector<std::pair<std::string, json>> plan;
    for (const auto& c : tp->cases())
      for (const auto& s : tp->specs) plan.emplace_back(s.canonical(), tp->case_settings(c));
    merge("throughput", plan);
  }
  if (rp) {
    std::vector<std::pair<std::string, json>> plan;
    for (const auto& c : rp->cases())
      for (const auto& s : rp->specs) plan.emplace_back(s.canonical(), rp->case_settings(c));
    merge("ruler", plan);
  }
  return tables;
}

}  // namespace

void register_run(CLI::App& app) {
  struct O {
    std::string config, out, model_file, only;
    bool append = false, check = false, smoke = false, merge = false;
    std::string shard;
  };
  auto o = std::make_shared<O>();
  auto* c = app.add_subcommand(
      "run",
      "Run an experiment config (TOML): every scheme on synthetic K/V (reconstruction SNR, attention KL,\n"
      "top-32 overlap), with a [model] table on SmolLM2 (perplexity, KLD, top-1 vs the fp32 cache), and\n"
      "with a [needle] table passkey retrieval (ctx x depth x trials, each against the fp32 cache), with a\n"
      "[throughput] table decode-attention and quantize time per backend x context x batch (GB/s, share\n"
      "of a memcpy timed in the same run, speed-up over bf16), with a [ruler] table the RULER-style\n"
      "long-context suite (length x task x sample: needles, variable tracking, word extraction; recall\n"
      "of each greedy answer, each against the fp32 cache).\n"
      "Rows go to OUT/<task>.{jsonl,csv} as each finishes; rerunning resumes.\n"
      "Everything is checked before the first row runs: unknown keys, types and ranges (FILE:LINE:\n"
      "[table].key), every scheme against the shapes it will meet (a [sweep] combination that does not\n"
      "fit is skipped with a line; an explicit one is an error), the model and text files.\n"
      "Example: kvq run experiments/configs/default.toml   (see that file for every key)");
  c->add_option("config", o->config, "TOML config")->required();
  // kernels/backend.h's table: what [model].backend and [throughput].backends can name
  c->footer("Backends ([model].backend, [throughput].backends; kernels/backend.h):\n" + support_help());
  c->add_option("--out", o->out, "results directory (default: the config's `out`)");
  c->add_option("--model-file,--model", o->model_file,
                "GGUF file or Hugging Face checkpoint folder (default: the fetched SmolLM2)");
  c->add_option("--only", o->only, "run one task")
      ->check(CLI::IsMember({"synthetic", "model", "needle", "throughput", "ruler"}));
  c->add_flag("--append", o->append,
              "add rows to an OUT made by a different config (its config is kept; this one is saved\n"
              "beside it as config-N.toml); without it a changed config into an existing OUT is refused");
  c->add_flag("--check,--dry-run", o->check,
              "check the config and every row against its shapes, list the rows, run nothing");
  c->add_option("--shard", o->shard,
                "I/N: run a deterministic 1/N of the rows (row j of each task goes to shard j % N + 1)\n"
                "into OUT/shard-I-of-N/; e.g. in a Slurm array --array=1-8: --shard $SLURM_ARRAY_TASK_ID/8");
  c->add_flag("--merge", o->merge,
              "merge the rows of every OUT/shard-I-of-N/ into OUT/, in the config's row order; runs nothing");
  c->add_flag("--smoke", o->smoke,
              "the same rows at a tiny size, for CI: synthetic tokens <= 256, model windows <= 64\n"
              "tokens over 128 tokens of text, ruler its first task once at 1,024 tokens (4 generated);\n"
              "results go to OUT-smoke unless --out is given");
  c->callback([o] {
    Shard shard;
    if (!o->shard.empty()) {
      const size_t slash = o->shard.find('/');
      char* e1 = nullptr;
      char* e2 = nullptr;
      const std::string a = o->shard.substr(0, slash), b = slash == std::string::npos ? "" : o->shard.substr(slash + 1);
      const long i = std::strtol(a.c_str(), &e1, 10), n = std::strtol(b.c_str(), &e2, 10);
      KVQ_CHECK(slash != std::string::npos && !a.empty() && !b.empty() && *e1 == 0 && *e2 == 0 && n >= 1 &&
                    n <= 100000 && i >= 1 && i <= n,
                "--shard {}: give I/N with 1 <= I <= N, e.g. --shard 2/8", o->shard);
      shard = {static_cast<int>(i), static_cast<int>(n)};
      KVQ_CHECK(!o->merge, "--shard and --merge: run the shards first, then --merge once without --shard");
    }
    toml::table cfg;
    const std::string config_text = read_file(o->config);
    try {
      cfg = toml::parse(config_text, o->config);
    } catch (const toml::parse_error& e) {
      fail("{}:{}:{}: {}", o->config, e.source().begin.line, e.source().begin.column, e.description());
    }
    const Where top{o->config, ""};
    check_keys(cfg, top,
               {"name", "out", "model_file", "schemes", "synthetic", "model", "needle", "throughput", "ruler", "sweep"});
    // The model: --model, else the config's model_file (a GGUF or a Hugging Face checkpoint folder),
    // else the fetched SmolLM2.
    if (o->model_file.empty()) o->model_file = get_or<std::string>(cfg, top, "model_file", "");
    auto table_of = [&](const char* name) -> const toml::table* {
      const auto* n = cfg.get(name);
      if (!n) return nullptr;
      KVQ_CHECK(n->is_table(), "{}: {} must be a table ([{}]), got {}", top.at(*n), name, name, type_of(*n));
      return n->as_table();
    };
    const toml::table* syn = table_of("synthetic");
    const toml::table* mt = table_of("model");
    const toml::table* nt = table_of("needle");
    const toml::table* sw = table_of("sweep");
    const toml::table* tt = table_of("throughput");
    const toml::table* rt = table_of("ruler");
    // Rows: explicit specs, then the sweep's combinations; a combination whose spec does not
    // parse is skipped with a line, an explicit spec that does not parse is an error.
    std::vector<std::string> errors;
    std::vector<Row> rows;
    auto add_rows = [&](const std::vector<std::string>& names, bool from_sweep, std::vector<Row>& to) {
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
    };
    add_rows(string_list(cfg, top, "schemes"), false, rows);
    size_t swept = 0;
    if (sw) {
      const auto names = expand_sweep(*sw, Where{o->config, "sweep"});
      swept = names.size();
      add_rows(names, true, rows);
    }
    KVQ_CHECK(!rows.empty() || !errors.empty() || swept > 0,
              "{}: no schemes (give schemes = [...] or a [sweep])", o->config);
    const bool want_syn = syn && (o->only.empty() || o->only == "synthetic"),
               want_model = mt && (o->only.empty() || o->only == "model"),
               want_needle = nt && (o->only.empty() || o->only == "needle"),
               want_tp = tt && (o->only.empty() || o->only == "throughput"),
               want_ruler = rt && (o->only.empty() || o->only == "ruler");
    KVQ_CHECK(syn || mt || nt || tt || rt,
              "{}: nothing to run: give a [synthetic], [model], [needle], [throughput] or [ruler] table", o->config);
    KVQ_CHECK(want_syn || want_model || want_needle || want_tp || want_ruler,
              "{}: --only {} but the config has no [{}] table", o->config,
              o->only, o->only);
    std::optional<SyntheticPlan> sp;
    std::optional<ModelPlan> mp;
    if (want_syn) {
      sp = plan_synthetic(*syn, Where{o->config, "synthetic"});
      sp->specs = fitting(rows, "synthetic", sp->ks.shape.heads, sp->ks.shape.dim, errors);
    }
    if (sp && o->smoke) {
      sp->ks.shape.tokens = std::min<int64_t>(sp->ks.shape.tokens, 256);
      sp->settings["tokens"] = sp->ks.shape.tokens;
      sp->settings["smoke"] = true;
    }
    if (sp)  // the model rows' rule (eval::quantized_tokens_of) on one tensor quantized at once
      for (const SchemeSpec& s : sp->specs) {
        const auto nothing = [&](Role r) {
          return eval::quantized_tokens_of(s, r, sp->ks.shape.tokens, 0, false) == 0;
        };
        if (!eval::exact_by_design(s) && nothing(Role::Key) && nothing(Role::Value))
          fmt::print(stderr,
                     "kvq run: warning: {} quantizes nothing of [synthetic] tokens = {} (all "
                     "within its window or sinks, or short of a key group); its rows will read "
                     "exact values\n",
                     s.canonical(), sp->ks.shape.tokens);
      }
    // The model's shape from the GGUF's metadata alone, read once for the tasks that need it.
    std::optional<LlamaConfig> lc;
    auto model_config = [&]() -> const LlamaConfig& {
      if (!lc) lc = LlamaModel::read_config(model_path(o->model_file));
      return *lc;
    };
    // A task's own `schemes`, else the top-level rows.
    auto task_rows = [&](const toml::table& t, const char* task) {
      if (!t.get("schemes")) return rows;
      std::vector<Row> own;
      add_rows(string_list(t, Where{o->config, task}, "schemes"), false, own);
      return own;
    };
    if (want_model) {
      mp = plan_model(*mt, Where{o->config, "model"}, o->model_file);
      if (o->smoke) {  // the same code path at a tiny size: windows of <= 64 tokens over 128
        for (int& c : mp->ctxs) c = std::min(c, 64);
        std::sort(mp->ctxs.begin(), mp->ctxs.end());
        mp->ctxs.erase(std::unique(mp->ctxs.begin(), mp->ctxs.end()), mp->ctxs.end());
        mp->o.ctx = mp->ctxs.front();
        mp->o.max_tokens = 128;
        mp->o.stride = std::min(mp->o.stride, mp->o.ctx);
        mp->o.score_from = std::min(mp->o.score_from, mp->o.ctx / 2);
        mp->settings["max_tokens"] = mp->o.max_tokens;
        mp->settings["stride"] = mp->o.stride;
        if (mp->o.score_from > 0) mp->settings["score_from"] = mp->o.score_from;
        mp->settings["smoke"] = true;
      }
      for (int c : mp->ctxs) {  // against the model's context, before the model loads
        eval::PplOptions po = mp->o;
        po.ctx = c;
        try {
          eval::check_ppl_options(po, model_config().context);
        } catch (const Error& e) {
          fail("{}: [model]: {}", o->config, e.what());
        }
      }
      mp->specs = fitting(task_rows(*mt, "model"), "model", model_config().kv_heads, model_config().head_dim,
                          errors, model_config().layers);
    }
    std::optional<NeedlePlan> np;
    if (want_needle) {
      np = plan_needle(*nt, Where{o->config, "needle"}, o->model_file, model_config().context);
      if (o->smoke) {  // one short trial per depth
        np->ctxs = {256};
        np->trials = 1;
        np->settings["smoke"] = true;
      }
      np->specs = fitting(task_rows(*nt, "needle"), "needle", model_config().kv_heads, model_config().head_dim,
                          errors, model_config().layers);
    }
    std::optional<ThroughputPlan> tp;
    if (want_tp) {
      tp = plan_throughput(*tt, Where{o->config, "throughput"});
      if (o->smoke) {  // one small context and batch, one repeat
        tp->contexts = {std::min<int64_t>(*std::min_element(tp->contexts.begin(), tp->contexts.end()), 256)};
        tp->batches = {std::min<int64_t>(*std::min_element(tp->batches.begin(), tp->batches.end()), 2)};
        tp->opt.repeats = 1;
        tp->opt.pool_bytes = 1 << 20;
        tp->settings["repeats"] = 1;
        tp->settings["smoke"] = true;
      }
      tp->specs = fitting(task_rows(*tt, "throughput"), "throughput", tp->shape.heads, tp->shape.head_dim, errors);
      // bf16 is every group's baseline: first, and added when the config does not name it.
      const SchemeSpec bf16 = parse_spec("bf16");
      std::erase_if(tp->specs, [](const SchemeSpec& x) { return x.canonical() == "bf16"; });
      tp->specs.insert(tp->specs.begin(), bf16);
      // kernels/backend.h's support table: every backend's shape and decode schemes (one error each)
      for (const auto& b : tp->backends) {
        const AttentionBackend be = parse_backend(b);
        if (const std::string why = unsupported_shape(be, tp->shape.heads, tp->shape.head_dim,
                                                      tp->shape.heads * tp->shape.gqa);
            !why.empty())
          errors.push_back(fmt::format("[throughput] backend {} cannot run decode attention over {}", b, why));
        if (std::find(tp->ops.begin(), tp->ops.end(), "decode") == tp->ops.end()) continue;
        for (const auto& s : tp->specs) try {
            require_supported(be, s, AttentionOp::kDecode);
          } catch (const Error& e) {
            errors.push_back(fmt::format("[throughput] {}", e.what()));
          }
      }
    }
    std::optional<RulerPlan> rp;
    if (want_ruler) {
      rp = plan_ruler(*rt, Where{o->config, "ruler"}, o->model_file, model_config().context);
      if (o->smoke) {  // the first task, one sample at 1,024 tokens, 4 generated tokens
        rp->tasks.resize(1);
        rp->lengths = {1024};
        rp->samples = 1;
        rp->max_new = 4;
        rp->settings["smoke"] = true;
      }
      rp->specs = fitting(task_rows(*rt, "ruler"), "ruler", model_config().kv_heads, model_config().head_dim,
                          errors, model_config().layers);
    }
    if (errors.size() == 1) fail("{}: {}; nothing was run", o->config, errors[0]);
    if (!errors.empty()) {
      for (const auto& e : errors) fmt::print(stderr, "kvq run: {}\n", e);
      fail("{}: {} invalid row{} (listed above); nothing was run", o->config, errors.size(),
           errors.size() == 1 ? "" : "s");
    }
    KVQ_CHECK((sp && !sp->specs.empty()) || (mp && !mp->specs.empty()) || (np && !np->specs.empty()) || tp ||
                  (rp && !rp->specs.empty()),
              "{}: every scheme was skipped (lines above); nothing to run", o->config);
    if (o->check) {
      auto list = [](const char* task, const std::vector<SchemeSpec>& specs) {
        std::string names;
        for (const auto& s : specs) names += (names.empty() ? "" : ", ") + s.canonical();
        fmt::print("{} rows ({}): {}\n", task, specs.size(), names.empty() ? "-" : names);
      };
      if (sp) list("synthetic", sp->specs);
      if (mp) {
        list("model", mp->specs);
        if (mp->ctxs.size() > 1)
          fmt::print("model rows repeat for each ctx: {} ({} rows)\n", fmt::join(mp->ctxs, ", "),
                     mp->specs.size() * mp->ctxs.size());
      }
      if (np) {
        list("needle", np->specs);
        fmt::print("needle rows repeat for each ctx ({}) x depth ({}) x trial ({}): {} rows\n",
                   fmt::join(np->ctxs, ", "), fmt::join(np->depths, ", "), np->trials,
                   np->specs.size() * np->ctxs.size() * np->depths.size() * static_cast<size_t>(np->trials));
      }
      if (tp) {
        list("throughput", tp->specs);
        fmt::print("throughput rows repeat for each op ({}) x backend ({}) x context ({}) x batch ({}; decode only): "
                   "{} rows\n",
                   fmt::join(tp->ops, ", "), fmt::join(tp->backends, ", "), fmt::join(tp->contexts, ", "),
                   fmt::join(tp->batches, ", "), tp->cases().size() * tp->specs.size());
      }
      if (rp) {
        list("ruler", rp->specs);
        fmt::print("ruler rows repeat for each length ({}) x task ({}) x sample ({}): {} rows\n",
                   fmt::join(rp->lengths, ", "), fmt::join(rp->tasks, ", "), rp->samples,
                   rp->specs.size() * rp->cases().size());
      }
      fmt::print("{}: ok, nothing run (--check)\n", o->config);
      return;
    }
    // A device backend needs its device (--check does not: configs are checked anywhere); one line
    // before anything is written.
    if (tp)
      for (const auto& b : tp->backends)
        if (!backend_info(parse_backend(b)).host)
          if (const std::string why = cuda_unavailable(); !why.empty())
            fail("{}: {}.backends \"{}\": {}", o->config, "[throughput]", b, why);
    // Only now is anything written.
    const std::string name = get_or<std::string>(cfg, top, "name", "run");
    const std::string base = !o->out.empty() ? o->out
                             : get_or<std::string>(cfg, top, "out", "results/" + name) + (o->smoke ? "-smoke" : "");
    const std::string out =
        shard.n > 1 ? (std::filesystem::path(base) / fmt::format("shard-{}-of-{}", shard.i, shard.n)).string() : base;
    const std::filesystem::path saved = std::filesystem::path(out) / "config.toml";
    remove_stale_temporaries(out, [](const std::string& name) {  // config.toml, config-N.toml
      return name == "config.toml" ||
             (name.rfind("config-", 0) == 0 && name.size() > 12 && name.ends_with(".toml"));
    });
    if (std::filesystem::exists(saved) && read_file(saved.string()) != config_text) {
      KVQ_CHECK(o->append,
                "{} holds results of a different config ({} differs from {}); give --out DIR for a new "
                "directory, or --append to add these rows to it",
                out, saved.string(), o->config);
      int n = 2;
      std::filesystem::path extra;
      do extra = std::filesystem::path(out) / fmt::format("config-{}.toml", n++);
      while (std::filesystem::exists(extra) && read_file(extra.string()) != config_text);
      write_file_atomic(extra.string(), config_text);
      fmt::print(stderr, "kvq run: --append: this config saved as {}\n", extra.string());
    } else {
      std::error_code ec;
      std::filesystem::create_directories(out, ec);
      KVQ_CHECK(!ec, "{}: cannot create the results directory ({}); give --out DIR somewhere writable",
                out, ec.message());
      write_file_atomic(saved.string(), config_text);
    }
    if (o->merge) {
      const std::string tables = merge_shards(sp, mp, np, tp, rp, out);
      fmt::print("results in {}/ ({})\n", out, tables);
      return;
    }
    fmt::print(stderr, "kvq run: {} synthetic + {} model + {} needle + {} throughput + {} ruler rows{} -> {}\n",
               sp ? sp->specs.size() : 0, mp ? mp->specs.size() * mp->ctxs.size() : 0,
               np ? np->specs.size() * np->ctxs.size() * np->depths.size() * static_cast<size_t>(np->trials) : 0,
               tp ? tp->cases().size() * tp->specs.size() : 0, rp ? rp->cases().size() * rp->specs.size() : 0,
               shard.n > 1 ? fmt::format(" (shard {} of {}: every {}th row)", shard.i, shard.n, shard.n) : "", out);
    std::optional<StopOnCtrlC> stop(std::in_place);
    try {
      if (sp && !sp->specs.empty()) run_synthetic(*sp, out, shard);
      ModelSource source{o->model_file, nullptr};
      if (mp && !mp->specs.empty()) run_model(*mp, out, shard, source);
      if (np && !np->specs.empty()) run_needle(*np, out, shard, source);
      if (tp) run_throughput(*tp, out, shard);
      if (rp && !rp->specs.empty()) run_ruler(*rp, out, shard, source);
    } catch (const Interrupted&) {
      throw Interrupted(fmt::format(
          "interrupted (Ctrl-C): every finished row is in {}/; run the same command again to resume", out));
    }
    stop.reset();
    // The tables written and, per task, the script that draws it (each writes its figures beside
    // the results); a shard's rows are plotted after --merge, from the merged folder.
    std::string tables;
    std::vector<std::string> scripts;
    for (const auto& [on, t, plot] : {std::tuple{bool(sp), "synthetic", "plot_results.py"},
                                      std::tuple{bool(mp), "model", "plot_results.py"},
                                      std::tuple{mp && mp->ctxs.size() > 1, "", "plot_context.py"},
                                      std::tuple{bool(np), "needle", "plot_needle.py"},
                                      std::tuple{bool(tp), "throughput", "plot_throughput.py"},
                                      std::tuple{bool(rp), "ruler", "plot_ruler.py"}})
      if (on) {
        if (*t) tables += fmt::format("{}{}.csv", tables.empty() ? "" : ", ", t);
        if (std::find(scripts.begin(), scripts.end(), plot) == scripts.end())
          scripts.push_back(plot);
      }
    std::string plots;
    for (const auto& sc : scripts)
      plots += fmt::format("{}.venv/bin/python experiments/plots/{} {}", plots.empty() ? "" : "; ",
                           sc, base);
    if (shard.n > 1)
      fmt::print(
          "results in {}/ ({}; when every shard is done: kvq run {}{} --merge, then plot: {})\n",
          out, tables, o->config, o->out.empty() ? "" : " --out " + base, plots);
    else
      fmt::print("results in {}/ ({}; plot: {})\n", out, tables, plots);
  });
}

}  // namespace kvq::cli
