// kvq plan: KV-cache capacity and decode-bandwidth planning (REFERENCE.md sections 1 and 5).
// Every byte count comes from kvq::footprint (core/footprint.h), the one formula the quantizers
// and the streaming cache use, so scale/zero bytes and the full-precision residual window are
// counted the same way everywhere.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/footprint.h"
#include "core/spec.h"

namespace kvq::planner {

/// \brief The KV-relevant shape of a decoder model.
struct ModelDims {
  std::string name;      ///< preset name, or "custom"
  int64_t layers = 0;    ///< decoder layers (each has one K and one V cache)
  int64_t kv_heads = 0;  ///< key/value heads (GQA: fewer than query heads)
  int64_t head_dim = 0;  ///< channels per head
  double params = 0;     ///< parameter count (8.03e9); 0 when unknown
};

/// \brief An accelerator: memory and peak memory bandwidth (decimal units in bytes, bytes/s).
struct Gpu {
  std::string name;      ///< preset name, or "custom"
  double mem_bytes = 0;  ///< 0 when unknown (--bandwidth without --gpu)
  double bandwidth = 0;  ///< bytes per second
};

/// \brief REFERENCE.md section 5's model table, in order.
const std::vector<ModelDims>& model_presets();
/// \brief REFERENCE.md section 5's GPU list, in order.
const std::vector<Gpu>& gpu_presets();
/// \brief The named preset; throws kvq::Error listing the allowed names.
const ModelDims& model_preset(std::string_view name);
const Gpu& gpu_preset(std::string_view name);

/// \brief What the command line says about the model: a preset, or all custom dimensions.
struct ModelArgs {
  std::optional<std::string> preset;
  std::optional<int64_t> layers, kv_heads, head_dim;
  std::optional<double> params_billions;
};
/// \brief Resolves --model or --layers/--kv-heads/--head-dim/--params (no flag at all:
/// llama-3.1-8b). `params` may be left out of a custom model when the weight bytes are given.
ModelDims resolve_model(const ModelArgs& a, bool have_weight_bytes);
/// \brief --gpu PRESET or --bandwidth TB/s (neither: h100-sxm; both: an error).
Gpu resolve_gpu(const std::optional<std::string>& preset, const std::optional<double>& tb_per_s);

/// \brief Parses a --kv entry: the aliases fp8 (= fp8_e4m3, per-tensor dynamic scale; also
/// fp8:PARAMS), int2/int3/int4/int8 (= int<B>:k=channel,v=token with g=32, r=0), else any spec
/// kvq::parse_spec accepts.
SchemeSpec parse_kv(std::string_view text);

/// \brief A size in decimal GB: "55", "55GB", "16.06 GB", or binary "80GiB"; returns bytes.
/// Throws naming `flag` when the text is not a positive number (or zero when `allow_zero`).
double parse_gb(std::string_view text, std::string_view flag, bool allow_zero = false);

/// \brief K and V footprints of one request of `tokens` tokens, summed over the layers (a
/// per-layer spec contributes each layer's own scheme).
struct RequestFootprint {
  Footprint key, value;
  /// \brief Bytes of the request over all layers, K and V.
  double total_bytes() const { return key.total_bytes() + value.total_bytes(); }
  /// \brief Codes + scales + zeros per quantized element (residual excluded); nullopt when no
  /// element is quantized (a request shorter than the residual window).
  std::optional<double> effective_bits() const;
};
/// \brief Sum over layers l of kvq::footprint(spec.for_layer(l), Key/Value,
/// [tokens, kv_heads, head_dim]) for one request.
RequestFootprint request_footprint(const ModelDims& m, const SchemeSpec& spec, int64_t tokens);

/// \brief Everything `kvq plan` takes.
struct PlanInput {
  ModelDims model;
  Gpu gpu;
  std::optional<double> weight_bytes;  ///< default: params x bytes per weight of weights_dtype
  std::string weights_dtype =
      "bf16";  ///< bf16 (2 bytes), fp8 (1), int4 (0.5 + a bf16 scale per 128)
  /// Memory given to the KV cache; nullopt: kv_mem_fraction of the GPU's memory minus the weights.
  std::optional<double> mem_bytes = 55e9;
  std::string mem_source = "--mem";  ///< what set mem_bytes, for the report
  int64_t ctx = 4096;                ///< request length for capacity
  int64_t batch = 64;                ///< decode batch
  int64_t decode_ctx = 2000;         ///< context per request of the decode batch
  std::vector<std::string> kv{"bf16", "fp8", "kivi4", "kivi2"};
};

/// \brief The KV memory of a plan: `mem` (a size as parse_gb reads it, named --mem in errors);
/// without it, the design note's 55 GB when neither `model` names anything nor a GPU or bandwidth
/// was given (the scenario of a bare `kvq plan`), else nullopt (kKvMemFraction of the GPU's memory
/// minus the weights).
void set_mem(PlanInput& in, const std::optional<std::string>& mem, const ModelArgs& model,
             bool gpu_given);

/// \brief One KV format's row.
struct PlanRow {
  std::string kv;                        ///< as given on the command line
  std::string spec;                      ///< canonical spec
  double request_bytes = 0;              ///< one ctx-token request, all layers, K and V
  double bytes_per_token = 0;            ///< request_bytes / ctx
  std::optional<double> effective_bits;  ///< codes + scales + zeros per quantized element
  double tokens_in_mem = 0;              ///< mem / bytes_per_token (not rounded)
  int64_t requests = 0;                  ///< floor(mem / request_bytes)
  int64_t decode_batch = 0;              ///< min(batch, decode_ctx-token requests that fit)
  double decode_kv_bytes = 0;            ///< decode_batch x bytes of one decode_ctx-token request
  double step_seconds = 0;               ///< (weights + decode_kv_bytes) / bandwidth
  double tokens_per_s = 0;               ///< decode_batch / step_seconds
  double speedup = 0;                    ///< tokens_per_s / bf16's (the same plan with --kv bf16)
};

/// \brief The share of GPU memory the weights and the KV cache may take when --mem is not given
/// (vLLM's default gpu_memory_utilization; the rest: activations, CUDA context, fragmentation).
inline constexpr double kKvMemFraction = 0.9;
/// \brief The bandwidth bound of one decode step: it reads every weight once and every held
/// request's cache once, (weight_bytes + kv_bytes) / bandwidth seconds (bandwidth in bytes/s).
/// PlanRow::step_seconds and kvq model serve-bench's prediction (evaluation/serve_run.h).
inline double decode_step_seconds(double weight_bytes, double kv_bytes, double bandwidth) {
  return (weight_bytes + kv_bytes) / bandwidth;
}

/// \brief Bytes per weight of --weights-dtype; throws naming the allowed names.
double weight_bytes_per_param(std::string_view dtype);

struct Plan {
  PlanInput in;
  double weight_bytes = 0;
  double mem_bytes = 0;    ///< KV memory used (given, or derived from the GPU's)
  std::string mem_source;  ///< how mem_bytes was set, for the report
  std::vector<PlanRow> rows;
  std::vector<std::string> notes;  ///< warnings about the assumptions (memory that does not fit)
};

/// \brief Validates the input (positive sizes, a non-empty --kv list) and computes every row.
Plan make_plan(const PlanInput& in);

/// \brief 419617 -> "419,617".
std::string group_thousands(int64_t v);
/// \brief The human report: assumptions, table, footnotes.
std::string format_plan(const Plan& p);
/// \brief The machine-readable report (same numbers, unrounded).
nlohmann::json plan_json(const Plan& p);

}  // namespace kvq::planner
