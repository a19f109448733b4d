// Model-level quality of a KV-cache scheme on the real model (REFERENCE.md section 4):
// perplexity with KL divergence and top-1 agreement against the fp32 cache, greedy divergence,
// passkey retrieval. Every run pairs the scheme with an fp32-cache run on the same tokens.
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "fp8/scale.h"
#include "model/llama.h"
#include "model/tokenizer.h"

namespace kvq::eval {

/// \brief A model path's model and tokenizer: a GGUF's from one open of the file, a checkpoint
/// folder's weights and tokenizer.json; `store` as LlamaModel::load takes it (a folder's dense
/// weights stay in the mapped shards by default).
struct LoadedModel {
  LlamaModel model;
  Tokenizer tok;
};
LoadedModel load_model(const std::string& path, WeightStore store = WeightStore::kMapped);

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

/// \brief A 95% confidence interval; NaN bounds when it could not be estimated (fewer than two
/// bootstrap blocks).
struct Interval {
  double lo = std::numeric_limits<double>::quiet_NaN(), hi = lo;
  bool known() const { return std::isfinite(lo) && std::isfinite(hi); }
};

/// \brief How perplexity() estimates its intervals: a block bootstrap over the scored positions.
/// Each window's scored positions are cut into consecutive blocks of kCiBlock (the last one of a
/// window shorter; no block crosses a window), so the dependence between neighbouring tokens stays
/// inside a block; kCiResamples resamples draw as many blocks as there are, with replacement, by
/// splitmix64 from kCiSeed (the same draws on every platform); every statistic of one resample is
/// computed from the same draw (so delta ppl is paired), and the interval is the 2.5th and 97.5th
/// percentile of the resampled statistic.
inline constexpr int kCiBlock = 32;
inline constexpr int kCiResamples = 2000;
inline constexpr uint64_t kCiSeed = 0x6b7671;

struct PplResult {
  int64_t windows = 0, scored = 0;
  double ppl = 0, ppl_ref = 0;  ///< exp(mean NLL) for the scheme and for the fp32 cache
  double kld = 0;               ///< mean KL(p_fp32 || p_scheme) of next-token distributions
  double kld_p99 = 0;           ///< 99th percentile of the per-token KL
  double top1 = 0;              ///< fraction of positions where both argmaxes agree
  /// 95% intervals of ppl, ppl_ref, ppl - ppl_ref, kld and top1 (kCiBlock's block bootstrap)
  Interval ppl_ci, ppl_ref_ci, delta_ppl_ci, kld_ci, top1_ci;
  int64_t ci_blocks = 0;  ///< bootstrap blocks the intervals were drawn from
  /// quantized_fraction() of the scheme for these windows: how much of what the scored positions
  /// attend was stored quantized
  double quantized = 0;
  double seconds = 0;  ///< of the whole run (all schemes together)
};

/// \brief One scheme's per-position scores in scoring order (window by window), what the
/// intervals are drawn from: the fp32 cache's and the scheme's NLL of the next token, the KL and
/// whether the argmaxes agree (1 or 0); window_begin: the index of each window's first position.
struct PositionScores {
  std::vector<double> nll_ref, nll, kl, agree;
  std::vector<size_t> window_begin;
};

/// \brief Sets r's intervals and ci_blocks from `s` by the block bootstrap of kCiBlock (the same
/// draws for every call with as many blocks: deterministic).
void bootstrap_intervals(const PositionScores& s, PplResult& r);

/// \brief A row's statistics by name, in the order every model row writes them: ppl, ppl_lo,
/// ppl_hi, ppl_fp32 (+ _lo, _hi), delta_ppl (+ _lo, _hi), kld (+ _lo, _hi), kld_p99, top1 (+ _lo,
/// _hi), quantized (NaN bounds: the interval is unknown; JSON writes them null).
std::vector<std::pair<std::string, double>> result_fields(const PplResult& r);
/// \brief A row's `reference` field on backend `b`: the canonical name of reference_spec(b) (the
/// cache its *_fp32 fields were measured with) when that is not fp32 (backend cuda: bf16), else ""
/// (no field: the rows of host backends read as before).
std::string reference_field(AttentionBackend b);

/// \brief One line for a row: "ppl 5.030 [4.81, 5.27], delta +1.031 [+0.94, +1.13], KLD 0.2668
/// [0.251, 0.283], top-1 83.95% [81.9, 86.0], quantized 52.1%" (95% intervals; "[-]" when unknown).
std::string format_result(const PplResult& r);

/// \brief Tokens of the first `tokens` that one cache side (layer `layer`'s scheme of `spec`,
/// role `role`) holding exactly `tokens` tokens stores quantized rather than exact, i.e. what a
/// query at position tokens - 1 reads quantized. int: core/footprint.h's quantized_tokens (the
/// residual window and a per-channel side's unfilled block are exact; the rule `kvq run` warns
/// with on synthetic rows); FP8: every token, except that dynamic tensor/head/channel scales hold a
/// streamed cache exact until their `first` tokens have arrived (`streamed`; a tensor quantized in
/// one piece takes its scales from the tokens it has); bf16/fp16: every token (rounded); fp32:
/// none; sink=S: the first S tokens exact; rot= changes nothing.
int64_t quantized_tokens_of(const SchemeSpec& spec, Role role, int64_t tokens, int layer = 0,
                            bool streamed = true);

/// \brief How much of the K/V cache the positions perplexity() scores with `o` (on a text of
/// `text_tokens` tokens) read quantized: the mean, over the scored positions p of every window
/// (the query at window position p attends the p + 1 tokens 0..p) and over the (layer, side)
/// pairs of the model's `layers` layers x {K, V} whose scheme is not fp32, of
/// quantized_tokens_of(spec, side, p + 1, layer) / (p + 1). fp32 sides (a split spec's
/// k=fp32, a per-layer study's fp32 layers) are exact by design and left out, so the number says
/// how much the sides that quantize did quantize; an all-fp32 scheme reads 0.
/// 0: the row measured nothing of the scheme (every attended token exact: a residual window or an
/// FP8 first-N prefix covering the windows); 1: everything those sides' queries read was quantized.
double quantized_fraction(const SchemeSpec& spec, const PplOptions& o, int64_t text_tokens,
                          int layers);

/// \brief Whether every layer's K and V scheme of `spec` is fp32 (nothing to quantize by design).
bool exact_by_design(const SchemeSpec& spec);

/// \brief Below this quantized_fraction a model row mostly measures the exact part of the cache:
/// `kvq run` and `kvq model ppl` print a warning, and `kvq advise` does not use the row. For
/// scale: kivi2 (r=128) scoring whole windows reads 0 at ctx 128, 0.25 at 256, 0.50 at 512 and
/// 0.81 at 2,048; FP8 with first=128 reads 0 at 128 and 0.50 at 256.
inline constexpr double kMinQuantizedFraction = 0.2;

/// \brief The words of that warning: "SCHEME at ctx N: only X% of the K/V the scored positions
/// attend was stored quantized (under 20%): ...".
std::string little_quantized(const std::string& scheme, int64_t ctx, double quantized);

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

/// \brief One passkey case of a grid, run with the reference cache and the scheme's.
struct NeedleRow {
  int ctx = 0;
  double depth = 0;
  int trial = 0, key = 0;
  NeedleResult ref, test;
};

struct NeedleGrid {
  std::vector<int> ctxs;       ///< prompt lengths
  std::vector<double> depths;  ///< needle depths in [0, 1]
  int trials = 1;              ///< pass keys per (ctx, depth)
  uint64_t seed = 1;           ///< the keys are needle_key(needle_seed(seed)) in grid order
  int threads = 0;
};

/// \brief Passkey retrieval over ctx x depth x trial (in that order, keys drawn in that order):
/// each case's prompt with `ref` and with `test`, as `kvq model needle` prints them and Python's
/// Model.needle returns them. `on_row` runs after every case (it may throw to stop); `progress`
/// gets needle_trial's messages prefixed with the case and the scheme.
std::vector<NeedleRow> needle_grid(const LoadedModel& L, const std::string& hay_text,
                                   const CacheOptions& ref, const CacheOptions& test,
                                   const NeedleGrid& g,
                                   const std::function<void(const NeedleRow&)>& on_row = {},
                                   const Progress& progress = {});

struct CalibrateOptions {
  std::string text_name;   ///< the text as the user named it ("kjv", a path), for the record
  int64_t max_tokens = 0;  ///< tokens calibrated on (after the skipped ones); 0 = all
  int64_t skip = 0;        ///< tokens skipped at the start of the text
  int ctx = 1024;          ///< window length: each window runs from an empty fp32 cache
  bool pre_rope = false;   ///< record keys before RoPE (for --pre-rope runs)
  int threads = 0;
  std::function<void()> poll;  ///< after every chunk (may throw to stop)
};

/// \brief Per-layer, per-head amax of K and V over `text` (windows of ctx tokens, chunks of 256),
/// with the model and source recorded: what `kvq model calibrate` writes for FP8
/// `scale=calib:FILE` and Python's Model.calibrate returns. `progress` after every window.
fp8::Calibration calibrate(const LoadedModel& L, const std::string& text, const CalibrateOptions& o,
                           const Progress& progress = {});

}  // namespace kvq::eval
