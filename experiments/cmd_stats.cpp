// kvq stats: per-layer, per-head, per-channel statistics of K/V tensors (a `kvq model dump`, one
// safetensors tensor, an npy, or the live model over a text): amax, std, kurtosis, and the outlier
// channels.
#include <fmt/format.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/gguf.h"
#include "core/io.h"
#include "core/safetensors.h"
#include "evaluation/channel_stats.h"
#include "evaluation/kv_input.h"
#include "evaluation/model_eval.h"
#include "evaluation/model_files.h"
#include "experiments/commands.h"
#include "model/tokenizer.h"

namespace kvq::cli {
namespace {

using json = nlohmann::ordered_json;

json number(double v) { return std::isfinite(v) ? json(v) : json(nullptr); }

struct Opts {
  std::string in, json_out, text, model_file;
  double threshold = 4.0;
  int64_t max_tokens = kDefaultMaxTokens;
  int threads = 0;
};

// The tensors: the model's own K/V over --text, every one of a whole safetensors file, else the
// one load_kv reads.
std::vector<std::pair<std::string, Tensor3>> load_tensors(const Opts& o) {
  std::vector<std::pair<std::string, Tensor3>> ts;
  KVQ_CHECK(!o.in.empty() || !o.text.empty(),
            "give an input file (a dump, FILE.safetensors:TENSOR, an npy) or --text FILE|kjv");
  if (!o.text.empty()) {
    const std::string text = read_text(o.text), path = model_path(o.model_file);
    const eval::LoadedModel L = eval::load_model(path);
    const auto ids = L.tok.encode_first(text, o.max_tokens);
    fmt::print(stderr, "kvq stats: {} over {} tokens of {}\n", path, ids.size(), o.text);
    int l = 0;
    for (auto& kv : eval::dump_kv(L.model, ids, o.threads)) {
      ts.emplace_back(fmt::format("layer.{}.k", l), std::move(kv.k));
      ts.emplace_back(fmt::format("layer.{}.k_pre", l), std::move(kv.k_pre));
      ts.emplace_back(fmt::format("layer.{}.v", l), std::move(kv.v));
      ++l;
    }
  } else if (is_safetensors(o.in)) {
    for (auto& t : read_safetensors(o.in)) {
      if (t.shape.size() != 2 && t.shape.size() != 3) {
        fmt::print(stderr, "kvq stats: {}: rank {} tensor skipped (not [T, H, D] or [T, D])\n",
                   t.name, t.shape.size());
        continue;
      }
      // load_kv's checks (zero sizes, non-finite values).
      ts.emplace_back(t.name, as_kv(o.in + ":" + t.name, t.shape, std::move(t.data)).tensor);
    }
    KVQ_CHECK(!ts.empty(), "{}: no [T, H, D] or [T, D] tensors", o.in);
  } else {
    ts.emplace_back(o.in, load_kv(o.in).tensor);
  }
  return ts;
}

// One head's line on stdout (its median and largest channel amax and kurtosis, its outlier
// channels) and its entry of the --json document.
json report_head(const std::string& name, const Tensor3& x, const HeadStats& h) {
  size_t amax_ch = 0, kurt_ch = 0;
  std::vector<double> k;
  for (size_t d = 0; d < h.channels.size(); ++d) {
    if (h.channels[d].amax > h.channels[amax_ch].amax) amax_ch = d;
    const double kd = h.channels[d].kurtosis;
    if (std::isfinite(kd)) {
      k.push_back(kd);
      if (!std::isfinite(h.channels[kurt_ch].kurtosis) || kd > h.channels[kurt_ch].kurtosis)
        kurt_ch = d;
    }
  }
  const double kmed = median(std::move(k));
  const double amax = h.channels[amax_ch].amax, kmax = h.channels[kurt_ch].kurtosis;
  std::string outl;
  for (int64_t d : h.outliers) outl += (outl.empty() ? "" : ", ") + std::to_string(d);
  fmt::print(
      "{:<22} {:>4} {:>7} {:>10.4g} {:>9.4g} ({:>4}) {:>7.1f}x {:>9.3g} {:>9.3g} ({:>4})  "
      "{}\n",
      name, h.head, x.shape.tokens, h.amax_median, amax, amax_ch,
      h.amax_median > 0 ? amax / h.amax_median : NAN, kmed, kmax, kurt_ch,
      outl.empty() ? "-" : outl);
  json chans = json::array();
  for (const auto& cs : h.channels)
    chans.push_back({{"amax", number(cs.amax)},
                     {"mean", number(cs.mean)},
                     {"std", number(cs.std)},
                     {"kurtosis", number(cs.kurtosis)}});
  return {{"tensor", name},           {"head", h.head},
          {"tokens", x.shape.tokens}, {"amax_median", number(h.amax_median)},
          {"outliers", h.outliers},   {"channels", std::move(chans)}};
}

}  // namespace

void register_stats(CLI::App& app) {
  auto o = std::make_shared<Opts>();
  auto* c = app.add_subcommand(
      "stats",
      "Per-head, per-channel statistics of K/V tensors over their tokens: amax, std, kurtosis (3 "
      "for\n"
      "a normal), and the outlier channels (amax above --threshold x the head's median channel "
      "amax),\n"
      "which is why KIVI quantizes keys per channel. One line per tensor and head on stdout.\n"
      "Example: kvq stats kv.safetensors        (a `kvq model dump`)\n"
      "         kvq stats --text kjv            (the model's own K/V over a text, nothing "
      "written)");
  auto* input = c->add_option(
      "input", o->in,
      "a `kvq model dump` (FILE.safetensors: every tensor), FILE.safetensors:TENSOR, or an\n"
      "npy; tensors [tokens, heads, head_dim] or [tokens, head_dim]");
  auto* text =
      c->add_option("--text", o->text,
                    "instead of a file: run the model over this text file (or 'kjv') and "
                    "measure every layer's k, k_pre and v, as `kvq model dump` would write");
  input->excludes(text);
  c->add_option("--max-tokens", o->max_tokens, "with --text: the first N tokens")
      ->check(at_least(1))
      ->capture_default_str();
  c->add_option("--model-file", o->model_file,
                "with --text: the GGUF (default: ~/.cache/kvq/SmolLM2-135M-Instruct.Q4_1.gguf)");
  c->add_option("--threads", o->threads, "with --text: threads (0 = all cores)")
      ->check(at_least(0))
      ->capture_default_str();
  c->add_option("--threshold", o->threshold,
                "outlier: channel amax above this many times the head's median channel amax")
      ->check(CLI::Range(1.0, 1e6))
      ->capture_default_str();
  c->add_option("--json", o->json_out,
                "also write every channel's statistics to this JSON file (atomically)");
  c->callback([o] {
    const std::vector<std::pair<std::string, Tensor3>> ts = load_tensors(*o);
    json doc = json::array();
    int64_t n_out = 0, n_ch = 0;
    fmt::print(
        "{:<22} {:>4} {:>7} {:>10} {:>16} {:>8} {:>9} {:>16}  outlier channels (amax > {:g}x "
        "median)\n",
        "tensor", "head", "tokens", "amax med", "amax max (ch)", "ratio", "kurt med",
        "kurt max (ch)", o->threshold);
    for (const auto& [name, x] : ts) {
      for (const HeadStats& h : channel_stats(x, o->threshold)) {
        doc.push_back(report_head(name, x, h));
        n_out += static_cast<int64_t>(h.outliers.size());
        n_ch += static_cast<int64_t>(h.channels.size());
      }
    }
    fmt::print("{} outlier channel{} of {} (threshold {:g}x the head's median amax)\n", n_out,
               n_out == 1 ? "" : "s", n_ch, o->threshold);
    // A channel's amax and kurtosis over a handful of tokens is noise, not an outlier channel.
    constexpr int64_t kFewTokens = 64;
    int64_t fewest = INT64_MAX;
    for (const auto& t : ts) fewest = std::min(fewest, t.second.shape.tokens);
    if (fewest < kFewTokens)
      fmt::print(stderr,
                 "kvq stats: warning: a tensor has only {} token{}: channel amax and kurtosis over "
                 "fewer than {} tokens say little, so the outlier count above is not a finding; "
                 "give more tokens\n",
                 fewest, fewest == 1 ? "" : "s", kFewTokens);
    if (!o->json_out.empty())
      write_file_atomic(
          o->json_out, json{{"threshold", o->threshold}, {"heads", std::move(doc)}}.dump(1) + "\n");
  });
}

}  // namespace kvq::cli
