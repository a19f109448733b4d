// kvq advise: which KV-cache scheme to serve a workload with, from the planner's bounds and the
// quality rows of `kvq run` results (evaluation/advisor.h has the rule).
#include <fmt/format.h>

#include <filesystem>

#include "core/error.h"
#include "core/gguf.h"
#include "core/io.h"
#include "evaluation/advisor.h"
#include "experiments/commands.h"
#include "evaluation/model_files.h"
#include "model/llama.h"

namespace kvq::cli {

void register_advise(CLI::App& app) {
  struct Opts {
    PlanFlags::Values v;
    std::vector<std::string> results{"results/default"};
    std::string gguf;
    double max_kld = 0, max_dppl = 0, min_gain = 1.10;
  };
  auto o = std::make_shared<Opts>();
  auto* c = app.add_subcommand(
      "advise",
      "Should this workload quantize its KV cache, and with which scheme? kvq advise combines the\n"
      "planner's capacity and decode-step bounds (kvq plan) with the quality rows of kvq run\n"
      "results (KLD and perplexity against the fp32 cache, measured, never guessed), prints the\n"
      "table it decided from, and answers: the eligible scheme with the most decode tokens/s, or\n"
      "'do not quantize' when bf16 holds the batch and nothing gains --min-gain over it.\n"
      "Example (the design note's scenario, quality from the default study):\n"
      "  kvq run experiments/configs/default.toml && kvq advise --max-kld 0.05");
  c->footer(plan_footer());
  const PlanFlags flags = add_plan_flags(c, o->v);
  auto* gguf = c->add_option(
      "--gguf", o->gguf,
      "the model from a llama-architecture GGUF instead of --model: its layers, kv heads and head\n"
      "dim from the metadata, its tensor bytes as the weights read per decode step");
  c->add_option("--results", o->results,
                "kvq run output directories whose model rows give the quality (model.jsonl)")
      ->capture_default_str();
  auto* kld = c->add_option("--max-kld", o->max_kld,
                            "quality budget: mean KLD per token against the fp32 cache, in nats "
                            "(e.g. 0.05)")
                  ->check(above_zero());
  auto* dppl = c->add_option("--max-dppl", o->max_dppl,
                             "quality budget: perplexity increase over the fp32 cache (e.g. 0.1)")
                   ->check(above_zero());
  c->add_option("--min-gain", o->min_gain,
                "smallest decode speed-up over bf16 worth quantizing for when bf16 fits")
      ->check(above_zero())
      ->capture_default_str();
  c->callback([o, flags, kld, dppl, gguf] {
    advisor::Budget b;
    if (kld->count()) b.max_kld = o->max_kld;
    if (dppl->count()) b.max_dppl = o->max_dppl;
    planner::PlanInput in = flags.resolve();
    if (gguf->count()) {
      if (flags.model->count() || flags.layers->count() || flags.kv_heads->count() ||
          flags.head_dim->count() || flags.params->count() || flags.weights->count() ||
          flags.weights_dtype->count())
        usage_error(
            "--gguf gives the model and its weight bytes; leave out --model, --layers, "
            "--kv-heads, --head-dim, --params, --weights-bytes and --weights-dtype");
      const auto f = gguf::GgufFile::open(model_path(o->gguf));
      const LlamaConfig cfg = LlamaModel::read_config(f);
      double bytes = 0;
      for (const auto& t : f.tensors()) bytes += static_cast<double>(t.nbytes);
      in.model = {std::filesystem::path(o->gguf).filename().string(), cfg.layers, cfg.kv_heads,
                  cfg.head_dim, 0.0};
      in.weight_bytes = bytes;
      // The design note's 55 GB belongs to its own model: a GGUF gets --mem, or 90% of --gpu's
      // memory minus its weights.
      KVQ_CHECK(flags.mem->count() || flags.gpu->count(),
                "--gguf: give --mem (the KV memory) or --gpu (90% of its memory minus the "
                "weights)");
    }
    const auto rows = advisor::read_quality(o->results);
    fmt::print("{}", advisor::format_advice(advisor::advise(in, rows, b, o->min_gain), b));
  });
}

}  // namespace kvq::cli
