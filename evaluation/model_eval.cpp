#include "evaluation/model_eval.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <span>

#include "core/error.h"
#include "core/footprint.h"
#include "core/schemes.h"
#include "core/splitmix.h"
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

// The first position perplexity() scores in window w: positions first .. ctx-2 predict tokens
// first+1 .. ctx-1: the whole window at first (and for non-overlapping windows), then only the
// last `stride` tokens of overlapping ones.
int64_t first_scored(const PplOptions& o, int stride, int64_t w) {
  return std::max<int64_t>(o.score_from, w == 0 ? 0 : std::max<int64_t>(0, o.ctx - stride - 1));
}

// quantized_tokens_of for one layer's one-side spec.
int64_t side_quantized(const SchemeSpec& side, Role role, int64_t t, bool streamed) {
  if (t <= side.sink) return 0;  // sink=S: the first S exact; the scheme holds the rest
  t -= side.sink;
  return scheme_traits(side).coded_tokens(side, role, t, streamed);
}

// A block bootstrap statistic's 2.5th and 97.5th percentiles.
Interval percentile_interval(std::vector<double>& v) {
  std::sort(v.begin(), v.end());
  const auto at = [&](double p) {  // linear interpolation between order statistics
    const double x = p * static_cast<double>(v.size() - 1);
    const size_t i = static_cast<size_t>(std::floor(x));
    const size_t j = std::min(i + 1, v.size() - 1);
    return v[i] + (x - static_cast<double>(i)) * (v[j] - v[i]);
  };
  return {at(0.025), at(0.975)};
}

}  // namespace

int64_t quantized_tokens_of(const SchemeSpec& spec, Role role, int64_t tokens, int layer,
                            bool streamed) {
  return side_quantized(spec.for_layer(layer).side(role), role, tokens, streamed);
}

bool exact_by_design(const SchemeSpec& spec) {
  for (const SchemeSpec& one : spec.distinct_layer_specs())
    for (Role r : {Role::Key, Role::Value})
      if (one.side(r).kind() != SchemeKind::Fp32) return false;
  return true;
}

std::string reference_field(AttentionBackend b) {
  return backend_info(b).support.fp32 ? std::string() : reference_spec(b).canonical();
}

std::vector<std::pair<std::string, double>> result_fields(const PplResult& r) {
  return {{"ppl", r.ppl},
          {"ppl_lo", r.ppl_ci.lo},
          {"ppl_hi", r.ppl_ci.hi},
          {"ppl_fp32", r.ppl_ref},
          {"ppl_fp32_lo", r.ppl_ref_ci.lo},
          {"ppl_fp32_hi", r.ppl_ref_ci.hi},
          {"delta_ppl", r.ppl - r.ppl_ref},
          {"delta_ppl_lo", r.delta_ppl_ci.lo},
          {"delta_ppl_hi", r.delta_ppl_ci.hi},
          {"kld", r.kld},
          {"kld_lo", r.kld_ci.lo},
          {"kld_hi", r.kld_ci.hi},
          {"kld_p99", r.kld_p99},
          {"top1", r.top1},
          {"top1_lo", r.top1_ci.lo},
          {"top1_hi", r.top1_ci.hi},
          {"quantized", r.quantized}};
}

std::string format_result(const PplResult& r) {
  const auto ci = [](const Interval& i, const char* spec, double scale = 1.0) {
    return i.known() ? fmt::format(fmt::runtime(fmt::format(" [{{:{0}}}, {{:{0}}}]", spec)),
                                   scale * i.lo, scale * i.hi)
                     : std::string(" [-]");
  };
  return fmt::format(
      "ppl {:.4f}{}, delta {:+.4f}{}, KLD {:.5f}{}, top-1 {:.2f}%{}, quantized {:.1f}%", r.ppl,
      ci(r.ppl_ci, ".4f"), r.ppl - r.ppl_ref, ci(r.delta_ppl_ci, "+.4f"), r.kld,
      ci(r.kld_ci, ".5f"), 100.0 * r.top1, ci(r.top1_ci, ".2f", 100.0), 100.0 * r.quantized);
}

std::string little_quantized(const std::string& scheme, int64_t ctx, double quantized) {
  return fmt::format(
      "{} at ctx {}: only {:.1f}% of the K/V the scored positions attend was stored quantized "
      "(under {:.0f}%: its exact window or FP8 first-N prefix covers most of each window), so the "
      "row measures little of the scheme; score longer windows",
      scheme, ctx, 100.0 * quantized, 100.0 * kMinQuantizedFraction);
}

