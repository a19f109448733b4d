// kvq quant: quantize + dequantize one tensor under a scheme; report the error.
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/io.h"
#include "core/npy.h"
#include "core/spec.h"
#include "experiments/commands.h"
#include "experiments/kv_input.h"
#include "experiments/report.h"
#include "reference_cpu/quantize.h"

namespace kvq::cli {

void register_quant(CLI::App& app) {
  struct Opts {
    std::string scheme, role = "key", in, out, stats;
    int layer = 0;
  };
  auto o = std::make_shared<Opts>();
  auto* c = app.add_subcommand(
      "quant",
      "Quantize and dequantize one layer's K or V tensor as a scheme stores it; write the values\n"
      "read back (float32 npy, same shape) and print the error as JSON.\n"
      "Example: kvq quant --kv fp8_e4m3:gran=head --role key k.npy k_q.npy --stats k.json");
  c->add_option(
      "--kv", o->scheme,
      "KV scheme spec (required): fp32 | bf16 | fp16 | "
      "fp8_e4m3|fp8_e4m3fnuz|fp8_e5m2[:gran=tensor|head|token|channel]"
      "[,scale=dynamic|<num>|calib:FILE] | int<B>:k=..,v=..[,g=G,r=R,sym] | kivi<B>[:g=G,r=R]");
  c->add_option("--scheme,-s", o->scheme, "the old name of --kv")->group("");  // hidden alias
  c->add_option("--role", o->role, "key or value: schemes with per-role axes (int, kivi) use it")
      ->check(CLI::IsMember({"key", "value"}))
      ->capture_default_str();
  c->add_option("--layer", o->layer, "layer index for scale=calib:FILE")
      ->check(at_least(0))
      ->capture_default_str();
  c->add_option("--stats", o->stats, "also write the JSON report to this file (atomically)");
  c->add_option(
       "input", o->in,
       "input: an npy (float16/32/64, either byte order) or FILE.safetensors:TENSOR (e.g. a\n"
       "`kvq model dump`'s kv.safetensors:layer.3.k), [tokens, heads, head_dim] or [tokens, "
       "head_dim]")
      ->required();
  c->add_option("output", o->out,
                "output npy: float32, same shape, the values the cache reads back")
      ->required();
  c->callback([o] {
    KVQ_CHECK(!o->scheme.empty(),
              "--kv is required: the scheme spec, e.g. --kv kivi2 (see --help)");
    const SchemeSpec spec = parse_spec(o->scheme);
    const Role role = o->role == "key" ? Role::Key : Role::Value;
    const KvInput in = load_kv(o->in);
    const RoundTrip r = round_trip(spec, role, in.tensor, o->layer);
    const nlohmann::json j = error_report(spec, role, in.tensor, r);
    const int64_t T = in.tensor.shape.tokens;
    if (spec.kind == SchemeKind::Int && j["residual_tokens"].get<int64_t>() >= T)
      fmt::print(stderr,
                 "kvq: warning: all {} tokens stay exact (residual window r={}, key groups of "
                 "g={} tokens): nothing was quantized, so the errors below are zero; give more "
                 "tokens or a smaller r\n",
                 T, spec.q.residual, spec.q.group_for(in.tensor.shape.dim));
    write_npy(o->out, in.file_shape, r.values.data.data());
    const std::string text = j.dump(2);
    if (!o->stats.empty()) write_file_atomic(o->stats, text + "\n");
    fmt::print("{}\n", text);
  });
}

}  // namespace kvq::cli
