#include "experiments/model_eval.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "core/error.h"
#include "fmt/format.h"

namespace kvq::eval {
namespace {

CacheOptions fp32_cache(const CacheOptions& like) {
  CacheOptions o = like;
  o.spec = parse_spec("fp32");
  return o;
}

int32_t argmax(const float* x, int64_t n) { return static_cast<int32_t>(std::max_element(x, x + n) - x); }

// Logits for every position of `tokens`, appended to `cache` in chunks.
void run_chunks(const LlamaModel& m, LlamaCache& cache, const int32_t* tokens, int64_t n, int chunk,
                int threads, std::vector<float>& all) {
  const int64_t V = m.config().vocab;
  all.resize(static_cast<size_t>(n * V));
  std::vector<float> part;
  for (int64_t a = 0; a < n; a += chunk) {
    const int64_t len = std::min<int64_t>(chunk, n - a);
    m.forward({tokens + a, static_cast<size_t>(len)}, cache, part, true, threads);
    std::copy(part.begin(), part.end(), all.begin() + a * V);
  }
}

}  // namespace

std::vector<double> log_softmax(const float* logits, int64_t n) {
  const double mx = *std::max_element(logits, logits + n);
  double z = 0;
  for (int64_t i = 0; i < n; ++i) z += std::exp(static_cast<double>(logits[i]) - mx);
  const double lz = mx + std::log(z);
  std::vector<double> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out[static_cast<size_t>(i)] = logits[i] - lz;
  return out;
}

PplResult perplexity(const LlamaModel& m, const CacheOptions& cache, const std::vector<int32_t>& all_tokens,
                     const PplOptions& o, const Progress& progress) {
  KVQ_CHECK(o.ctx >= 2, "ppl: --ctx {} must be at least 2", o.ctx);
  KVQ_CHECK(o.ctx <= m.config().context, "ppl: --ctx {} exceeds the model's context {}", o.ctx, m.config().context);
  KVQ_CHECK(o.chunk >= 1, "ppl: --chunk {} must be positive", o.chunk);
  const int stride = o.stride > 0 ? o.stride : o.ctx;
  KVQ_CHECK(stride <= o.ctx, "ppl: --stride {} must not exceed --ctx {}", stride, o.ctx);
  const int64_t n = o.max_tokens > 0 ? std::min<int64_t>(o.max_tokens, static_cast<int64_t>(all_tokens.size()))
                                     : static_cast<int64_t>(all_tokens.size());
  KVQ_CHECK(n >= o.ctx, "ppl: the text has {} tokens, fewer than --ctx {}", n, o.ctx);
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t V = m.config().vocab;
  PplResult r;
  double nll = 0, nll_ref = 0, agree = 0;
  std::vector<double> klds;
  std::vector<float> lr, lq;
  const int64_t windows = (n - o.ctx) / stride + 1;
  for (int64_t w = 0; w < windows; ++w) {
    const int32_t* tok = all_tokens.data() + w * stride;
    LlamaCache ref(m.config(), fp32_cache(cache)), test(m.config(), cache);
    run_chunks(m, ref, tok, o.ctx, o.chunk, o.threads, lr);
    run_chunks(m, test, tok, o.ctx, o.chunk, o.threads, lq);
    // Positions first .. ctx-2 predict tokens first+1 .. ctx-1: the whole window at first (and
    // for non-overlapping windows), then only the last `stride` tokens of overlapping ones.
    const int64_t first = w == 0 ? 0 : std::max<int64_t>(0, o.ctx - stride - 1);
    for (int64_t p = first; p < o.ctx - 1; ++p) {
      const auto a = log_softmax(lr.data() + p * V, V), b = log_softmax(lq.data() + p * V, V);
      const int32_t next = tok[p + 1];
      nll_ref -= a[static_cast<size_t>(next)];
      nll -= b[static_cast<size_t>(next)];
      double kl = 0;
      for (int64_t i = 0; i < V; ++i) kl += std::exp(a[static_cast<size_t>(i)]) * (a[static_cast<size_t>(i)] - b[static_cast<size_t>(i)]);
      klds.push_back(std::max(kl, 0.0));
      agree += argmax(lr.data() + p * V, V) == argmax(lq.data() + p * V, V);
    }
    r.windows = w + 1;
    if (progress) {
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      progress(fmt::format("window {}/{}: ppl {:.4f} (fp32 {:.4f}), {:.0f} tokens/s", w + 1, windows,
                           std::exp(nll / static_cast<double>(klds.size())),
                           std::exp(nll_ref / static_cast<double>(klds.size())),
                           2.0 * static_cast<double>((w + 1) * o.ctx) / s));
    }
  }
  r.scored = static_cast<int64_t>(klds.size());
  r.ppl = std::exp(nll / static_cast<double>(r.scored));
  r.ppl_ref = std::exp(nll_ref / static_cast<double>(r.scored));
  double s = 0;
  for (double k : klds) s += k;
  r.kld = s / static_cast<double>(r.scored);
  std::sort(klds.begin(), klds.end());
  r.kld_p99 = klds[static_cast<size_t>(std::min<double>(static_cast<double>(klds.size() - 1), std::floor(0.99 * static_cast<double>(klds.size()))))];
  r.top1 = agree / static_cast<double>(r.scored);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

std::vector<int32_t> generate(const LlamaModel& m, const CacheOptions& opts, const std::vector<int32_t>& prompt,
                              int n, const std::vector<int32_t>& stop, int threads,
                              const std::function<void(int32_t)>& on_token) {
  KVQ_CHECK(!prompt.empty(), "generate: empty prompt");
  KVQ_CHECK(static_cast<int64_t>(prompt.size()) + n <= m.config().context,
            "generate: {} prompt tokens + {} new exceed the model's context {}", prompt.size(), n, m.config().context);
  LlamaCache cache(m.config(), opts);
  std::vector<float> logits;
  std::vector<int32_t> out;
  for (size_t a = 0; a < prompt.size(); a += 256) {
    const size_t len = std::min<size_t>(256, prompt.size() - a);
    m.forward({prompt.data() + a, len}, cache, logits, false, threads);
  }
  for (int i = 0; i < n; ++i) {
    const int32_t t = argmax(logits.data(), m.config().vocab);
    out.push_back(t);
    if (on_token) on_token(t);
    if (std::find(stop.begin(), stop.end(), t) != stop.end()) break;
    m.forward({&t, 1}, cache, logits, false, threads);
  }
  return out;
}

DivergeResult diverge(const LlamaModel& m, const CacheOptions& ref, const CacheOptions& test,
                      const std::vector<int32_t>& prompt, int n, int threads) {
  DivergeResult r;
  r.ref = generate(m, ref, prompt, n, {}, threads);
  r.test = generate(m, test, prompt, n, {}, threads);
  for (size_t i = 0; i < r.ref.size() && i < r.test.size(); ++i)
    if (r.ref[i] != r.test[i]) {
      r.first_diff = static_cast<int64_t>(i);
      break;
    }
  // Teacher forcing: the test cache reads the ref continuation; does its argmax agree each step?
  LlamaCache tc(m.config(), test);
  std::vector<int32_t> seq = prompt;
  seq.insert(seq.end(), r.ref.begin(), r.ref.end() - 1);
  std::vector<float> logits;
  const int64_t V = m.config().vocab;
  run_chunks(m, tc, seq.data(), static_cast<int64_t>(seq.size()), 256, threads, logits);
  int agree = 0;
  for (size_t i = 0; i < r.ref.size(); ++i)
    agree += argmax(logits.data() + static_cast<int64_t>(prompt.size() - 1 + i) * V, V) == r.ref[i];
  r.top1 = static_cast<double>(agree) / static_cast<double>(r.ref.size());
  return r;
}

NeedleResult needle_trial(const LlamaModel& m, const CacheOptions& opts, const std::vector<int32_t>& prompt,
                          const std::vector<int32_t>& answer, int chunk, int threads) {
  KVQ_CHECK(!answer.empty(), "needle: empty answer");
  LlamaCache cache(m.config(), opts);
  std::vector<float> logits;
  for (size_t a = 0; a < prompt.size(); a += static_cast<size_t>(chunk)) {
    const size_t len = std::min<size_t>(static_cast<size_t>(chunk), prompt.size() - a);
    m.forward({prompt.data() + a, len}, cache, logits, false, threads);
  }
  NeedleResult r;
  r.ctx = static_cast<int64_t>(prompt.size());
  r.correct = true;
  const int64_t V = m.config().vocab;
  for (size_t i = 0; i < answer.size(); ++i) {
    const auto lp = log_softmax(logits.data(), V);
    r.logprob += lp[static_cast<size_t>(answer[i])] / static_cast<double>(answer.size());
    r.correct = r.correct && argmax(logits.data(), V) == answer[i];
    if (i + 1 < answer.size()) m.forward({&answer[i], 1}, cache, logits, false, threads);
  }
  return r;
}

}  // namespace kvq::eval
