// Serving-style batches (issue 47 item 3), the host-side logic: which requests a decode step
// holds under a KV memory cap (`--mem`, to emulate a smaller card), in what order they are
// batched, and the bytes and tokens each step accounts for. The byte counts are the planner's
// (evaluation/planner.h request_footprint: kvq::footprint summed over layers, the one formula the
// caches store by), so a schedule's capacity is the plan's `requests` column by construction.
//
// Policy (vLLM's first-come-first-served scheduler without preemption, with whole-request
// reservation): requests arrive in the given order; at the start of each step the waiting ones are
// admitted in order while the most bytes their cache will take on the way to its full length
// (prompt + output tokens; a KIVI cache's bytes drop when a block is quantized, so the peak can
// come before the end) fit the cap beside what the held requests reserved, and while the batch
// has room; the first one that
// does not fit blocks the ones behind it (no overtaking, so no starvation). An admitted request's
// first step runs its prefill and yields its first output token; every later step decodes one
// token; a request leaves after its last output token, releasing its reservation for the next
// step. The batch order of a step (the order of append_batch's requests and of the decode
// launch's sequences) is the held requests in admission order.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/spec.h"
#include "evaluation/planner.h"

namespace kvq::eval {

/// \brief One request: its prompt and the tokens it generates (both >= 1).
struct ServeRequest {
  int64_t prompt_tokens = 0;
  int64_t output_tokens = 0;
};

struct ServeOptions {
  double mem_bytes = 0;   ///< the KV memory cap (> 0)
  int64_t max_batch = 0;  ///< most requests held at once; 0: no limit but the memory
};

/// \brief One step of a schedule. Requests are named by their index in the input.
struct ServeStep {
  std::vector<int64_t> admitted;  ///< admitted at this step (their prefill), in order
  std::vector<int64_t> batch;     ///< every held request, in admission order: the batch order
  std::vector<int64_t> finished;  ///< leave after this step (their last output token)
  double reserved_bytes = 0;      ///< the held requests' reservations (<= the cap)
  double live_bytes = 0;          ///< their footprints at the tokens held after this step
  int64_t prefill_tokens = 0;     ///< prompt tokens of the admitted requests
};

struct ServeSchedule {
  std::vector<ServeStep> steps;
  std::vector<double> request_bytes;  ///< each request's reservation: its peak footprint
  int64_t max_held = 0;               ///< most requests held in one step
  double peak_reserved_bytes = 0, peak_live_bytes = 0;
  int64_t output_tokens = 0;  ///< every request's, = the sum of the steps' batch sizes
};

/// \brief `kvq model serve-bench`'s and `kvq run [serve]`'s requests: request i of `count` has
/// prompt / 2 + (37 i mod (prompt / 2 + 1)) prompt tokens and gen / 2 + (13 i mod (gen / 2 + 1))
/// outputs (lengths spread over [prompt / 2, prompt] and [gen / 2, gen], the same every run).
std::vector<ServeRequest> serve_requests(int64_t count, int64_t prompt, int64_t gen);

/// \brief The schedule of `requests` for a model of shape `m` whose cache stores `spec`. Throws
/// kvq::Error naming the request for a length < 1, or for one whose peak footprint alone
/// exceeds the cap (it could never be admitted), and for a cap <= 0.
ServeSchedule schedule_serve(const planner::ModelDims& m, const SchemeSpec& spec,
                             std::span<const ServeRequest> requests, const ServeOptions& opt);

}  // namespace kvq::eval
