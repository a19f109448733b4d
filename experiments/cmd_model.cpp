// kvq model ...: the real model (SmolLM2-135M-Instruct GGUF) with a quantized KV cache.
#include <fmt/format.h>

#include <omp.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/gguf.h"
#include "core/io.h"
#include "core/npy.h"
#include "core/safetensors.h"
#include "experiments/commands.h"
#include "evaluation/model_eval.h"
#include "evaluation/model_files.h"
#include "evaluation/planner.h"
#include "evaluation/serve.h"
#include "evaluation/serve_run.h"
#include "evaluation/synthetic.h"
#include "fp8/scale.h"
#include "kernels/backend.h"
#include "model/llama.h"
#include "model/tokenizer.h"

namespace kvq::cli {
namespace {

struct Common {
  std::string model_file, kv = kDefaultKv, json, backend = "cpu", weights = "mapped";
  bool pre_rope = false, hadamard = false;
  int threads = 0;
  int64_t device_chunk = LlamaModel::kDefaultDeviceChunk;  // backend cuda's prefill chunk
};

// The loaded model and tokenizer (loaded once per process).
using Loaded = eval::LoadedModel;

const Loaded& load(const Common& c) {
  static std::unique_ptr<Loaded> l;
  const AttentionBackend backend = parse_backend(c.backend);  // before the long load
  require_model(backend);      // cuda: the model on the GPU (model/llama_cuda.cpp)
  require_available(backend);  // cuda without a device: its one line, before the load
  if (!l) {
    const std::string path = model_path(c.model_file);
    const auto t0 = std::chrono::steady_clock::now();
    l = std::make_unique<Loaded>(eval::load_model(path, parse_weight_store(c.weights)));
    fmt::print(stderr, "loaded {} ({} layers, {} kv heads x {}) in {:.1f} s\n", path, l->model.config().layers,
               l->model.config().kv_heads, l->model.config().head_dim,
               std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  l->model.set_backend(backend);
  l->model.set_device_chunk(c.device_chunk);
  return *l;
}

// The model's shape from the GGUF's metadata alone (no weights), so that flags are checked
// against it before the long load.
const LlamaConfig& model_config(const Common& c) {
  static std::optional<LlamaConfig> cfg;
  if (!cfg) cfg = LlamaModel::read_config(model_path(c.model_file));
  return *cfg;
}

CacheOptions cache_options(const std::string& spec, bool pre_rope, bool hadamard = false) {
  CacheOptions o;
  o.spec = parse_spec(spec);
  if (hadamard) o.spec = with_rotation(o.spec, RotSpec{true});  // --hadamard: rot=hadamard
  o.pre_rope = pre_rope;
  return o;
}

void add_common(CLI::App* c, Common& o, bool with_kv = true) {
  c->add_option("--model-file,--model", o.model_file,
                "GGUF file, or Hugging Face checkpoint folder (config.json, *.safetensors, "
                "tokenizer.json; families: llama, mistral, qwen2, qwen3) (default: "
                "${KVQ_MODEL_DIR:-~/.cache/kvq}/SmolLM2-135M-Instruct.Q4_1.gguf, fetched by "
                "scripts/fetch-model.sh)");
  c->add_option("--weights", o.weights, kWeightsHelp)
      ->check(CLI::IsMember({"mapped", "packed", "fp32"}))
      ->capture_default_str();
  if (with_kv) {
    c->add_option("--kv", o.kv, "KV-cache scheme spec (fp32, bf16, fp8_e4m3:gran=token, kivi2, int4:k=channel,v=token,...)")
        ->capture_default_str();
    c->add_flag("--pre-rope", o.pre_rope, "quantize keys before RoPE and rotate them when reading (KVQuant)");
    c->add_flag("--hadamard", o.hadamard,
                "add rot=hadamard to the --kv spec (Walsh-Hadamard-rotated K and V, as llama.cpp stores its "
                "quantized caches; rot=hadamard:SEED in the spec for random signs)");
  }
  c->add_option("--threads", o.threads, "threads (0 = kvq chooses per forward pass between all cores and one, by measuring both: one wins when another process shares a core)")->check(at_least(0))->capture_default_str();
  c->add_option("--device-chunk", o.device_chunk,
                "backend cuda: a prompt's tokens per prefill chunk (each chunk's dense part over its rows at once "
                "and one causal attention call a layer); 1 runs every token as a decode step (token by token)")
      ->check(at_least(1))
      ->capture_default_str();
  c->add_option("--backend", o.backend,
                "attention backend, one of " + backend_names(" | ") +
                    ": cpu (SIMD kernels), cpu-int8 (the same kernels with reduced-precision "
                    "dot products: on 2/4-bit kivi codes int8 queries on keys and 8-bit weights on values, "
                    "on FP8 codes bf16 queries and weights in builds for AVX-512 BF16 and VBMI, head_dim a "
                    "multiple of 32) or ref (the scalar reference); all read the same stored codes, and "
                    "each keeps chunked prefill == token-by-token decode bit-identical. cuda: the whole "
                    "model on the GPU (bf16 weights, prompts in chunks of --device-chunk tokens, decode "
                    "token by token, its cache in device memory: "
                    "ppl, needle and kvq run's model rows measure against a bf16 cache there, it stores no "
                    "fp32 ones; dump and calibrate need host caches). What each runs:\n" +
                    support_help())
      ->check(
          [](const std::string& s) {
            try {
              require_model(parse_backend(s));  // kernels/backend.h: the one list of backend names
              return std::string();
            } catch (const Error& e) {
              return std::string(e.what());
            }
          },
          "")
      ->capture_default_str();
  c->add_option("--json", o.json, "also write the result as JSON to this file (atomically)");
}

// Runs f under StopOnCtrlC: a first Ctrl-C stops it at its next chunk with one line saying that
// nothing was written (these commands print and write their result at the end) and what keeps
// finished work (kvq run); exit status 130 as for SIGINT.
template <class F>
auto stopped_by_ctrl_c(const char* command, F&& f) {
  const StopOnCtrlC stop;
  try {
    return f();
  } catch (const Interrupted&) {
    throw Interrupted(fmt::format(
        "interrupted (Ctrl-C): kvq {} writes its result at the end, so nothing was written; run it "
        "again, smaller (--max-tokens), or as a kvq run config, which keeps every finished row",
        command));
  }
}

void write_json(const std::string& path, const nlohmann::json& j) {
  if (!path.empty()) write_file_atomic(path, j.dump(2) + "\n");
}

// The prompt: --prompt TEXT, or --text FILE ('kjv': the King James Bible); --prompt-file is the
// old name of --text.
std::string prompt_text(const std::string& prompt, const std::string& file) {
  if (!prompt.empty() && !file.empty()) usage_error("give --prompt or --text, not both");
  if (!file.empty()) return read_text(file);
  if (prompt.empty()) usage_error("no prompt: give --prompt TEXT or --text FILE (or --text kjv)");
  return prompt;
}

// --text FILE (the prompt's file, or 'kjv') and its old name --prompt-file, hidden.
void add_text_option(CLI::App* c, std::string& file) {
  c->add_option("--text", file, "file holding the prompt, or 'kjv' (the King James Bible)");
  c->add_option("--prompt-file", file, "the old name of --text")->group("");
}

std::vector<int32_t> encode_prompt(const Tokenizer& t, const std::string& text, bool chat) {
  // A plain prompt gets what the tokenizer's post-processor adds (Llama's and Mistral's BOS, as
  // `tokenizers` encodes by default; nothing for SmolLM2); a rendered chat holds its own BOS.
  auto ids = chat ? t.encode(t.chat({{"user", text}}, true), true) : t.encode(text, false, true);
  if (ids.empty()) fail("the prompt is empty after tokenization");
  return ids;
}

void register_generate(CLI::App* model) {
  struct O : Common {
    std::string prompt, prompt_file;
    int n = 64;
    bool chat = false;
  };
  auto o = std::make_shared<O>();
  auto* c = model->add_subcommand("generate", "Greedy generation with a quantized KV cache.\n"
                                              "Example: kvq model generate --kv kivi2 --chat --prompt 'What is gravity?' -n 80");
  add_common(c, *o);
  c->add_option("--prompt", o->prompt, "prompt text");
  add_text_option(c, o->prompt_file);
  c->add_option("-n", o->n, "tokens to generate")->check(at_least(1))->capture_default_str();
  c->add_flag("--chat", o->chat, "wrap the prompt in the instruct chat template");
  c->callback([o] {
    const CacheOptions co = cache_options(o->kv, o->pre_rope, o->hadamard);
    const std::string text = prompt_text(o->prompt, o->prompt_file);
    check_cache_options(co, model_config(*o));
    KVQ_CHECK(o->n < model_config(*o).context, "-n {} leaves no room for a prompt in the model's context {}", o->n,
              model_config(*o).context);
    const Loaded& L = load(*o);
    const auto ids = encode_prompt(L.tok, text, o->chat);
    const auto t0 = std::chrono::steady_clock::now();
    std::string out;
    const auto gen = eval::generate(L.model, co, ids, o->n, {L.tok.eos()}, o->threads, [&](int32_t t) {
      if (t == L.tok.eos()) return;
      const std::string piece(L.tok.token_bytes(t));  // mid-sequence bytes: keeps "▁"'s space
      out += piece;
      std::fputs(piece.c_str(), stdout);
      std::fflush(stdout);
    });
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::fputs("\n", stdout);
    fmt::print(stderr, "[{}] {} prompt + {} generated tokens in {:.2f} s\n", co.spec.canonical(), ids.size(), gen.size(), s);
    write_json(o->json, {{"kv", co.spec.canonical()}, {"backend", o->backend}, {"prompt_tokens", ids.size()}, {"tokens", gen}, {"text", out}, {"seconds", s}});
  });
}

void register_ppl(CLI::App* model) {
  struct O : Common {
    std::string text = "kjv";
    std::vector<std::string> also;
    eval::PplOptions p;
  };
  auto o = std::make_shared<O>();
  o->p.max_tokens = kDefaultMaxTokens;
  auto* c = model->add_subcommand(
      "ppl",
      "Perplexity of a text with the scheme's KV cache, plus KL divergence of every next-token\n"
      "distribution against the fp32 cache and top-1 agreement (llama-perplexity's KL mode).\n"
      "Teacher forcing is streaming-consistent: each position sees exactly the cache a token-by-token\n"
      "decode would hold. Example: kvq model ppl --kv kivi2 --text kjv --ctx 1024 --max-tokens 8192");
  add_common(c, *o);
  c->add_option("--text", o->text, "text file, or 'kjv' (King James Bible, scripts/fetch-text.sh)")->capture_default_str();
  c->add_option("--ctx", o->p.ctx, "window length (tokens)")->check(at_least(2))->capture_default_str();
  c->add_option("--stride", o->p.stride, "window step; 0 = --ctx (non-overlapping)")->check(at_least(0))->capture_default_str();
  c->add_option("--score-from", o->p.score_from,
                "score only positions >= N of every window (llama-perplexity scores the second half: "
                "--score-from CTX/2); 0 = all")
      ->check(at_least(0))
      ->capture_default_str();
  c->add_option("--chunk", o->p.chunk, "prefill chunk (tokens)")->check(at_least(1))->capture_default_str();
  c->add_option("--max-tokens", o->p.max_tokens, "use the first N tokens of the text (0 = all)")->check(at_least(0))->capture_default_str();
  c->add_option("--also", o->also,
                "more schemes scored in the same pass against the same fp32 reference (computed once per "
                "window); one row each. Example: --kv fp8_e4m3 --also fp8_e4m3:first=16 kivi4");
  c->callback([o] {
    std::vector<CacheOptions> cos{cache_options(o->kv, o->pre_rope, o->hadamard)};
    for (const auto& a : o->also) cos.push_back(cache_options(a, o->pre_rope, o->hadamard));
    const std::string text = read_text(o->text);
    eval::check_ppl_options(o->p, model_config(*o).context);
    for (const auto& co : cos) check_cache_options(co, model_config(*o));
    const Loaded& L = load(*o);
    const auto ids = L.tok.encode_first(text, o->p.max_tokens);
    o->p.threads = o->threads;
    o->p.poll = check_stop;  // Ctrl-C stops between chunks with a line saying what was kept
    const auto rs = stopped_by_ctrl_c("model ppl", [&] {
      return eval::perplexity(L.model, cos, ids, o->p, [](const std::string& m) { fmt::print(stderr, "[ppl] {}\n", m); });
    });
    const eval::PplResult& r = rs.front();
    const std::string mods = std::string(o->pre_rope ? " (pre-RoPE keys)" : "") + (o->hadamard ? " (Hadamard-rotated K/V)" : "");
    fmt::print("text        {} ({} tokens used)\n", o->text, r.windows * o->p.ctx);
    fmt::print("windows     {} x {} tokens, {} scored positions\n", r.windows, o->p.ctx, r.scored);
    fmt::print("attention   backend {}\n", o->backend);
    fmt::print("fp32 cache  ppl {:.4f}\n", r.ppl_ref);
    nlohmann::json rows = nlohmann::json::array();
    // Each statistic over its 95% interval (eval::kCiBlock's block bootstrap; "-" when unknown).
    const auto ci = [](const eval::Interval& i, const char* spec, double scale = 1.0) {
      return i.known() ? fmt::format(fmt::runtime(fmt::format("{{:{0}}}..{{:{0}}}", spec)),
                                     scale * i.lo, scale * i.hi)
                       : std::string("-");
    };
    fmt::print("{:<44} {:>15} {:>17} {:>17} {:>10} {:>11} {:>10}\n", "kv" + mods, "ppl", "delta",
               "mean KLD", "KLD p99", "top-1", "quantized");
    std::vector<std::string> warnings;
    for (size_t i = 0; i < cos.size(); ++i) {
      const eval::PplResult& x = rs[i];
      fmt::print("{:<44} {:>15.4f} {:>+17.4f} {:>17.6f} {:>10.6f} {:>10.2f}% {:>9.1f}%\n",
                 cos[i].spec.canonical(), x.ppl, x.ppl - x.ppl_ref, x.kld, x.kld_p99,
                 100.0 * x.top1, 100.0 * x.quantized);
      fmt::print("{:<44} {:>15} {:>17} {:>17} {:>10} {:>11}\n", "  95% interval",
                 ci(x.ppl_ci, ".3f"), ci(x.delta_ppl_ci, "+.3f"), ci(x.kld_ci, ".4f"), "",
                 ci(x.top1_ci, ".1f", 100.0));
      if (!eval::exact_by_design(cos[i].spec) && x.quantized < eval::kMinQuantizedFraction)
        warnings.push_back(eval::little_quantized(cos[i].spec.canonical(), o->p.ctx, x.quantized));
      nlohmann::json row = {{"kv", cos[i].spec.canonical()},
                            {"backend", o->backend},
                            {"pre_rope", o->pre_rope},
                            {"hadamard", o->hadamard},
                            {"text", o->text},
                            {"ctx", o->p.ctx},
                            {"score_from", o->p.score_from},
                            {"stride", o->p.stride},
                            {"windows", x.windows},
                            {"scored", x.scored}};
      for (const auto& [name, value] : eval::result_fields(x)) row[name] = value;
      row["ci_blocks"] = x.ci_blocks;
      row["seconds"] = x.seconds;
      rows.push_back(std::move(row));
    }
    fmt::print(
        "intervals   95%, block bootstrap over the scored positions ({} blocks of up to {} "
        "tokens, {} resamples)\n",
        r.ci_blocks, eval::kCiBlock, eval::kCiResamples);
    fmt::print("time        {:.1f} s\n", r.seconds);
    std::fflush(stdout);  // the warnings after the table they refer to
    for (const std::string& w : warnings) fmt::print(stderr, "warning: {}\n", w);
    write_json(o->json, rows.size() == 1 ? rows[0] : nlohmann::json{{"rows", rows}});
  });
}

void register_diverge(CLI::App* model) {
  struct O : Common {
    std::string vs = "fp32", prompt, prompt_file;
    int n = 64;
    bool chat = false;
  };
  auto o = std::make_shared<O>();
  auto* c = model->add_subcommand("diverge",
                                  "Greedy outputs of two caches side by side: the index of the first differing token\n"
                                  "and teacher-forced per-step top-1 agreement.\n"
                                  "Example: kvq model diverge --kv kivi2 --vs fp32 --text p.txt -n 100");
  add_common(c, *o);
  c->add_option("--vs", o->vs, "reference scheme")->capture_default_str();
  c->add_option("--prompt", o->prompt, "prompt text");
  add_text_option(c, o->prompt_file);
  c->add_option("-n", o->n, "tokens to generate")->check(at_least(1))->capture_default_str();
  c->add_flag("--chat", o->chat, "wrap the prompt in the instruct chat template");
  c->callback([o] {
    const CacheOptions test = cache_options(o->kv, o->pre_rope, o->hadamard), ref = cache_options(o->vs, false);
    const std::string text = prompt_text(o->prompt, o->prompt_file);
    check_cache_options(test, model_config(*o));
    KVQ_CHECK(o->n < model_config(*o).context, "-n {} leaves no room for a prompt in the model's context {}", o->n,
              model_config(*o).context);
    const Loaded& L = load(*o);
    const auto ids = encode_prompt(L.tok, text, o->chat);
    const auto r = eval::diverge(L.model, ref, test, ids, o->n, o->threads);
    fmt::print("{:>5}  {:<28} {:<28}\n", "step", ref.spec.canonical(), test.spec.canonical());
    for (size_t i = 0; i < r.ref.size(); ++i) {
      auto show = [&](int32_t t) {
        std::string s(L.tok.token_bytes(t));
        for (char& ch : s)
          if (ch == '\n') ch = ' ';
        return fmt::format("{:>6} {:<21}", t, "'" + s + "'");
      };
      fmt::print("{:>5}  {} {} {}\n", i, show(r.ref[i]), i < r.test.size() ? show(r.test[i]) : "",
                 i < r.test.size() && r.ref[i] != r.test[i] ? "<-" : "");
    }
    fmt::print("first divergence: {}\n", r.first_diff < 0 ? std::string("none") : fmt::format("step {}", r.first_diff));
    fmt::print("teacher-forced top-1 agreement: {:.2f}%\n", 100.0 * r.top1);
    write_json(o->json, {{"kv", test.spec.canonical()}, {"vs", ref.spec.canonical()}, {"backend", o->backend}, {"prompt_tokens", ids.size()},
                         {"ref", r.ref}, {"test", r.test}, {"first_diff", r.first_diff}, {"top1", r.top1}});
  });
}

void register_needle(CLI::App* model) {
  struct O : Common {
    std::vector<int> ctx{1024, 2048, 4096, 8192};
    std::vector<double> depth{0.1, 0.5, 0.9};
    int trials = 1;
    uint64_t seed = 1;
    std::string text = "kjv";
  };
  auto o = std::make_shared<O>();
  auto* c = model->add_subcommand(
      "needle",
      "Passkey retrieval in KJV text: a 5-digit pass key hidden at each depth of a haystack of each\n"
      "context length; accuracy of greedy retrieval and the mean log-probability of the key's tokens,\n"
      "for the scheme and the fp32 cache. Example: kvq model needle --kv kivi2 --ctx 1024,4096 --depth 0.1,0.5,0.9");
  add_common(c, *o);
  c->add_option("--ctx", o->ctx, "context lengths (comma separated, <= 8192)")->delimiter(',')->capture_default_str();
  c->add_option("--depth", o->depth, "needle depths in [0, 1] (comma separated)")->delimiter(',')->capture_default_str();
  c->add_option("--trials", o->trials, "pass keys per (ctx, depth)")->check(at_least(1))->capture_default_str();
  c->add_option("--seed", o->seed, "pass key seed")->capture_default_str();
  c->add_option("--text", o->text, "haystack text file, or 'kjv'")->capture_default_str();
  c->callback([o] {
    const CacheOptions test = cache_options(o->kv, o->pre_rope, o->hadamard),
                       ref{reference_spec(parse_backend(o->backend))};  // fp32; bf16 on cuda
    for (double d : o->depth) KVQ_CHECK(d >= 0 && d <= 1, "--depth {} outside [0, 1]", d);
    const std::string hay_text = read_text(o->text);
    const int context = model_config(*o).context;
    for (int cx : o->ctx) KVQ_CHECK(cx >= 256 && cx <= context, "--ctx {} outside [256, {}]", cx, context);
    check_cache_options(test, model_config(*o));
    const Loaded& L = load(*o);
    nlohmann::json rows = nlohmann::json::array();
    fmt::print("{:>6} {:>6} {:>7}  {:>8} {:>9}  {:>8} {:>9}\n", "ctx", "depth", "key", "fp32", "logprob", "scheme", "logprob");
    std::map<int, std::pair<int, int>> acc;  // ctx -> (fp32 correct, scheme correct)
    const auto on_row = [&](const eval::NeedleRow& r) {
      acc[r.ctx].first += r.ref.correct;
      acc[r.ctx].second += r.test.correct;
      fmt::print("{:>6} {:>6.2f} {:>7}  {:>8} {:>9.3f}  {:>8} {:>9.3f}\n", r.ctx, r.depth, r.key, r.ref.correct ? "yes" : "no",
                 r.ref.logprob, r.test.correct ? "yes" : "no", r.test.logprob);
      std::fflush(stdout);
      rows.push_back({{"ctx", r.ctx}, {"depth", r.depth}, {"key", r.key}, {"fp32_correct", r.ref.correct},
                      {"fp32_logprob", r.ref.logprob}, {"correct", r.test.correct}, {"logprob", r.test.logprob}});
    };
    stopped_by_ctrl_c("model needle", [&] {
      return eval::needle_grid(L, hay_text, ref, test, {o->ctx, o->depth, o->trials, o->seed, o->threads},
                               [&](const eval::NeedleRow& r) {
                                 on_row(r);
                                 check_stop();
                               },
                               [](const std::string& msg) { fmt::print(stderr, "{}\n", msg); });
    });
    const int per = static_cast<int>(o->depth.size()) * o->trials;
    for (const auto& [cx, ab] : acc)
      fmt::print("ctx {:>5}: accuracy fp32 {}/{}, {} {}/{}\n", cx, ab.first, per, test.spec.canonical(), ab.second, per);
    write_json(o->json, {{"kv", test.spec.canonical()}, {"backend", o->backend}, {"pre_rope", test.pre_rope}, {"rows", rows}});
  });
}

void register_dump(CLI::App* model) {
  struct O : Common {
    std::string prompt, prompt_file, out;
    int64_t max_tokens = kDefaultMaxTokens;
  };
  auto o = std::make_shared<O>();
  auto* c = model->add_subcommand("dump", "Per-layer K (post-RoPE and pre-RoPE) and V of a prompt, as safetensors\n"
                                          "(layer.L.k, layer.L.k_pre, layer.L.v: [tokens, kv_heads, head_dim] float32).\n"
                                          "Example: kvq model dump --text p.txt --out kv.safetensors");
  add_common(c, *o, false);
  c->add_option("--prompt", o->prompt, "prompt text");
  add_text_option(c, o->prompt_file);
  c->add_option("--max-tokens", o->max_tokens, "truncate the prompt to N tokens")->check(at_least(1))->capture_default_str();
  c->add_option("--out", o->out, "output .safetensors")->required();
  c->callback([o] {
    const std::string text = prompt_text(o->prompt, o->prompt_file);
    KVQ_CHECK(o->max_tokens <= model_config(*o).context, "--max-tokens {} exceeds the model's context {}",
              o->max_tokens, model_config(*o).context);
    const Loaded& L = load(*o);
    const auto ids = L.tok.encode_first(text, o->max_tokens);
    KVQ_CHECK(!ids.empty(), "the prompt is empty after tokenization");
    const auto& cfg = L.model.config();
    const int64_t T = static_cast<int64_t>(ids.size()), H = cfg.kv_heads, D = cfg.head_dim;
    std::vector<NamedTensor> ts;
    int l = 0;
    for (auto& kv : eval::dump_kv(L.model, ids, o->threads)) {
      ts.push_back({fmt::format("layer.{}.k", l), {T, H, D}, std::move(kv.k.data)});
      ts.push_back({fmt::format("layer.{}.k_pre", l), {T, H, D}, std::move(kv.k_pre.data)});
      ts.push_back({fmt::format("layer.{}.v", l), {T, H, D}, std::move(kv.v.data)});
      ++l;
    }
    write_safetensors(o->out, ts, {{"model", "SmolLM2-135M-Instruct.Q4_1"}, {"tokens", std::to_string(T)}});
    fmt::print("wrote {}: {} layers x (k, k_pre, v) [{}, {}, {}]\n", o->out, cfg.layers, T, H, D);
  });
}

void register_calibrate(CLI::App* model) {
  struct O : Common {
    std::string text = "kjv", out;
    int64_t tokens = kDefaultMaxTokens, skip = 0;
    int ctx = 1024;
  };
  auto o = std::make_shared<O>();
  auto* c = model->add_subcommand("calibrate",
                                  "Per-layer, per-head amax of K and V over calibration text, for FP8 scale=calib:FILE.\n"
                                  "Example: kvq model calibrate --text kjv --out scales.json; then\n"
                                  "         kvq model ppl --kv fp8_e4m3:gran=head,scale=calib:scales.json");
  add_common(c, *o, false);
  c->add_flag("--pre-rope", o->pre_rope, "record keys before RoPE (for --pre-rope runs)");
  c->add_option("--text", o->text, "text file, or 'kjv'")->capture_default_str();
  c->add_option("--max-tokens", o->tokens, "calibrate on the first N tokens of the text")->check(at_least(1))->capture_default_str();
  c->add_option("--tokens", o->tokens, "the old name of --max-tokens")->check(at_least(1))->group("");
  c->add_option("--skip-tokens", o->skip,
                "start after the first N tokens of the text (calibrate on text the evaluation does not read: "
                "`kvq model ppl` and `kvq run` read from the start)")
      ->check(at_least(0))
      ->capture_default_str();
  c->add_option("--ctx", o->ctx, "window length")->check(at_least(1))->capture_default_str();
  c->add_option("--out", o->out, "output JSON")->required();
  c->callback([o] {
    const std::string text = read_text(o->text);
    KVQ_CHECK(o->ctx <= model_config(*o).context, "--ctx {} exceeds the model's context {}", o->ctx,
              model_config(*o).context);
    const Loaded& L = load(*o);
    eval::CalibrateOptions co;
    co.text_name = o->text;
    co.max_tokens = o->tokens;
    co.skip = o->skip;
    co.ctx = o->ctx;
    co.pre_rope = o->pre_rope;
    co.threads = o->threads;
    co.poll = check_stop;
    const fp8::Calibration cal = stopped_by_ctrl_c("model calibrate", [&] {
      return eval::calibrate(L, text, co, [](const std::string& msg) { fmt::print(stderr, "{}\n", msg); });
    });
    fp8::write_calibration(o->out, cal);
    fmt::print("wrote {}: {} layers x {} heads (K and V amax)\n", o->out, L.model.config().layers,
               L.model.config().kv_heads);
  });
}

void register_logits(CLI::App* model) {
  struct O : Common {
    std::string prompt, prompt_file, out, ids_out;
    int64_t max_tokens = kDefaultMaxTokens;
  };
  auto o = std::make_shared<O>();
  auto* c = model->add_subcommand("logits", "Next-token logits of every position of a text (float32 npy [tokens, vocab]) and\n"
                                            "its token ids (JSON), for comparison with other implementations.\n"
                                            "Example: kvq model logits --text kjv --max-tokens 300 --out l.npy --ids-out ids.json");
  add_common(c, *o);
  c->add_option("--prompt", o->prompt, "prompt text");
  add_text_option(c, o->prompt_file);
  c->add_option("--max-tokens", o->max_tokens, "truncate to N tokens (the npy holds N x vocab floats: 400 MB at 2,048)")->check(at_least(1))->capture_default_str();
  c->add_option("--out", o->out, "output logits .npy")->required();
  c->add_option("--ids-out", o->ids_out, "also write the token ids as a JSON array");
  c->callback([o] {
    const CacheOptions co = cache_options(o->kv, o->pre_rope, o->hadamard);
    const std::string text = prompt_text(o->prompt, o->prompt_file);
    check_cache_options(co, model_config(*o));
    KVQ_CHECK(o->max_tokens <= model_config(*o).context, "--max-tokens {} exceeds the model's context {}",
              o->max_tokens, model_config(*o).context);
    const Loaded& L = load(*o);
    const auto ids = L.tok.encode_first(text, o->max_tokens);
    KVQ_CHECK(!ids.empty(), "the text is empty after tokenization");
    LlamaCache cache(L.model.config(), co);
    std::vector<float> logits;
    L.model.forward(ids, cache, logits, true, o->threads);
    write_npy(o->out, {static_cast<int64_t>(ids.size()), L.model.config().vocab}, logits.data());
    if (!o->ids_out.empty()) write_file_atomic(o->ids_out, nlohmann::json(ids).dump() + "\n");
    fmt::print("wrote {}: [{}, {}] logits ({})\n", o->out, ids.size(), L.model.config().vocab, co.spec.canonical());
  });
}

void register_bench(CLI::App* model) {
  struct O : Common {
    std::string text = "kjv", fill = "prefill";
    int prompt = 512, gen = 64, depth = 0, reps = 3, batch = 1;
  };
  auto o = std::make_shared<O>();
  auto* c = model->add_subcommand(
      "bench",
      "Model throughput, as llama-bench reports it: prefill of --prompt tokens in one call (pp) and\n"
      "token-by-token decode of --gen tokens (tg), each after --depth tokens already in the cache.\n"
      "Wall-clock tokens/s, median of --reps runs, plus CPU seconds and peak memory (RSS). With\n"
      "--batch B, tg decodes B sequences a token each per step (backend cuda: one batched call a step,\n"
      "as serve-bench's, the first step untimed; the host backends one sequence after another) and\n"
      "counts all B's tokens;\n"
      "--fill synthetic puts the depth in without running the model over it, for batches too deep\n"
      "to prefill.\n"
      "Example: kvq model bench --threads 2 --prompt-tokens 512 --gen 64 --depth 8192 --kv kivi2\n"
      "         kvq model bench --backend cuda --prompt-tokens 0 --gen 32 --depth 8192 --batch 64 --fill synthetic");
  add_common(c, *o);
  c->add_option("--text", o->text, "text the tokens come from, or 'kjv'")->capture_default_str();
  c->add_option("--prompt-tokens", o->prompt, "prefill tokens (0 = skip pp)")->check(at_least(0))->capture_default_str();
  // --prompt is a prompt's text in every other model command; here it was a count (before 0.x)
  c->add_option_function<std::string>(
       "--prompt",
       [](const std::string&) {
         usage_error("--prompt is a prompt's text in kvq model; bench's prefill length is --prompt-tokens N");
       })
      ->group("");
  c->add_option("--gen", o->gen, "decoded tokens (0 = skip tg)")->check(at_least(0))->capture_default_str();
  c->add_option("--depth", o->depth, "tokens in the cache before each measurement")->check(at_least(0))->capture_default_str();
  c->add_option("--reps", o->reps, "repetitions (the median is reported)")->check(at_least(1))->capture_default_str();
  c->add_option("--batch", o->batch,
                "tg: sequences decoded together, each --depth tokens deep, a token each per step (backend cuda: "
                "one batched call a step, LlamaModel::decode_batch; the host backends one sequence after another); "
                "tokens/s counts every sequence's tokens. Only with --prompt-tokens 0")
      ->check(at_least(1))
      ->capture_default_str();
  c->add_option("--fill", o->fill,
                "how --depth's tokens enter each cache: prefill (the model runs them) or synthetic (the model runs "
                "the first; the other depth - 1 K/V rows of every layer are evaluation/synthetic.h's made-up rows, "
                "appended and quantized as a prefill's would be: the same bytes for the decode to read without "
                "the prefill's cost; the outputs then mean nothing)")
      ->check(CLI::IsMember({"prefill", "synthetic"}))
      ->capture_default_str();
  c->callback([o] {
    const CacheOptions co = cache_options(o->kv, o->pre_rope, o->hadamard);
    if (o->batch > 1 && o->prompt > 0)
      usage_error("bench: --batch {} times decode (tg) only; give --prompt-tokens 0 with it", o->batch);
    const std::string text = read_text(o->text);
    const int64_t need = static_cast<int64_t>(o->depth) + std::max(o->prompt, o->gen);
    KVQ_CHECK(need <= model_config(*o).context, "bench: --depth {} + {} tokens exceed the model's context {}",
              o->depth, std::max(o->prompt, o->gen), model_config(*o).context);
    check_cache_options(co, model_config(*o));
    const Loaded& L = load(*o);
    const auto ids = L.tok.encode_first(text, need);
    KVQ_CHECK(static_cast<int64_t>(ids.size()) >= need, "bench: the text has {} tokens, {} needed", ids.size(), need);
    const int threads = o->threads;  // 0: the model chooses per pass (model/thread_team.h, AutoThreads)
    const std::string threads_label =
        threads > 0 ? std::to_string(threads) : fmt::format("auto (1 or {} per pass)", omp_get_num_procs());
    auto cpu_now = [] { return static_cast<double>(std::clock()) / CLOCKS_PER_SEC; };
    // --fill synthetic: K and V rows for depth - 1 tokens, the [throughput] sweep's (keys with
    // outlier channels); the same rows go to every layer and sequence
    const LlamaConfig& mc = L.model.config();
    const Tensor3 syn_k = o->fill == "synthetic" && o->depth > 1
                              ? synthetic_kv({{o->depth - 1, mc.kv_heads, mc.head_dim}, 2, 12.0f, 1})
                              : Tensor3{},
                  syn_v = o->fill == "synthetic" && o->depth > 1
                              ? synthetic_kv({{o->depth - 1, mc.kv_heads, mc.head_dim}, 0, 1.0f, 2})
                              : Tensor3{};
    auto fill = [&](LlamaCache& cache) {  // the untimed context
      std::vector<float> logits;
      if (o->fill == "synthetic" && o->depth > 0) {
        // the first token through the model puts the sides where the backend keeps them
        L.model.forward({ids.data(), 1}, cache, logits, false, threads);
        if (o->depth > 1)
          for (LlamaCache::Layer& l : cache.layers()) {
            l.k->append(syn_k.data.data(), o->depth - 1);
            l.v->append(syn_v.data.data(), o->depth - 1);
          }
        return;
      }
      for (int64_t a = 0; a < o->depth; a += 512)
        L.model.forward({ids.data() + a, static_cast<size_t>(std::min<int64_t>(512, o->depth - a))}, cache, logits,
                        false, threads);
    };
    struct Stat {
      std::vector<double> tps, cpu;
    } pp, tg;
    double tg_cache_bytes = 0;  // the tg caches' stored bytes after their last step
    for (int r = 0; r < o->reps; ++r) {
      std::vector<float> logits;
      if (o->prompt > 0) {
        LlamaCache cache(L.model.config(), co);
        fill(cache);
        const auto t0 = std::chrono::steady_clock::now();
        const double c0 = cpu_now();
        L.model.forward({ids.data() + o->depth, static_cast<size_t>(o->prompt)}, cache, logits, false, threads);
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        pp.tps.push_back(o->prompt / s);
        pp.cpu.push_back((cpu_now() - c0) / o->prompt * 1e3);
      }
      if (o->gen > 0) {
        std::vector<std::unique_ptr<LlamaCache>> caches;
        std::vector<LlamaCache*> cs;
        for (int b = 0; b < o->batch; ++b) {
          caches.push_back(std::make_unique<LlamaCache>(L.model.config(), co));
          fill(*caches.back());
          for (LlamaCache::Layer& l : caches.back()->layers()) {  // no reallocation in a timed step
            l.k->reserve(o->depth + o->gen);
            l.v->reserve(o->depth + o->gen);
          }
          cs.push_back(caches.back().get());
        }
        const bool batched = o->batch > 1 && L.model.backend() == AttentionBackend::kCuda;
        if (batched) L.model.reserve_device_batch(o->batch);  // no allocation inside the timed steps
        std::vector<int32_t> step(static_cast<size_t>(o->batch));
        auto decode_step = [&](int i) {
          std::fill(step.begin(), step.end(), ids[static_cast<size_t>(o->depth + i)]);
          if (batched)
            L.model.decode_batch(step, cs, logits);
          else
            for (LlamaCache* cache : cs) L.model.forward({step.data(), 1}, *cache, logits, false, threads);
        };
        // The first batched step runs untimed: its launches load the batched kernels (CUDA loads a
        // module's kernels at their first launch), which a one-rep batch run would otherwise time.
        const int untimed = batched && o->gen > 1 ? 1 : 0;
        for (int i = 0; i < untimed; ++i) decode_step(i);
        const auto t0 = std::chrono::steady_clock::now();
        const double c0 = cpu_now();
        for (int i = untimed; i < o->gen; ++i) decode_step(i);
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        const double tokens = static_cast<double>(o->gen - untimed) * o->batch;
        tg.tps.push_back(tokens / s);
        tg_cache_bytes = 0;
        for (const LlamaCache* cache : cs) tg_cache_bytes += cache->bytes();
        tg.cpu.push_back((cpu_now() - c0) / tokens * 1e3);
      }
      fmt::print(stderr, "[bench] rep {}/{}{}{}\n", r + 1, o->reps,
                 pp.tps.empty() ? "" : fmt::format(": pp{} {:.1f} tok/s", o->prompt, pp.tps.back()),
                 tg.tps.empty() ? "" : fmt::format(", tg{} {:.1f} tok/s", o->gen, tg.tps.back()));
    }
    auto median = [](std::vector<double> v) {
      std::sort(v.begin(), v.end());
      return v.empty() ? 0.0 : v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
    };
    struct rusage ru {};
    getrusage(RUSAGE_SELF, &ru);
    const double rss_mb = static_cast<double>(ru.ru_maxrss) / 1024.0;
    fmt::print("model       {} ({}; {:.1f} MB of weights)\n", model_path(o->model_file), L.model.weight_formats(),
               static_cast<double>(L.model.weight_bytes()) / 1e6);
    fmt::print("kv          {}, threads {}, depth {}{}{}\n", co.spec.canonical(), threads_label, o->depth,
               o->fill == "synthetic" ? " (synthetic rows after the first token)" : "",
               o->batch > 1 ? fmt::format(", batch {}", o->batch) : "");
    fmt::print("{:<8} {:>10} {:>14} {:>6}\n", "test", "tokens/s", "CPU ms/token", "reps");
    if (!pp.tps.empty()) fmt::print("{:<8} {:>10.1f} {:>14.2f} {:>6}\n", fmt::format("pp{}", o->prompt), median(pp.tps), median(pp.cpu), o->reps);
    if (!tg.tps.empty()) fmt::print("{:<8} {:>10.1f} {:>14.2f} {:>6}\n", fmt::format("tg{}", o->gen), median(tg.tps), median(tg.cpu), o->reps);
    fmt::print("peak RSS    {:.0f} MB\n", rss_mb);
    nlohmann::json j = {{"kv", co.spec.canonical()}, {"backend", o->backend}, {"threads", threads}, {"depth", o->depth}, {"prompt", o->prompt},
              {"gen", o->gen}, {"batch", o->batch}, {"fill", o->fill}, {"pp_tokens_per_s", median(pp.tps)}, {"tg_tokens_per_s", median(tg.tps)},
              {"pp_cpu_ms_per_token", median(pp.cpu)}, {"tg_cpu_ms_per_token", median(tg.cpu)},
              {"peak_rss_mb", rss_mb}, {"weights", L.model.weight_formats()}, {"tg_cache_bytes", tg_cache_bytes}};
    if (L.model.backend() == AttentionBackend::kCuda) {
      // Every decode step (a token of each of --batch sequences) reads every device weight once and
      // each cache once: the bandwidths tg's rate implies from the weights alone and from both.
      const DeviceReport d = device_report(AttentionBackend::kCuda);
      const double wb = static_cast<double>(L.model.device_weight_bytes()), steps = median(tg.tps) / o->batch;
      const double gbps = steps * wb / 1e9, read_gbps = steps * (wb + tg_cache_bytes) / 1e9;
      fmt::print("device      {}: {:.1f} MB of weights; tg reads them at {:.1f} GB/s = {:.3f} of peak {:.0f} GB/s ({})\n",
                 d.name, wb / 1e6, gbps, d.peak_gbps > 0 ? gbps / d.peak_gbps : 0.0, d.peak_gbps, d.peak_formula);
      fmt::print("            with the caches ({:.1f} MB after the last step): {:.1f} GB/s = {:.3f} of peak\n",
                 tg_cache_bytes / 1e6, read_gbps, d.peak_gbps > 0 ? read_gbps / d.peak_gbps : 0.0);
      j["device"] = d.name;
      j["device_weight_bytes"] = wb;
      j["tg_weight_gbps"] = gbps;
      j["tg_read_gbps"] = read_gbps;
      j["peak_gbps"] = d.peak_gbps;
    }
    write_json(o->json, j);
  });
}

// Serving-style batches (issue 47 item 3): evaluation/serve.h's schedule run on the model
// (evaluation/serve_run.h): on backend cuda each step's held requests decode as one batched call
// (LlamaModel::decode_batch); the host backends, which have no batched forward, decode them one
// after another in the batch order.
void register_serve_bench(CLI::App* model) {
  struct O : Common {
    std::string text = "kjv", mem = "0.02";
    int requests = 8, prompt = 64, gen = 16;
    int64_t max_batch = 0;
  };
  auto o = std::make_shared<O>();
  auto* c = model->add_subcommand(
      "serve-bench",
      "Requests of different prompt and output lengths admitted first come first served while their\n"
      "caches fit --mem (evaluation/serve.h: each reserves its peak cache bytes, the planner's\n"
      "formula), prefilled on admission, then decoded a token per step each, in admission order.\n"
      "Reports decode and prefill tokens/s (wall), requests held, and the caches' peak bytes\n"
      "measured beside the schedule's prediction. Request i has --prompt-tokens / 2 + (37 i mod\n"
      "(--prompt-tokens / 2 + 1)) prompt tokens and --gen / 2 + (13 i mod (--gen / 2 + 1)) outputs.\n"
      "On --backend cuda each step's decodes run as one batched call (every layer's products over the\n"
      "batch's rows, one attention launch over its caches; the host backends decode them one after\n"
      "another), and the report adds the device memory in use (cudaMemGetInfo) and the planner's\n"
      "decode tokens/s bound at the GPU's peak bandwidth.\n"
      "Example: kvq model serve-bench --kv kivi2 --mem 0.02 --requests 8 --prompt-tokens 64 --gen 16");
  add_common(c, *o);
  c->add_option("--text", o->text, "text the prompts come from, or 'kjv'")->capture_default_str();
  c->add_option("--mem", o->mem, "KV memory cap in GB (decimal; 80GiB for binary)")->capture_default_str();
  c->add_option("--requests", o->requests, "requests")->check(at_least(1))->capture_default_str();
  c->add_option("--prompt-tokens", o->prompt, "longest prompt (tokens)")->check(at_least(2))->capture_default_str();
  c->add_option("--gen", o->gen, "most tokens a request generates")->check(at_least(2))->capture_default_str();
  c->add_option("--max-batch", o->max_batch, "most requests held at once (0: only --mem limits)")
      ->check(at_least(0))
      ->capture_default_str();
  c->callback([o] {
    const CacheOptions co = cache_options(o->kv, o->pre_rope, o->hadamard);
    const LlamaConfig& cfg = model_config(*o);
    check_cache_options(co, cfg);
    KVQ_CHECK(o->prompt + o->gen <= cfg.context, "serve-bench: --prompt-tokens {} + --gen {} exceed the model's context {}",
              o->prompt, o->gen, cfg.context);
    const std::vector<eval::ServeRequest> reqs = eval::serve_requests(o->requests, o->prompt, o->gen);
    const planner::ModelDims dims{"model", cfg.layers, cfg.kv_heads, cfg.head_dim, 0};
    const double mem = planner::parse_gb(o->mem, "--mem");
    const eval::ServeSchedule plan = eval::schedule_serve(dims, co.spec, reqs, {mem, o->max_batch});
    const std::vector<eval::ServeStepCalls> calls = eval::serve_calls(dims, co.spec, reqs, plan);
    const Loaded& L = load(*o);
    const auto ids = L.tok.encode_first(read_text(o->text), o->prompt);
    KVQ_CHECK(static_cast<int64_t>(ids.size()) >= o->prompt, "serve-bench: the text has {} tokens, {} needed",
              ids.size(), o->prompt);
    const eval::ServeRunResult r = eval::run_serve(L.model, ids, reqs, co, calls, o->threads);
    const double decode_tps = r.decode_s > 0 ? r.decode_tokens / r.decode_s : 0;
    fmt::print("kv          {}, backend {}, --mem {:.4g} GB, {} requests ({}-{} prompt, {}-{} output tokens)\n",
               co.spec.canonical(), o->backend, mem / 1e9, reqs.size(), o->prompt / 2, o->prompt, o->gen / 2, o->gen);
    fmt::print("steps       {}, requests held at most {}{}\n", plan.steps.size(), plan.max_held,
               o->max_batch ? fmt::format(" (--max-batch {})", o->max_batch) : "");
    if (r.batched)
      fmt::print("decode      {:.1f} tokens/s ({} tokens, wall; each step's requests as one batched call: {} calls of "
                 "up to {})\n",
                 decode_tps, r.decode_tokens, r.decode_calls, eval::max_decode_batch(calls));
    else
      fmt::print("decode      {:.1f} tokens/s ({} tokens, wall; a step's requests one after another)\n", decode_tps,
                 r.decode_tokens);
    fmt::print("prefill     {:.1f} tokens/s ({} tokens{})\n", r.prefill_s > 0 ? r.prefill_tokens / r.prefill_s : 0.0,
               r.prefill_tokens,
               r.batched ? fmt::format(", each request alone, in chunks of {}", o->device_chunk) : std::string());
    fmt::print("cache bytes peak {:.0f} measured, {:.0f} predicted by the schedule; {:.0f} reserved (cap {:.0f})\n",
               r.peak_cache_bytes, plan.peak_live_bytes, plan.peak_reserved_bytes, mem);
    nlohmann::ordered_json j = {{"kv", co.spec.canonical()}, {"backend", o->backend}};
    j.update(eval::serve_fields(L.model, mem, plan, calls, r));
    if (r.batched) {
      // The planner's bound: each decode call reads the device weights once and its caches once at
      // the GPU's peak bandwidth (planner::decode_step_seconds).
      const DeviceReport d = device_report(AttentionBackend::kCuda);
      const double wb = static_cast<double>(L.model.device_weight_bytes());
      const eval::DecodeBound bound = eval::decode_bound(calls, wb, d.peak_gbps * 1e9);
      fmt::print("device      {}: memory in use (cudaMemGetInfo, total - free) peak {} bytes, {} with the weights "
                 "({:.0f}) and activations before any cache: the run added {} bytes\n",
                 d.name, r.device_bytes_peak, r.device_bytes_start, wb, r.device_bytes_peak - r.device_bytes_start);
      fmt::print("bound       {:.1f} tokens/s by the planner (each call reads the weights and its caches once at {:.0f} "
                 "GB/s); measured {:.3f} of it\n",
                 bound.tokens_per_s(), d.peak_gbps, bound.tokens_per_s() > 0 ? decode_tps / bound.tokens_per_s() : 0.0);
    }
    write_json(o->json, j);
  });
}

}  // namespace

void register_model(CLI::App& app) {
  auto* model = app.add_subcommand("model");
  model->require_subcommand(1);
  register_generate(model);
  register_ppl(model);
  register_diverge(model);
  register_needle(model);
  register_dump(model);
  register_calibrate(model);
  register_logits(model);
  register_bench(model);
  register_serve_bench(model);
  std::string names;  // from the registrations, so the list cannot fall behind them
  for (const CLI::App* sub : model->get_subcommands([](const CLI::App*) { return true; }))
    names += (names.empty() ? "" : ", ") + sub->get_name();
  model->description(
      "Run a Llama-family model with a quantized KV cache: " + names +
      ".\nThe model (--model): SmolLM2-135M-Instruct's GGUF by default, any llama GGUF, or a "
      "Hugging Face checkpoint folder (config.json, *.safetensors [+ index], tokenizer.json) of "
      "the families " +
      architecture_names() +
      " (bf16/fp16/fp32 weights, or fp8 with their scales; README \"Your own checkpoint\").");
}

}  // namespace kvq::cli
