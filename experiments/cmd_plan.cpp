// kvq plan: how many tokens and requests fit in the KV memory, and how much faster a decode step
// bound by memory reads gets, for each KV format (REFERENCE.md sections 1 and 5).
#include <fmt/format.h>

#include "core/error.h"
#include "core/io.h"
#include "experiments/commands.h"
#include "evaluation/planner.h"

namespace kvq::cli {
namespace {

constexpr const char* kPlanFooter = R"(
How the numbers are made (GB = 10^9 bytes, TB/s = 10^12 bytes/s, KiB = 1,024 bytes):
  bytes of a request of N tokens = sum over layers of footprint(K, [N, kv_heads, head_dim])
                                                    + footprint(V, [N, kv_heads, head_dim])
    the same kvq::footprint the quantizers use: codes, scale and zero bytes per group, and the
    R most recent tokens of kivi/int schemes (and sink=S tokens) kept at 2 bytes per element;
    a per-layer spec (kivi2@0-1=kivi4) counts each layer in its own scheme.
  KiB/token   = bytes of one --ctx request / --ctx (per-request scales and the window spread
                over the request: 128 KiB for bf16 and 64 KiB for fp8 on llama-3.1-8b, where fp8's
                per-tensor scales add 1/16 byte per token at --ctx 4096)
  bits/elem   = codes + scales + zeros per quantized element (the recent window not counted)
  tokens      = --mem / KiB/token (rounded); reqs = floor(--mem / bytes of one --ctx request)
  KV read     = batch x bytes of one --decode-ctx request
  batch       = --batch, or the --decode-ctx requests that fit in --mem if fewer (a note says so)
  min step    = (weight bytes + KV read) / bandwidth; tokens/s = batch / min step;
  speedup     = tokens/s / bf16's tokens/s (bf16 computed whether or not --kv lists it)

KV formats (--kv): bf16, fp16, fp32; fp8 (= fp8_e4m3, one dynamic scale per layer tensor; also
  fp8:gran=head); any fp8_e4m3|fp8_e4m3fnuz|fp8_e5m2[:gran=...,scale=...]; int2, int3, int4, int8
  (= int<B>:k=channel,v=token,g=32,r=0); kivi2/kivi4 (= g=32, r=128); any full spec such as
  kivi2:g=32,r=128 or int4:k=token,v=token,g=64.
)";

constexpr const char* kPlanExamples = R"(
Examples:
  kvq plan                      the design note's scenario (llama-3.1-8b, 55 GB, h100-sxm)
  kvq plan --model llama-3.1-70b --gpu h200 --weights-bytes 70.6 --mem 60GB --ctx 32768
           --kv bf16 fp8 kivi2:g=32,r=128 int4:k=channel,v=token,g=64
  kvq plan --model llama-3.1-70b --gpu h200 --weights-dtype fp8 --kv bf16 fp8 kivi2
  kvq plan --layers 30 --kv-heads 3 --head-dim 64 --params 0.135 --bandwidth 0.3 --mem 8 --json)";

}  // namespace

// The footer: how the numbers are made, the presets (from the planner's tables), examples.
std::string plan_footer() {
  std::string s = kPlanFooter;
  s += "\nModel presets (--model):       layers  kv heads  head dim  params\n";
  for (const auto& m : planner::model_presets())
    s += fmt::format("  {:<28} {:>6}  {:>8}  {:>8}  {:>5.3g} B\n", m.name, m.layers, m.kv_heads,
                     m.head_dim, m.params / 1e9);
  s += "GPU presets (--gpu):           memory  bandwidth\n";
  for (const auto& g : planner::gpu_presets())
    s += fmt::format("  {:<28} {:>3.0f} GB  {:>4.2f} TB/s\n", g.name, g.mem_bytes / 1e9,
                     g.bandwidth / 1e12);
  return s + kPlanExamples;
}

PlanFlags add_plan_flags(CLI::App* c, PlanFlags::Values& o) {
  PlanFlags f;
  f.model = c->add_option("--model", o.model,
                          "model preset (default llama-3.1-8b; presets below), or a custom "
                          "model: all of the next four");
  f.layers = c->add_option("--layers", o.layers, "custom model: decoder layers (e.g. 32)");
  f.kv_heads = c->add_option("--kv-heads", o.kv_heads, "custom model: KV heads (e.g. 8)");
  f.head_dim = c->add_option("--head-dim", o.head_dim, "custom model: head dim (e.g. 128)");
  f.params = c->add_option("--params", o.params,
                           "custom model: parameters in billions (e.g. 8.03); sets the "
                           "weight bytes to params x 2 (bf16)");
  f.mem = c->add_option(
      "--mem", o.mem,
      "memory for the KV cache in GB (55, 55GB, 80GiB, 500MB); default: 90% of the GPU's memory\n"
      "minus the weights (vLLM's default gpu_memory_utilization), or the design note's 55 GB when\n"
      "no model or GPU flag is given");
  f.gpu = c->add_option("--gpu", o.gpu, "GPU preset (default h100-sxm; presets below)");
  f.bw = c->add_option("--bandwidth", o.bandwidth,
                       "memory bandwidth in TB/s instead of --gpu (e.g. 3.35)");
  f.weights = c->add_option(
      "--weights-bytes", o.weights,
      "weight bytes read per decode step, in GB like --mem (default params x 2 bytes; 0: KV only)");
  f.weights_dtype =
      c->add_option(
           "--weights-dtype", o.in.weights_dtype,
           "weights in memory and read per step: bf16 | fp16 (2 bytes per parameter) | fp8 (1) |\n"
           "int4 (0.5 + a bf16 scale per 128 weights)")
          ->check(CLI::IsMember({"bf16", "fp16", "fp8", "int4"}))
          ->capture_default_str();
  // The workload: one name, meaning and default in kvq plan and kvq advise.
  c->add_option("--ctx", o.in.ctx, "tokens per request, for capacity: how many requests fit")
      ->capture_default_str();
  c->add_option("--batch", o.in.batch, "requests in the decode batch")->capture_default_str();
  c->add_option("--decode-ctx", o.in.decode_ctx,
                "tokens of context per decode-batch request (kvq advise: the quality rows nearest "
                "it are used)")
      ->capture_default_str();
  f.values = &o;
  return f;
}

