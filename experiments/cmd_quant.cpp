// kvq quant: quantize + dequantize one tensor under a scheme; report the error.
#include <fmt/format.h>

#include <map>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/io.h"
#include "core/npy.h"
#include "core/safetensors.h"
#include "core/schemes.h"
#include "core/spec.h"
#include "experiments/commands.h"
#include "evaluation/kv_input.h"
#include "evaluation/report.h"
#include "fp8/scale.h"
#include "kivi/layout.h"
#include "kivi/minmax.h"
#include "reference_cpu/kv_cache.h"
#include "reference_cpu/quantize.h"

namespace kvq::cli {
namespace {

std::string raw(const void* p, int64_t bytes) {
  return std::string(static_cast<const char*>(p), static_cast<size_t>(bytes));
}

// The bytes a cache of `spec` stores for x (one append, as `kvq quant` measures it), as
// safetensors: the codes / packed words, the scales and minima, the tokens still exact, and
// metadata naming the layout, so they can be inspected with numpy or safetensors.
void write_codes(const std::string& path, const SchemeSpec& spec, Role role, const Tensor3& x,
                 int layer) {
  const auto side = make_side(spec, role, x, layer);
  const StoredSide s = side->stored();
  const int64_t T = x.shape.tokens, H = x.shape.heads, D = x.shape.dim;
  const int64_t qt = side->quantized_tokens_at(T);
  std::map<std::string, std::string> meta{{"spec", spec.canonical()},
                                          {"role", std::string(to_string(role))},
                                          {"shape", fmt::format("[{}, {}, {}]", T, H, D)},
                                          {"quantized_tokens", std::to_string(qt)},
                                          {"writer", "kvq quant --codes"}};
  std::vector<RawTensor> ts;
  switch (s.kind) {
    case SchemeKind::Fp32:
      ts.push_back({"values", "F32", {T, H, D}, raw(s.f32, T * H * D * 4)});
      break;
    case SchemeKind::Bf16:
    case SchemeKind::Fp16:
      ts.push_back({"values",
                    s.kind == SchemeKind::Bf16 ? "BF16" : "F16",
                    {T, H, D},
                    raw(s.half16, T * H * D * 2)});
      break;
    case SchemeKind::Fp8: {
      const int64_t ns = qt > 0 ? fp8::scale_count(s.gran, Shape3{qt, H, D}) : 0;
      ts.push_back({"codes", "U8", {qt, H, D}, raw(s.codes, qt * H * D)});
      ts.push_back({"scales", "F32", {ns}, raw(s.fp8_scales, ns * 4)});
      meta["format"] = std::string(to_string(s.format));
      meta["granularity"] = std::string(to_string(s.gran));
      meta["layout"] = "codes[t][h][d] is fp8 of x / scale; value = scale * decode(code)";
      break;
    }
    case SchemeKind::Int: {
      int64_t nw = 0, np = 0;
      if (s.axis == Axis::Channel) {
        const kivi::ChannelLayout lay{H, D, s.group, s.bits};
        nw = lay.words_for_tokens(qt);
        np = lay.params_for_tokens(qt);
        meta["layout"] = fmt::format(
            "per-channel: token group g = t / {0} of (head h, channel d) has scale/min index "
            "(g * {1} + h) * {2} + d and its {3} words start at that index times {3}; code i = t % "
            "{0} sits at bit {4} * (i % {5}) of the group's word i / {5}",
            s.group, H, D, lay.words_per_group(), s.bits, kivi::codes_per_word(s.bits));
      } else {
        const kivi::TokenLayout lay{H, D, s.group, s.bits};
        nw = lay.words_for_tokens(qt);
        np = lay.params_for_tokens(qt);
        meta["layout"] = fmt::format(
            "per-token: (token t, head h, channel group c = d / {0}) has scale/min index (t * {1} "
            "+ "
            "h) * {2} + c and its words start at (t * {1} + h) * {3} + c * {4}; code i = d % {0} "
            "sits at bit {5} * (i % {6}) of the group's word i / {6}",
            s.group, H, lay.channel_groups(), lay.words_per_token_head(),
            kivi::words_for(s.group, s.bits), s.bits, kivi::codes_per_word(s.bits));
      }
      ts.push_back({"words", "U32", {nw}, raw(s.words, nw * 4)});
      ts.push_back({"scales", "F16", {np}, raw(s.scales, np * 2)});
      if (!s.sym) ts.push_back({"mins", "F16", {np}, raw(s.mins, np * 2)});
      meta["bits"] = std::to_string(s.bits);
      meta["group"] = std::to_string(s.group);
      meta["axis"] = std::string(to_string(s.axis));
      meta["value"] = s.sym ? fmt::format("scale * (code - {})", kivi::sym_offset(s.bits))
                            : std::string("min + scale * code");
      break;
    }
  }
  if (qt < T && s.kind != SchemeKind::Fp32 && s.kind != SchemeKind::Bf16 &&
      s.kind != SchemeKind::Fp16) {
    std::vector<float> tail;
    side->exact_tail(tail);
    ts.push_back({"exact_tail",
                  "F32",
                  {T - qt, H, D},
                  raw(tail.data(), static_cast<int64_t>(tail.size()) * 4)});
  }
  write_safetensors(path, ts, meta);
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
