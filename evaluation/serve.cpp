#include "evaluation/serve.h"

#include <algorithm>
#include <deque>

#include "core/error.h"
#include "core/schemes.h"

namespace kvq::eval {
namespace {

// The most bytes a request's cache takes while it grows from t0 to t1 tokens. Not the bytes at
// t1: a KIVI per-channel side holds up to 2B - 1 tokens in its exact window (B = R, or G without
// one) before a block completes and is quantized, and an FP8 side with dynamic first=N scales
// holds its first tokens exact until the N-th, so the footprint drops at those points. Between
// them it only grows, so the peak is at t1 or just before one of them (t - S + 1 a multiple of B
// with S sinks in front, or N - 1 + S). Each family says where its sides drop (core/schemes.h's
// footprint_drops).
double peak_bytes(const planner::ModelDims& m, const SchemeSpec& spec, int64_t t0, int64_t t1) {
  std::vector<FootprintDrops> drops;
  for (const SchemeSpec& l : spec.distinct_layer_specs())
    for (const Role r : {Role::Key, Role::Value}) {
      const SchemeSpec& x = l.side(r);
      drops.push_back(scheme_traits(x).footprint_drops(x, r, m.head_dim));
    }
  double peak = planner::request_footprint(m, spec, t1).total_bytes();
  auto at = [&](int64_t t) {
    if (t >= t0 && t < t1)
      peak = std::max(peak, planner::request_footprint(m, spec, t).total_bytes());
  };
  for (const FootprintDrops& d : drops) {
    if (d.at >= 0) at(d.at);                  // one point: the token before the N-th
    if (const int64_t b = d.period; b > 0) {  // t = after + k b - 1, k >= 1, from t0 on
      const int64_t k = std::max<int64_t>(1, (t0 - d.after + 1 + b - 1) / b);
      for (int64_t t = d.after + k * b - 1; t < t1; t += b) at(t);
    }
  }
  return peak;
}

}  // namespace

std::vector<ServeRequest> serve_requests(int64_t count, int64_t prompt, int64_t gen) {
  std::vector<ServeRequest> out;
  for (int64_t i = 0; i < count; ++i)
    out.push_back({prompt / 2 + (37 * i) % (prompt / 2 + 1), gen / 2 + (13 * i) % (gen / 2 + 1)});
  return out;
}

ServeSchedule schedule_serve(const planner::ModelDims& m, const SchemeSpec& spec,
                             std::span<const ServeRequest> requests, const ServeOptions& opt) {
  KVQ_CHECK(opt.mem_bytes > 0, "serve: --mem must be positive, got {} bytes", opt.mem_bytes);
  KVQ_CHECK(opt.max_batch >= 0, "serve: the batch limit must be >= 0 (0: none), got {}",
            opt.max_batch);
  ServeSchedule s;
  const size_t n = requests.size();
  for (size_t i = 0; i < n; ++i) {
    const ServeRequest& r = requests[i];
    KVQ_CHECK(r.prompt_tokens >= 1 && r.output_tokens >= 1,
              "serve: request {} has {} prompt and {} output tokens (each must be >= 1)", i,
              r.prompt_tokens, r.output_tokens);
    const double b = peak_bytes(m, spec, r.prompt_tokens, r.prompt_tokens + r.output_tokens);
    KVQ_CHECK(b <= opt.mem_bytes,
              "serve: request {} ({} + {} tokens) takes {:.0f} bytes of {} cache, more than the "
              "{:.0f}-byte cap alone; it could never be admitted",
              i, r.prompt_tokens, r.output_tokens, b, spec.canonical(), opt.mem_bytes);
    s.request_bytes.push_back(b);
  }
  std::deque<int64_t> waiting;
  for (size_t i = 0; i < n; ++i) waiting.push_back(static_cast<int64_t>(i));
  std::vector<int64_t> held;  // admission order
  std::vector<int64_t> generated(n, 0);
  double reserved = 0;
  while (!waiting.empty() || !held.empty()) {
    ServeStep st;
    while (!waiting.empty() &&
           (opt.max_batch == 0 || static_cast<int64_t>(held.size()) < opt.max_batch)) {
      const int64_t i = waiting.front();
      const double b = s.request_bytes[static_cast<size_t>(i)];
      if (reserved + b > opt.mem_bytes) break;  // first come, first served: no overtaking
      reserved += b;
      held.push_back(i);
      st.admitted.push_back(i);
      st.prefill_tokens += requests[static_cast<size_t>(i)].prompt_tokens;
      waiting.pop_front();
    }
    // held is never empty here: with nothing held the first waiting request fits (checked above)
    st.batch = held;
    st.reserved_bytes = reserved;
    std::vector<int64_t> still;
    for (const int64_t i : held) {
      const ServeRequest& r = requests[static_cast<size_t>(i)];
      const int64_t g = ++generated[static_cast<size_t>(i)];
      // the tokens the cache holds after this step: the prompt and the outputs fed back so far
      st.live_bytes += planner::request_footprint(m, spec, r.prompt_tokens + g - 1).total_bytes();
      if (g == r.output_tokens) {
        st.finished.push_back(i);
        reserved -= s.request_bytes[static_cast<size_t>(i)];
      } else {
        still.push_back(i);
      }
    }
    s.max_held = std::max<int64_t>(s.max_held, static_cast<int64_t>(st.batch.size()));
    s.peak_reserved_bytes = std::max(s.peak_reserved_bytes, st.reserved_bytes);
    s.peak_live_bytes = std::max(s.peak_live_bytes, st.live_bytes);
    s.output_tokens += static_cast<int64_t>(st.batch.size());
    held = std::move(still);
    if (held.empty()) reserved = 0;  // no drift from the float sums
    s.steps.push_back(std::move(st));
  }
  return s;
}

}  // namespace kvq::eval
