// Model-level quality of a KV-cache scheme on the real model (REFERENCE.md section 4):
// perplexity with KL divergence and top-1 agreement against the fp32 cache, greedy divergence,
// passkey retrieval. Every run pairs the scheme with an fp32-cache run on the same tokens.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "model/llama.h"
#include "model/tokenizer.h"

namespace kvq::eval {

/// \brief A GGUF's model and tokenizer, from one open of the file (its mapping is released once
/// the weights are packed).
struct LoadedModel {
  LlamaModel model;
  Tokenizer tok;
};
LoadedModel load_model(const std::string& path);

/// \brief Called with a one-line progress message on long runs.
using Progress = std::function<void(const std::string&)>;

struct PplOptions {
  int ctx = 512;       ///< window length in tokens
  int stride = 0;      ///< window step; 0 = ctx (non-overlapping). Windows after the first score
                       ///< only their last `stride` positions (the rest is context), like
                       ///< llama-perplexity's strided mode.
  int score_from = 0;  ///< score only positions >= score_from of each window (0: as stride says)
  int chunk = 256;     ///< prefill chunk: the cache is appended chunk by chunk
  int64_t max_tokens = 0;  ///< use only the first max_tokens tokens of the text (0 = all)
  int threads = 0;
  /// Called after every chunk; may throw to stop the run (the Python module's Ctrl-C check).
  std::function<void()> poll;
};

/// \brief Throws kvq::Error for options no text can satisfy on a model of `context` tokens
/// (what perplexity checks first; the CLI calls it before the weights load).
void check_ppl_options(const PplOptions& o, int context);

struct PplResult {
  int64_t windows = 0, scored = 0;
  double ppl = 0, ppl_ref = 0;  ///< exp(mean NLL) for the scheme and for the fp32 cache
  double kld = 0;               ///< mean KL(p_fp32 || p_scheme) of next-token distributions
  double kld_p99 = 0;           ///< 99th percentile of the per-token KL
  double top1 = 0;              ///< fraction of positions where both argmaxes agree
  double seconds = 0;           ///< of the whole run (all schemes together)
};

/// \brief Perplexity of `tokens` with each scheme's cache, with KL and top-1 agreement against the
/// fp32 cache on the same windows. The fp32 reference runs once per window for all schemes.
std::vector<PplResult> perplexity(const LlamaModel& m, const std::vector<CacheOptions>& caches,
                                  const std::vector<int32_t>& tokens, const PplOptions& o,
                                  const Progress& progress = {});

/// \brief perplexity() for one scheme.
PplResult perplexity(const LlamaModel& m, const CacheOptions& cache,
                     const std::vector<int32_t>& tokens, const PplOptions& o,
                     const Progress& progress = {});

struct DivergeResult {
  std::vector<int32_t> ref, test;  ///< greedy continuations (vs spec, kv spec)
  int64_t first_diff = -1;         ///< index of the first differing generated token; -1 if none
  double top1 = 0;  ///< teacher-forced: the test cache's argmax equals the ref's next token
};

/// \brief Greedy generation of n tokens after `prompt` with two caches, side by side.
DivergeResult diverge(const LlamaModel& m, const CacheOptions& ref, const CacheOptions& test,
                      const std::vector<int32_t>& prompt, int n, int threads = 0);

/// \brief Greedy generation (stops at `stop` ids).
std::vector<int32_t> generate(const LlamaModel& m, const CacheOptions& cache,
                              const std::vector<int32_t>& prompt, int n,
                              const std::vector<int32_t>& stop, int threads = 0,
                              const std::function<void(int32_t)>& on_token = {});

struct NeedleResult {
  int64_t ctx = 0;       ///< prompt tokens
  double depth = 0;      ///< where the needle sits, as a fraction of the haystack
  bool correct = false;  ///< greedy decoding reproduces every passkey token
  double logprob = 0;    ///< mean log-probability of the passkey tokens (teacher forced)
};

/// \brief The fixed parts of every passkey prompt: the haystack's tokens (the first 400,000 bytes
/// of `hay_text`), the instruction before it and the question after it.
struct NeedleText {
  std::vector<int32_t> hay, intro, question;
};
NeedleText needle_text(const Tokenizer& tok, const std::string& hay_text);

/// \brief The next pass key (10000-99999) of a deterministic sequence; `state` starts as
/// needle_seed(seed).
uint64_t needle_seed(uint64_t seed);
int needle_key(uint64_t& state);

/// \brief A prompt of exactly `ctx` tokens with the pass key `key` at `depth` of the haystack, and
/// the key's tokens (the answer). Throws kvq::Error when ctx leaves no room for the haystack.
struct NeedleCase {
  std::vector<int32_t> prompt, answer;
};
NeedleCase needle_case(const Tokenizer& tok, const NeedleText& t, int ctx, double depth, int key);

/// \brief One passkey trial: `prompt` holds the needle; `answer` are the passkey's tokens.
NeedleResult needle_trial(const LlamaModel& m, const CacheOptions& cache,
                          const std::vector<int32_t>& prompt, const std::vector<int32_t>& answer,
                          int chunk = 256, int threads = 0, const Progress& progress = {});

/// \brief One layer's K (post-RoPE and pre-RoPE) and V of a text, [tokens, kv_heads, head_dim].
struct LayerKv {
  Tensor3 k, k_pre, v;
};

/// \brief Every layer's K and V as the forward pass computes them for `ids` (an fp32 cache, chunks
/// of 256 tokens): what `kvq model dump` writes, `kvq stats --text` measures and Python's
/// Model.dump_kv returns. `poll` runs after every chunk (it may throw to stop).
std::vector<LayerKv> dump_kv(const LlamaModel& m, const std::vector<int32_t>& ids, int threads = 0,
                             const std::function<void()>& poll = {});

/// \brief log-softmax of one logits row, in double.
std::vector<double> log_softmax(const float* logits, int64_t n);

}  // namespace kvq::eval
