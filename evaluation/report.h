// Result rows shared by the commands: one JSON object per (scheme, role, tensor).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "cache/round_trip.h"
#include "core/spec.h"
#include "core/tensor.h"

namespace kvq::cli {

/// \brief scheme, role, shape, effective_bits (codes + scales + zeros per quantized element),
/// overall_bits (residual included), mse, nmse, snr_db (null when exact), max_abs_err, cosine,
/// scales_from (scales_from below).
nlohmann::json error_report(const SchemeSpec& spec, Role role, const Tensor3& x, const RoundTrip& r);

/// \brief Which tokens of a `tokens`-token sequence set the scales of `spec`'s `role` side, in
/// words a table can print: "tokens 0-127 of 1024" (dynamic FP8 tensor/head/channel scales come
/// from the first `first` tokens after any sinks), "all 1024 tokens", "each token", "fixed 1",
/// "calib FILE", "each 32 tokens" (per-channel int groups), "-" (no scales).
std::string scales_from(const SchemeSpec& spec, Role role, int64_t tokens);
/// \brief Whether `spec`'s `role` side has dynamic scales set by fewer than all `tokens` tokens
/// (the case a reader must be told about: `first=N` shorter than the tensor).
bool scales_from_prefix(const SchemeSpec& spec, Role role, int64_t tokens);

/// \brief One line of a results file (`kvq run`'s TASK.jsonl): its 1-based line number and value.
struct JsonLine {
  int line = 0;
  nlohmann::ordered_json value;  // keys in file order, as kvq run wrote them
};
/// \brief The non-empty lines of a JSONL file; a line that is not JSON throws kvq::Error
/// "PATH:LINE: not a JSON line" followed by `hint`.
std::vector<JsonLine> read_jsonl(const std::string& path, std::string_view hint = "");

}  // namespace kvq::cli