planner::PlanInput PlanFlags::resolve() const {
  const Values& o = *values;
  planner::ModelArgs a;
  if (model->count()) a.preset = o.model;
  if (layers->count()) a.layers = o.layers;
  if (kv_heads->count()) a.kv_heads = o.kv_heads;
  if (head_dim->count()) a.head_dim = o.head_dim;
  if (params->count()) a.params_billions = o.params;
  planner::PlanInput in = o.in;
  in.model = planner::resolve_model(a, weights->count() > 0);
  in.gpu = planner::resolve_gpu(gpu->count() ? std::optional<std::string>(o.gpu) : std::nullopt,
                                bw->count() ? std::optional<double>(o.bandwidth) : std::nullopt);
  planner::set_mem(in, mem->count() ? std::optional<std::string>(o.mem) : std::nullopt, a,
                   gpu->count() || bw->count());
  if (weights->count()) in.weight_bytes = planner::parse_gb(o.weights, "--weights-bytes", true);
  return in;
}

void register_plan(CLI::App& app) {
  struct Opts {
    PlanFlags::Values v;
    std::string json, sweep_csv;
    std::vector<int64_t> sweep_batch, sweep_ctx;
  };
  auto o = std::make_shared<Opts>();
  auto* c = app.add_subcommand(
      "plan",
      "Capacity and bandwidth planner: per KV format, the bytes per token, how many tokens and\n"
      "requests fit in the KV memory, and the lower bound of a decode step that reads the weights\n"
      "and the KV cache once. With no options it prints the design note's scenario (Llama 3.1 8B,\n"
      "55 GB of KV memory, 4,096-token requests, decode batch 64 x 2,000 tokens, H100 SXM).\n"
      "Example: kvq plan --model mistral-7b --gpu a100-80gb --kv bf16 fp8 kivi2");
  c->footer(plan_footer());
  const PlanFlags flags = add_plan_flags(c, o->v);
  c->add_option("--kv", o->v.in.kv, "KV formats, space separated, one row each (see below)")
      ->capture_default_str();
  auto* json = c->add_option("--json", o->json,
                             "write the plan as JSON to FILE (no FILE or '-': print it instead of "
                             "the table)")
                   ->expected(0, 1);

  c->add_option(
      "--sweep-csv", o->sweep_csv,
      "also write a batch x context sweep to this CSV, one row per (batch, decode ctx, KV\n"
      "format): what the plots read (experiments/plots/plot_plan.py)");
  c->add_option("--sweep-batch", o->sweep_batch, "decode batches of the sweep (default: --batch)")
      ->check(CLI::PositiveNumber);
  c->add_option("--sweep-ctx", o->sweep_ctx,
                "decode contexts of the sweep in tokens (default: --decode-ctx)")
      ->check(CLI::PositiveNumber);
  c->callback([o, flags, json] {
    const planner::PlanInput in = flags.resolve();
    const planner::Plan p = planner::make_plan(in);
    KVQ_CHECK(!o->sweep_csv.empty() || (o->sweep_batch.empty() && o->sweep_ctx.empty()),
              "--sweep-batch and --sweep-ctx need --sweep-csv FILE (where the sweep goes)");
    if (!o->sweep_csv.empty()) {
      const auto batches = o->sweep_batch.empty() ? std::vector<int64_t>{in.batch} : o->sweep_batch;
      const auto ctxs = o->sweep_ctx.empty() ? std::vector<int64_t>{in.decode_ctx} : o->sweep_ctx;
      std::string csv =
          "kv,spec,batch,decode_ctx,decode_batch,kv_read_bytes,step_ms,tokens_per_s,speedup_vs_"
          "bf16,"
          "mem_bytes,weight_bytes\n";
      for (int64_t c : ctxs)
        for (int64_t b : batches) {
          planner::PlanInput si = in;
          si.batch = b;
          si.decode_ctx = c;
          for (const auto& r : planner::make_plan(si).rows)
            csv += fmt::format("\"{}\",\"{}\",{},{},{},{},{},{},{},{},{}\n", r.kv, r.spec, b, c,
                               r.decode_batch, r.decode_kv_bytes, r.step_seconds * 1e3,
                               r.tokens_per_s, r.speedup, p.mem_bytes, p.weight_bytes);
        }
      write_file_atomic(o->sweep_csv, csv);
    }
    const bool to_stdout = json->count() && (o->json.empty() || o->json == "-");
    if (json->count() && !to_stdout)
      write_file_atomic(o->json, planner::plan_json(p).dump(2) + "\n");
    if (to_stdout)
      fmt::print("{}\n", planner::plan_json(p).dump(2));
    else
      fmt::print("{}", planner::format_plan(p));
  });
}

}  // namespace kvq::cli
