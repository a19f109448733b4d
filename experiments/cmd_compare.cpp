// kvq synth / kvq compare: a synthetic KV tensor with outlier channels, and a table of schemes
// and their errors on one tensor.
#include <fmt/format.h>

#include "core/io.h"
#include "core/npy.h"
#include "experiments/commands.h"
#include "evaluation/kv_input.h"
#include "evaluation/report.h"
#include "evaluation/synthetic.h"

namespace kvq::cli {
namespace {

void add_synth_options(CLI::App* c, SyntheticSpec& s) {
  c->add_option("--tokens", s.shape.tokens, "tokens")->check(at_least(1))->capture_default_str();
  c->add_option("--heads", s.shape.heads, "kv heads")->check(at_least(1))->capture_default_str();
  c->add_option("--head-dim", s.shape.dim, "channels per head")
      ->check(at_least(1))
      ->capture_default_str();
  c->add_option("--outliers", s.outlier_channels, "outlier channels per head")
      ->check(at_least(0))
      ->capture_default_str();
  c->add_option("--outlier-scale", s.outlier_scale, "outlier magnitude multiplier")
      ->check(above_zero())
      ->capture_default_str();
  c->add_option("--seed", s.seed, "random seed")->capture_default_str();
}

}  // namespace

void register_synth(CLI::App& app) {
  auto s = std::make_shared<SyntheticSpec>();
  auto out = std::make_shared<std::string>();
  auto* c = app.add_subcommand(
      "synth",
      "Write a deterministic synthetic K/V tensor [tokens, heads, head_dim] "
      "with outlier channels (float32 npy).\nExample: kvq synth k.npy --tokens 1000");
  add_synth_options(c, *s);
  c->add_option("output", *out, "output npy")->required();
  c->callback([s, out] {
    check_outputs({}, {{"output", *out, ".npy"}});
    const Tensor3 x = synthetic_kv(*s);
    write_npy(*out, {x.shape.tokens, x.shape.heads, x.shape.dim}, x.data.data());
    fmt::print("wrote {} [{}, {}, {}]\n", *out, x.shape.tokens, x.shape.heads, x.shape.dim);
  });
}

void register_compare(CLI::App& app) {
  struct Opts {
    std::vector<std::string> schemes{"bf16",
                                     "fp8_e4m3:gran=tensor",
                                     "fp8_e4m3:gran=head",
                                     "fp8_e4m3:gran=token",
                                     "fp8_e4m3:gran=channel",
                                     "fp8_e4m3:gran=tensor,scale=1.0",
                                     "fp8_e4m3fnuz:gran=token",
                                     "fp8_e5m2:gran=token"};
    std::string role = "key", in, json;
    int layer = 0;
    SyntheticSpec synth;
  };
  auto o = std::make_shared<Opts>();
  auto* c = app.add_subcommand(
      "compare",
      "Quantize one tensor under several schemes and print a table of bits and errors.\n"
      "Without an input file it uses a synthetic tensor with outlier channels (see 'kvq synth').\n"
      "Example: kvq compare --role key k.npy --kv bf16 fp8_e4m3:gran=channel kivi2");
  c->add_option("--kv", o->schemes, "KV scheme specs, space separated, one row each")
      ->capture_default_str();
  c->add_option("--schemes", o->schemes, "the old name of --kv")->group("");  // hidden alias
  c->add_option("--role", o->role, "key or value")
      ->check(CLI::IsMember({"key", "value"}))
      ->capture_default_str();
  c->add_option("--layer", o->layer,
                "the model layer the tensor comes from: per-layer specs (SPEC@L=...) and "
                "scale=calib:FILE read this layer's scheme and scales (as kvq quant --layer)")
      ->check(at_least(0))
      ->capture_default_str();
  c->add_option("--json", o->json, "also write every row as JSON lines to this file (atomically)");
  c->add_option(
      "input", o->in,
      "input npy or FILE.safetensors:TENSOR, [tokens, heads, head_dim] or [tokens, head_dim]");
  add_synth_options(c, o->synth);
  c->callback([o] {
    check_outputs({o->in}, {{"--json", o->json, ".json|.jsonl"}});
    const Tensor3 x = o->in.empty() ? synthetic_kv(o->synth) : load_kv(o->in).tensor;
    const Role role = o->role == "key" ? Role::Key : Role::Value;
    std::vector<SchemeSpec> specs;
    // fail before any work; a per-layer spec is --layer's scheme here (one tensor)
    for (const auto& s : o->schemes) specs.push_back(parse_spec(s).for_layer(o->layer));
    if (o->in.empty())
      fmt::print(
          "input: synthetic [{} tokens, {} heads, {} dim], {} outlier channels x{} per head, seed "
          "{}\n",
          x.shape.tokens, x.shape.heads, x.shape.dim, o->synth.outlier_channels,
          o->synth.outlier_scale, o->synth.seed);
    else
      fmt::print("input: {} [{} tokens, {} heads, {} dim]\n", o->in, x.shape.tokens, x.shape.heads,
                 x.shape.dim);
    fmt::print("role: {}, layer {}\n\n", o->role, o->layer);
    fmt::print("{:<40} {:>7} {:>11} {:>8} {:>10} {:>10}  {}\n", "scheme", "bits", "nmse", "snr_db",
               "max_err", "cosine", "scales from");
    std::string lines;
    bool prefix = false;  // a dynamic scale read fewer tokens than the tensor has
    for (const auto& spec : specs) {
      const RoundTrip r = round_trip(spec, role, x, o->layer);
      const auto j = error_report(spec, role, x, r);
      lines += j.dump() + "\n";
      prefix = prefix || scales_from_prefix(spec, role, x.shape.tokens);
      fmt::print("{:<40} {:>7.3f} {:>11.3e} {:>8} {:>10.4g} {:>10.6f}  {}\n", spec.canonical(),
                 j["effective_bits"].get<double>(), j["nmse"].get<double>(),
                 j["snr_db"].is_null() ? std::string("exact")
                                       : fmt::format("{:.2f}", j["snr_db"].get<double>()),
                 j["max_abs_err"].get<double>(), j["cosine"].get<double>(),
                 j["scales_from"].get<std::string>());
    }
    if (prefix)
      fmt::print(
          "\nnote: dynamic FP8 tensor/head/channel scales come from the first `first` tokens "
          "(default {}), as a\nserving engine sets them from the prefill; the tokens after them can "
          "exceed that range and clip.\nfirst={} makes every token count (an offline bound, not what "
          "a streaming cache can do).\n",
          Fp8Spec::kFp8FirstDefault, x.shape.tokens);
    if (!o->json.empty()) write_file_atomic(o->json, lines);
  });
}

}  // namespace kvq::cli
