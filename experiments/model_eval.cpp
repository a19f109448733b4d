#include "experiments/model_eval.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <span>

#include "core/error.h"
#include "fmt/format.h"

namespace kvq::eval {
namespace {

int32_t argmax(const float* x, int64_t n) {
  return static_cast<int32_t>(std::max_element(x, x + n) - x);
}

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

void check_ppl_options(const PplOptions& o, int context) {
  KVQ_CHECK(o.ctx >= 2, "ppl: --ctx {} must be at least 2", o.ctx);
  KVQ_CHECK(o.ctx <= context, "ppl: --ctx {} exceeds the model's context {}", o.ctx, context);
  KVQ_CHECK(o.chunk >= 1, "ppl: --chunk {} must be positive", o.chunk);
  const int stride = o.stride > 0 ? o.stride : o.ctx;
  KVQ_CHECK(stride <= o.ctx, "ppl: --stride {} must not exceed --ctx {}", stride, o.ctx);
  KVQ_CHECK(o.score_from >= 0 && o.score_from < o.ctx - 1,
            "ppl: --score-from {} leaves nothing to score in windows of {}", o.score_from, o.ctx);
}

std::vector<PplResult> perplexity(const LlamaModel& m, const std::vector<CacheOptions>& caches,
                                  const std::vector<int32_t>& all_tokens, const PplOptions& o,
                                  const Progress& progress) {
  KVQ_CHECK(!caches.empty(), "ppl: no scheme to evaluate");
  check_ppl_options(o, m.config().context);
  const int stride = o.stride > 0 ? o.stride : o.ctx;
  const int64_t n = o.max_tokens > 0
                        ? std::min<int64_t>(o.max_tokens, static_cast<int64_t>(all_tokens.size()))
                        : static_cast<int64_t>(all_tokens.size());
  KVQ_CHECK(n >= o.ctx, "ppl: the text has {} tokens, fewer than --ctx {}", n, o.ctx);
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t V = m.config().vocab;
  const size_t S = caches.size();
  std::vector<double> nll(S, 0.0), agree(S, 0.0);
  std::vector<std::vector<double>> klds(S);
  double nll_ref = 0;
  std::vector<float> lr;
  std::vector<std::vector<float>> lq(S);
  const int64_t windows = (n - o.ctx) / stride + 1;
  CacheOptions ref_opts;  // the unquantized reference: fp32 keys and values, post-RoPE
  ref_opts.spec = parse_spec("fp32");
  for (int64_t w = 0; w < windows; ++w) {
    const int32_t* tok = all_tokens.data() + w * stride;
    LlamaCache ref(m.config(), ref_opts);
    std::vector<LlamaCache> test;
    for (const CacheOptions& c : caches) test.emplace_back(m.config(), c);
    // Positions first .. ctx-2 predict tokens first+1 .. ctx-1: the whole window at first (and
    // for non-overlapping windows), then only the last `stride` tokens of overlapping ones.
    const int64_t first =
        std::max<int64_t>(o.score_from, w == 0 ? 0 : std::max<int64_t>(0, o.ctx - stride - 1));
    // Chunk by chunk, every cache in step: the reference logits of a chunk are computed once and
    // every scheme is scored against them, holding (schemes + 1) x chunk x vocab floats.
    for (int64_t a = 0; a < o.ctx; a += o.chunk) {
      const int64_t len = std::min<int64_t>(o.chunk, o.ctx - a);
      const std::span<const int32_t> part(tok + a, static_cast<size_t>(len));
      m.forward(part, ref, lr, true, o.threads);
      for (size_t s = 0; s < S; ++s) m.forward(part, test[s], lq[s], true, o.threads);
      if (o.poll) o.poll();
      const int64_t p0 = std::max(first, a), p1 = std::min<int64_t>(a + len, o.ctx - 1);
      if (p1 <= p0) continue;
      // Score the chunk's positions in parallel; sums are taken in position order afterwards.
      const int64_t np = p1 - p0;
      std::vector<double> r_nll(static_cast<size_t>(np)), q_nll(static_cast<size_t>(np) * S),
          q_kl(static_cast<size_t>(np) * S), q_agree(static_cast<size_t>(np) * S);
#pragma omp parallel for schedule(dynamic, 4) \
    num_threads(o.threads > 0 ? o.threads : omp_get_num_procs())
      for (int64_t i = 0; i < np; ++i) {
        const int64_t row = p0 + i - a;
        const auto la = log_softmax(lr.data() + row * V, V);
        std::vector<double> pa(la.size());
        for (size_t j = 0; j < la.size(); ++j) pa[j] = std::exp(la[j]);
        const auto next = static_cast<size_t>(tok[p0 + i + 1]);
        r_nll[static_cast<size_t>(i)] = -la[next];
        const int32_t top_ref = argmax(lr.data() + row * V, V);
        for (size_t s = 0; s < S; ++s) {
          const auto lb = log_softmax(lq[s].data() + row * V, V);
          double kl = 0;
          for (size_t j = 0; j < la.size(); ++j) kl += pa[j] * (la[j] - lb[j]);
          const size_t at = static_cast<size_t>(i) * S + s;
          q_nll[at] = -lb[next];
          q_kl[at] = std::max(kl, 0.0);
          q_agree[at] = argmax(lq[s].data() + row * V, V) == top_ref;
        }
      }
      for (int64_t i = 0; i < np; ++i) {
        nll_ref += r_nll[static_cast<size_t>(i)];
        for (size_t s = 0; s < S; ++s) {
          const size_t at = static_cast<size_t>(i) * S + s;
          nll[s] += q_nll[at];
          klds[s].push_back(q_kl[at]);
          agree[s] += q_agree[at];
        }
      }
    }
    if (progress) {
      const double sec =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const double scored = static_cast<double>(klds[0].size());
      std::string ppls;
      for (size_t s = 0; s < S && s < 4; ++s)
        ppls += fmt::format(" {:.4f}", std::exp(nll[s] / scored));
      if (S > 4) ppls += " ...";
      progress(fmt::format(
          "window {}/{}: ppl fp32 {:.4f}, schemes{}; {:.0f} tokens/s over {} caches, ETA {:.0f} s",
          w + 1, windows, std::exp(nll_ref / scored), ppls,
          static_cast<double>((w + 1) * o.ctx * static_cast<int64_t>(S + 1)) / sec, S + 1,
          sec / static_cast<double>(w + 1) * static_cast<double>(windows - w - 1)));
    }
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::vector<PplResult> out(S);
  for (size_t s = 0; s < S; ++s) {
    PplResult& r = out[s];
    r.windows = windows;
    r.scored = static_cast<int64_t>(klds[s].size());
    r.ppl = std::exp(nll[s] / static_cast<double>(r.scored));
    r.ppl_ref = std::exp(nll_ref / static_cast<double>(r.scored));
    double sum = 0;
    for (double k : klds[s]) sum += k;
    r.kld = sum / static_cast<double>(r.scored);
    std::sort(klds[s].begin(), klds[s].end());
    r.kld_p99 = klds[s][static_cast<size_t>(
        std::min<double>(static_cast<double>(klds[s].size() - 1),
                         std::floor(0.99 * static_cast<double>(klds[s].size()))))];
    r.top1 = agree[s] / static_cast<double>(r.scored);
    r.seconds = seconds;
  }
  return out;
}

PplResult perplexity(const LlamaModel& m, const CacheOptions& cache,
                     const std::vector<int32_t>& tokens, const PplOptions& o,
                     const Progress& progress) {
  return perplexity(m, std::vector<CacheOptions>{cache}, tokens, o, progress).front();
}

std::vector<int32_t> generate(const LlamaModel& m, const CacheOptions& opts,
                              const std::vector<int32_t>& prompt, int n,
                              const std::vector<int32_t>& stop, int threads,
                              const std::function<void(int32_t)>& on_token) {
  KVQ_CHECK(!prompt.empty(), "generate: empty prompt");
  KVQ_CHECK(static_cast<int64_t>(prompt.size()) + n <= m.config().context,
            "generate: {} prompt tokens + {} new exceed the model's context {}", prompt.size(), n,
            m.config().context);
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

LoadedModel load_model(const std::string& path) {
  const gguf::GgufFile f = gguf::GgufFile::open(path);
  return {LlamaModel::load(f), Tokenizer::from_gguf(f)};
}

NeedleText needle_text(const Tokenizer& tok, const std::string& hay_text) {
  NeedleText t;
  t.hay = tok.encode(std::string_view(hay_text).substr(0, 400000));
  t.intro = tok.encode(
      "There is an important pass key hidden inside a lot of irrelevant text. Find it and memorize "
      "it. I will quiz you about the pass key.\n\n");
  t.question = tok.encode("\n\nWhat is the pass key? The pass key is");
  return t;
}

uint64_t needle_seed(uint64_t seed) { return seed * 0x9e3779b97f4a7c15ULL + 17; }

int needle_key(uint64_t& state) {
  state = state * 6364136223846793005ULL + 1442695040888963407ULL;
  return 10000 + static_cast<int>((state >> 33) % 90000);
}

NeedleCase needle_case(const Tokenizer& tok, const NeedleText& t, int ctx, double depth, int key) {
  const auto needle =
      tok.encode(fmt::format("\nThe pass key is {}. Remember it. {} is the pass key.\n", key, key));
  NeedleCase c;
  c.answer = tok.encode(fmt::format(" {}", key));
  const int64_t fill = ctx - static_cast<int64_t>(t.intro.size() + needle.size() + t.question.size());
  KVQ_CHECK(fill > 0 && fill <= static_cast<int64_t>(t.hay.size()),
            "needle: ctx {} leaves no room for the haystack", ctx);
  const int64_t at = static_cast<int64_t>(std::llround(depth * static_cast<double>(fill)));
  c.prompt = t.intro;
  c.prompt.insert(c.prompt.end(), t.hay.begin(), t.hay.begin() + at);
  c.prompt.insert(c.prompt.end(), needle.begin(), needle.end());
  c.prompt.insert(c.prompt.end(), t.hay.begin() + at, t.hay.begin() + fill);
  c.prompt.insert(c.prompt.end(), t.question.begin(), t.question.end());
  return c;
}

NeedleResult needle_trial(const LlamaModel& m, const CacheOptions& opts,
                          const std::vector<int32_t>& prompt, const std::vector<int32_t>& answer,
                          int chunk, int threads, const Progress& progress) {
  KVQ_CHECK(!answer.empty(), "needle: empty answer");
  LlamaCache cache(m.config(), opts);
  std::vector<float> logits;
  const auto t0 = std::chrono::steady_clock::now();
  auto last = t0;
  for (size_t a = 0; a < prompt.size(); a += static_cast<size_t>(chunk)) {
    const size_t len = std::min<size_t>(static_cast<size_t>(chunk), prompt.size() - a);
    m.forward({prompt.data() + a, len}, cache, logits, false, threads);
    const auto now = std::chrono::steady_clock::now();
    if (progress && std::chrono::duration<double>(now - last).count() > 10.0) {  // every ~10 s
      last = now;
      const double sec = std::chrono::duration<double>(now - t0).count(),
                   done = static_cast<double>(a + len);
      // Causal attention grows with position, so the remaining time is extrapolated quadratically.
      const double total = sec * std::pow(static_cast<double>(prompt.size()) / done, 2.0);
      progress(fmt::format("{}/{} prompt tokens, {:.0f} tokens/s, ETA {:.0f} s", a + len,
                           prompt.size(), done / sec, std::max(0.0, total - sec)));
    }
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

std::vector<LayerKv> dump_kv(const LlamaModel& m, const std::vector<int32_t>& ids, int threads,
                             const std::function<void()>& poll) {
  KVQ_CHECK(!ids.empty(), "dump: the text is empty after tokenization");
  const LlamaConfig& c = m.config();
  const int64_t T = static_cast<int64_t>(ids.size()), H = c.kv_heads, D = c.head_dim;
  KVQ_CHECK(T <= c.context, "dump: {} tokens exceed the model's context {}", T, c.context);
  std::vector<LayerKv> out(static_cast<size_t>(c.layers));
  for (auto& l : out) l = {Tensor3({T, H, D}), Tensor3({T, H, D}), Tensor3({T, H, D})};
  CacheOptions fp32;
  fp32.spec = parse_spec("fp32");
  LlamaCache cache(c, fp32);
  std::vector<float> logits;
  for (int64_t a = 0; a < T; a += 256) {
    const int64_t len = std::min<int64_t>(256, T - a);
    m.forward(
        {ids.data() + a, static_cast<size_t>(len)}, cache, logits, false, threads,
        [&](int l, int64_t pos0, int64_t n, const float* kpre, const float* k, const float* v) {
          LayerKv& L = out[static_cast<size_t>(l)];
          const auto off = static_cast<long>(pos0 * H * D);
          const int64_t cnt = n * H * D;
          std::copy(k, k + cnt, L.k.data.begin() + off);
          std::copy(kpre, kpre + cnt, L.k_pre.data.begin() + off);
          std::copy(v, v + cnt, L.v.data.begin() + off);
        });
    if (poll) poll();
  }
  return out;
}

}  // namespace kvq::eval