double quantized_fraction(const SchemeSpec& spec, const PplOptions& o, int64_t text_tokens,
                          int layers) {
  KVQ_CHECK(layers >= 1 && o.ctx >= 2 && text_tokens >= o.ctx,
            "quantized_fraction: {} layers, ctx {}, {} tokens", layers, o.ctx, text_tokens);
  const int stride = o.stride > 0 ? o.stride : o.ctx;
  // share[t]: the quantized part of a t-token cache, summed over the sides that quantize.
  std::vector<double> share(static_cast<size_t>(o.ctx), 0.0);
  int sides = 0;
  const SchemeSpec whole = resolve_layers(spec, layers, "the model");
  for (int l = 0; l < layers; ++l) {
    const SchemeSpec one = whole.for_layer(l);
    for (Role r : {Role::Key, Role::Value}) {
      const SchemeSpec& side = one.side(r);
      if (side.kind() == SchemeKind::Fp32) continue;  // exact by design: not in the mean
      ++sides;
      for (int64_t t = 1; t < o.ctx; ++t)
        share[static_cast<size_t>(t)] +=
            static_cast<double>(side_quantized(side, r, t, true)) / static_cast<double>(t);
    }
  }
  if (sides == 0) return 0.0;
  for (double& x : share) x /= sides;
  // Windows after the first all score the same positions: weigh them by their count.
  const int64_t windows = (text_tokens - o.ctx) / stride + 1;
  double sum = 0, n = 0;
  for (int64_t w = 0; w < std::min<int64_t>(windows, 2); ++w) {
    const double weight = w == 0 ? 1.0 : static_cast<double>(windows - 1);
    for (int64_t p = first_scored(o, stride, w); p < o.ctx - 1; ++p) {
      sum += weight * share[static_cast<size_t>(p + 1)];
      n += weight;
    }
  }
  return n > 0 ? sum / n : 0.0;
}

void bootstrap_intervals(const PositionScores& s, PplResult& r) {
  const size_t n = s.nll.size();
  KVQ_CHECK(s.nll_ref.size() == n && s.kl.size() == n && s.agree.size() == n,
            "bootstrap_intervals: score arrays of different lengths");
  // Per block: sums of each score and its length; blocks never cross a window.
  struct Block {
    double nll_ref = 0, nll = 0, kl = 0, agree = 0, count = 0;
  };
  std::vector<Block> blocks;
  for (size_t w = 0; w < s.window_begin.size(); ++w) {
    const size_t end = w + 1 < s.window_begin.size() ? s.window_begin[w + 1] : n;
    for (size_t a = s.window_begin[w]; a < end; a += kCiBlock) {
      Block b;
      for (size_t i = a; i < std::min<size_t>(a + kCiBlock, end); ++i) {
        b.nll_ref += s.nll_ref[i];
        b.nll += s.nll[i];
        b.kl += s.kl[i];
        b.agree += s.agree[i];
        b.count += 1;
      }
      blocks.push_back(b);
    }
  }
  r.ci_blocks = static_cast<int64_t>(blocks.size());
  r.ppl_ci = r.ppl_ref_ci = r.delta_ppl_ci = r.kld_ci = r.top1_ci = Interval{};
  if (blocks.size() < 2) return;
  std::vector<double> ppl, ppl_ref, dppl, kld, top1;
  uint64_t state = kCiSeed;
  const auto nb = static_cast<unsigned __int128>(blocks.size());
  for (int k = 0; k < kCiResamples; ++k) {
    Block t;
    for (size_t i = 0; i < blocks.size(); ++i) {
      // A uniform block index: the high word of a 64 x 64-bit product (Lemire's map).
      const Block& b = blocks[static_cast<size_t>((splitmix64(state) * nb) >> 64)];
      t.nll_ref += b.nll_ref;
      t.nll += b.nll;
      t.kl += b.kl;
      t.agree += b.agree;
      t.count += b.count;
    }
    const double p = std::exp(t.nll / t.count), pr = std::exp(t.nll_ref / t.count);
    ppl.push_back(p);
    ppl_ref.push_back(pr);
    dppl.push_back(p - pr);
    kld.push_back(t.kl / t.count);
    top1.push_back(t.agree / t.count);
  }
  r.ppl_ci = percentile_interval(ppl);
  r.ppl_ref_ci = percentile_interval(ppl_ref);
  r.delta_ppl_ci = percentile_interval(dppl);
  r.kld_ci = percentile_interval(kld);
  r.top1_ci = percentile_interval(top1);
}

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

