// kvq quant: quantize + dequantize one tensor under a scheme; report the error.
#include <fmt/format.h>

#include <map>
#include <nlohmann/json.hpp>

#include "cache/round_trip.h"
#include "cache/schemes.h"
#include "cache/side.h"
#include "core/error.h"
#include "core/io.h"
#include "core/npy.h"
#include "core/safetensors.h"
#include "core/schemes.h"
#include "core/spec.h"
#include "evaluation/kv_input.h"
#include "evaluation/report.h"
#include "experiments/commands.h"

namespace kvq::cli {
namespace {

// The bytes a cache of `spec` stores for x (one append, as `kvq quant` measures it), as
// safetensors: the codes / packed words, the scales and minima (each family's stored_bytes,
// cache/schemes.h), the tokens still exact, and metadata naming the layout, so they can be
// inspected with numpy or safetensors.
void write_codes(const std::string& path, const SchemeSpec& spec, Role role, const Tensor3& x,
                 int layer) {
  const auto side = make_side(spec, role, x, layer);
  const StoredSide s = side->stored();
  const int64_t T = x.shape.tokens, H = x.shape.heads, D = x.shape.dim;
  const int64_t qt = side->quantized_tokens_at(T);
  StoredBytes out;
  out.meta = {{"spec", spec.canonical()},
              {"role", std::string(to_string(role))},
              {"shape", fmt::format("[{}, {}, {}]", T, H, D)},
              {"quantized_tokens", std::to_string(qt)},
              {"writer", "kvq quant --codes"}};
  const int64_t covered = scheme_storage(s.kind).stored_bytes(s, qt, out);
  if (covered < T) {
    std::vector<float> tail;
    side->exact_tail(tail);
    out.add("exact_tail", "F32", {T - covered, H, D}, tail.data(),
            static_cast<int64_t>(tail.size()) * 4);
  }
  write_safetensors(path, out.tensors, out.meta);
}

}  // namespace

void register_quant(CLI::App& app) {
  struct Opts {
    std::string scheme, role = "key", in, out, stats, codes;
    int layer = 0;
  };
  auto o = std::make_shared<Opts>();
  auto* c = app.add_subcommand(
      "quant",
      "Quantize and dequantize one layer's K or V tensor as a scheme stores it; write the values\n"
      "read back (float32 npy, same shape) and print the error as JSON.\n"
      "Example: kvq quant --kv fp8_e4m3:gran=head --role key k.npy k_q.npy --json k.json");
  c->add_option("--kv", o->scheme, "KV scheme spec (required; the schemes are listed below)");
  c->footer(scheme_help());  // the registry's list (core/schemes.h): every family, its keys
  c->add_option("--scheme,-s", o->scheme, "the old name of --kv")->group("");  // hidden alias
  c->add_option("--role", o->role, "key or value: schemes with per-role axes (int, kivi) use it")
      ->check(CLI::IsMember({"key", "value"}))
      ->capture_default_str();
  c->add_option("--layer", o->layer, "layer index for scale=calib:FILE")
      ->check(at_least(0))
      ->capture_default_str();
  c->add_option("--json", o->stats, "also write the JSON report to this file (atomically)");
  c->add_option("--stats", o->stats, "the old name of --json")->group("");  // hidden alias
  c->add_option(
      "--codes", o->codes,
      "also write what the cache stores - codes or packed words, scales, minima, the tokens\n"
      "still exact - to this .safetensors file, its layout in the metadata");
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
    if (o->scheme.empty()) usage_error("--kv is required: the scheme spec, e.g. --kv kivi2");
    const SchemeSpec spec = parse_spec(o->scheme).for_layer(o->layer);  // SPEC@L=..: --layer's
    const Role role = o->role == "key" ? Role::Key : Role::Value;
    const SchemeSpec& own = spec.side(role);
    if (!o->codes.empty() && (own.rot.on || own.sink > 0))
      fail(
          "--codes writes one scheme's stored bytes; {} has {}, which the file layout does not "
          "describe yet (drop it for --codes)",
          own.canonical(), own.rot.on ? "rot=" : "sink=");
    check_outputs({o->in}, {{"output", o->out, ".npy"},
                            {"--codes", o->codes, ".safetensors"},
                            {"--json", o->stats, ".json"}});
    const KvInput in = load_kv(o->in);
    const RoundTrip r = round_trip(spec, role, in.tensor, o->layer);
    const nlohmann::json j = error_report(spec, role, in.tensor, r);
    const int64_t T = in.tensor.shape.tokens;
    const SchemeSpec& side = spec.side(role);
    if (side.kind() == SchemeKind::Int && j["residual_tokens"].get<int64_t>() >= T)
      fmt::print(stderr,
                 "kvq: warning: all {} tokens stay exact (residual window r={}, key groups of "
                 "g={} tokens): nothing was quantized, so the errors below are zero; give more "
                 "tokens or a smaller r\n",
                 T, side.q().residual, side.q().group_for(in.tensor.shape.dim));
    write_npy(o->out, in.file_shape, r.values.data.data());
    if (!o->codes.empty()) write_codes(o->codes, spec, role, in.tensor, o->layer);
    const std::string text = j.dump(2);
    if (!o->stats.empty()) write_file_atomic(o->stats, text + "\n");
    fmt::print("{}\n", text);
  });
}

}  // namespace kvq::cli
