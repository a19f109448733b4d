// A serving schedule (evaluation/serve.h) run on the model (issue 47 item 3): which model calls
// each step makes, the planner's bound on their decode tokens/s, and the run itself for
// `kvq model serve-bench`.
//
// A step's calls: the held requests admitted before it decode one token each, as ONE call in the
// batch order (backend cuda: LlamaModel::decode_batch, every layer's dense part over the batch's
// rows and one attention call over its caches), or one request after another (the host backends,
// which have no batched forward); then each request admitted at the step runs its prefill alone
// (LlamaModel::forward over its prompt, in chunks: the host backends' causal calls, backend cuda's
// --device-chunk launches), which yields its first output token. A request of P prompt and O output tokens so decodes
// O - 1 tokens, at positions P .. P + O - 2 (the cache holds that many tokens before each).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <span>
#include <vector>

#include "core/spec.h"
#include "evaluation/planner.h"
#include "evaluation/serve.h"
#include "model/llama.h"

namespace kvq::eval {

/// \brief One step's decode call: the held requests admitted at an earlier step, in the batch
/// order, each with its new token's position, and the cache bytes the call reads.
struct ServeDecodeCall {
  std::vector<int64_t> requests;
  std::vector<int64_t> positions;
  /// planner::request_footprint of each request at position + 1 tokens (its cache after the
  /// append, which the attention reads), summed
  double kv_bytes = 0;
};

/// \brief The model calls of one schedule step.
struct ServeStepCalls {
  ServeDecodeCall decode;         ///< empty when every held request was admitted at this step
  std::vector<int64_t> prefill;   ///< the requests admitted at this step, in order
  std::vector<int64_t> finished;  ///< leave after this step (ServeStep::finished)
};

/// \brief The calls of every step of `s` (a schedule of `requests` for a model of shape `m` whose
/// cache stores `spec`).
std::vector<ServeStepCalls> serve_calls(const planner::ModelDims& m, const SchemeSpec& spec,
                                        std::span<const ServeRequest> requests,
                                        const ServeSchedule& s);
/// \brief The largest decode call (the batch the device activations are sized for); 0 if none.
int64_t max_decode_batch(std::span<const ServeStepCalls> calls);

/// \brief The planner's bandwidth bound on the decode calls: each reads the weights once and its
/// requests' caches once (planner::decode_step_seconds), at `bandwidth` bytes/s.
struct DecodeBound {
  int64_t tokens = 0;  ///< decoded tokens (the calls' batch sizes, summed)
  double seconds = 0;  ///< the calls' bound times, summed
  double tokens_per_s() const { return seconds > 0 ? static_cast<double>(tokens) / seconds : 0; }
};
DecodeBound decode_bound(std::span<const ServeStepCalls> calls, double weight_bytes,
                         double bandwidth);

/// \brief What a run measured. Times are wall seconds; each decode call's time ends with its
/// logits on the host.
struct ServeRunResult {
  double prefill_s = 0, decode_s = 0;
  int64_t prefill_tokens = 0, decode_tokens = 0, decode_calls = 0;
  bool batched = false;  ///< each step's decode ran as one batched call (backend cuda)
  /// The held requests' caches after each step, LlamaCache::bytes (kvq::footprint: what the
  /// sides store, not what they allocated), summed; and the largest such sum.
  std::vector<double> step_cache_bytes;
  double peak_cache_bytes = 0;
  /// Backend cuda: device memory in use (cudaMemGetInfo: total - free) once the weights and the
  /// activations for the largest decode call are in place, before any cache; and the most in
  /// use after any step. 0 on the host backends.
  int64_t device_bytes_start = 0, device_bytes_peak = 0;
  std::vector<std::vector<int32_t>> outputs;  ///< each request's greedy output tokens
};

/// \brief Runs `calls` (serve_calls of a schedule of `requests`) on `m` with caches in `co`:
/// request i's prompt is the first requests[i].prompt_tokens tokens of `prompt`, each step's
/// decode call feeds each request's last output token, outputs greedy. On backend cuda the decode
/// calls are batched (LlamaModel::decode_batch; activations reserved for the largest first) and
/// each cache reserves its full length once prefilled; on the host backends `threads` as
/// forward's. A request's cache is released after its last output token.
ServeRunResult run_serve(const LlamaModel& m, std::span<const int32_t> prompt,
                         std::span<const ServeRequest> requests, const CacheOptions& co,
                         std::span<const ServeStepCalls> calls, int threads = 0);

/// \brief What one serving run measured, as `kvq model serve-bench --json` and `kvq run`'s [serve]
/// rows record it: the schedule's counts (`plan` of requests under `mem_bytes`, its `calls`), the
/// run's tokens/s (wall) and cache bytes, and on backend cuda the GPU, its memory in use and the
/// planner's decode bound at its peak bandwidth (decode_bound).
nlohmann::ordered_json serve_fields(const LlamaModel& m, double mem_bytes,
                                    const ServeSchedule& plan,
                                    std::span<const ServeStepCalls> calls, const ServeRunResult& r);

}  // namespace kvq::eval