namespace {

// One chunk's scored positions [p0, p1) (logit rows p0 - a ...): each position's reference NLL and,
// per scheme s, its NLL, KL(reference || scheme) and top-1 agreement at [i * S + s]. Scored in
// parallel; the caller sums them in position order.
struct ChunkScores {
  std::vector<double> r_nll, q_nll, q_kl, q_agree;
};

ChunkScores score_chunk(const std::vector<float>& lr, const std::vector<std::vector<float>>& lq,
                        const int32_t* tok, int64_t a, int64_t p0, int64_t p1, int64_t V,
                        int threads) {
  const size_t S = lq.size();
  const int64_t np = p1 - p0;
  const size_t n = static_cast<size_t>(np);
  ChunkScores c{std::vector<double>(n), std::vector<double>(n * S), std::vector<double>(n * S),
                std::vector<double>(n * S)};
  std::vector<double>&r_nll = c.r_nll, &q_nll = c.q_nll, &q_kl = c.q_kl, &q_agree = c.q_agree;
#pragma omp parallel for schedule(dynamic, 4) \
    num_threads(threads > 0 ? threads : omp_get_num_procs())
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
  return c;
}

// The progress line after window w of `windows`: the perplexities so far (the first four schemes)
// and the speed.
std::string window_progress(int64_t w, int64_t windows, int ctx, double sec, double nll_ref,
                            const std::vector<double>& nll, double scored) {
  const size_t S = nll.size();
  std::string ppls;
  for (size_t s = 0; s < S && s < 4; ++s) ppls += fmt::format(" {:.4f}", std::exp(nll[s] / scored));
  if (S > 4) ppls += " ...";
  return fmt::format(
      "window {}/{}: ppl fp32 {:.4f}, schemes{}; {:.0f} tokens/s over {} caches, ETA {:.0f} s",
      w + 1, windows, std::exp(nll_ref / scored), ppls,
      static_cast<double>((w + 1) * ctx * static_cast<int64_t>(S + 1)) / sec, S + 1,
      sec / static_cast<double>(w + 1) * static_cast<double>(windows - w - 1));
}

// One scheme's row from its sums: ppl (and the reference's), mean and 99th-percentile KL, top-1
// agreement, the bootstrap intervals. `klds` is sorted.
PplResult ppl_result(double nll, double nll_ref, double agree, std::vector<double>& klds,
                     const PositionScores& scores, int64_t windows) {
  PplResult r;
  r.windows = windows;
  r.scored = static_cast<int64_t>(klds.size());
  r.ppl = std::exp(nll / static_cast<double>(r.scored));
  r.ppl_ref = std::exp(nll_ref / static_cast<double>(r.scored));
  double sum = 0;
  for (double k : klds) sum += k;
  r.kld = sum / static_cast<double>(r.scored);
  std::sort(klds.begin(), klds.end());
  r.kld_p99 = klds[static_cast<size_t>(std::min<double>(
      static_cast<double>(klds.size() - 1), std::floor(0.99 * static_cast<double>(klds.size()))))];
  r.top1 = agree / static_cast<double>(r.scored);
  bootstrap_intervals(scores, r);
  return r;
}

}  // namespace

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
  std::vector<PositionScores> scores(S);
  double nll_ref = 0;
  std::vector<float> lr;
  std::vector<std::vector<float>> lq(S);
  const int64_t windows = (n - o.ctx) / stride + 1;
  CacheOptions ref_opts;  // the unquantized reference, post-RoPE: fp32 (bf16 on backend cuda)
  ref_opts.spec = reference_spec(m.backend());
  for (int64_t w = 0; w < windows; ++w) {
    const int32_t* tok = all_tokens.data() + w * stride;
    LlamaCache ref(m.config(), ref_opts);
    std::vector<LlamaCache> test;
    for (const CacheOptions& c : caches) test.emplace_back(m.config(), c);
    const int64_t first = first_scored(o, stride, w);
    for (PositionScores& sc : scores) sc.window_begin.push_back(sc.nll.size());
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
      const ChunkScores c = score_chunk(lr, lq, tok, a, p0, p1, V, o.threads);
      for (int64_t i = 0; i < np; ++i) {
        const double r_nll = c.r_nll[static_cast<size_t>(i)];
        nll_ref += r_nll;
        for (size_t s = 0; s < S; ++s) {
          const size_t at = static_cast<size_t>(i) * S + s;
          nll[s] += c.q_nll[at];
          klds[s].push_back(c.q_kl[at]);
          agree[s] += c.q_agree[at];
          PositionScores& sc = scores[s];
          sc.nll_ref.push_back(r_nll);
          sc.nll.push_back(c.q_nll[at]);
          sc.kl.push_back(c.q_kl[at]);
          sc.agree.push_back(c.q_agree[at]);
        }
      }
    }
    if (progress) {
      const double sec =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      progress(window_progress(w, windows, o.ctx, sec, nll_ref, nll,
                               static_cast<double>(klds[0].size())));
    }
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::vector<PplResult> out(S);
  for (size_t s = 0; s < S; ++s) {
    PplResult& r = out[s];
    r = ppl_result(nll[s], nll_ref, agree[s], klds[s], scores[s], windows);
    r.quantized = quantized_fraction(caches[s].spec, o, n, m.config().layers);
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

LoadedModel load_model(const std::string& path, WeightStore store) {
  if (HfCheckpoint::is_folder(path)) {  // a checkpoint folder: its tokenizer.json
    const HfCheckpoint c = HfCheckpoint::open(path);
    return {LlamaModel::load(c, store), Tokenizer::from_tokenizer_json(c.tokenizer_path())};
  }
  const gguf::GgufFile f = gguf::GgufFile::open(path);
  return {LlamaModel::load(f, store), Tokenizer::from_gguf(f)};
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
  const int64_t fill =
      ctx - static_cast<int64_t>(t.intro.size() + needle.size() + t.question.size());
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

std::vector<NeedleRow> needle_grid(const LoadedModel& L, const std::string& hay_text,
                                   const CacheOptions& ref, const CacheOptions& test,
                                   const NeedleGrid& g,
                                   const std::function<void(const NeedleRow&)>& on_row,
                                   const Progress& progress) {
  const NeedleText text = needle_text(L.tok, hay_text);
  uint64_t state = needle_seed(g.seed);
  std::vector<NeedleRow> rows;
  for (int ctx : g.ctxs)
    for (double depth : g.depths)
      for (int trial = 0; trial < g.trials; ++trial) {
        NeedleRow r{ctx, depth, trial, needle_key(state), {}, {}};
        const NeedleCase c = needle_case(L.tok, text, ctx, depth, r.key);
        const auto show = [&](const CacheOptions& co) -> Progress {
          if (!progress) return {};
          return [&, name = co.spec.canonical()](const std::string& msg) {
            progress(fmt::format("[needle ctx {} depth {} {}] {}", ctx, depth, name, msg));
          };
        };
        r.ref = needle_trial(L.model, ref, c.prompt, c.answer, 256, g.threads, show(ref));
        r.test = needle_trial(L.model, test, c.prompt, c.answer, 256, g.threads, show(test));
        r.ref.depth = r.test.depth = depth;
        rows.push_back(r);
        if (on_row) on_row(rows.back());
      }
  return rows;
}

fp8::Calibration calibrate(const LoadedModel& L, const std::string& text, const CalibrateOptions& o,
                           const Progress& progress) {
  std::vector<int32_t> ids = L.tok.encode_first(text, o.max_tokens > 0 ? o.skip + o.max_tokens : 0);
  KVQ_CHECK(static_cast<int64_t>(ids.size()) > o.skip,
            "calibrate: the text has {} tokens, --skip-tokens {} leaves none", ids.size(), o.skip);
  ids.erase(ids.begin(), ids.begin() + o.skip);
  const LlamaConfig& cfg = L.model.config();
  const int64_t H = cfg.kv_heads, D = cfg.head_dim;
  fp8::Calibration cal;
  cal.model = "SmolLM2-135M-Instruct.Q4_1";
  cal.source = fmt::format("{}: {} tokens{}, windows of {}{}", o.text_name, ids.size(),
                           o.skip > 0 ? fmt::format(" after the first {}", o.skip) : std::string(),
                           o.ctx, o.pre_rope ? ", pre-RoPE keys" : "");
  cal.k_amax.assign(static_cast<size_t>(cfg.layers),
                    std::vector<float>(static_cast<size_t>(H), 0.0f));
  cal.v_amax = cal.k_amax;
  std::vector<float> logits;
  for (size_t w = 0; w < ids.size(); w += static_cast<size_t>(o.ctx)) {
    LlamaCache cache(cfg, CacheOptions{parse_spec("fp32")});
    const size_t len = std::min<size_t>(static_cast<size_t>(o.ctx), ids.size() - w);
    for (size_t a = 0; a < len; a += 256) {
      L.model.forward(
          {ids.data() + w + a, std::min<size_t>(256, len - a)}, cache, logits, false, o.threads,
          [&](int l, int64_t, int64_t n, const float* kpre, const float* k, const float* v) {
            const float* kk = o.pre_rope ? kpre : k;
            for (int64_t i = 0; i < n * H * D; ++i) {
              const auto h = static_cast<size_t>(i / D % H);
              auto& ka = cal.k_amax[static_cast<size_t>(l)][h];
              auto& va = cal.v_amax[static_cast<size_t>(l)][h];
              ka = std::max(ka, std::fabs(kk[i]));
              va = std::max(va, std::fabs(v[i]));
            }
          });
      if (o.poll) o.poll();
    }
    if (progress) progress(fmt::format("[calibrate] {}/{} tokens", w + len, ids.size()));
  }
  return cal;
}

}  // namespace kvq::eval
