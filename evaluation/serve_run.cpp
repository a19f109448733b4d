#include "evaluation/serve_run.h"

#include <algorithm>
#include <chrono>
#include <memory>

#include "core/error.h"
#include "kernels/backend.h"

namespace kvq::eval {

std::vector<ServeStepCalls> serve_calls(const planner::ModelDims& m, const SchemeSpec& spec,
                                        std::span<const ServeRequest> requests,
                                        const ServeSchedule& s) {
  std::vector<ServeStepCalls> out;
  std::vector<int64_t> generated(requests.size(), 0);  // output tokens so far
  for (const ServeStep& st : s.steps) {
    ServeStepCalls c;
    c.prefill = st.admitted;
    c.finished = st.finished;
    for (const int64_t i : st.batch) {
      KVQ_CHECK(i >= 0 && static_cast<size_t>(i) < requests.size(),
                "serve: step names request {} of {}", i, requests.size());
      const auto u = static_cast<size_t>(i);
      if (std::find(st.admitted.begin(), st.admitted.end(), i) == st.admitted.end()) {
        KVQ_CHECK(generated[u] >= 1, "serve: request {} decodes before its prefill", i);
        // its prompt and the outputs fed back before this one
        const int64_t pos = requests[u].prompt_tokens + generated[u] - 1;
        c.decode.requests.push_back(i);
        c.decode.positions.push_back(pos);
        c.decode.kv_bytes += planner::request_footprint(m, spec, pos + 1).total_bytes();
      }
      ++generated[u];
    }
    out.push_back(std::move(c));
  }
  return out;
}

int64_t max_decode_batch(std::span<const ServeStepCalls> calls) {
  int64_t b = 0;
  for (const ServeStepCalls& c : calls)
    b = std::max<int64_t>(b, static_cast<int64_t>(c.decode.requests.size()));
  return b;
}

DecodeBound decode_bound(std::span<const ServeStepCalls> calls, double weight_bytes,
                         double bandwidth) {
  KVQ_CHECK(bandwidth > 0 && weight_bytes >= 0, "serve: bandwidth {} and weight bytes {}",
            bandwidth, weight_bytes);
  DecodeBound b;
  for (const ServeStepCalls& c : calls) {
    if (c.decode.requests.empty()) continue;
    b.tokens += static_cast<int64_t>(c.decode.requests.size());
    b.seconds += planner::decode_step_seconds(weight_bytes, c.decode.kv_bytes, bandwidth);
  }
  return b;
}

ServeRunResult run_serve(const LlamaModel& m, std::span<const int32_t> prompt,
                         std::span<const ServeRequest> requests, const CacheOptions& co,
                         std::span<const ServeStepCalls> calls, int threads) {
  using Clock = std::chrono::steady_clock;
  auto since = [](Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
  };
  for (size_t i = 0; i < requests.size(); ++i)
    KVQ_CHECK(requests[i].prompt_tokens >= 1 &&
                  requests[i].prompt_tokens <= static_cast<int64_t>(prompt.size()),
              "serve: request {} has {} prompt tokens, the text {}", i, requests[i].prompt_tokens,
              prompt.size());
  ServeRunResult r;
  const bool cuda = m.backend() == AttentionBackend::kCuda;
  r.batched = cuda;
  if (cuda) {
    m.reserve_device_batch(std::max<int64_t>(1, max_decode_batch(calls)));
    r.device_bytes_start = device_memory_used(AttentionBackend::kCuda);
    r.device_bytes_peak = r.device_bytes_start;
  }
  const int64_t vocab = m.config().vocab;
  std::vector<std::unique_ptr<LlamaCache>> caches(requests.size());
  r.outputs.resize(requests.size());
  std::vector<float> logits;
  auto argmax = [&](size_t row) {
    const float* l = logits.data() + row * static_cast<size_t>(vocab);
    return static_cast<int32_t>(std::max_element(l, l + vocab) - l);
  };
  std::vector<int64_t> held;  // admission order
  for (const ServeStepCalls& c : calls) {
    const ServeDecodeCall& d = c.decode;
    if (!d.requests.empty()) {
      std::vector<int32_t> tokens;
      std::vector<LlamaCache*> cs;
      for (const int64_t i : d.requests) {
        const auto u = static_cast<size_t>(i);
        KVQ_CHECK(caches[u] && !r.outputs[u].empty(),
                  "serve: request {} decodes before its prefill", i);
        tokens.push_back(r.outputs[u].back());
        cs.push_back(caches[u].get());
      }
      if (cuda) {
        const auto t0 = Clock::now();
        m.decode_batch(tokens, cs, logits);
        r.decode_s += since(t0);
        for (size_t b = 0; b < tokens.size(); ++b)
          r.outputs[static_cast<size_t>(d.requests[b])].push_back(argmax(b));
      } else {
        for (size_t b = 0; b < tokens.size(); ++b) {
          const auto t0 = Clock::now();
          m.forward({&tokens[b], 1}, *cs[b], logits, false, threads);
          r.decode_s += since(t0);
          r.outputs[static_cast<size_t>(d.requests[b])].push_back(argmax(0));
        }
      }
      r.decode_tokens += static_cast<int64_t>(tokens.size());
      ++r.decode_calls;
    }
    for (const int64_t i : c.prefill) {
      const auto u = static_cast<size_t>(i);
      KVQ_CHECK(!caches[u], "serve: request {} is admitted twice", i);
      const ServeRequest& q = requests[u];
      caches[u] = std::make_unique<LlamaCache>(m.config(), co);
      const auto t0 = Clock::now();
      m.forward(prompt.first(static_cast<size_t>(q.prompt_tokens)), *caches[u], logits, false,
                threads);
      r.prefill_s += since(t0);
      r.prefill_tokens += q.prompt_tokens;
      r.outputs[u].push_back(argmax(0));
      if (cuda)  // the whole request's room now: no reallocation inside a timed decode call
        for (LlamaCache::Layer& l : caches[u]->layers()) {
          l.k->reserve(q.prompt_tokens + q.output_tokens);
          l.v->reserve(q.prompt_tokens + q.output_tokens);
        }
      held.push_back(i);
    }
    double live = 0;
    for (const int64_t i : held) live += caches[static_cast<size_t>(i)]->bytes();
    r.step_cache_bytes.push_back(live);
    r.peak_cache_bytes = std::max(r.peak_cache_bytes, live);
    if (cuda)
      r.device_bytes_peak =
          std::max(r.device_bytes_peak, device_memory_used(AttentionBackend::kCuda));
    for (const int64_t i : c.finished) {  // the schedule says who leaves; its counts must agree
      const auto u = static_cast<size_t>(i);
      KVQ_CHECK(u < requests.size() && caches[u] &&
                    static_cast<int64_t>(r.outputs[u].size()) == requests[u].output_tokens,
                "serve: request {} leaves with {} of its output tokens", i,
                u < requests.size() ? r.outputs[u].size() : 0);
      caches[u].reset();
      held.erase(std::find(held.begin(), held.end(), i));
    }
  }
  return r;
}

nlohmann::ordered_json serve_fields(const LlamaModel& m, double mem_bytes,
                                    const ServeSchedule& plan,
                                    std::span<const ServeStepCalls> calls,
                                    const ServeRunResult& r) {
  const double decode_tps = r.decode_s > 0 ? r.decode_tokens / r.decode_s : 0;
  nlohmann::ordered_json j = {
      {"mem_bytes", mem_bytes},
      {"requests", r.outputs.size()},
      {"steps", plan.steps.size()},
      {"max_held", plan.max_held},
      {"decode_tokens_per_s", decode_tps},
      {"prefill_tokens_per_s", r.prefill_s > 0 ? r.prefill_tokens / r.prefill_s : 0.0},
      {"decode_tokens", r.decode_tokens},
      {"prefill_tokens", r.prefill_tokens},
      {"peak_cache_bytes", r.peak_cache_bytes},
      {"predicted_peak_cache_bytes", plan.peak_live_bytes},
      {"peak_reserved_bytes", plan.peak_reserved_bytes},
      {"batched", r.batched},
      {"decode_calls", r.decode_calls},
      {"max_decode_batch", max_decode_batch(calls)}};
  if (r.batched) {  // backend cuda: the GPU, its memory in use, and the planner's bound
    const DeviceReport d = device_report(m.backend());
    const double wb = static_cast<double>(m.device_weight_bytes());
    const DecodeBound bound = decode_bound(calls, wb, d.peak_gbps * 1e9);
    j["device"] = d.name;
    j["driver_version"] = d.driver_version;
    j["runtime_version"] = d.runtime_version;
    j["peak_gb_per_s"] = d.peak_gbps;
    j["device_weight_bytes"] = wb;
    j["device_bytes_start"] = r.device_bytes_start;
    j["device_bytes_peak"] = r.device_bytes_peak;
    j["bound_decode_tokens_per_s"] = bound.tokens_per_s();
    j["of_bound"] = bound.tokens_per_s() > 0 ? decode_tps / bound.tokens_per_s() : 0.0;
  }
  return j;
}

}  // namespace kvq::eval
