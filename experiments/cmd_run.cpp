// kvq run CONFIG.toml: an experiment sweep. Every scheme in the config (plus any [sweep]
// expansion) is measured on synthetic K/V (reconstruction and attention metrics) and, when the
// config has a [model] table, on the real model (perplexity, KLD, top-1 against the fp32 cache).
// Each finished row is appended to OUT/<task>.jsonl and OUT/<task>.csv, both rewritten
// atomically, so an interrupted run loses nothing and a rerun resumes where it stopped (rows whose
// key and settings match are skipped).
#include <fmt/format.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>
#include <toml++/toml.h>

#include "core/error.h"
#include "core/footprint.h"
#include "core/gguf.h"
#include "core/io.h"
#include "experiments/commands.h"
#include "experiments/model_eval.h"
#include "experiments/model_files.h"
#include "experiments/synthetic.h"
#include "reference_cpu/attention.h"
#include "reference_cpu/metrics.h"
#include "reference_cpu/quantize.h"
#include "model/tokenizer.h"

namespace kvq::cli {
namespace {

using json = nlohmann::ordered_json;

// One results table: rows keyed by "key", persisted as jsonl + csv after every row.
class ResultTable {
 public:
  ResultTable(std::filesystem::path dir, std::string task) : dir_(std::move(dir)), task_(std::move(task)) {
    const auto p = dir_ / (task_ + ".jsonl");
    if (std::filesystem::exists(p)) {
      std::istringstream in(read_file(p.string()));
      std::string line;
      int n = 0;
      while (std::getline(in, line)) {
        ++n;
        if (line.empty()) continue;
        try {
          rows_.push_back(json::parse(line));
        } catch (const json::exception&) {
          fail("{}:{}: not a JSON line; delete the file or the line to rerun", p.string(), n);
        }
      }
    }
  }
  // The stored row with this key and these settings, if any.
  const json* find(const std::string& key, const json& settings) const {
    for (const auto& r : rows_)
      if (r.value("key", "") == key && r.value("settings", json()) == settings) return &r;
    return nullptr;
  }
  void add(json row) {
    rows_.push_back(std::move(row));
    std::string jl;
    for (const auto& r : rows_) jl += r.dump() + "\n";
    write_file_atomic((dir_ / (task_ + ".jsonl")).string(), jl);
    // CSV: the union of scalar columns, in first-seen order.
    std::vector<std::string> cols;
    std::set<std::string> seen;
    for (const auto& r : rows_)
      for (const auto& [k, v] : r.items())
        if (!v.is_structured() && seen.insert(k).second) cols.push_back(k);
    std::string csv;
    for (size_t i = 0; i < cols.size(); ++i) csv += (i ? "," : "") + cols[i];
    csv += "\n";
    for (const auto& r : rows_) {
      for (size_t i = 0; i < cols.size(); ++i) {
        if (i) csv += ",";
        if (!r.contains(cols[i])) continue;
        const auto& v = r[cols[i]];
        csv += v.is_string() ? "\"" + v.get<std::string>() + "\"" : v.dump();
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

template <typename T>
T get_or(const toml::table& t, std::string_view key, T def) {
  const auto* n = t.get(key);
  if (!n) return def;
  if (auto v = n->value<T>()) return *v;
  fail("config: '{}' has the wrong type", key);
}

std::vector<std::string> string_list(const toml::table& t, std::string_view key, const std::string& where) {
  std::vector<std::string> out;
  const auto* n = t.get(key);
  if (!n) return out;
  const auto* a = n->as_array();
  KVQ_CHECK(a, "config: {}{} must be an array of strings", where, key);
  for (const auto& e : *a) {
    auto s = e.value<std::string>();
    KVQ_CHECK(s.has_value(), "config: {}{} must be an array of strings", where, key);
    out.push_back(*s);
  }
  return out;
}

// [sweep] template = "int{b}:k={k},v=token,g={g}" with b = [2, 4], g = [32, 128], ...
std::vector<std::string> expand_sweep(const toml::table& sw) {
  const std::string tmpl = get_or<std::string>(sw, "template", "");
  KVQ_CHECK(!tmpl.empty(), "config: [sweep] needs a template, e.g. template = \"kivi{{b}}:g={{g}}\"");
  std::vector<std::string> out{tmpl};
  for (const auto& [k, v] : sw) {
    if (k.str() == "template") continue;
    const auto* a = v.as_array();
    KVQ_CHECK(a && !a->empty(), "config: [sweep] {} must be a non-empty array", k.str());
    const std::string ph = "{" + std::string(k.str()) + "}";
    KVQ_CHECK(tmpl.find(ph) != std::string::npos, "config: [sweep] {} does not appear in the template as {}", k.str(), ph);
    std::vector<std::string> next;
    for (const auto& s : out)
      for (const auto& e : *a) {
        std::string val;
        if (auto i = e.value<int64_t>()) val = std::to_string(*i);
        else if (auto st = e.value<std::string>()) val = *st;
        else fail("config: [sweep] {} values must be integers or strings", k.str());
        std::string r = s;
        for (size_t p; (p = r.find(ph)) != std::string::npos;) r.replace(p, ph.size(), val);
        next.push_back(r);
      }
    out = std::move(next);
  }
  return out;
}

void run_synthetic(const toml::table& syn, const std::vector<SchemeSpec>& specs, const std::filesystem::path& out) {
  SyntheticSpec ks;
  ks.shape = {get_or<int64_t>(syn, "tokens", 2048), get_or<int64_t>(syn, "heads", 8), get_or<int64_t>(syn, "head_dim", 128)};
  ks.outlier_channels = static_cast<int>(get_or<int64_t>(syn, "outliers", 2));
  ks.outlier_scale = static_cast<float>(get_or<double>(syn, "outlier_scale", 12.0));
  ks.seed = static_cast<uint64_t>(get_or<int64_t>(syn, "seed", 0));
  const int64_t gqa = get_or<int64_t>(syn, "gqa", 4), nqueries = get_or<int64_t>(syn, "queries", 4);
  KVQ_CHECK(ks.shape.tokens > 0 && ks.shape.heads > 0 && ks.shape.dim > 0 && gqa > 0 && nqueries > 0,
            "config: [synthetic] sizes must be positive");
  SyntheticSpec vs = ks;
  vs.outlier_channels = 0;
  vs.seed = ks.seed + 1;
  const Tensor3 k = synthetic_kv(ks), v = synthetic_kv(vs);
  std::mt19937_64 rng(ks.seed + 2);
  std::normal_distribution<float> nd;
  std::vector<std::vector<float>> qs(static_cast<size_t>(nqueries), std::vector<float>(static_cast<size_t>(ks.shape.heads * gqa * ks.shape.dim)));
  for (auto& q : qs)
    for (float& x : q) x = nd(rng);
  const json settings = {{"tokens", ks.shape.tokens}, {"heads", ks.shape.heads}, {"head_dim", ks.shape.dim},
                         {"outliers", ks.outlier_channels}, {"outlier_scale", ks.outlier_scale}, {"seed", ks.seed},
                         {"gqa", gqa}, {"queries", nqueries}};
  ResultTable table(out, "synthetic");
  const SchemeSpec f32 = parse_spec("fp32");
  const auto kr = make_side(f32, Role::Key, k), vr = make_side(f32, Role::Value, v);
  int i = 0;
  for (const auto& spec : specs) {
    ++i;
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
                {"key_snr_db", snr(mk.snr_db)}, {"value_snr_db", snr(mv.snr_db)},
                {"key_nmse", mk.nmse}, {"value_nmse", mv.nmse}, {"key_max_abs_err", mk.max_abs_err},
                {"value_max_abs_err", mv.max_abs_err}, {"attn_kl", am.kl}, {"attn_output_nmse", am.output_nmse},
                {"attn_top32_overlap", am.topk_overlap}};
    fmt::print(stderr, "[synthetic {}/{}] {}: key SNR {:.2f} dB, value SNR {:.2f} dB, attention KL {:.3g}\n", i,
               specs.size(), key, mk.snr_db, mv.snr_db, am.kl);
    table.add(std::move(row));
  }
}

void run_model(const toml::table& mt, const std::vector<SchemeSpec>& specs, const std::filesystem::path& out,
               const std::string& model_file) {
  eval::PplOptions o;
  o.ctx = static_cast<int>(get_or<int64_t>(mt, "ctx", 512));
  o.stride = static_cast<int>(get_or<int64_t>(mt, "stride", 0));
  o.chunk = static_cast<int>(get_or<int64_t>(mt, "chunk", 256));
  o.max_tokens = get_or<int64_t>(mt, "max_tokens", 2048);
  const std::string text = get_or<std::string>(mt, "text", "kjv");
  const bool pre = get_or<bool>(mt, "pre_rope", false), rot = get_or<bool>(mt, "hadamard", false);
  const std::string backend = get_or<std::string>(mt, "backend", "cpu");
  const AttentionBackend attn = parse_backend(backend);
  json settings = {{"text", text},         {"ctx", o.ctx}, {"stride", o.stride}, {"max_tokens", o.max_tokens},
                   {"pre_rope", pre},      {"backend", backend}};
  if (rot) settings["hadamard"] = true;  // only when set, so rows of earlier runs still match
  ResultTable table(out, "model");
  std::vector<const SchemeSpec*> todo;
  for (const auto& s : specs)
    if (!table.find(s.canonical(), settings)) todo.push_back(&s);
  if (todo.empty()) {
    fmt::print(stderr, "[model] all {} schemes done already\n", specs.size());
    return;
  }
  const std::string path = model_path(model_file);
  std::vector<int32_t> ids;
  const LlamaModel m = [&] {  // the file's mapping is released once the weights are packed
    const auto f = gguf::GgufFile::open(path);
    ids = Tokenizer::from_gguf(f).encode(read_file(text_path(text)));
    LlamaModel lm = LlamaModel::load(f);
    lm.set_backend(attn);
    return lm;
  }();
  std::vector<CacheOptions> caches;
  for (const SchemeSpec* s : todo) {
    CacheOptions co;
    co.spec = *s;
    co.pre_rope = pre;
    co.hadamard = rot;
    caches.push_back(co);
  }
  // All schemes in one pass: the fp32 reference of each window is computed once.
  const auto results = eval::perplexity(m, caches, ids, o, [&](const std::string& msg) {
    fmt::print(stderr, "[model, {} schemes] {}\n", todo.size(), msg);
  });
  for (size_t i = 0; i < todo.size(); ++i) {
    const SchemeSpec* s = todo[i];
    const eval::PplResult& r = results[i];
    const Shape3 one{o.ctx, m.config().kv_heads, m.config().head_dim};
    const Footprint fk = footprint(*s, Role::Key, one), fv = footprint(*s, Role::Value, one);
    table.add({{"key", s->canonical()}, {"scheme", s->canonical()}, {"settings", settings},
               {"bits", (fk.effective_bits() + fv.effective_bits()) / 2},
               {"bytes_per_token", (fk.total_bytes() + fv.total_bytes()) * m.config().layers / o.ctx},
               {"ppl", r.ppl}, {"ppl_fp32", r.ppl_ref}, {"delta_ppl", r.ppl - r.ppl_ref}, {"kld", r.kld},
               {"kld_p99", r.kld_p99}, {"top1", r.top1}, {"scored", r.scored}, {"seconds", r.seconds}});
  }
}

}  // namespace

void register_run(CLI::App& app) {
  struct O {
    std::string config, out, model_file, only;
  };
  auto o = std::make_shared<O>();
  auto* c = app.add_subcommand(
      "run",
      "Run an experiment config (TOML): every scheme on synthetic K/V (reconstruction SNR, attention KL,\n"
      "top-32 overlap) and, with a [model] table, on SmolLM2 (perplexity, KLD, top-1 vs the fp32 cache).\n"
      "Rows go to OUT/synthetic.{jsonl,csv} and OUT/model.{jsonl,csv} as each finishes; rerunning resumes.\n"
      "Example: kvq run experiments/configs/default.toml   (see that file for every key)");
  c->add_option("config", o->config, "TOML config")->required();
  c->add_option("--out", o->out, "results directory (default: the config's `out`)");
  c->add_option("--model-file", o->model_file, "GGUF model (default: the fetched SmolLM2)");
  c->add_option("--only", o->only, "run one task")->check(CLI::IsMember({"synthetic", "model"}));
  c->callback([o] {
    toml::table cfg;
    try {
      cfg = toml::parse(read_file(o->config), o->config);
    } catch (const toml::parse_error& e) {
      fail("{}:{}:{}: {}", o->config, e.source().begin.line, e.source().begin.column, e.description());
    }
    static const std::set<std::string> known{"name", "out", "schemes", "synthetic", "model", "sweep"};
    for (const auto& [k, v] : cfg)
      KVQ_CHECK(known.count(std::string(k.str())), "{}: unknown key '{}' (allowed: name, out, schemes, [synthetic], [model], [sweep])",
                o->config, k.str());
    std::vector<std::string> names = string_list(cfg, "schemes", "");
    if (const auto* sw = cfg["sweep"].as_table()) {
      const auto more = expand_sweep(*sw);
      names.insert(names.end(), more.begin(), more.end());
    }
    KVQ_CHECK(!names.empty(), "{}: no schemes (give schemes = [...] or a [sweep])", o->config);
    std::vector<SchemeSpec> specs;
    for (const auto& n : names) specs.push_back(parse_spec(n));  // every spec checked before any work
    const std::string out = !o->out.empty() ? o->out : get_or<std::string>(cfg, "out", "results/" + get_or<std::string>(cfg, "name", "run"));
    std::filesystem::create_directories(out);
    write_file_atomic(out + "/config.toml", read_file(o->config));
    fmt::print(stderr, "kvq run: {} schemes -> {}\n", specs.size(), out);
    if (const auto* syn = cfg["synthetic"].as_table(); syn && o->only != "model") run_synthetic(*syn, specs, out);
    if (const auto* mt = cfg["model"].as_table(); mt && o->only != "synthetic") {
      std::vector<SchemeSpec> ms = specs;
      if (mt->get("schemes")) {
        ms.clear();
        for (const auto& n : string_list(*mt, "schemes", "[model].")) ms.push_back(parse_spec(n));
      }
      run_model(*mt, ms, out, o->model_file);
    }
    fmt::print("results in {}/ (synthetic.csv, model.csv; plot: experiments/plots/plot_results.py {})\n", out, out);
  });
}

}  // namespace kvq::cli
