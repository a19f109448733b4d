// A RULER-style long-context suite (Hsieh et al. 2024, github.com/NVIDIA/RULER), generated here
// from a seed with no data download: needle retrieval (single, multi-key, multi-value,
// multi-query; numbers, words and UUIDs as values), variable tracking, common- and frequent-word
// extraction, in RULER's task templates and answer prefixes, scored by RULER's string_match_all.
// Prompts are assembled from token pieces, so a needle or variable-tracking prompt has exactly the
// tokens asked for; the word-list tasks come within one word's entries of it (RulerCase).
// Where kvq differs from RULER and why: README.md, "kvq run" ([ruler]) and docs/results.md.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "model/llama.h"
#include "model/tokenizer.h"

namespace kvq::eval {

/// \brief One RULER task: its name (RULER's), its group ("niah", "vt", "cwe", "fwe") and how
/// many tokens RULER lets the model generate for it (the prompt is the length minus these).
struct RulerTask {
  std::string_view name, group;
  int gen_tokens = 0;
};

/// \brief The tasks in RULER's order: niah_single_1..3, niah_multikey_1..3, niah_multivalue,
/// niah_multiquery, vt, cwe, fwe (RULER's two QA tasks need SQuAD/HotpotQA and are left out).
const std::vector<RulerTask>& ruler_tasks();
/// \brief The task named `name`; throws kvq::Error listing the names otherwise.
const RulerTask& ruler_task(std::string_view name);

/// \brief The haystack every case draws from: `text` tokens (needle_text's haystack: the first
/// 400,000 bytes of the text, e.g. KJV) stand where RULER uses Paul Graham's essays; with
/// `noise` RULER's repeated sentences stand there instead. niah_single_1 and vt always use the
/// noise and niah_multikey_2/3 a haystack of distractor needles, as RULER defines them.
struct RulerHaystack {
  std::vector<int32_t> text;  ///< empty with noise
  bool noise = false;
};
/// \brief RULER's "repeat" haystack unit: one line of it.
inline constexpr std::string_view kRulerNoise =
    "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.\n";
RulerHaystack ruler_haystack(const Tokenizer& tok, const std::string& text, bool noise);

/// \brief One generated case. The prompt is the model's chat template around the task's text,
/// with RULER's answer prefix opening the assistant turn; `answers` are what the output must
/// contain (RULER's "outputs"). Length: prompt + gen_tokens == length for the niah and vt tasks;
/// for cwe and fwe the prompt is the longest whole list that fits, within kRulerListSlack tokens.
struct RulerCase {
  std::vector<int32_t> prompt;
  std::vector<std::string> answers;
  int gen_tokens = 0;
};
inline constexpr int kRulerListSlack = 48;

/// \brief Case `sample` of `task` at `length` tokens, a function of (seed, task, length, sample)
/// alone (so sharding, resuming and adding tasks change no other case). Throws kvq::Error when
/// the length leaves no room for the task.
RulerCase ruler_case(const Tokenizer& tok, const RulerHaystack& hay, std::string_view task,
                     int length, uint64_t seed, int sample);

/// \brief RULER's postprocess_pred: strips, turns every control character into a newline,
/// strips again.
std::string ruler_postprocess(std::string_view pred);
/// \brief RULER's scores of one prediction (after ruler_postprocess): string_match_all, the
/// fraction of `refs` found in it, and string_match_part, 1 if any is (both case-insensitive
/// substring tests). RULER scores every synthetic task with string_match_all.
double string_match_all(std::string_view pred, const std::vector<std::string>& refs);
double string_match_part(std::string_view pred, const std::vector<std::string>& refs);

/// \brief One case run with one cache: greedy decoding (eval::generate, stopping at the
/// tokenizer's eos) of at most the task's budget (`max_new` > 0: of at most that many), the
/// output after ruler_postprocess and its string_match_all against the case's answers.
/// `poll` runs after every generated token (it may throw to stop).
struct RulerOutput {
  std::string text;
  double score = 0;
  int tokens = 0;  ///< generated, the stop token included
};
RulerOutput ruler_trial(const LlamaModel& m, const Tokenizer& tok, const CacheOptions& cache,
                        const RulerCase& c, int max_new = 0, int threads = 0,
                        const std::function<void()>& poll = {});

/// \brief The word pool the "words" values, cwe's lists and the keys are drawn from (English
/// nouns, adjectives and verbs, as RULER's wonderwords lists; none is a substring of another).
const std::vector<std::string>& ruler_words();

}  // namespace kvq::eval
